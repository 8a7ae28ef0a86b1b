"""The upstream pool: an answer is only ever paired with its own request, and waits are bounded."""

from __future__ import annotations

import asyncio
import json
import socket
import struct
from collections.abc import AsyncIterator

import aiohttp
import pytest
from aiohttp.test_utils import TestServer

from tests.fake_vllm import FakeVLLM, hang
from tests.metrics import scrape
from tests.sidecar import (
    COMPLETION,
    MakeSidecar,
    Sidecar,
    StartSidecar,
    admin_of,
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


class IdleClosingUpstream:
    """A raw HTTP/1.1 server that answers `answers` POSTs per connection, then closes it as the
    next one arrives, unanswered: as a client sees uvicorn's close of an idle kept-alive
    connection crossing its next request on the wire. GETs (the health checks) are answered
    and closed, so that only the POSTs reuse connections."""

    def __init__(self, answers: int, *, reset: bool = False, then_down: bool = False) -> None:
        self.answers = answers
        self.reset = reset  # the unanswered request gets a reset (RST), not a close (FIN)
        self.then_down = then_down  # and the server stops listening as it drops it
        self.answered: list[str] = []
        self.unanswered: list[str] = []
        self.server: asyncio.Server | None = None

    async def serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        served = 0
        try:
            while True:
                head, rid = await _request(reader)
                if not head.startswith(b"POST"):
                    writer.write(
                        _answer(b"{}").replace(b"\r\n\r\n", b"\r\nConnection: close\r\n\r\n", 1)
                    )
                    await writer.drain()
                    return
                if served == self.answers:
                    self.unanswered.append(rid)
                    if self.then_down and self.server is not None:
                        self.server.close()
                    if self.reset:
                        linger = struct.pack("ii", 1, 0)  # closed at once: an RST
                        writer.get_extra_info("socket").setsockopt(
                            socket.SOL_SOCKET, socket.SO_LINGER, linger
                        )
                    return
                served += 1
                self.answered.append(rid)
                writer.write(_answer(json.dumps({"request_id": rid}).encode()))
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()

    @property
    def url(self) -> str:
        assert self.server is not None
        return f"http://127.0.0.1:{self.server.sockets[0].getsockname()[1]}"


async def idle_closing(answers: int, **faults: bool) -> IdleClosingUpstream:
    upstream = IdleClosingUpstream(answers, **faults)
    upstream.server = await asyncio.start_server(upstream.serve, "127.0.0.1", 0)
    return upstream


async def in_front_of(upstream: IdleClosingUpstream, make_sidecar: MakeSidecar) -> Sidecar:
    """A sidecar for the raw upstream: its names given, no health checks to share its pool."""
    return await make_sidecar(
        upstream.url, ready=False, served_model_names=["tiny-model"], health_interval=3600
    )


async def after_one_answer(upstream: IdleClosingUpstream, make_sidecar: MakeSidecar) -> Sidecar:
    """`in_front_of`, with one request answered: the next goes out on a reused connection."""
    sidecar = await in_front_of(upstream, make_sidecar)
    assert (await sidecar.client.post("/v1/completions", json=COMPLETION)).status == 200
    return sidecar


async def test_a_request_that_meets_vllm_closing_an_idle_connection_is_sent_again(
    make_sidecar: MakeSidecar,
) -> None:
    """vLLM closes a connection idle for 5 s; a request that goes out on it that moment was
    never read: it is sent again on a new connection, whatever its method, not failed."""
    upstream = await idle_closing(answers=1)
    async with upstream.server:  # type: ignore[union-attr]
        sidecar = await in_front_of(upstream, make_sidecar)
        ids = [f"client-{i}" for i in range(4)]
        for rid in ids:  # one after the other: each after the first reuses a connection
            resp = await sidecar.client.post(
                "/v1/completions", json=COMPLETION, headers={"X-Request-Id": rid}
            )
            assert resp.status == 200, await resp.text()
            assert await resp.json() == {"request_id": rid}
        resp = await sidecar.client.post("/pause", headers={"X-Request-Id": "pause"})
        assert resp.status == 200, await resp.text()
    assert upstream.unanswered == [*ids[1:], "pause"]  # each met a closing connection once
    assert upstream.answered == [*ids, "pause"]  # and was answered on a new one


async def test_a_reset_on_a_reused_connection_is_not_sent_again(
    make_sidecar: MakeSidecar,
) -> None:
    """uvicorn's idle close is a FIN, and a request crossing it meets at worst the RST of a
    closed socket (EPIPE); a reset of an open connection (ECONNRESET) came from a vLLM that had
    the request, and may have run it: the client gets its 502, and vLLM saw the request once
    (the chaos run found such requests run twice)."""
    upstream = await idle_closing(answers=1, reset=True)
    async with upstream.server:  # type: ignore[union-attr]
        sidecar = await after_one_answer(upstream, make_sidecar)
        resp = await sidecar.client.post(
            "/v1/completions", json=COMPLETION, headers={"X-Request-Id": "reset"}
        )
        await assert_envelope(resp, 502, "upstream_disconnected")
    assert upstream.unanswered == ["reset"]
    assert len(upstream.answered) == 1


async def test_a_resend_that_finds_vllm_gone_reports_the_drop_not_an_unsent_request(
    make_sidecar: MakeSidecar,
) -> None:
    """A request whose reused connection closed unanswered is sent again; when vLLM went down
    with it, the new connection is refused. vLLM may have had the request, so the client is told
    the connection dropped (`upstream_disconnected`), never `upstream_unreachable`, which says
    that nothing was sent."""
    upstream = await idle_closing(answers=1, then_down=True)
    async with upstream.server:  # type: ignore[union-attr]
        sidecar = await after_one_answer(upstream, make_sidecar)
        resp = await sidecar.client.post(
            "/v1/completions", json=COMPLETION, headers={"X-Request-Id": "gone"}
        )
        err = await assert_envelope(resp, 502, "upstream_disconnected")
        assert "sent again" in err["message"]
    assert upstream.unanswered == ["gone"]


async def test_a_connection_of_its_own_closed_unanswered_is_not_sent_again(
    make_sidecar: MakeSidecar,
) -> None:
    """A new connection vLLM closes without an answer is vLLM failing on the request: it
    may have run, so the client gets the 502, and vLLM saw the request once."""
    upstream = await idle_closing(answers=0)
    async with upstream.server:  # type: ignore[union-attr]
        sidecar = await in_front_of(upstream, make_sidecar)
        resp = await sidecar.client.post(
            "/v1/completions", json=COMPLETION, headers={"X-Request-Id": "once"}
        )
        await assert_envelope(resp, 502, "upstream_disconnected")
    assert upstream.unanswered == ["once"]


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
    proc, url = await start_sidecar(
        str(upstream.make_url("")),
        "--max-connections", "2", "--pool-timeout", "1", "--health-interval", "3600",
    )  # fmt: skip
    stalled = [await _stall(url, _LARGE, 70_000) for _ in range(2)]

    async def both_in() -> bool:
        metrics = await scrape(admin_of(proc))
        return metrics.value("vllm_sidecar_in_flight_requests", {"route": "/v1/completions"}) == 2

    await eventually(both_in, "both stalled requests are in")
    async with aiohttp.ClientSession() as session:
        async with session.post(f"{url}/v1/completions", json=COMPLETION) as resp:
            assert resp.status == 200, await resp.text()
    assert fake.arriving.count("/v1/completions") == 1  # the third: the stalled went nowhere
    metrics = await scrape(admin_of(proc))
    assert metrics.value("vllm_sidecar_buffered_bytes", {}) == 2 * len(_LARGE)
    for writer in stalled:
        writer.close()


async def test_a_body_past_the_budget_streams_and_a_stall_lets_its_connection_go(
    upstream: TestServer, fake: FakeVLLM, start_sidecar: StartSidecar
) -> None:
    """A body the memory budget cannot hold streams through on a pooled connection taken early;
    when its client stops half way, the body timeout lets that connection go."""
    _, url = await start_sidecar(
        str(upstream.make_url("")),
        "--max-connections", "1", "--client-body-timeout", "0.5", "--health-interval", "3600",
        "--buffer-budget-bytes", str(MiB),
    )  # fmt: skip
    writer = await _stall(url, _LARGE, MiB + 100)
    # Its head is upstream, holding the one connection.
    await eventually(lambda: "/v1/completions" in fake.arriving, "the head is upstream")
    async with aiohttp.ClientSession() as session:
        resp = await asyncio.wait_for(session.get(f"{url}/v1/models"), 10)
        assert resp.status == 200, await resp.text()
    writer.close()
