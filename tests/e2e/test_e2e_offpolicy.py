"""Off-policy counts against a real vLLM on CPU in dev mode (the run's shared `dev_engine`):
generations under load while a trainer pauses (`keep`, as SkyRL 0.4 does) and updates the weights
again and again; the sidecar's counters must equal what the answers' own spans and versions say,
token for token (docs/offpolicy.md)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest

from proxy.core.offpolicy import LAGS
from proxy.engine.lifecycle import LIFECYCLE
from tests.metrics import metric
from tests.sidecar import MakeSidecar, Sidecar, control
from tests.support import eventually
from tests.vllm_servers import DevVllm

pytestmark = pytest.mark.vllm

GENERATE = "/inference/v1/generate"
CLIENTS, UPDATES = 4, 3


def lag_label(behind: int) -> str:
    return str(behind) if behind < 3 else "3+"


@pytest.fixture
async def front(dev_engine: DevVllm, make_sidecar: MakeSidecar) -> AsyncIterator[Sidecar]:
    sidecar = await make_sidecar(dev_engine.url, health_interval=0.5)
    await eventually(lambda: sidecar.app[LIFECYCLE].version is not None, within=30.0)
    yield sidecar
    for path in ("/resume", "/wake_up"):  # the shared engine serving again, whatever happened
        await control(sidecar, path)


async def running(http: aiohttp.ClientSession, engine: DevVllm) -> float:
    """vLLM's own gauge: the requests running at its last step."""
    return await metric(http, f"{engine.url}/metrics", "vllm:num_requests_running")


async def pause_mid_answer(front: Sidecar, http: aiohttp.ClientSession, engine: DevVllm) -> None:
    """A `keep` pause that froze a request mid-answer. Read once the engine is paused, the gauge
    tells what its last step left running: each such request has a token made (the first comes
    with its prefill) and more to come. Four clients in step can all be between answers when the
    pause lands (a run froze none, and straddled nothing): such a pause is resumed, and tried
    again once a request runs."""
    for _ in range(50):
        await eventually(lambda: running(http, engine), "a request running", 60.0)
        assert (await control(front, "/pause?mode=keep")).status == 200
        if await running(http, engine) >= 1:
            return
        assert (await control(front, "/resume")).status == 200
    pytest.fail("no keep pause of 50 froze a request mid-answer")


async def test_counters_match_the_answers_spans_under_pauses_and_updates(
    front: Sidecar, dev_engine: DevVllm
) -> None:
    answers: list[tuple[list[dict[str, Any]], str]] = []  # spans, the version at the end
    stop = asyncio.Event()

    async def client(tag: int) -> None:
        while not stop.is_set():
            body = {
                "token_ids": [tag + 1, 2, 3],
                "sampling_params": {"max_tokens": 24, "ignore_eos": True, "temperature": 0.0},
            }
            async with front.client.post(GENERATE, json=body) as resp:
                assert resp.status == 200, await resp.text()
                answer = await resp.json()
                end = resp.headers.get("X-Weight-Version-End", resp.headers["X-Weight-Version"])
            [choice] = answer["choices"]
            assert sum(s["end"] - s["start"] for s in choice["weight_versions"]) == len(
                choice["token_ids"]
            )
            answers.append((choice["weight_versions"], end))

    clients = [asyncio.create_task(client(tag)) for tag in range(CLIENTS)]
    base = front.app[LIFECYCLE].version
    async with aiohttp.ClientSession() as http:
        for n in range(UPDATES):
            await eventually(lambda n=n: len(answers) >= 2 * (n + 1), within=120.0)
            await pause_mid_answer(front, http, dev_engine)
            await control(front, "/start_weight_update", json={})
            version = f"{base}-e2e{n}"
            await control(front, "/finish_weight_update", json={"weight_version": version})
            assert (await control(front, "/resume")).status == 200
    await eventually(lambda: len(answers) >= 2 * (UPDATES + 1), within=120.0)
    stop.set()
    await asyncio.wait_for(asyncio.gather(*clients), 120)

    async with front.admin.get("/engine") as resp:
        history = [u["version"] for u in (await resp.json())["weight_versions"]]
    assert history[-UPDATES:] == [f"{base}-e2e{n}" for n in range(UPDATES)]
    expected: dict[str, int] = {}
    straddling = 0
    for spans, end in answers:
        straddling += len({s["version"] for s in spans}) > 1
        for span in spans:
            label = lag_label(history.index(end) - history.index(span["version"]))
            expected[label] = expected.get(label, 0) + span["end"] - span["start"]
    name = "vllm_sidecar_generated_tokens_total"
    found = {lag: front.sample(name, route=GENERATE, lag=lag) for lag in LAGS}
    counted = {lag: int(v) for lag, v in found.items() if v}
    # Every update comes in a `keep` pause that froze a request mid-answer (a local run: 12
    # answers, 6 straddling, tokens at lags 0, 1 and 2).
    assert straddling >= 1
    assert counted == expected
    assert sum(counted.values()) == 24 * len(answers)
    assert (front.sample("vllm_sidecar_straddling_answers_total", route=GENERATE) or 0) == (
        straddling
    )
