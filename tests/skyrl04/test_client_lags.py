"""The companion's generate says how many updates behind each response's oldest tokens were
(`weight_lags`), counted along the versions the batch itself shows: spans, then the sidecar's
`X-Weight-Version` and `X-Weight-Version-End` headers."""

from __future__ import annotations

import asyncio
import json
from typing import Any

from aiohttp import web

from proxy.skyrl.lags import Seen, lags, order
from tests.fake_vllm import FakeVLLM, json_response
from tests.sidecar import Sidecar
from tests.skyrl04.clients import companion, url
from tests.support import eventually

GENERATE = "/inference/v1/generate"


def span(version: str, start: int, end: int) -> dict[str, Any]:
    return {"version": version, "start": start, "end": end}


# -- the order of versions, and lags along it (pure) -------------------------------------------
def test_versions_are_ordered_as_each_answer_shows_them() -> None:
    arrivals = [
        # Made after the sync, short: it arrives first.
        Seen([span("v2", 0, 4)], "v2", None),
        # Forwarded at v0, frozen across two syncs: v0 and v1 came before v2, though first seen
        # after it.
        Seen([span("v0", 0, 2), span("v1", 2, 3), span("v2", 3, 9)], "v0", "v2"),
    ]
    assert order(arrivals) == ["v0", "v1", "v2"]
    # Spans out of token order are read in token order; the headers frame them.
    assert order([Seen([span("b", 3, 5), span("a", 0, 3)], None, "c")]) == ["a", "b", "c"]


def test_a_version_no_answer_places_goes_as_late_as_its_answer_allows() -> None:
    # v1 before v2 is known; an answer forwarded at v0 and made by v2 shows v0 before v2 only:
    # nothing the batch shows puts v0 before v1 (docs/skyrl.md says what one batch can tell).
    arrivals = [Seen([span("v1", 0, 2), span("v2", 2, 4)], "v1", "v2"), Seen(None, "v0", "v2")]
    assert order(arrivals) == ["v1", "v0", "v2"]
    # A version seen alone, after the others, is taken for the newest.
    assert order([Seen(None, "v0", None), Seen(None, "v1", None)]) == ["v0", "v1"]


def test_the_first_order_seen_wins_a_conflict() -> None:
    # Two pods that name their updates alike but count them differently (one restarted).
    assert order([Seen(None, "a", "b"), Seen(None, "b", "a")]) == ["a", "b"]


def test_a_responses_lag_is_its_oldest_tokens_behind_the_batchs_newest() -> None:
    responses: list[Seen | None] = [
        Seen([span("v0", 0, 2), span("v1", 2, 5)], "v0", "v1"),
        Seen([span("v1", 0, 5)], "v0", "v1"),  # queued across the sync: its tokens are v1's
        Seen([span("v0", 0, 0), span("v1", 0, 5)], "v0", "v1"),  # a span over no tokens
        Seen(None, "v0", "v1"),  # no spans: the start says it (an upper bound)
        Seen(None, None, "v1"),
        Seen(None, None, None),  # no version known (a vLLM outside dev mode)
        None,  # no answer can be told apart (a prompt given twice)
    ]
    arrivals = [r for r in responses if r is not None]
    assert lags(responses, arrivals) == [1, 0, 0, 1, 0, None, None]


def test_malformed_spans_leave_the_headers_to_say_it() -> None:
    # v0 came before v1; the spans would say the tokens are v0's, the header says v1.
    for spans in (
        [span("v0", 0, 5), {"version": "v1"}],
        [{"version": "v0", "start": True, "end": 2}],
        [span("v0", 0, 5), "v1"],
        "v0",
    ):
        seen = Seen(spans, "v1", None)
        assert lags([seen], [Seen(None, "v0", "v1"), seen]) == [0], spans


# -- through the sidecar -----------------------------------------------------------------------
def answering(spans: list[dict[str, Any]] | None, gate: asyncio.Event | None = None) -> Any:
    """vLLM's generate answer with `spans` (none if None), sent once `gate` is set."""

    async def handler(request: web.Request) -> web.Response:
        payload = json.loads(await request.read())
        if gate is not None:
            await gate.wait()
        choice: dict[str, Any] = {"index": 0, "token_ids": [7, 8], "finish_reason": "length"}
        if spans is not None:
            choice["weight_versions"] = spans
        return json_response({"choices": [choice], "model": payload["model"]})

    return handler


async def across_an_update(
    fake: FakeVLLM, sidecar: Sidecar, handlers: list[Any], gate: asyncio.Event
) -> dict[str, Any]:
    """A batch of one prompt per handler; the gated ones are forwarded at `default`, and answer
    once the version is `step-1`."""
    fake.scripts[f"POST {GENERATE}"] = list(handlers)  # the fake pops its own copy
    client = companion(url(sidecar))
    batch = {"prompt_token_ids": [[i, 1] for i in range(len(handlers))], "sampling_params": {}}
    try:
        asked = asyncio.create_task(client.generate(batch))
        await eventually(lambda: fake.forwarded(GENERATE) == len(handlers), "all forwarded")
        resp = await sidecar.client.post("/update_weight_version", json={"new_version": "step-1"})
        assert resp.status == 200, await resp.text()
        gate.set()
        out: dict[str, Any] = await asked
    finally:
        await client.teardown()
    return out


async def test_spans_and_headers_order_an_update_inside_one_batch(
    fake: FakeVLLM, sidecar: Sidecar
) -> None:
    gate = asyncio.Event()
    out = await across_an_update(
        fake,
        sidecar,
        [
            answering(None),  # before the update, no spans: X-Weight-Version says `default`
            answering([span("default", 0, 1), span("step-1", 1, 2)], gate),  # frozen across it
            answering([span("step-1", 0, 2)], gate),  # forwarded before it, made after it
        ],
        gate,
    )
    assert out["weight_lags"] == [1, 1, 0]
    assert out["weight_versions"][2] == [span("step-1", 0, 2)]


async def test_the_end_header_alone_can_show_the_update(fake: FakeVLLM, sidecar: Sidecar) -> None:
    # No spans at all: the second answer's X-Weight-Version-End is the only sight of step-1.
    gate = asyncio.Event()
    out = await across_an_update(fake, sidecar, [answering(None), answering(None, gate)], gate)
    assert out["weight_versions"] == [None, None]
    assert out["weight_lags"] == [1, 1]


async def test_a_batch_under_one_version_is_on_policy(fake: FakeVLLM, sidecar: Sidecar) -> None:
    fake.scripts[f"POST {GENERATE}"] = [answering(None), answering([span("default", 0, 2)])]
    client = companion(url(sidecar))
    out = await client.generate({"prompt_token_ids": [[1], [2]], "sampling_params": {}})
    assert out["weight_lags"] == [0, 0]
    await client.teardown()
