"""No closed world for routes: a route the table does not name is held through a weight sync and
stamped, and the routes vLLM keeps for operators need the control token (issue 33, items 1-2)."""

from __future__ import annotations

import asyncio

import pytest
from aiohttp.test_utils import TestServer

from proxy.engine.lifecycle import LIFECYCLE
from tests.fake_vllm import FakeVLLM, respond
from tests.sidecar import MakeSidecar, Sidecar, assert_envelope, control
from tests.support import eventually

FAMILY = "vllm_sidecar_phase_requests_total"
TOKEN = "s3cret"
BEARER = {"Authorization": f"Bearer {TOKEN}"}
ANSWER = '{"id": "x", "message": {"role": "assistant", "content": []}}'


@pytest.fixture
async def guarded(upstream: TestServer, make_sidecar: MakeSidecar) -> Sidecar:
    """A sidecar with a control token, vLLM's version read."""
    sidecar = await make_sidecar(str(upstream.make_url("")), control_token=TOKEN)
    await eventually(lambda: sidecar.app[LIFECYCLE].version == "default")
    return sidecar


@pytest.mark.parametrize(
    ("path", "label"),
    [
        ("/v1/a_route_of_the_next_release", "other"),  # named by no row: the rule
        ("/cohere/v2/chat", "/cohere/v2/chat"),  # vLLM 0.32's, a row now
        ("/v2/rerank", "/v2/rerank"),
    ],
)
async def test_a_post_the_table_does_not_know_waits_out_a_weight_sync_and_is_stamped(
    guarded: Sidecar, fake: FakeVLLM, path: str, label: str
) -> None:
    # Guards: routes.rule making an unnamed path a data route, and the rows for vLLM's
    # generation routes: they reached vLLM during the sync and came back without a version.
    fake.script(f"POST {path}", respond(200, ANSWER))
    await control(guarded, "/pause?mode=keep", headers=BEARER)
    await control(guarded, "/start_weight_update", headers=BEARER)
    held = asyncio.create_task(guarded.client.post(path, json={"model": "tiny-model"}))
    await eventually(lambda: guarded.app[LIFECYCLE].held == 1, "the request is held")
    assert fake.forwarded(path) == 0
    await control(guarded, "/finish_weight_update", json={"weight_version": "v9"}, headers=BEARER)
    await control(guarded, "/resume", headers=BEARER)
    resp = await asyncio.wait_for(held, 10)
    assert (resp.status, await resp.text()) == (200, ANSWER)
    assert resp.headers["X-Weight-Version"] == "v9"
    assert fake.forwarded(path) == 1
    # An unnamed path keeps the bounded label: a client cannot mint label values.
    assert guarded.metric(FAMILY, phase="weight_sync", route=label, outcome="held") == 1


async def test_a_read_the_table_does_not_know_passes_a_weight_sync(
    guarded: Sidecar, fake: FakeVLLM
) -> None:
    fake.script("GET /v1/a_read_of_the_next_release", respond(200, "{}"))
    await control(guarded, "/start_weight_update", headers=BEARER)
    resp = await asyncio.wait_for(guarded.client.get("/v1/a_read_of_the_next_release"), 10)
    assert resp.status == 200
    assert "X-Weight-Version" not in resp.headers


@pytest.mark.parametrize(
    ("method", "path"),
    [
        ("POST", "/inference/v1/abort_requests"),
        ("POST", "/start_profile"),
        ("POST", "/stop_profile"),
        ("POST", "/fault_tolerance/apply"),
        ("POST", "/adapters"),
        ("DELETE", "/adapters/sql-lora"),
    ],
)
async def test_the_routes_vllm_keeps_for_operators_need_the_token(
    guarded: Sidecar, fake: FakeVLLM, method: str, path: str
) -> None:
    # Guards: their CONTROL rows. vLLM answered 200 and aborted every request it ran.
    fake.script(f"{method} {path}", respond(200, "{}"))
    resp = await guarded.client.request(method, path, json={"request_ids": []})
    await assert_envelope(resp, 401, "unauthorized")
    assert fake.forwarded(path) == 0
    resp = await guarded.client.request(method, path, json={"request_ids": []}, headers=BEARER)
    assert resp.status == 200
    assert fake.forwarded(path) == 1
