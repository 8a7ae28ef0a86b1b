"""Client connections are bounded in time and number, against the real `vllm-sidecar` process.

Each timeout is set to a fraction of a second here; each wait below is a deadline that only turns
a connection held forever into a failure, never a measure of speed.
"""

from __future__ import annotations

import asyncio
import re
import resource
from pathlib import Path

import aiohttp
import pytest
from aiohttp.test_utils import TestServer

from tests.fake_vllm import FakeVLLM, Firehose
from tests.metrics import sample, scrape
from tests.procfs import fd_count
from tests.sidecar import SidecarProcess, StartSidecar
from tests.support import eventually

MiB = 1 << 20
FAST = (
    "--client-header-timeout", "0.5", "--client-body-timeout", "0.5",
    "--client-idle-timeout", "0.5", "--client-send-timeout", "0.5",
)  # fmt: skip
HEAD = b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"


async def closed_within(reader: asyncio.StreamReader, seconds: float = 5.0) -> bytes:
    """What the sidecar sent until it closed the connection; fails if it stays open."""
    return await asyncio.wait_for(reader.read(), seconds)


async def connect(url: str) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    host, port = url.removeprefix("http://").split(":")
    return await asyncio.open_connection(host, int(port))


async def trickled_until_closed(url: str, first: bytes, rest: bytes, step: int) -> bytes:
    """Send `first`, then `rest` `step` bytes every 0.1 s; what came back before the close."""
    reader, writer = await connect(url)
    writer.write(first)

    async def trickle() -> None:
        for i in range(0, len(rest), step):
            writer.write(rest[i : i + step])
            await asyncio.sleep(0.1)

    task = asyncio.create_task(trickle())
    try:
        return await closed_within(reader)
    finally:
        task.cancel()
        writer.close()


async def closes(proc: SidecarProcess, reason: str) -> float:
    return sample(
        await scrape(proc.admin_url), "vllm_sidecar_client_connections_closed_total", reason=reason
    )


async def test_silent_connection_is_closed(
    upstream: TestServer, start_sidecar: StartSidecar
) -> None:
    proc = await start_sidecar(str(upstream.make_url("")), *FAST)
    url = proc.url
    reader, writer = await connect(url)
    assert await closed_within(reader) == b""
    writer.close()
    assert await closes(proc, "idle_timeout") == 1


async def test_trickled_headers_are_closed(
    upstream: TestServer, start_sidecar: StartSidecar
) -> None:
    proc = await start_sidecar(str(upstream.make_url("")), *FAST)
    url = proc.url
    # One byte every 0.1 s: never idle, never a whole head.
    assert await trickled_until_closed(url, b"", HEAD, 1) == b""
    assert await closes(proc, "header_timeout") == 1


async def test_stalled_body_is_closed_and_the_upstream_request_cancelled(
    upstream: TestServer, fake: FakeVLLM, start_sidecar: StartSidecar
) -> None:
    proc = await start_sidecar(str(upstream.make_url("")), *FAST)
    url = proc.url
    reader, writer = await connect(url)
    # Over 1 MiB, with the model first: the sidecar streams it to the upstream as it comes.
    body = b'{"model": "tiny-model", "prompt": "' + b"x" * (2 * MiB) + b'"}'
    writer.write(HEAD + b"Content-Length: %d\r\n\r\n" % len(body) + body[: MiB + 100])
    await writer.drain()
    assert await closed_within(reader) == b""
    writer.close()
    assert await closes(proc, "body_timeout") == 1
    # The handler ended with the connection, and with it the upstream request that held a
    # pooled connection (the pool's own test: test_upstream_pool.py).
    metrics = await scrape(proc.admin_url)
    assert sample(metrics, "vllm_sidecar_in_flight_requests", route="/v1/completions") == 0
    assert sample(metrics, "vllm_sidecar_client_disconnects_total", route="/v1/completions") == 1


async def test_trickled_body_is_closed(upstream: TestServer, start_sidecar: StartSidecar) -> None:
    """A byte now and then keeps the body timeout at bay; the minimum rate still applies."""
    proc = await start_sidecar(str(upstream.make_url("")), *FAST)
    url = proc.url
    body = b'{"model": "tiny-model", "prompt": "' + b"x" * 100_000 + b'"}'
    head = HEAD + b"Content-Length: %d\r\n\r\n" % len(body)
    # 20 bytes every 0.1 s: 200 bytes a second, under the 1 KiB/s minimum.
    assert await trickled_until_closed(url, head, body, 20) == b""
    assert await closes(proc, "body_too_slow") == 1


async def test_client_that_does_not_read_is_closed(
    upstream: TestServer, fake: FakeVLLM, start_sidecar: StartSidecar
) -> None:
    proc = await start_sidecar(str(upstream.make_url("")), *FAST)
    url = proc.url
    fire = Firehose(total=128 * MiB)
    fake.script("POST /v1/completions", fire.handler())
    async with aiohttp.ClientSession() as session:
        resp = await session.post(
            f"{url}/v1/completions", json={"model": "tiny-model", "prompt": "x", "stream": True}
        )
        async with resp:
            await resp.content.readexactly(64 * 1024)
            await asyncio.sleep(3)  # reads nothing: the sidecar's writes stall
            with pytest.raises(aiohttp.ClientPayloadError):
                await asyncio.wait_for(resp.content.read(), 10)
    assert not fire.finished
    assert await closes(proc, "send_timeout") == 1


async def test_a_client_that_closes_mid_answer_ends_its_request_at_once(
    upstream: TestServer, fake: FakeVLLM, start_sidecar: StartSidecar
) -> None:
    # The default 60 s send timeout: only the client's FIN can end the request in time. The
    # client reads nothing, so the answer fills the socket; a close that first flushed the
    # answer would wait on a window a gone client never opens (on loopback, the kernel's
    # zero-window probes back off to tens of seconds before they draw its reset).
    proc = await start_sidecar(str(upstream.make_url("")))
    url = proc.url
    fire = Firehose(total=1 << 40)
    fake.script("POST /v1/completions", fire.handler())
    reader, writer = await connect(url)
    body = b'{"model": "tiny-model", "prompt": "x", "stream": true}'
    writer.write(HEAD + b"Content-Length: %d\r\n\r\n" % len(body) + body)
    assert (await reader.readuntil(b"\r\n\r\n")).startswith(b"HTTP/1.1 200")

    async def stalled() -> bool:
        before = fire.sent
        await asyncio.sleep(0.3)
        return fire.sent == before > 0

    await eventually(stalled, "the sidecar's writes to the client stall")
    writer.write_eof()  # the client's FIN, as a close sends it

    async def ended() -> bool:
        metrics = await scrape(proc.admin_url)
        return sample(metrics, "vllm_sidecar_in_flight_requests", route="/v1/completions") == 0

    await eventually(ended, "the request ends with the client's FIN", within=20)
    metrics = await scrape(proc.admin_url)
    assert sample(metrics, "vllm_sidecar_client_disconnects_total", route="/v1/completions") == 1
    assert await closed_within(reader, 20) is not None
    writer.close()
    assert not fire.finished


def _soft_limit(pid: int) -> int:
    text = Path(f"/proc/{pid}/limits").read_text()
    match = re.search(r"Max open files\s+(\d+)\s+(\d+)", text)
    assert match is not None
    return int(match.group(1))


async def test_connections_are_capped_and_admin_still_answers(
    upstream: TestServer, start_sidecar: StartSidecar
) -> None:
    proc = await start_sidecar(str(upstream.make_url("")), "--max-client-connections", "20")
    url = proc.url
    before = fd_count(proc.pid)
    socks = [await connect(url) for _ in range(200)]
    try:
        await asyncio.sleep(0.5)
        held = fd_count(proc.pid)
        async with aiohttp.ClientSession() as session:
            async with session.get(f"{proc.admin_url}/livez") as resp:
                assert resp.status == 200
    finally:
        for _, writer in socks:
            writer.close()
    print(f"descriptors: {before} before, {held} with 200 clients connecting (cap 20)")
    assert held <= before + 20 + 2
    assert await closes(proc, "connection_limit") >= 180


async def test_open_files_limit_is_raised_to_the_hard_limit(
    upstream: TestServer, start_sidecar: StartSidecar
) -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    # Started below its hard limit (containerd's 1,024 under a higher hard one, say), the
    # sidecar must raise its own soft limit: a started process keeps the limit it was given.
    low = min(256, hard // 2)
    assert low > 64, f"hard open-files limit {hard} leaves the sidecar no room to start"
    resource.setrlimit(resource.RLIMIT_NOFILE, (low, hard))
    try:
        proc = await start_sidecar(str(upstream.make_url("")))
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    assert _soft_limit(proc.pid) == hard
