"""The drain, against the real `vllm-sidecar` process: what SIGTERM and the pod's preStop do."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys

import aiohttp
import pytest
from aiohttp.test_utils import TestServer

from tests.fake_vllm import FakeVLLM, hang, respond, slow, sse_forever
from tests.manifests import KUBERNETES, load_yaml
from tests.sidecar import COMPLETION, StartSidecar
from tests.sse import read_events
from tests.support import eventually, refuses_connections

DEPLOYMENT = KUBERNETES / "deployment.yaml"


async def test_keep_alive_connections_take_no_new_request_after_sigterm(
    upstream: TestServer, fake: FakeVLLM, start_sidecar: StartSidecar
) -> None:
    proc = await start_sidecar(str(upstream.make_url("")), "--shutdown-grace", "10")
    url = proc.url
    fake.script("POST /v1/completions", sse_forever(delay=0.1))  # keeps the drain going
    fake.script("POST /v1/chat/completions", slow(1.0, respond(200, b"{}")))
    host, port = url.removeprefix("http://").split(":")
    idle_reader, idle_writer = await asyncio.open_connection(host, int(port))
    async with aiohttp.ClientSession() as session:
        stream = await session.post(f"{url}/v1/completions", json={**COMPLETION, "stream": True})
        await stream.content.readuntil(b"\n\n")
        busy = asyncio.create_task(session.post(f"{url}/v1/chat/completions", json=COMPLETION))
        await eventually(lambda: fake.forwarded("/v1/chat/completions") == 1, "busy is upstream")
        proc.send_signal(signal.SIGTERM)
        # An idle kept-alive connection is closed at once, not at the end of the grace.
        assert await asyncio.wait_for(idle_reader.read(), 3) == b""
        # A busy one gets its answer, which closes it.
        resp = await asyncio.wait_for(busy, 10)
        assert resp.status == 200
        assert resp.headers["Connection"].lower() == "close"
        stream.close()
    idle_writer.close()
    assert await asyncio.to_thread(proc.wait, 10) == 0


async def test_sigterm_lets_in_flight_streams_finish(
    upstream: TestServer, fake: FakeVLLM, start_sidecar: StartSidecar
) -> None:
    proc = await start_sidecar(str(upstream.make_url("")), "--shutdown-grace", "10")
    url = proc.url
    fake.stream_events, fake.stream_delay = 10, 0.1
    async with aiohttp.ClientSession() as session:
        async with session.post(
            f"{url}/v1/completions", json={"model": "a/tiny-model", "prompt": "x", "stream": True}
        ) as resp:
            await resp.content.readuntil(b"\n\n")
            proc.send_signal(signal.SIGTERM)
            await eventually(lambda: refuses_connections(f"{url}/v1/models"), "listener closed")
            events = await read_events(resp)
    assert events[-1] == "data: [DONE]"
    assert len(events) == 10  # nine left after the first, plus [DONE]
    assert not any('"error"' in e for e in events)
    assert await asyncio.to_thread(proc.wait, 10) == 0


async def test_streams_past_the_grace_period_end_with_an_error_event(
    upstream: TestServer, fake: FakeVLLM, start_sidecar: StartSidecar
) -> None:
    proc = await start_sidecar(str(upstream.make_url("")), "--shutdown-grace", "0.5")
    url = proc.url
    fake.script("POST /v1/completions", sse_forever())
    async with aiohttp.ClientSession() as session:
        async with session.post(
            f"{url}/v1/completions", json={"model": "tiny-model", "prompt": "x", "stream": True}
        ) as resp:
            await resp.content.readuntil(b"\n\n")
            proc.send_signal(signal.SIGTERM)
            events = await read_events(resp)
    assert events[-1] == "data: [DONE]"
    error = json.loads(events[-2].removeprefix("data: "))["error"]
    assert (error["reason"], error["code"]) == ("shutting_down", 503)
    assert await asyncio.to_thread(proc.wait, 10) == 0
    assert fake.cancelled == ["/v1/completions"]


async def test_request_still_running_at_the_deadline_gets_the_503_envelope(
    upstream: TestServer, fake: FakeVLLM, start_sidecar: StartSidecar
) -> None:
    proc = await start_sidecar(str(upstream.make_url("")), "--shutdown-grace", "0.5")
    url = proc.url
    fake.script("POST /v1/completions", hang())
    async with aiohttp.ClientSession() as session:
        request = asyncio.create_task(session.post(f"{url}/v1/completions", json=COMPLETION))
        await eventually(lambda: fake.forwarded() == 1, "the request is upstream")
        proc.send_signal(signal.SIGTERM)
        resp = await asyncio.wait_for(request, 10)
        body = await resp.json()
    assert resp.status == 503, body
    assert (body["error"]["reason"], body["error"]["code"]) == ("shutting_down", 503)
    assert resp.headers["X-Sidecar-Error"] == "shutting_down"
    assert await asyncio.to_thread(proc.wait, 10) == 0
    assert fake.cancelled == ["/v1/completions"]  # vLLM aborts the generation


def _pre_stop() -> tuple[list[str], str]:
    """The vLLM container's preStop command, as the pod runs it, and the variable the pod sets
    for it from the Secret the sidecar reads its control token from."""
    deployment = load_yaml(DEPLOYMENT)
    spec = deployment["spec"]["template"]["spec"]
    [sidecar], [vllm] = spec["initContainers"], spec["containers"]
    [secret] = [
        e["valueFrom"]["secretKeyRef"]
        for e in sidecar["env"]
        if e["name"] == "VLLM_SIDECAR_CONTROL_TOKEN"
    ]
    [name] = [
        e["name"] for e in vllm["env"] if e.get("valueFrom", {}).get("secretKeyRef") == secret
    ]
    command: list[str] = vllm["lifecycle"]["preStop"]["exec"]["command"]
    assert command[0] == "python3"
    return [sys.executable, *command[1:]], name


@pytest.mark.parametrize("token", [None, "T0KEN"])
async def test_pre_stop_drains_through_the_sidecar_before_vllm_stops(
    upstream: TestServer, fake: FakeVLLM, start_sidecar: StartSidecar, token: str | None
) -> None:
    """With the control token set (its Secret exists), /drain needs it from loopback too, as a
    meshed pod must (tests/test_admin.py): the hook sends it. Without the Secret, the pod sets
    no variable and the hook drains from loopback with none."""
    settings = ("--control-token", token) if token else ()
    proc = await start_sidecar(str(upstream.make_url("")), "--shutdown-grace", "20", *settings)
    url = proc.url
    fake.stream_events, fake.stream_delay = 10, 0.2  # a 2 s stream, started before the preStop
    command, variable = _pre_stop()
    env = {k: v for k, v in os.environ.items() if k != variable}
    env |= {variable: token} if token else {}
    env |= {"SIDECAR_DRAIN_DELAY": "0", "SIDECAR_ADMIN_URL": proc.admin_url}
    async with aiohttp.ClientSession() as session:
        async with session.post(
            f"{url}/v1/completions", json={**COMPLETION, "stream": True}
        ) as stream:
            await stream.content.readuntil(b"\n\n")
            hook = await asyncio.create_subprocess_exec(*command, env=env, stdout=subprocess.PIPE)

            async def unready() -> bool:
                assert hook.returncode is None, "the preStop hook failed: not drained"
                async with session.get(f"{proc.admin_url}/readyz") as ready:
                    return ready.status == 503

            await eventually(unready, "the endpoints drop the pod")
            async with session.post(f"{url}/v1/completions", json=COMPLETION) as refused:
                assert refused.status == 503
            assert hook.returncode is None  # still waiting for the stream
            events = await read_events(stream)
        out, _ = await asyncio.wait_for(hook.communicate(), 30)
    assert hook.returncode == 0
    assert json.loads(out) == {"draining": True, "in_flight": 0}
    assert events[-1] == "data: [DONE]"
    assert len(events) == 10
    assert not any('"error"' in e for e in events)
    proc.send_signal(signal.SIGTERM)  # after vLLM exits: nothing left to drain
    assert await asyncio.to_thread(proc.wait, 10) == 0
