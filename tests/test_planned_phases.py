"""Planned phases waited out: holds with no deadline unless asked for, an engine that dies or is
only slow, control calls cut short, versions named for the trainer, vLLM 0.33's paused
rejection, and /health and readiness while the engine is busy."""

from __future__ import annotations

import asyncio
import logging
import re
import time
from typing import Any

import aiohttp
import pytest
from aiohttp.test_utils import TestServer

from proxy.engine.lifecycle import LIFECYCLE
from proxy.upstream.discovery import DISCOVERY
from tests.fake_vllm import FakeVLLM, dumps, error_body, hang, paused_rejection, raw, reset, respond
from tests.sidecar import COMPLETION, MakeSidecar, Sidecar, assert_envelope, control
from tests.sse import read_events
from tests.support import eventually

CHAT = {"model": "tiny-model", "messages": [{"role": "user", "content": "x"}]}
FAMILY = "vllm_sidecar_phase_requests_total"
HOLD = "X-Sidecar-Hold-Timeout"
SLOW_HEALTH = "/health is slow while the engine is busy"


def outcome(
    sidecar: Sidecar, what: str, phase: str = "paused", route: str = "/v1/completions"
) -> float:
    return sidecar.metric(FAMILY, phase=phase, route=route, outcome=what)


async def complete(sidecar: Sidecar, **kwargs: Any) -> aiohttp.ClientResponse:
    return await asyncio.wait_for(
        sidecar.client.post("/v1/completions", json=COMPLETION, **kwargs), 10
    )


async def hold(sidecar: Sidecar, **kwargs: Any) -> asyncio.Task[aiohttp.ClientResponse]:
    """A completion sent during a phase, once the sidecar holds it."""
    task = asyncio.create_task(sidecar.client.post("/v1/completions", json=COMPLETION, **kwargs))
    await eventually(lambda: sidecar.app[LIFECYCLE].held == 1, "the request is held")
    return task


async def readyz(sidecar: Sidecar) -> int:
    async with sidecar.admin.get("/readyz") as resp:
        return resp.status


@pytest.fixture
async def defaults(upstream: TestServer, make_sidecar: MakeSidecar) -> Sidecar:
    """The sidecar with its default settings (no hold deadline), vLLM's version read."""
    sidecar = await make_sidecar(str(upstream.make_url("")))
    await eventually(lambda: sidecar.app[LIFECYCLE].version == "default")
    return sidecar


async def test_by_default_a_hold_lasts_as_long_as_the_pause(
    defaults: Sidecar, fake: FakeVLLM
) -> None:
    # Guards: --phase-hold-timeout off by default (it was 30 s, and a hold ended in a 503).
    assert defaults.app[LIFECYCLE].hold_timeout is None
    await control(defaults, "/pause?mode=keep")
    held = await hold(defaults)
    done, _ = await asyncio.wait({held}, timeout=2)  # past any short deadline: still waiting
    assert not done
    assert (defaults.app[LIFECYCLE].held, fake.forwarded()) == (1, 0)
    await control(defaults, "/resume")
    resp = await asyncio.wait_for(held, 10)
    assert resp.status == 200
    assert (outcome(defaults, "held"), outcome(defaults, "refused")) == (1, 0)


async def test_a_client_asks_for_its_own_hold_deadline(defaults: Sidecar, fake: FakeVLLM) -> None:
    """X-Sidecar-Hold-Timeout: a 503 with Retry-After once it passes; 0 refuses at once."""
    # Guards: holds.asked_deadline feeding Lifecycle.admit's deadline.
    await control(defaults, "/pause")
    started = time.monotonic()
    resp = await complete(defaults, headers={HOLD: "0.3"})
    assert time.monotonic() - started >= 0.3
    error = await assert_envelope(resp, 503, "engine_paused")
    assert f"held 0.3s ({HOLD})" in error["message"]
    assert (error["retryable"], int(resp.headers["Retry-After"]) >= 1) == (True, True)
    resp = await complete(defaults, headers={HOLD: "0"})
    error = await assert_envelope(resp, 503, "engine_paused")
    assert f"{HOLD} is 0" in error["message"]
    assert "Retry-After" in resp.headers
    assert (outcome(defaults, "held"), outcome(defaults, "refused")) == (1, 2)
    assert fake.forwarded() == 0


@pytest.mark.parametrize("value", ["abc", "-1", "nan", "inf"])
async def test_a_bad_hold_deadline_is_the_clients_error(
    defaults: Sidecar, fake: FakeVLLM, value: str
) -> None:
    # Guards: holds.asked_deadline's check (a bad value must not mean "hold forever").
    await control(defaults, "/pause")
    resp = await complete(defaults, headers={HOLD: value})
    error = await assert_envelope(resp, 400, "invalid_request")
    assert HOLD in error["message"]
    assert (outcome(defaults, "held"), fake.forwarded()) == (0, 0)


@pytest.mark.parametrize(
    ("pod", "asked", "cited"), [(10, "0.2", HOLD), (0.2, "30", "--phase-hold-timeout")]
)
async def test_the_shorter_of_two_hold_deadlines_applies(
    upstream: TestServer, make_sidecar: MakeSidecar, pod: float, asked: str, cited: str
) -> None:
    # Guards: EngineState.deadline choosing the shorter deadline and citing it.
    sidecar = await make_sidecar(str(upstream.make_url("")), phase_hold_timeout=pod)
    await control(sidecar, "/pause")
    resp = await asyncio.wait_for(complete(sidecar, headers={HOLD: asked}), 5)
    error = await assert_envelope(resp, 503, "engine_paused")
    # What was left of it when the hold began: the request's own deadline counts from its head.
    held = re.search(rf"held ([0-9.]+)s \({re.escape(cited)}\)", error["message"])
    assert held is not None, error["message"]
    assert 0.1 < float(held.group(1)) <= 0.2


@pytest.mark.parametrize("gone", ["closed", "reset"])
async def test_an_engine_that_dies_ends_the_holds_at_once(
    defaults: Sidecar, fake: FakeVLLM, gone: str
) -> None:
    # Guards: reconcile_once marking vLLM down on a refused probe, and EngineState.check_up.
    lifecycle = defaults.app[LIFECYCLE]
    await control(defaults, "/pause")
    held = await hold(defaults)
    drop = raw(b"") if gone == "closed" else reset()  # each probe's connection drops
    fake.script("GET /is_paused", drop, times=1000)
    error = await assert_envelope(await asyncio.wait_for(held, 10), 502, "upstream_unreachable")
    assert "held by the sidecar and not sent to it" in error["message"]
    await assert_envelope(await complete(defaults), 502, "upstream_unreachable")  # not held
    assert fake.forwarded() == 0
    async with defaults.admin.get("/engine") as resp:
        engine = await resp.json()
    assert "/is_paused" in engine["engine_down"]
    assert (engine["phase"], engine["held_requests"]) == ("paused", 0)
    assert outcome(defaults, "engine_down") == 2
    fake.scripts["GET /is_paused"].clear()  # vLLM answers again
    await eventually(lambda: lifecycle.state.down is None, "vLLM is seen up again")


async def test_a_probe_that_times_out_does_not_end_a_weight_sync(
    defaults: Sidecar, fake: FakeVLLM
) -> None:
    # Guards: reconcile._loop not taking a timed-out probe (SLOW) for a restart.
    lifecycle = defaults.app[LIFECYCLE]
    await control(defaults, "/start_weight_update")
    held = await hold(defaults)
    fake.script("GET /is_paused", hang(), times=2)  # past the probe's 1 s: vLLM busy, not gone
    await eventually(lambda: fake.cancelled.count("/is_paused") == 2, "two probes timed out")
    probes = fake.forwarded("/is_paused")
    await eventually(lambda: fake.forwarded("/is_paused") >= probes + 3, "probes answered")
    assert (lifecycle.phase, lifecycle.state.down, lifecycle.held) == ("weight_sync", None, 1)
    assert not held.done()
    assert fake.forwarded() == 0
    await control(defaults, "/finish_weight_update", json={"weight_version": "step-1"})
    resp = await asyncio.wait_for(held, 10)
    assert (resp.status, resp.headers["X-Weight-Version"]) == (200, "step-1")


async def test_a_control_call_cut_off_in_its_body_never_enters_its_phase(
    defaults: Sidecar, fake: FakeVLLM
) -> None:
    # Guards: forward._respond entering a control call's phase only once its body is read.
    lifecycle, port = defaults.app[LIFECYCLE], defaults.client.port
    assert port is not None
    _, writer = await asyncio.open_connection("127.0.0.1", port)
    head = b"POST /start_weight_update HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n"
    writer.write(head + b'{"a": 1234')
    await writer.drain()
    in_flight = "vllm_sidecar_in_flight_requests"
    route = "/start_weight_update"
    await eventually(lambda: defaults.metric(in_flight, route=route) == 1, "the body is awaited")
    awaiting = (lifecycle.phase, lifecycle.state.calls)
    writer.close()  # before it reached vLLM
    await writer.wait_closed()
    await eventually(lambda: defaults.metric(in_flight, route=route) == 0, "the call is over")
    assert awaiting == ("serving", 0)
    assert (lifecycle.phase, lifecycle.state.calls) == ("serving", 0)
    assert fake.forwarded(route) == 0
    assert (await complete(defaults)).status == 200


async def test_a_finished_update_that_names_no_version_gets_the_next(
    defaults: Sidecar, fake: FakeVLLM
) -> None:
    # Guards: gate.named_version, and stamp's X-Weight-Version on the finish's answer.
    for body, version in ((None, "default+1"), ({}, "default+2")):
        await control(defaults, "/start_weight_update")
        resp = await control(defaults, "/finish_weight_update", json=body)
        assert (resp.status, resp.headers["X-Weight-Version"]) == (200, version)
        sent = fake.last("/finish_weight_update")
        assert sent.json() == {"weight_version": version}
        assert sent.headers["Content-Type"] == "application/json"
        assert defaults.app[LIFECYCLE].version == version
        assert (await complete(defaults)).headers["X-Weight-Version"] == version
    own = b'{"weight_version": "step-9",  "note": "as sent"}'
    await control(defaults, "/start_weight_update")
    headers = {"Content-Type": "application/json"}
    resp = await control(defaults, "/finish_weight_update", data=own, headers=headers)
    assert resp.status == 200
    assert "X-Weight-Version" not in resp.headers
    assert fake.last("/finish_weight_update").body == own
    assert (await complete(defaults)).headers["X-Weight-Version"] == "step-9"


async def test_a_finish_vllm_refused_names_no_version(defaults: Sidecar, fake: FakeVLLM) -> None:
    """The version given to a finish that failed was never vLLM's: the answer must not say it."""
    # Guards: stamp naming the given version only on a finish vLLM accepted.
    await control(defaults, "/start_weight_update")
    fake.script("POST /finish_weight_update", respond(500, '{"error": "boom"}'))
    resp = await control(defaults, "/finish_weight_update")
    assert resp.status == 500
    assert defaults.app[LIFECYCLE].version == "default"
    assert "X-Weight-Version" not in resp.headers
    resp = await control(defaults, "/finish_weight_update")
    assert (resp.status, resp.headers["X-Weight-Version"]) == (200, "default+1")


@pytest.mark.parametrize("stream", [False, True], ids=["json", "sse"])
@pytest.mark.parametrize("path", ["/v1/completions", "/v1/chat/completions"])
async def test_vllm_033s_paused_rejection_is_held_and_sent_again(
    defaults: Sidecar, fake: FakeVLLM, path: str, stream: bool
) -> None:
    """A pause made around the sidecar: vLLM 0.33 rejects the request, which never ran."""
    # Guards: forward._peek with rejection.rejected_body/rejected_stream, and the resend loop.
    chat = path == "/v1/chat/completions"
    fake.script(f"POST {path}", paused_rejection(chat=chat, stream=stream), times=2)
    body = {**(CHAT if chat else COMPLETION), "stream": stream}
    resp = await asyncio.wait_for(defaults.client.post(path, json=body), 10)
    assert resp.status == 200
    if stream:
        events = await read_events(resp)
        assert events[-1] == "data: [DONE]"
        assert len(events) == 4
        assert all('"choices"' in e and "error" not in e for e in events[:-1])
    else:
        assert (await resp.json())["choices"][0]["finish_reason"] == "length"
    assert fake.forwarded(path) == 3
    assert outcome(defaults, "rejected", route=path) == 2


async def test_a_rejected_request_waits_as_held_not_as_running(
    defaults: Sidecar, fake: FakeVLLM
) -> None:
    """While it waits the pause out it is held: an update starting then finds nothing running."""
    # Guards: gate.held_again taking the request off `running` while it is held again.
    keepalive = respond(
        200,
        b": keep-alive\n\n"
        + b"data: "
        + dumps(
            error_body(
                "Generation is paused. Please retry after it resumes.",
                "ServiceUnavailableError",
                None,
                503,
            )
        )
        + b"\n\ndata: [DONE]\n\n",
        "text/event-stream",
    )
    fake.script("POST /v1/completions", keepalive, times=3)
    request = asyncio.create_task(
        defaults.client.post("/v1/completions", json={**COMPLETION, "stream": True})
    )
    lifecycle = defaults.app[LIFECYCLE]
    await eventually(lambda: outcome(defaults, "rejected") >= 1, "vLLM rejected it")
    await eventually(lambda: lifecycle.held == 1, "it is held again")
    assert lifecycle.running == 0
    resp = await asyncio.wait_for(request, 20)
    events = await read_events(resp)
    assert events[-1] == "data: [DONE]"
    assert all("error" not in e for e in events)
    assert fake.forwarded() == 4  # three rejections (one after keep-alive comments), then served
    assert (lifecycle.held, lifecycle.running) == (0, 0)


async def test_an_error_that_is_no_pause_is_relayed_and_not_sent_again(
    defaults: Sidecar, fake: FakeVLLM
) -> None:
    # Guards: rejection._is_rejection matching vLLM's paused words, not any 503.
    overloaded = error_body("The server is overloaded.", "ServiceUnavailableError", None, 503)
    fake.script("POST /v1/completions", respond(503, dumps(overloaded)))
    error = await assert_envelope(await complete(defaults), 503, "upstream_status")
    assert "overloaded" in str(error)
    oov = {**COMPLETION, "prompt": [[5000]], "stream": True}  # its first event is an error
    resp = await asyncio.wait_for(defaults.client.post("/v1/completions", json=oov), 10)
    events = await read_events(resp)
    assert "out of vocabulary" in events[0]
    assert fake.forwarded() == 2
    assert outcome(defaults, "rejected") == 0


async def test_a_slow_health_is_answered_from_the_sidecars_last_check(
    defaults: Sidecar, fake: FakeVLLM
) -> None:
    # Guards: forward._health answering within HEALTH_PROMPT while discovery found vLLM healthy.
    fake.script("GET /health", hang(), times=2)  # the sidecar's own check may take one
    resp = await asyncio.wait_for(defaults.client.get("/health"), 5)
    assert (resp.status, resp.headers["X-Sidecar-Health"]) == (200, "cached")
    assert defaults.app[DISCOVERY].healthy


async def test_a_slow_health_after_a_failed_check_is_a_timeout(
    defaults: Sidecar, fake: FakeVLLM
) -> None:
    # Guards: forward._health answering for vLLM only when its last check found it healthy.
    fake.healthy = False
    await eventually(lambda: not defaults.app[DISCOVERY].healthy, "the sidecar saw it unhealthy")
    fake.script("GET /health", hang(), times=2)
    resp = await asyncio.wait_for(defaults.client.get("/health"), 5)
    error = await assert_envelope(resp, 504, "upstream_timeout")
    assert "last health check failed" in error["message"]


async def test_a_slow_health_during_a_pause_keeps_the_sidecar_ready(
    upstream: TestServer,
    make_sidecar: MakeSidecar,
    fake: FakeVLLM,
    caplog: pytest.LogCaptureFixture,
) -> None:
    # Guards: Discovery.check_health's patience (Discovery.patient) in a planned phase only.
    sidecar = await make_sidecar(str(upstream.make_url("")), connect_timeout=1)  # checks: 5 s
    discovery = sidecar.app[DISCOVERY]
    await control(sidecar, "/pause")
    with caplog.at_level(logging.INFO, logger="proxy.upstream"):
        fake.script("GET /health", hang(), times=2)  # two checks in a row time out
        await eventually(lambda: caplog.text.count(SLOW_HEALTH) == 1, "a slow check", 20)
        assert (discovery.healthy, await readyz(sidecar)) == (True, 200)
        await eventually(lambda: caplog.text.count(SLOW_HEALTH) == 2, "another slow check", 20)
        assert (discovery.healthy, await readyz(sidecar)) == (True, 200)
        assert "upstream down" not in caplog.text
        await control(sidecar, "/resume")
        fake.script("GET /health", hang(), times=100)
        # Serving, a hung /health is an outage once SLOW_CHECKS checks in a row timed out.
        await eventually(lambda: "1 of 3 in a row" in caplog.text, "a first slow check", 20)
        assert (discovery.healthy, await readyz(sidecar)) == (True, 200)
        await eventually(lambda: "upstream down" in caplog.text, "unready once serving", 30)
    assert (discovery.healthy, await readyz(sidecar)) == (False, 503)
    assert caplog.text.count(SLOW_HEALTH) == 2
    assert "2 of 3 in a row" in caplog.text


async def test_a_long_pause_is_flagged_and_the_flag_ends_with_it(
    upstream: TestServer, make_sidecar: MakeSidecar, caplog: pytest.LogCaptureFixture
) -> None:
    # Guards: Lifecycle._watch_length and the engine_phase_long gauge.
    sidecar = await make_sidecar(str(upstream.make_url("")), phase_long_after=0.2)
    lifecycle = sidecar.app[LIFECYCLE]
    long = "vllm_sidecar_engine_phase_long"
    assert (lifecycle.describe()["long"], sidecar.metric(long, phase="serving")) == (False, 0)
    with caplog.at_level(logging.WARNING, logger="proxy.engine"):
        await control(sidecar, "/pause")
        await eventually(lambda: lifecycle.describe()["long"] is True, "the pause is long")
    assert sidecar.metric(long, phase="paused") == 1
    assert "--phase-long-after 0.2" in caplog.text
    await control(sidecar, "/resume")
    assert (lifecycle.describe()["long"], sidecar.metric(long, phase="serving")) == (False, 0)
    await asyncio.sleep(0.4)  # the scenario: serving past --phase-long-after is never long
    assert (lifecycle.describe()["long"], sidecar.metric(long, phase="serving")) == (False, 0)
