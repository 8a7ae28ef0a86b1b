"""The real `vllm-sidecar` process: production runner, hang-up cancellation, SIGTERM drain."""

from __future__ import annotations

import asyncio
import json
import signal

import aiohttp
from aiohttp.test_utils import TestServer

from tests.fake_vllm import FakeVLLM, hang, sse_forever
from tests.sidecar import StartSidecar, read_events
from tests.support import eventually, refuses_connections


async def test_client_hang_up_cancels_upstream_in_production(
    upstream: TestServer, fake: FakeVLLM, start_sidecar: StartSidecar
) -> None:
    _, url = await start_sidecar(str(upstream.make_url("")))
    fake.script("POST /v1/completions", hang())
    async with aiohttp.ClientSession() as session:
        request = asyncio.create_task(
            session.post(f"{url}/v1/completions", json={"model": "tiny-model", "prompt": "x"})
        )
        await eventually(lambda: any(r.raw_path == "/v1/completions" for r in fake.requests))
        request.cancel()
    await eventually(lambda: fake.cancelled == ["/v1/completions"])


async def test_sigterm_lets_in_flight_streams_finish(
    upstream: TestServer, fake: FakeVLLM, start_sidecar: StartSidecar
) -> None:
    proc, url = await start_sidecar(str(upstream.make_url("")), "--shutdown-grace", "10")
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
    proc, url = await start_sidecar(str(upstream.make_url("")), "--shutdown-grace", "0.5")
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
