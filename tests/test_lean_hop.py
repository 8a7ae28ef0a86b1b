"""The lean upstream hop against a scripted asyncio server: framing, reuse, and each fault raising
the aiohttp exception `classify` expects."""

from __future__ import annotations

import asyncio
import errno
import socket
import struct
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import pytest
from yarl import URL

from proxy.config.settings import Settings
from proxy.core.errors import (
    UpstreamDisconnected,
    UpstreamInvalidResponse,
    UpstreamPoolExhausted,
    UpstreamTimeout,
    UpstreamUnreachable,
)
from proxy.upstream.hop import HOP
from proxy.upstream.lean import LeanClient
from proxy.upstream.lean.body import HIGH_WATER
from proxy.upstream.marks import QUEUED, WIRE
from proxy.upstream.session import SESSION, classify, closed_while_idle, never_connected

Script = Callable[["Peer"], Awaitable[None]]
OK = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"


@dataclass
class Peer:
    """One accepted connection: read requests off it, write answers."""

    reader: asyncio.StreamReader
    writer: asyncio.StreamWriter
    number: int

    async def request(self) -> tuple[bytes, bytes]:
        """A request's head and body (by Content-Length)."""
        head = await self.reader.readuntil(b"\r\n\r\n")
        length = 0
        for line in head.split(b"\r\n"):
            if line.lower().startswith(b"content-length:"):
                length = int(line.split(b":", 1)[1])
        return head, await self.reader.readexactly(length)

    def send(self, data: bytes) -> None:
        self.writer.write(data)


@dataclass
class Upstream:
    """A server that answers each connection with the next script (the last one repeats)."""

    scripts: list[Script]
    peers: list[Peer] = field(default_factory=list)
    heads: list[bytes] = field(default_factory=list)
    server: asyncio.Server | None = None

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        peer = Peer(reader, writer, len(self.peers))
        self.peers.append(peer)
        script = self.scripts[min(peer.number, len(self.scripts) - 1)]
        try:
            await script(peer)
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()

    @property
    def url(self) -> URL:
        assert self.server is not None
        port = self.server.sockets[0].getsockname()[1]
        return URL(f"http://127.0.0.1:{port}")


@pytest.fixture
async def serve() -> AsyncIterator[Callable[..., Awaitable[Upstream]]]:
    started: list[Upstream] = []

    async def start(*scripts: Script) -> Upstream:
        upstream = Upstream(list(scripts))
        upstream.server = await asyncio.start_server(upstream._serve, "127.0.0.1", 0)
        started.append(upstream)
        return upstream

    yield start
    for upstream in started:
        assert upstream.server is not None
        upstream.server.close()


def client(upstream: Upstream, **options: object) -> LeanClient:
    return LeanClient(upstream.url, Settings(upstream_url=str(upstream.url), **options))


def answering(*answers: bytes, then: Callable[[Peer], Awaitable[None]] | None = None) -> Script:
    """Answer each request on a connection with the next of `answers`, noting its head."""

    async def script(peer: Peer) -> None:
        for answer in answers:
            await peer.request()
            peer.send(answer)
        if then is not None:
            await then(peer)
        else:
            await peer.reader.read()  # until the client closes

    return script


async def get(hop: LeanClient, upstream: Upstream, method: str = "GET", **kw: object) -> bytes:
    kw.setdefault("headers", {})
    async with hop.request(method, upstream.url / "x", **kw) as resp:  # type: ignore[arg-type]
        return await resp.read()


def where(exc: BaseException) -> type:
    return type(classify(exc, where="here"))


# -- framing and reuse ---------------------------------------------------------------------------


async def test_a_request_is_written_as_given_and_the_connection_reused(serve: Callable) -> None:
    seen: list[tuple[bytes, bytes]] = []

    async def script(peer: Peer) -> None:
        for _ in range(2):
            seen.append(await peer.request())
            peer.send(OK)
        await peer.reader.read()

    upstream = await serve(script)
    async with client(upstream) as hop:
        marks = []
        for body in (b'{"a": 1}', b""):
            async with hop.request(
                "POST",
                upstream.url.with_path("/v1/x", encoded=True).with_query("q=1"),
                data=body,
                headers={"X-One": "1", "Content-Type": "application/json"},
            ) as resp:
                wire = WIRE.get()
                marks.append(wire is not None and wire.reused)
                assert (resp.status, await resp.read(), resp.content_length) == (200, b"ok", 2)
    assert len(upstream.peers) == 1
    assert marks == [False, True]
    host = upstream.url.host_port_subcomponent
    assert seen[0] == (
        f"POST /v1/x?q=1 HTTP/1.1\r\nHost: {host}\r\nX-One: 1\r\n"
        "Content-Type: application/json\r\nContent-Length: 8\r\n\r\n".encode(),
        b'{"a": 1}',
    )
    assert seen[1][0].endswith(b"Content-Length: 0\r\n\r\n")


async def test_no_header_is_added_but_a_posts_zero_length(serve: Callable) -> None:
    heads: list[bytes] = []

    async def script(peer: Peer) -> None:
        for _ in range(2):
            heads.append((await peer.request())[0])
            peer.send(OK)
        await peer.reader.read()

    upstream = await serve(script)
    async with client(upstream) as hop:
        assert await get(hop, upstream) == b"ok"
        assert await get(hop, upstream, "POST") == b"ok"  # as aiohttp sends a POST without data
    host = upstream.url.host_port_subcomponent
    assert heads == [
        f"GET /x HTTP/1.1\r\nHost: {host}\r\n\r\n".encode(),
        f"POST /x HTTP/1.1\r\nHost: {host}\r\nContent-Length: 0\r\n\r\n".encode(),
    ]


async def test_the_most_recently_used_idle_connection_goes_first(serve: Callable) -> None:
    go = [asyncio.Event(), asyncio.Event()]
    served: list[int] = []  # the connection each request came on

    async def script(peer: Peer) -> None:
        while True:
            await peer.request()
            served.append(peer.number)
            if len(served) <= 2:
                await go[peer.number].wait()
            peer.send(OK)

    upstream = await serve(script)
    async with client(upstream) as hop:
        first = asyncio.create_task(get(hop, upstream))
        await asyncio.sleep(0.05)
        second = asyncio.create_task(get(hop, upstream))
        await asyncio.sleep(0.05)
        go[1].set()  # the second connection is handed back first, the first one last
        await second
        go[0].set()
        await first
        assert await get(hop, upstream) == b"ok"
    assert served == [0, 1, 0]


async def test_a_streamed_body_goes_with_its_length_never_chunked(serve: Callable) -> None:
    got: list[tuple[bytes, bytes]] = []

    async def script(peer: Peer) -> None:
        got.append(await peer.request())
        peer.send(OK)
        await peer.reader.read()

    async def parts() -> AsyncIterator[bytes]:
        for part in (b"ab", b"cd" * 100_000, b"e"):
            yield part

    upstream = await serve(script)
    async with client(upstream) as hop:
        body = await get(hop, upstream, "POST", data=parts(), headers={"Content-Length": "200003"})
    assert body == b"ok"
    head, sent = got[0]
    assert b"chunked" not in head.lower()
    assert sent == b"ab" + b"cd" * 100_000 + b"e"


async def test_chunked_and_close_delimited_answers(serve: Callable) -> None:
    chunked = (
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n2\r\nde\r\n0\r\n\r\n"
    )
    until_close = b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\n\r\nuntil the close"
    upstream = await serve(answering(chunked, until_close, then=_close))
    async with client(upstream) as hop:
        assert await get(hop, upstream) == b"abcde"
        assert await get(hop, upstream) == b"until the close"  # on the same, reused, connection
        assert len(upstream.peers) == 1
        assert await get(hop, upstream) == b"abcde"  # the closed one is not reused
    assert len(upstream.peers) == 2


async def _close(peer: Peer) -> None:
    await peer.writer.drain()
    peer.writer.close()


async def test_head_204_304_and_interim_answers_have_no_body(serve: Callable) -> None:
    upstream = await serve(
        answering(
            b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\n",  # to a HEAD: nothing follows
            b"HTTP/1.1 204 No Content\r\n\r\n",
            b"HTTP/1.1 304 Not Modified\r\nContent-Length: 5\r\n\r\n",
            b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 103 Early Hints\r\nLink: </a>\r\n\r\n" + OK,
        )
    )
    async with client(upstream) as hop:
        async with hop.request("HEAD", upstream.url, headers={}) as resp:
            assert (resp.status, resp.content_length, await resp.read()) == (200, 10, b"")
        for status in (204, 304):
            async with hop.request("GET", upstream.url, headers={}) as resp:
                assert (resp.status, await resp.read()) == (status, b"")
        async with hop.request("GET", upstream.url, headers={}) as resp:
            assert (resp.status, await resp.read()) == (200, b"ok")
            assert "Link" not in resp.headers
    assert len(upstream.peers) == 1


async def test_connection_close_and_an_unread_body_are_not_reused(serve: Callable) -> None:
    closing = b"HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: 2\r\n\r\nok"
    big = b"HTTP/1.1 200 OK\r\nContent-Length: 4000000\r\n\r\n" + b"x" * 4_000_000

    upstream = await serve(answering(closing), answering(big), answering(OK))
    async with client(upstream) as hop:
        assert await get(hop, upstream) == b"ok"
        async with hop.request("GET", upstream.url, headers={}) as resp:
            assert len(await resp.content.readany()) < 4_000_000  # left unread
        assert await get(hop, upstream) == b"ok"
    assert len(upstream.peers) == 3


async def test_content_encoding_and_bytes_pass_untouched(serve: Callable) -> None:
    gz = b"\x1f\x8b\x08\x00garbage"
    answer = b"HTTP/1.1 200 OK\r\nContent-Encoding: gzip\r\nContent-Length: %d\r\n\r\n" % len(gz)
    upstream = await serve(answering(answer + gz))
    async with client(upstream) as hop, hop.request("GET", upstream.url, headers={}) as resp:
        assert resp.headers["Content-Encoding"] == "gzip"
        assert await resp.read() == gz


async def test_a_slow_reader_pauses_the_socket_with_a_bounded_buffer(serve: Callable) -> None:
    size = 8 << 20
    upstream = await serve(
        answering(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % size + b"y" * size)
    )
    async with client(upstream) as hop, hop.request("GET", upstream.url, headers={}) as resp:
        await asyncio.sleep(0.2)  # the upstream writes as fast as it can meanwhile
        held = resp.content._size
        got = 0
        while chunk := await resp.content.readany():
            got += len(chunk)
    assert got == size
    assert HIGH_WATER <= held <= 1 << 20  # the rest waits in the upstream's socket


# -- faults, each the aiohttp exception classify() reads -----------------------------------------


async def test_unsolicited_bytes_close_an_idle_connection(serve: Callable) -> None:
    async def stray(peer: Peer) -> None:
        await asyncio.sleep(0.05)
        peer.send(b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nstale")
        await peer.reader.read()

    upstream = await serve(
        answering(OK, then=stray), answering(b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nfresh")
    )
    async with client(upstream) as hop:
        assert await get(hop, upstream) == b"ok"
        await asyncio.sleep(0.2)
        assert await get(hop, upstream) == b"fresh"  # never the stale answer
    assert len(upstream.peers) == 2


async def test_bytes_past_an_answer_close_the_connection(serve: Callable) -> None:
    extra = b"HTTP/1.1 204 No Content\r\n\r\n"  # a whole kept-alive answer, bodiless
    upstream = await serve(answering(OK + extra, OK), answering(OK))
    async with client(upstream) as hop:
        assert await get(hop, upstream) == b"ok"
        assert await get(hop, upstream) == b"ok"
    assert len(upstream.peers) == 2


async def test_a_close_before_the_answer_on_a_reused_connection(serve: Callable) -> None:
    """vLLM read the request and closed: its kernel acknowledged the request, so it may have
    run, and is no idle close (which would let it go again)."""

    async def close_on_second(peer: Peer) -> None:
        await peer.request()
        peer.writer.close()

    upstream = await serve(answering(OK, then=close_on_second))
    async with client(upstream) as hop:
        assert await get(hop, upstream) == b"ok"
        with pytest.raises(aiohttp.ServerDisconnectedError) as caught:
            await get(hop, upstream, "POST", data=b"{}")
        wire = WIRE.get()
        assert wire is not None
        assert (wire.reused, wire.unread) == (True, False)
        assert not closed_while_idle(caught.value)
        assert where(caught.value) is UpstreamDisconnected


async def test_a_close_on_a_new_connection_is_not_an_idle_close(serve: Callable) -> None:
    async def close(peer: Peer) -> None:
        await peer.request()
        peer.writer.close()

    upstream = await serve(close)
    async with client(upstream) as hop:
        with pytest.raises(aiohttp.ServerDisconnectedError) as caught:
            await get(hop, upstream)
        assert not closed_while_idle(caught.value)


async def test_a_reset_before_the_answer_is_an_os_error(serve: Callable) -> None:
    async def reset(peer: Peer) -> None:
        await peer.request()
        sock = peer.writer.get_extra_info("socket")
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        peer.writer.transport.abort()

    upstream = await serve(answering(OK, then=reset))
    async with client(upstream) as hop:
        assert await get(hop, upstream) == b"ok"
        with pytest.raises(aiohttp.ClientOSError) as caught:
            await get(hop, upstream)
    assert not isinstance(caught.value, aiohttp.ServerDisconnectedError)
    assert caught.value.errno == errno.ECONNRESET
    # A reset is no idle close (uvicorn's is a FIN): even on a reused connection, not sent again.
    assert not closed_while_idle(caught.value)


@pytest.mark.parametrize(
    "answer",
    [
        b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\nonly ten b",
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nabcde\r\n",
    ],
    ids=["content-length", "chunked"],
)
async def test_a_body_cut_short_is_a_payload_error(serve: Callable, answer: bytes) -> None:
    async def cut(peer: Peer) -> None:
        await peer.request()
        peer.send(answer)
        await _close(peer)

    upstream = await serve(cut)
    async with client(upstream) as hop:
        with pytest.raises(aiohttp.ClientPayloadError) as caught:
            await get(hop, upstream)
    assert where(caught.value) is UpstreamDisconnected


async def test_an_invalid_status_line_is_an_invalid_response(serve: Callable) -> None:
    upstream = await serve(answering(b"HTTX/1.1 200 OK\r\n\r\n"))
    async with client(upstream) as hop:
        with pytest.raises(aiohttp.ClientResponseError) as caught:
            await get(hop, upstream)
    assert where(caught.value) is UpstreamInvalidResponse


async def test_a_runaway_head_is_an_invalid_response(serve: Callable) -> None:
    async def runaway(peer: Peer) -> None:
        await peer.request()
        peer.send(b"HTTP/1.1 200 OK\r\n")
        for _ in range(100):
            peer.send(b"X-Filler: " + b"f" * 4000 + b"\r\n")
            await peer.writer.drain()
        await peer.reader.read()

    upstream = await serve(runaway)
    async with client(upstream) as hop:
        with pytest.raises(aiohttp.ClientResponseError) as caught:
            await get(hop, upstream)
    assert where(caught.value) is UpstreamInvalidResponse


async def test_headers_slower_than_the_read_timeout(serve: Callable) -> None:
    async def slow(peer: Peer) -> None:
        await peer.request()
        await asyncio.sleep(1)
        peer.send(OK)

    upstream = await serve(slow)
    async with client(upstream, read_timeout=0.2) as hop:
        with pytest.raises(aiohttp.ServerTimeoutError) as caught:
            await get(hop, upstream)
    assert where(caught.value) is UpstreamTimeout


async def test_a_body_read_slower_than_the_read_timeout(serve: Callable) -> None:
    async def stalls(peer: Peer) -> None:
        await peer.request()
        peer.send(b"HTTP/1.1 200 OK\r\nContent-Length: 4\r\n\r\nab")
        await asyncio.sleep(1)

    upstream = await serve(stalls)
    async with client(upstream, read_timeout=0.2) as hop:
        with pytest.raises(aiohttp.ServerTimeoutError):
            await get(hop, upstream)


async def test_a_refused_connect_is_unreachable() -> None:
    probe = await asyncio.start_server(lambda r, w: None, "127.0.0.1", 0)
    port = probe.sockets[0].getsockname()[1]
    probe.close()
    await probe.wait_closed()
    url = URL(f"http://127.0.0.1:{port}")
    async with LeanClient(url, Settings(upstream_url=str(url))) as hop:
        with pytest.raises(aiohttp.ClientConnectorError) as caught:
            async with hop.request("GET", url, headers={}):
                pass
    assert isinstance(caught.value.os_error, ConnectionRefusedError)
    assert where(caught.value) is UpstreamUnreachable
    assert not never_connected(caught.value)


async def test_an_exhausted_pool_waits_then_is_refused(serve: Callable) -> None:
    release = asyncio.Event()

    async def held(peer: Peer) -> None:
        await peer.request()
        await release.wait()
        peer.send(OK)
        await answering(OK)(peer)

    upstream = await serve(held)
    async with client(upstream, max_connections=1, pool_timeout=0.2) as hop:
        first = asyncio.create_task(get(hop, upstream))
        await asyncio.sleep(0.05)
        with pytest.raises(aiohttp.ConnectionTimeoutError) as caught:
            await get(hop, upstream)
        assert QUEUED.get()
        assert where(caught.value) is UpstreamPoolExhausted
        assert not never_connected(caught.value)
        waiting = asyncio.create_task(get(hop, upstream))  # handed the first one's connection
        await asyncio.sleep(0.05)
        release.set()
        assert await first == b"ok"
        assert await waiting == b"ok"
    assert len(upstream.peers) == 1


async def test_an_idle_connection_is_dropped_after_keepalive(serve: Callable) -> None:
    upstream = await serve(answering(OK, OK))
    async with client(upstream) as hop:
        hop.pool._keepalive = 0.1
        assert await get(hop, upstream) == b"ok"
        await asyncio.sleep(0.3)
        assert hop.pool.all == set()  # closed by then, not only when the next request looks
        assert await get(hop, upstream) == b"ok"
    assert len(upstream.peers) == 2


async def test_a_read_cut_from_outside_wakes_the_reader(serve: Callable) -> None:
    # engine/stalls.py ends a stalled stream with content.set_exception
    upstream = await serve(answering(b"HTTP/1.1 200 OK\r\nContent-Length: 9\r\n\r\nab"))
    async with client(upstream) as hop, hop.request("GET", upstream.url, headers={}) as resp:
        reading = asyncio.create_task(resp.content.read())
        await asyncio.sleep(0.05)
        resp.content.set_exception(aiohttp.ClientPayloadError("cut"))
        with pytest.raises(aiohttp.ClientPayloadError, match="cut"):
            await reading


async def test_a_closed_client_refuses_like_a_closed_session(serve: Callable) -> None:
    upstream = await serve(answering(OK))
    hop = client(upstream)
    await hop.close()
    with pytest.raises(RuntimeError, match="Session is closed"):
        hop.request("GET", upstream.url, headers={})


def test_it_runs_on_uvloop_as_the_sidecar_does() -> None:
    uvloop = pytest.importorskip("uvloop")
    chunked = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nab\r\n0\r\n\r\n"

    async def main() -> list[bytes]:
        upstream = Upstream([answering(OK, chunked)])
        upstream.server = await asyncio.start_server(upstream._serve, "127.0.0.1", 0)
        async with upstream.server, client(upstream) as hop:
            return [await get(hop, upstream), await get(hop, upstream, "POST", data=b"{}")]

    assert uvloop.run(main()) == [b"ok", b"ab"]


@pytest.mark.parametrize("choice", ["lean", "aiohttp"])
async def test_the_proxied_requests_go_through_the_chosen_client(
    make_sidecar: Callable[..., Awaitable[Any]], fake_upstream: str, choice: str
) -> None:
    sidecar = await make_sidecar(fake_upstream, upstream_client=choice)
    hop = sidecar.app[HOP]
    assert isinstance(hop, LeanClient) == (choice == "lean")
    assert (hop is sidecar.app[SESSION]) == (choice == "aiohttp")
    resp = await sidecar.client.post("/v1/completions", json={"model": "tiny-model"})
    assert resp.status == 200
    if choice == "lean":
        assert len(hop.pool.all) == 1  # it went out on the lean pool


@pytest.fixture
def fake_upstream(upstream: Any) -> str:
    return str(upstream.make_url(""))
