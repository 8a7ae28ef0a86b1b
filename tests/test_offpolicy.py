"""Off-policy counts (docs/offpolicy.md) against the generating fake (tests/fake_generator.py):
every answer's tokens by lag behind the pod's newest version, checked against what the answer
itself says (its spans, its versions, its token count), token for token."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from aiohttp.test_utils import TestServer

from proxy.core.offpolicy import LAGS
from proxy.engine.lifecycle import LIFECYCLE
from tests.fake_generator import Generator
from tests.fake_vllm import FakeVLLM
from tests.sidecar import MakeSidecar, Sidecar, control
from tests.sse import sse_data
from tests.support import eventually

PROMPT = [3, 1, 4, 1, 5]
TOKENS = "vllm_sidecar_generated_tokens_total"
STRADDLING = "vllm_sidecar_straddling_answers_total"
COMPLETIONS, CHAT, GENERATE = "/v1/completions", "/v1/chat/completions", "/inference/v1/generate"


@pytest.fixture
def generator(fake: FakeVLLM) -> Generator:
    gen = Generator(fake, delay=0.005)
    gen.install()
    return gen


async def started(make_sidecar: MakeSidecar, upstream: TestServer, **settings: Any) -> Sidecar:
    sidecar = await make_sidecar(str(upstream.make_url("")), **settings)
    await eventually(lambda: sidecar.app[LIFECYCLE].version == "default")
    return sidecar


@pytest.fixture
async def sidecar(upstream: TestServer, make_sidecar: MakeSidecar, generator: Generator) -> Sidecar:
    return await started(make_sidecar, upstream)


def counted(sidecar: Sidecar, route: str) -> dict[str, float]:
    """The route's tokens by lag, the labels counted so far."""
    found = {lag: sidecar.sample(TOKENS, route=route, lag=lag) for lag in LAGS}
    return {lag: value for lag, value in found.items() if value}


def body_of(route: str, max_tokens: int, **extra: Any) -> dict[str, Any]:
    if route == GENERATE:
        return {"token_ids": PROMPT, "sampling_params": {"max_tokens": max_tokens}, **extra}
    if route == CHAT:
        messages = [{"role": "user", "content": "hi"}]
        return {"model": "tiny-model", "messages": messages, "max_tokens": max_tokens, **extra}
    return {"model": "tiny-model", "prompt": PROMPT, "max_tokens": max_tokens, **extra}


def by_spans(spans: list[dict[str, Any]], history: list[str]) -> dict[str, float]:
    """What the spans say, by the test's own reckoning: updates behind the newest."""
    out: dict[str, float] = {}
    for span in spans:
        behind = len(history) - 1 - history.index(span["version"])
        lag = str(behind) if behind < 3 else "3+"
        out[lag] = out.get(lag, 0) + span["end"] - span["start"]
    return out


async def history(sidecar: Sidecar) -> list[str]:
    async with sidecar.admin.get("/engine") as resp:
        return [u["version"] for u in (await resp.json())["weight_versions"]]


async def update(sidecar: Sidecar, version: str) -> None:
    await control(sidecar, "/start_weight_update", json={})
    await control(sidecar, "/finish_weight_update", json={"weight_version": version})


@pytest.mark.parametrize(
    ("route", "extra"),
    [
        (COMPLETIONS, {}),
        (COMPLETIONS, {"stream": True}),
        (COMPLETIONS, {"stream": True, "stream_options": {"include_usage": True}}),
        (CHAT, {}),
        (CHAT, {"stream": True}),  # its first event, a role, carries no token
        (GENERATE, {}),
        (GENERATE, {"stream": True}),
    ],
)
async def test_an_answer_under_one_version_counts_every_token_at_lag_0(
    sidecar: Sidecar, route: str, extra: dict[str, Any]
) -> None:
    async with sidecar.client.post(route, json=body_of(route, 7, **extra)) as resp:
        assert resp.status == 200, await resp.text()
        await resp.read()
    assert counted(sidecar, route) == {"0": 7}
    assert sidecar.sample(STRADDLING, route=route) is None


@pytest.mark.parametrize("updates", [1, 2, 3])
async def test_tokens_made_across_updates_count_by_their_spans(
    sidecar: Sidecar, updates: int
) -> None:
    """A generate stream frozen by a `keep` pause across `updates` weight updates: its tokens
    before them are `updates` behind (3 or more: `3+`), those after at lag 0."""
    body = body_of(GENERATE, 60, stream=True)
    async with sidecar.client.post(GENERATE, json=body) as resp:
        await resp.content.readuntil(b"\n\n")  # tokens made under `default`
        await control(sidecar, "/pause?mode=keep")
        for n in range(updates):
            await update(sidecar, f"v{n + 2}")
        await control(sidecar, "/resume")
        events = [e for e in await sse_data(resp) if isinstance(e, dict)]
    [spans] = [c["weight_versions"] for e in events for c in e["choices"] if c["weight_versions"]]
    assert [s["version"] for s in spans] == ["default", f"v{updates + 1}"]
    expected = by_spans(spans, await history(sidecar))
    assert counted(sidecar, GENERATE) == expected
    assert sum(expected.values()) == 60
    assert sidecar.metric(STRADDLING, route=GENERATE) == 1


@pytest.mark.parametrize("stream", [False, True])
async def test_without_spans_an_answer_across_an_update_is_straddled(
    sidecar: Sidecar, fake: FakeVLLM, stream: bool
) -> None:
    """Completions carry no spans (vLLM 0.32): which tokens came before the update is not
    known, and not guessed."""
    asked = asyncio.create_task(
        sidecar.client.post(COMPLETIONS, json=body_of(COMPLETIONS, 60, stream=stream))
    )
    await eventually(lambda: fake.forwarded() == 1)
    await control(sidecar, "/pause?mode=keep")
    await update(sidecar, "v2")
    await control(sidecar, "/resume")
    resp = await asyncio.wait_for(asked, 30)
    await resp.read()
    assert counted(sidecar, COMPLETIONS) == {"straddled": 60}
    assert sidecar.metric(STRADDLING, route=COMPLETIONS) == 1


async def test_after_an_update_new_answers_are_current_and_old_versions_lag(
    sidecar: Sidecar,
) -> None:
    """The lag is counted against the newest version when each answer ends."""
    await update(sidecar, "v2")
    async with sidecar.client.post(GENERATE, json=body_of(GENERATE, 5)) as resp:
        answer = await resp.json()
    assert answer["choices"][0]["weight_versions"] == [{"version": "v2", "start": 0, "end": 5}]
    assert counted(sidecar, GENERATE) == {"0": 5}
    assert await history(sidecar) == ["default", "v2"]


@pytest.mark.parametrize("stream", [False, True])
async def test_a_continued_answer_counts_its_parts_by_their_versions(
    upstream: TestServer, make_sidecar: MakeSidecar, generator: Generator, stream: bool
) -> None:
    """An abort-mode cut, an update, and the rest generated by the new weights: the joined
    answer's parts are counted once each, by the version that made them."""
    sidecar = await started(make_sidecar, upstream, continue_aborted=True)
    generator.stall_at = 12
    asked = asyncio.create_task(
        sidecar.client.post(COMPLETIONS, json=body_of(COMPLETIONS, 40, stream=stream))
    )
    await asyncio.wait_for(generator.stalled.wait(), 10)
    await control(sidecar, "/pause?mode=abort")
    await update(sidecar, "v2")
    await control(sidecar, "/resume")
    resp = await asyncio.wait_for(asked, 30)
    assert resp.status == 200
    await resp.read()
    assert counted(sidecar, COMPLETIONS) == {"1": 12, "0": 28}
    assert sidecar.metric(STRADDLING, route=COMPLETIONS) == 1


async def test_the_alert_threshold_is_exported_only_when_set(
    upstream: TestServer, make_sidecar: MakeSidecar, generator: Generator
) -> None:
    plain = await started(make_sidecar, upstream)
    assert plain.sample("vllm_sidecar_offpolicy_alert_share") is None
    alerting = await started(make_sidecar, upstream, offpolicy_alert_share=0.25)
    assert alerting.metric("vllm_sidecar_offpolicy_alert_share") == 0.25
