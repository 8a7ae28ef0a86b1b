"""The real `vllm-sidecar` process: production runner, hang-up cancellation, SIGTERM drain."""

from __future__ import annotations

import asyncio
import json
import signal
import subprocess
import sys
from collections.abc import AsyncIterator, Callable
from typing import Any

import aiohttp
import pytest
from aiohttp.test_utils import TestServer

from tests.fake_vllm import FakeVLLM, hang, sse_forever
from tests.test_failures import free_port

StartSidecar = Callable[..., Any]


def _spawn(*args: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen([sys.executable, "-m", "proxy", *args])


@pytest.fixture
async def start_sidecar() -> AsyncIterator[StartSidecar]:
    procs: list[subprocess.Popen[bytes]] = []

    async def start(upstream: str, *args: str) -> tuple[subprocess.Popen[bytes], str]:
        port, admin = free_port(), free_port()
        proc = _spawn(
            "--upstream-url",
            upstream,
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--admin-port",
            str(admin),
            "--health-interval",
            "0.1",
            *args,
        )
        procs.append(proc)
        async with aiohttp.ClientSession() as session:
            for _ in range(300):
                try:
                    async with session.get(f"http://127.0.0.1:{admin}/readyz") as resp:
                        if resp.status == 200:
                            return proc, f"http://127.0.0.1:{port}"
                except aiohttp.ClientError:
                    pass
                await asyncio.sleep(0.05)
        raise AssertionError("sidecar did not become ready")

    yield start
    for proc in procs:
        if proc.poll() is None:
            proc.kill()
        proc.wait(10)


async def wait_until(predicate: Callable[[], bool], within: float = 10.0) -> None:
    for _ in range(int(within / 0.02)):
        if predicate():
            return
        await asyncio.sleep(0.02)
    raise AssertionError("condition not reached")


async def test_client_hang_up_cancels_upstream_in_production(
    upstream: TestServer, fake: FakeVLLM, start_sidecar: StartSidecar
) -> None:
    _, url = await start_sidecar(str(upstream.make_url("")))
    fake.script("POST /v1/completions", hang())
    async with aiohttp.ClientSession() as session:
        request = asyncio.create_task(
            session.post(f"{url}/v1/completions", json={"model": "tiny-model", "prompt": "x"})
        )
        await wait_until(lambda: any(r.raw_path == "/v1/completions" for r in fake.requests))
        request.cancel()
    await wait_until(lambda: fake.cancelled == ["/v1/completions"])


async def read_events(resp: aiohttp.ClientResponse) -> list[str]:
    return [e for e in (await resp.text()).split("\n\n") if e]


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
            await asyncio.sleep(0.3)
            with pytest.raises(aiohttp.ClientConnectorError):
                async with aiohttp.ClientSession() as other:
                    await other.get(f"{url}/v1/models")
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
