"""The upstream pool: an answer is only ever paired with its own request, and waits are bounded."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator

import aiohttp
import pytest
from aiohttp.test_utils import TestServer

from tests.fake_vllm import FakeVLLM, hang
from tests.metrics import scrape
from tests.sidecar import (
    COMPLETION,
    MakeSidecar,
    StartSidecar,
    assert_envelope,
    failures,
)
from tests.support import eventually

MiB = 1 << 20


async def _request(reader: asyncio.StreamReader) -> tuple[bytes, str]:
    """The next request's head, its body read past, and its X-Request-Id."""
    head = await reader.readuntil(b"\r\n\r\n")
    fields = dict(line.split(b": ", 1) for line in head.split(b"\r\n")[1:] if b": " in line)
    await reader.readexactly(int(fields.get(b"Content-Length", b"0")))
    return head, fields.get(b"X-Request-Id", b"none").decode()


def _answer(body: bytes) -> bytes:
    head = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n"
    return head % len(body) + body


class PushyUpstream:
    """A raw HTTP/1.1 server that, after answering, writes one more response nobody asked for.

    It echoes each request's X-Request-Id, so a client can tell whose answer it got.
    """

    def __init__(self) -> None:
        self.connections = self.closed = 0
        self.server: asyncio.Server | None = None

    async def serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        try:
            while True:
                _, rid = await _request(reader)
                writer.write(_answer(json.dumps({"request_id": rid}).encode()))
                await asyncio.sleep(0.05)  # idle in the pool by now
                writer.write(_answer(b'{"request_id": "unsolicited"}'))
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            self.closed += 1  # after the unsolicited answer, only the sidecar closes
            writer.close()

    def all_closed(self) -> bool:
        return self.connections > 0 and self.closed == self.connections

    @property
    def url(self) -> str:
        assert self.server is not None
        return f"http://127.0.0.1:{self.server.sockets[0].getsockname()[1]}"


@pytest.fixture
async def pushy() -> AsyncIterator[PushyUpstream]:
    upstream = PushyUpstream()
    upstream.server = await asyncio.start_server(upstream.serve, "127.0.0.1", 0)
    async with upstream.server:
        yield upstream


async def test_unsolicited_bytes_on_an_idle_connection_never_reach_a_client(
    make_sidecar: MakeSidecar, pushy: PushyUpstream
) -> None:
    sidecar = await make_sidecar(
        pushy.url, ready=False, served_model_names=["tiny-model"], health_interval=3600
    )
    # The first health check's connection, idle and pushed to, is closed by the sidecar.
    await eventually(pushy.all_closed, "the sidecar closes a connection pushed to")
    for i in range(4):
        resp = await sidecar.client.post(
            "/v1/completions", json=COMPLETION, headers={"X-Request-Id": f"client-{i}"}
        )
        assert resp.status == 200, await resp.text()
        assert await resp.json() == {"request_id": f"client-{i}"}
        # The unsolicited answer lands on the idle pooled connection, which is closed.
        await eventually(pushy.all_closed, "the sidecar closes a connection pushed to")
    # Each connection that received bytes while idle was closed, never handed out again.
    assert pushy.connections >= 4


async def test_wait_for_a_pooled_connection_is_bounded(
    upstream: TestServer, fake: FakeVLLM, make_sidecar: MakeSidecar
) -> None:
    sidecar = await make_sidecar(
        str(upstream.make_url("")),
        max_connections=1,
        pool_timeout=0.5,
        connect_timeout=0.5,
        health_interval=3600,
    )
    fake.script("POST /v1/completions", hang())
    holder = asyncio.create_task(sidecar.client.post("/v1/completions", json=COMPLETION))
    await eventually(lambda: any(r.raw_path == "/v1/completions" for r in fake.requests))
    resp = await asyncio.wait_for(sidecar.client.post("/v1/chat/completions", json=COMPLETION), 10)
    err = await assert_envelope(resp, 503, "upstream_pool_exhausted")
    assert err["retryable"] is True
    assert failures(sidecar, "upstream_pool_exhausted", "503", route="/v1/chat/completions") == 1
    holder.cancel()


async def _stall(url: str, body: bytes, sent: int) -> asyncio.StreamWriter:
    """A client that sends the head and `sent` bytes of `body`, then nothing."""
    host, port = url.removeprefix("http://").split(":")
    _, writer = await asyncio.open_connection(host, int(port))
    head = b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
    writer.write(head + b"Content-Length: %d\r\n\r\n" % len(body) + body[:sent])
    await writer.drain()
    return writer


_LARGE = b'{"model": "tiny-model", "prompt": "' + b"x" * (2 * MiB) + b'"}'


async def test_stalled_bodies_do_not_take_a_bounded_pool(
    upstream: TestServer, fake: FakeVLLM, start_sidecar: StartSidecar
) -> None:
    """With --max-connections, a body the budget can hold is read whole before a pooled
    connection is taken (nginx's `proxy_request_buffering on`): two clients that stop 70 KB
    into 2 MiB bodies hold none of the two, and a third request is answered at once."""
    proc = await start_sidecar(
        str(upstream.make_url("")),
        "--max-connections", "2", "--pool-timeout", "1", "--health-interval", "3600",
    )  # fmt: skip
    url = proc.url
    stalled = [await _stall(url, _LARGE, 70_000) for _ in range(2)]

    async def both_in() -> bool:
        metrics = await scrape(proc.admin_url)
        return metrics.value("vllm_sidecar_in_flight_requests", {"route": "/v1/completions"}) == 2

    await eventually(both_in, "both stalled requests are in")
    async with aiohttp.ClientSession() as session:
        async with session.post(f"{url}/v1/completions", json=COMPLETION) as resp:
            assert resp.status == 200, await resp.text()
    assert fake.arriving.count("/v1/completions") == 1  # the third: the stalled went nowhere
    metrics = await scrape(proc.admin_url)
    assert metrics.value("vllm_sidecar_buffered_bytes", {}) == 2 * len(_LARGE)
    for writer in stalled:
        writer.close()


async def test_a_body_past_the_budget_streams_and_a_stall_lets_its_connection_go(
    upstream: TestServer, fake: FakeVLLM, start_sidecar: StartSidecar
) -> None:
    """A body the memory budget cannot hold streams through on a pooled connection taken early;
    when its client stops half way, the body timeout lets that connection go."""
    sidecar = await start_sidecar(
        str(upstream.make_url("")),
        "--max-connections", "1", "--client-body-timeout", "0.5", "--health-interval", "3600",
        "--buffer-budget-bytes", str(MiB),
    )  # fmt: skip
    url = sidecar.url
    writer = await _stall(url, _LARGE, MiB + 100)
    # Its head is upstream, holding the one connection.
    await eventually(lambda: "/v1/completions" in fake.arriving, "the head is upstream")
    async with aiohttp.ClientSession() as session:
        resp = await asyncio.wait_for(session.get(f"{url}/v1/models"), 10)
        assert resp.status == 200, await resp.text()
    writer.close()
