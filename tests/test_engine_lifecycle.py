"""The engine lifecycle through the sidecar, against the fake vLLM's dev-mode routes."""

from __future__ import annotations

import asyncio
import json
import logging

import aiohttp
import openai
import pytest
from aiohttp.test_utils import TestServer

from proxy.engine.lifecycle import LIFECYCLE
from tests.fake_vllm import FakeVLLM, hang, raw, respond, sse_chunk, sse_then_drop, start_sse
from tests.sidecar import COMPLETION, MakeSidecar, Sidecar, control
from tests.support import eventually

STREAM = {**COMPLETION, "stream": True}
FAMILY = "vllm_sidecar_phase_requests_total"


def phase_of(sidecar: Sidecar) -> str:
    return sidecar.app[LIFECYCLE].phase


def gauge(sidecar: Sidecar) -> dict[str, float]:
    names = ("serving", "paused", "sleeping", "weight_sync")
    return {p: sidecar.metric("vllm_sidecar_engine_phase", phase=p) for p in names}


@pytest.fixture
async def lifecycle(upstream: TestServer, make_sidecar: MakeSidecar) -> Sidecar:
    sidecar = await make_sidecar(str(upstream.make_url("")), phase_hold_timeout=10)
    await eventually(lambda: sidecar.app[LIFECYCLE].version == "default")
    return sidecar


@pytest.mark.parametrize("mode", ["abort", "wait", "keep"])
async def test_a_request_during_a_pause_is_held_and_completes_after_resume(
    lifecycle: Sidecar, fake: FakeVLLM, mode: str
) -> None:
    assert (await control(lifecycle, f"/pause?mode={mode}")).status == 200
    assert phase_of(lifecycle) == "paused"
    assert gauge(lifecycle) == {"serving": 0, "paused": 1, "sleeping": 0, "weight_sync": 0}
    held = asyncio.create_task(lifecycle.client.post("/v1/completions", json=COMPLETION))
    await eventually(lambda: lifecycle.app[LIFECYCLE].held == 1)
    assert fake.forwarded() == 0  # held by the sidecar, not queued in vLLM
    assert lifecycle.metric("vllm_sidecar_held_requests") == 1
    assert (await control(lifecycle, "/resume")).status == 200
    resp = await asyncio.wait_for(held, 10)
    assert resp.status == 200
    assert resp.headers["X-Weight-Version"] == "default"
    assert (await resp.json())["choices"][0]["finish_reason"] == "length"
    assert phase_of(lifecycle) == "serving"
    labels = {"phase": "paused", "route": "/v1/completions"}
    assert lifecycle.metric(FAMILY, **labels, outcome="held") == 1
    assert lifecycle.metric(FAMILY, **labels, outcome="refused") == 0
    assert lifecycle.metric("vllm_sidecar_engine_phase_duration_seconds_count", phase="paused") == 1


async def test_past_the_deadline_a_held_request_gets_the_503_envelope(
    upstream: TestServer, make_sidecar: MakeSidecar, fake: FakeVLLM
) -> None:
    sidecar = await make_sidecar(str(upstream.make_url("")), phase_hold_timeout=0.3)
    await control(sidecar, "/sleep?level=1")
    resp = await asyncio.wait_for(sidecar.client.post("/v1/completions", json=STREAM), 10)
    assert resp.status == 503
    assert resp.headers["X-Sidecar-Error"] == "engine_sleeping"
    assert int(resp.headers["Retry-After"]) >= 1
    error = (await resp.json())["error"]
    assert (error["reason"], error["code"], error["retryable"]) == ("engine_sleeping", 503, True)
    assert error["source"] == "sidecar"
    assert "--phase-hold-timeout" in error["message"]
    assert fake.forwarded() == 0
    labels = {"phase": "sleeping", "route": "/v1/completions"}
    assert sidecar.metric(FAMILY, **labels, outcome="refused") == 1
    failures = {"route": "/v1/completions", "reason": "engine_sleeping", "status": "503"}
    assert sidecar.metric("vllm_sidecar_failures_total", source="sidecar", **failures) == 1


async def test_hold_timeout_zero_refuses_at_once_and_the_queue_is_bounded(
    upstream: TestServer, make_sidecar: MakeSidecar, fake: FakeVLLM
) -> None:
    url = str(upstream.make_url(""))
    refusing = await make_sidecar(url, phase_hold_timeout=0)
    await control(refusing, "/pause")
    resp = await refusing.client.post("/v1/completions", json=COMPLETION)
    assert (resp.status, resp.headers["X-Sidecar-Error"]) == (503, "engine_paused")
    assert "--phase-hold-timeout is 0" in (await resp.json())["error"]["message"]

    bounded = await make_sidecar(url, phase_hold_timeout=10, phase_hold_queue=1)
    first = asyncio.create_task(bounded.client.post("/v1/completions", json=COMPLETION))
    await eventually(lambda: bounded.app[LIFECYCLE].held == 1)
    resp = await bounded.client.post("/v1/chat/completions", json=COMPLETION)
    assert resp.status == 503
    assert "--phase-hold-queue" in (await resp.json())["error"]["message"]
    await control(bounded, "/resume")
    assert (await asyncio.wait_for(first, 10)).status == 200
    assert fake.forwarded("/v1/chat/completions") == 0


async def test_reads_and_tokenize_pass_a_pause(lifecycle: Sidecar, fake: FakeVLLM) -> None:
    await control(lifecycle, "/pause")
    for method, path in (("GET", "/is_paused"), ("GET", "/v1/models"), ("GET", "/health")):
        assert (await lifecycle.client.request(method, path)).status == 200
    resp = await lifecycle.client.post("/tokenize", json={"model": "tiny-model", "prompt": "ab"})
    assert resp.status == 200


async def test_an_aborted_stream_ends_as_vllm_sent_it_and_is_counted(
    lifecycle: Sidecar, fake: FakeVLLM
) -> None:
    fake.stream_events, fake.stream_delay = 50, 0.02
    async with lifecycle.client.post("/v1/completions", json=STREAM) as resp:
        await resp.content.readuntil(b"\n\n")
        pause = asyncio.create_task(control(lifecycle, "/pause?mode=abort"))
        events = [e for e in (await resp.text()).split("\n\n") if e]
    assert (await pause).status == 200
    assert events[-1] == "data: [DONE]"
    last = json.loads(events[-2].removeprefix("data: "))
    assert last["choices"][0]["finish_reason"] == "abort"
    assert not any("error" in e or "weight_version" in e for e in events)
    labels = {"phase": "paused", "route": "/v1/completions", "outcome": "aborted"}
    assert lifecycle.metric(FAMILY, **labels) == 1


async def test_an_aborted_stream_is_counted_when_the_client_leaves_at_done(
    lifecycle: Sidecar, fake: FakeVLLM
) -> None:
    # A client (the openai SDK) stops reading at `[DONE]` and closes; the abort it carried is
    # still counted. The scripted vLLM keeps its connection open after `[DONE]`, so the
    # sidecar's handler is cancelled while it waits for the end of the upstream body.
    release, closed = asyncio.Event(), asyncio.Event()

    async def aborted_then_open(request: aiohttp.web.Request) -> aiohttp.web.StreamResponse:
        resp = await start_sse(request)
        await resp.write(sse_chunk("tiny-model", 0))
        await release.wait()
        await resp.write(sse_chunk("tiny-model", 1, finish="abort") + b"data: [DONE]\n\n")
        try:
            await asyncio.sleep(3600)
        finally:
            closed.set()
        return resp

    fake.script("POST /v1/completions", aborted_then_open)
    async with lifecycle.client.post("/v1/completions", json=STREAM) as resp:
        await resp.content.readuntil(b"\n\n")
        assert (await control(lifecycle, "/pause?mode=abort")).status == 200
        release.set()
        await resp.content.readuntil(b"data: [DONE]\n\n")
        resp.close()
    await asyncio.wait_for(closed.wait(), 10)  # the sidecar let go of the upstream request
    labels = {"phase": "paused", "route": "/v1/completions", "outcome": "aborted"}
    await eventually(lambda: lifecycle.metric(FAMILY, **labels) == 1, "the abort counted")


async def test_an_aborted_completion_is_counted(lifecycle: Sidecar, fake: FakeVLLM) -> None:
    fake.stream_events, fake.stream_delay = 50, 0.02
    request = asyncio.create_task(lifecycle.client.post("/v1/completions", json=COMPLETION))
    await eventually(lambda: fake.forwarded() == 1)
    await control(lifecycle, "/sleep?level=1&mode=abort")
    resp = await asyncio.wait_for(request, 10)
    assert (await resp.json())["choices"][0]["finish_reason"] == "abort"
    labels = {"phase": "sleeping", "route": "/v1/completions", "outcome": "aborted"}
    assert lifecycle.metric(FAMILY, **labels) == 1


async def test_a_weight_sync_forwards_nothing_and_changes_the_version(
    lifecycle: Sidecar, fake: FakeVLLM
) -> None:
    await control(lifecycle, "/pause")
    await control(lifecycle, "/start_weight_update")
    assert phase_of(lifecycle) == "weight_sync"
    held = asyncio.create_task(lifecycle.client.post("/v1/completions", json=COMPLETION))
    await eventually(lambda: lifecycle.app[LIFECYCLE].held == 1)
    await control(lifecycle, "/update_weights", json={"update_info": {}})
    await control(lifecycle, "/finish_weight_update", json={"weight_version": "step-7"})
    assert phase_of(lifecycle) == "paused"
    assert lifecycle.app[LIFECYCLE].version == "step-7"  # read back before the answer went out
    assert fake.forwarded() == 0
    await control(lifecycle, "/resume")
    resp = await asyncio.wait_for(held, 10)
    assert (resp.status, resp.headers["X-Weight-Version"]) == (200, "step-7")
    assert lifecycle.metric("vllm_sidecar_weight_updates_total") == 1
    assert lifecycle.metric("vllm_sidecar_weight_version_info", version="step-7") == 1
    assert (
        lifecycle.registry.get_sample_value(
            "vllm_sidecar_weight_version_info", {"version": "default"}
        )
        is None
    )  # only the current version is a series
    labels = {"phase": "weight_sync", "route": "/v1/completions", "outcome": "held"}
    assert lifecycle.metric(FAMILY, **labels) == 1
    async with lifecycle.admin.get("/engine") as resp:
        engine = await resp.json()
    assert engine["phase"] == "serving"
    assert (engine["weight_version"], engine["weight_updates"]) == ("step-7", 1)
    assert engine["seconds"] >= 0
    assert engine["since"] > 1.7e9


async def test_requests_an_unpaused_update_held_are_released_with_the_new_version(
    lifecycle: Sidecar, fake: FakeVLLM
) -> None:
    await control(lifecycle, "/start_weight_update")
    held = asyncio.create_task(lifecycle.client.post("/v1/completions", json=COMPLETION))
    await eventually(lambda: lifecycle.app[LIFECYCLE].held == 1)
    await control(lifecycle, "/finish_weight_update", json={"weight_version": "step-8"})
    resp = await asyncio.wait_for(held, 10)
    # Released when the sync ended: they run on the new weights, and say so.
    assert (resp.status, resp.headers["X-Weight-Version"]) == (200, "step-8")
    assert "X-Weight-Version-End" not in resp.headers


async def test_an_update_under_traffic_is_counted_and_logged(
    lifecycle: Sidecar, fake: FakeVLLM, caplog: pytest.LogCaptureFixture
) -> None:
    fake.stream_events, fake.stream_delay = 20, 0.02
    running = asyncio.create_task(lifecycle.client.post("/v1/completions", json=COMPLETION))
    await eventually(lambda: fake.forwarded() == 1)
    with caplog.at_level(logging.WARNING, logger="proxy.engine"):
        await control(lifecycle, "/start_weight_update")
    assert lifecycle.metric("vllm_sidecar_weight_update_running_requests_total") == 1
    assert "1 requests running" in caplog.text
    await control(lifecycle, "/finish_weight_update", json={})
    assert (await asyncio.wait_for(running, 10)).status == 200


async def test_a_failed_control_call_reverts_the_phase(
    lifecycle: Sidecar, fake: FakeVLLM, upstream: TestServer
) -> None:
    fake.script("POST /pause", respond(500, '{"error": "Failed to pause generation: boom"}'))
    assert (await control(lifecycle, "/pause")).status == 500
    assert phase_of(lifecycle) == "serving"
    fake.script("POST /sleep", respond(400, "{}"))
    await control(lifecycle, "/sleep?level=3")
    assert phase_of(lifecycle) == "serving"
    fake.script("POST /start_weight_update", raw(b""), times=2)  # the connection drops: 502
    assert (await control(lifecycle, "/start_weight_update")).status == 502
    assert phase_of(lifecycle) == "serving"
    assert gauge(lifecycle)["serving"] == 1


async def test_a_control_call_whose_caller_left_is_settled_by_vllms_flags(
    lifecycle: Sidecar, fake: FakeVLLM, caplog: pytest.LogCaptureFixture
) -> None:
    fake.script("POST /pause", hang())  # vLLM never answers, and never pauses
    call = asyncio.create_task(lifecycle.client.post("/pause"))
    await eventually(lambda: fake.forwarded("/pause") == 1)
    assert phase_of(lifecycle) == "paused"
    with caplog.at_level(logging.WARNING, logger="proxy.engine"):
        call.cancel()
        await eventually(lambda: "the caller left" in caplog.text)
    await eventually(lambda: phase_of(lifecycle) == "serving")  # /is_paused says false


async def test_a_partial_wake_up_keeps_the_engine_asleep(lifecycle: Sidecar) -> None:
    await control(lifecycle, "/sleep?level=1")
    await control(lifecycle, "/wake_up?tags=weights")
    assert phase_of(lifecycle) == "sleeping"
    await control(lifecycle, "/wake_up?tags=kv_cache")
    assert phase_of(lifecycle) == "serving"


async def test_a_pause_made_around_the_sidecar_is_noticed(
    lifecycle: Sidecar, fake: FakeVLLM
) -> None:
    fake.engine.paused = True  # e.g. the trainer called vLLM's port directly
    await eventually(lambda: phase_of(lifecycle) == "paused")
    fake.engine.paused = False
    fake.engine.weight_version = "v9"
    await eventually(lambda: phase_of(lifecycle) == "serving")
    await eventually(lambda: lifecycle.app[LIFECYCLE].version == "v9")


async def test_a_stream_straddling_a_weight_update_says_so_after_done(
    lifecycle: Sidecar, fake: FakeVLLM
) -> None:
    fake.stream_events, fake.stream_delay = 6, 0.05
    async with lifecycle.client.post("/v1/completions", json=STREAM) as resp:
        assert resp.headers["X-Weight-Version"] == "default"
        await resp.content.readuntil(b"\n\n")
        await control(lifecycle, "/pause?mode=keep")  # frozen, continues after the resume
        await control(lifecycle, "/start_weight_update")
        await control(lifecycle, "/finish_weight_update", json={"weight_version": "v2"})
        await control(lifecycle, "/resume")
        events = [e for e in (await resp.text()).split("\n\n") if e]
    assert events[-2] == "data: [DONE]"
    assert events[-1] == 'event: weight_version\ndata: {"weight_version":"v2","previous":"default"}'


async def test_the_openai_sdk_reads_a_straddling_stream_unharmed(
    lifecycle: Sidecar, fake: FakeVLLM
) -> None:
    fake.stream_events, fake.stream_delay = 6, 0.05
    client = openai.AsyncOpenAI(base_url=str(lifecycle.client.make_url("/v1")), api_key="x")
    stream = await client.completions.create(model="tiny-model", prompt="x", stream=True)
    chunks = [await anext(stream)]
    await control(lifecycle, "/pause?mode=keep")
    await control(lifecycle, "/update_weight_version", json={"new_version": "v3"})
    await control(lifecycle, "/resume")
    chunks += [chunk async for chunk in stream]
    await client.close()
    assert [c.choices[0].text for c in chunks] == [f" t{i}" for i in range(6)]
    assert lifecycle.app[LIFECYCLE].version == "v3"


async def test_control_token_guards_the_control_plane_only(
    upstream: TestServer, make_sidecar: MakeSidecar, fake: FakeVLLM
) -> None:
    sidecar = await make_sidecar(str(upstream.make_url("")), control_token="s3cret")
    for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": "Basic s3cret"}):
        resp = await sidecar.client.post("/pause", headers=headers)
        assert resp.status == 401
        assert resp.headers["X-Sidecar-Error"] == "unauthorized"
        assert resp.headers["WWW-Authenticate"].startswith("Bearer")
        error = (await resp.json())["error"]
        assert (error["reason"], error["code"], error["retryable"]) == ("unauthorized", 401, False)
    assert fake.forwarded("/pause") == 0
    assert phase_of(sidecar) == "serving"
    labels = {"route": "/pause", "source": "sidecar", "reason": "unauthorized", "status": "401"}
    assert sidecar.metric("vllm_sidecar_failures_total", **labels) == 3
    # Data plane and reads keep vLLM's own rules: no token needed.
    assert (await sidecar.client.get("/is_paused")).status == 200
    assert (await sidecar.client.post("/v1/completions", json=COMPLETION)).status == 200
    good = await control(sidecar, "/pause", headers={"Authorization": "Bearer s3cret"})
    assert (good.status, phase_of(sidecar)) == (200, "paused")
    assert fake.forwarded("/pause") == 1


async def test_a_stream_a_phase_stalls_ends_with_the_phases_error_event(
    upstream: TestServer, make_sidecar: MakeSidecar, fake: FakeVLLM
) -> None:
    sidecar = await make_sidecar(str(upstream.make_url("")), phase_hold_timeout=0.2)
    fake.stream_events, fake.stream_delay = 6, 0.05
    async with sidecar.client.post("/v1/completions", json=STREAM) as resp:
        await resp.content.readuntil(b"\n\n")
        await control(sidecar, "/pause?mode=keep")  # frozen inside vLLM, its headers sent
        events = [e for e in (await asyncio.wait_for(resp.text(), 10)).split("\n\n") if e]
    assert events[-1] == "data: [DONE]"
    error = json.loads(events[-2].removeprefix("data: "))["error"]
    assert (error["reason"], error["code"], error["retryable"]) == ("engine_paused", 503, True)
    assert "the stream was ended" in error["message"]
    assert all('"choices"' in e for e in events[:-2])
    await eventually(lambda: fake.cancelled == ["/v1/completions"])  # vLLM drops it
    labels = {"phase": "paused", "route": "/v1/completions", "outcome": "cut"}
    assert sidecar.metric(FAMILY, **labels) == 1
    failures = {"route": "/v1/completions", "reason": "engine_paused", "status": "503"}
    assert sidecar.metric("vllm_sidecar_failures_total", source="sidecar", **failures) == 1


async def test_a_held_client_that_hangs_up_leaves_the_hold(
    lifecycle: Sidecar, fake: FakeVLLM
) -> None:
    await control(lifecycle, "/pause")
    held = asyncio.create_task(lifecycle.client.post("/v1/completions", json=COMPLETION))
    await eventually(lambda: lifecycle.app[LIFECYCLE].held == 1)
    held.cancel()
    await eventually(lambda: lifecycle.app[LIFECYCLE].held == 0)
    await eventually(
        lambda: lifecycle.metric("vllm_sidecar_client_disconnects_total", route="/v1/completions")
    )
    assert lifecycle.metric("vllm_sidecar_held_requests") == 0
    await control(lifecycle, "/resume")
    assert fake.forwarded() == 0


async def test_a_restarted_vllm_is_not_left_in_a_weight_sync(
    lifecycle: Sidecar, fake: FakeVLLM
) -> None:
    await control(lifecycle, "/start_weight_update")
    probes = fake.forwarded("/is_paused")
    # Probes that reach vLLM cannot end a sync: vLLM has no flag for one.
    await eventually(lambda: fake.forwarded("/is_paused") >= probes + 2)
    assert phase_of(lifecycle) == "weight_sync"
    # vLLM is unreachable for a probe (it restarts), then answers serving again.
    fake.script("GET /is_paused", raw(b""), times=2)
    await eventually(lambda: phase_of(lifecycle) == "serving")
    assert (await lifecycle.client.post("/v1/completions", json=COMPLETION)).status == 200


async def test_without_dev_mode_the_state_routes_are_asked_now_and_then(
    upstream: TestServer, make_sidecar: MakeSidecar, fake: FakeVLLM
) -> None:
    for route in ("GET /is_paused", "GET /is_sleeping", "GET /weight_info"):
        fake.script(route, fake.not_found, times=100)  # vLLM without VLLM_SERVER_DEV_MODE
    sidecar = await make_sidecar(str(upstream.make_url("")), discovery_interval=3600)
    checks = fake.forwarded("/health")
    await eventually(lambda: fake.forwarded("/health") >= checks + 5)
    assert fake.forwarded("/is_paused") == 1
    assert sidecar.app[LIFECYCLE].version is None
    resp = await sidecar.client.post("/v1/completions", json=COMPLETION)
    assert resp.status == 200
    assert "X-Weight-Version" not in resp.headers


async def test_an_answer_that_straddles_a_version_change_names_both(
    lifecycle: Sidecar, fake: FakeVLLM
) -> None:
    fake.stream_events, fake.stream_delay = 6, 0.05
    request = asyncio.create_task(lifecycle.client.post("/v1/completions", json=COMPLETION))
    await eventually(lambda: fake.forwarded() == 1)
    await control(lifecycle, "/pause?mode=keep")
    await control(lifecycle, "/update_weight_version", json={"new_version": "v5"})
    await control(lifecycle, "/resume")
    resp = await asyncio.wait_for(request, 10)
    assert resp.status == 200
    assert (resp.headers["X-Weight-Version"], resp.headers["X-Weight-Version-End"]) == (
        "default",
        "v5",
    )


@pytest.mark.parametrize("api_key", ["vllm-key", None])
async def test_the_control_token_is_not_sent_to_vllm_as_its_api_key(
    upstream: TestServer, make_sidecar: MakeSidecar, fake: FakeVLLM, api_key: str | None
) -> None:
    """With vLLM's `--api-key`, `--upstream-api-key` says it: a control call checked against the
    sidecar's token reaches vLLM with vLLM's key, or with none; the data plane is the client's."""
    sidecar = await make_sidecar(
        str(upstream.make_url("")), control_token="s3cret", upstream_api_key=api_key
    )
    fake.script("POST /v1/load_lora_adapter", respond(200, "Success: LoRA adapter loaded."))
    bearer = {"Authorization": "Bearer s3cret"}
    ok = await control(sidecar, "/v1/load_lora_adapter", headers=bearer)

    assert ok.status == 200
    sent = fake.last("/v1/load_lora_adapter").headers.get("Authorization")
    assert sent == (f"Bearer {api_key}" if api_key else None)
    client = {"Authorization": "Bearer the-clients-own"}
    await sidecar.client.post("/v1/completions", json=COMPLETION, headers=client)
    assert fake.last("/v1/completions").headers["Authorization"] == "Bearer the-clients-own"


async def test_a_straddling_stream_that_breaks_ends_with_its_error_and_nothing_after(
    lifecycle: Sidecar, fake: FakeVLLM, caplog: pytest.LogCaptureFixture
) -> None:
    """The version changed while it ran, then vLLM dropped it: the error event and [DONE] end
    it. The version-change event was written after the stream had ended (write_eof): an
    unhandled exception in the handler."""
    fake.script("POST /v1/completions", sse_then_drop(events=6, delay=0.1))
    async with lifecycle.client.post("/v1/completions", json=STREAM) as resp:
        await resp.content.readuntil(b"\n\n")
        await control(lifecycle, "/pause?mode=keep")
        await control(lifecycle, "/start_weight_update")
        await control(lifecycle, "/finish_weight_update", json={"weight_version": "v2"})
        await control(lifecycle, "/resume")
        events = [e for e in (await resp.text()).split("\n\n") if e]
    assert events[-1] == "data: [DONE]"
    assert json.loads(events[-2].removeprefix("data: "))["error"]["reason"] == (
        "upstream_disconnected"
    )
    assert "write_eof" not in caplog.text
