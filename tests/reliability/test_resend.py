"""Sent again only when vLLM never read it: a request that met uvicorn's idle close on the wire
goes again on a new connection; one vLLM read (and then closed, reset or died on) never does."""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
import struct
import threading
from collections.abc import Iterator
from typing import Any

import aiohttp
import pytest

from proxy.upstream.hop import HOP
from proxy.upstream.lean import LeanClient
from proxy.upstream.marks import Wire
from tests.sidecar import COMPLETION, MakeSidecar, Sidecar, assert_envelope

WAIT = 5.0  # every wait on the upstream's threads ends


def _read_request(conn: socket.socket) -> tuple[bytes, str] | None:
    """The next request's head and X-Request-Id (its body read past), or None at EOF."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = conn.recv(65536)
        if not chunk:
            return None
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    fields = {
        k.lower(): v
        for k, v in (line.split(b": ", 1) for line in head.split(b"\r\n")[1:] if b": " in line)
    }
    length = int(fields.get(b"content-length", b"0"))
    while len(body) < length:
        chunk = conn.recv(65536)
        if not chunk:
            return None
        body += chunk
    return head, fields.get(b"x-request-id", b"none").decode()


def _answer(rid: str) -> bytes:
    body = json.dumps({"request_id": rid}).encode()
    head = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n"
    return head % len(body) + body


class RawUpstream:
    """A raw HTTP/1.1 server on its own threads that answers `answers` POSTs on a connection,
    then does one of these to the next (`fault`):

    - "cross": uvicorn's idle close crossing the request on the wire. The connection is closed
      (a FIN, nothing unread) at the moment the sidecar takes it from its pool to send, before
      the request is written: `cross()`, called there, closes it in this server's thread while
      the sidecar's loop waits, so that the request meets a socket already closed, as it does
      when the two pass each other in flight;
    - "read-close": reads the whole request, holds it `hold` seconds and closes unanswered (vLLM
      had it: a weight update now waiting for a broadcast, a generation running);
    - "read-reset": reads it and resets the connection;
    `then_down` stops listening as the fault happens. GETs are answered with Connection: close.
    """

    def __init__(
        self, answers: int, fault: str, *, hold: float = 0.0, then_down: bool = False
    ) -> None:
        self.answers, self.fault, self.hold, self.then_down = answers, fault, hold, then_down
        self.answered: list[str] = []
        self.unanswered: list[str] = []
        self._listener = socket.create_server(("127.0.0.1", 0))
        self._idle: list[socket.socket] = []  # connections waiting to be crossed, newest last
        self._crossed = threading.Event()
        self._lock = threading.Lock()
        self._conns: list[socket.socket] = []
        self._threads = [threading.Thread(target=self._accept, daemon=True)]
        self._threads[0].start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._listener.getsockname()[1]}"

    def cross(self) -> None:
        """Close the connection waiting for its unanswered request, and wait until it is."""
        with self._lock:
            conn = self._idle.pop() if self._idle else None
        if conn is None:
            return
        conn.close()
        if self.then_down:
            self.close()

    def close(self) -> None:
        """Stop listening: new connections are refused (shutdown wakes the blocked accept)."""
        with contextlib.suppress(OSError):
            self._listener.shutdown(socket.SHUT_RDWR)
        self._listener.close()

    def release(self) -> None:
        """Stop, and close every connection still open (the server's end)."""
        self.close()
        with self._lock:
            conns, self._conns = self._conns, []
        for conn in conns:
            conn.close()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self._listener.accept()
            except OSError:
                return
            conn.settimeout(WAIT)
            with self._lock:
                self._conns.append(conn)
            thread = threading.Thread(target=self._serve, args=(conn,), daemon=True)
            self._threads.append(thread)
            thread.start()

    def _serve(self, conn: socket.socket) -> None:
        served = 0
        try:
            while True:
                got = _read_request(conn)
                if got is None:
                    return
                head, rid = got
                if not head.startswith(b"POST"):
                    conn.sendall(
                        _answer(rid).replace(b"\r\n\r\n", b"\r\nConnection: close\r\n\r\n")
                    )
                    conn.close()
                    return
                if served == self.answers:
                    self.unanswered.append(rid)
                    if self.then_down:
                        self.close()
                    threading.Event().wait(self.hold)
                    if self.fault == "read-reset":
                        conn.setsockopt(
                            socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0)
                        )
                    conn.close()
                    return
                served += 1
                self.answered.append(rid)
                if served == self.answers and self.fault == "cross":
                    with self._lock:  # before the answer: the next request may follow at once
                        self._idle.append(conn)
                    conn.sendall(_answer(rid))
                    return  # cross() closes it; the request it then meets is never read
                conn.sendall(_answer(rid))
        except OSError:
            conn.close()


@contextlib.contextmanager
def raw_upstream(answers: int, fault: str, **options: Any) -> Iterator[RawUpstream]:
    upstream = RawUpstream(answers, fault, **options)
    try:
        yield upstream
    finally:
        upstream.release()


def crossing_on_reuse(sidecar: Sidecar, upstream: RawUpstream) -> None:
    """The crossing made exact: each time the sidecar takes a kept-alive connection that carried
    a request already, the upstream closes it before the sidecar's loop runs again, so that the
    FIN is in flight (not yet read) as the request is written, on either upstream client."""
    hop = sidecar.app[HOP]
    if isinstance(hop, LeanClient):
        acquire = hop.pool.acquire

        async def acquire_crossed() -> Any:
            conn = await acquire()
            assert conn.wire is not None
            if conn.wire.sent > 0:
                upstream.cross()
            return conn

        hop.pool.acquire = acquire_crossed  # type: ignore[method-assign]
        return
    assert isinstance(hop, aiohttp.ClientSession)
    connector = hop.connector
    assert connector is not None
    connect = connector.connect

    async def connect_crossed(*args: Any, **kwargs: Any) -> Any:
        conn = await connect(*args, **kwargs)
        wire: Wire | None = getattr(conn.protocol, "_wire", None)
        if wire is not None and wire.sent > 0:
            upstream.cross()
        return conn

    connector.connect = connect_crossed  # type: ignore[method-assign]


async def in_front_of(upstream: RawUpstream, make_sidecar: MakeSidecar) -> Sidecar:
    """A sidecar for the raw upstream: its names given, no health checks to share its pool."""
    sidecar = await make_sidecar(
        upstream.url, ready=False, served_model_names=["tiny-model"], health_interval=3600
    )
    if upstream.fault == "cross":
        crossing_on_reuse(sidecar, upstream)
    return sidecar


async def post(sidecar: Sidecar, rid: str, path: str = "/v1/completions") -> aiohttp.ClientResponse:
    resp = await sidecar.client.post(path, json=COMPLETION, headers={"X-Request-Id": rid})
    await resp.read()
    return resp


async def test_a_request_that_meets_vllm_closing_an_idle_connection_is_sent_again(
    make_sidecar: MakeSidecar,
) -> None:
    """vLLM closes a connection idle for 5 s; a request written as the close is on its way
    was never read (vLLM's kernel acknowledged none of it): it goes again on a new connection,
    whatever its method, and is answered there."""
    with raw_upstream(answers=1, fault="cross") as upstream:
        sidecar = await in_front_of(upstream, make_sidecar)
        ids = [f"client-{i}" for i in range(4)]
        for rid in ids:  # one after the other: each after the first reuses a connection
            resp = await post(sidecar, rid)
            assert resp.status == 200, await resp.text()
            assert await resp.json() == {"request_id": rid}
        resp = await post(sidecar, "pause", "/pause")
        assert resp.status == 200, await resp.text()
    assert upstream.unanswered == []  # the crossed requests were never read
    assert upstream.answered == [*ids, "pause"]  # each answered once, on a new connection


@pytest.mark.parametrize("fault", ["read-close", "read-reset"])
@pytest.mark.parametrize("path", ["/v1/completions", "/update_weights", "/finish_weight_update"])
async def test_a_request_vllm_read_is_never_sent_again(
    make_sidecar: MakeSidecar, fault: str, path: str
) -> None:
    """vLLM read the whole request, held it, and closed (or reset) its kept-alive connection
    unanswered: it may have run. Sent again, a weight update over NCCL would wait forever for a
    broadcast the trainer does not send twice (a hung run), a version-less finish would skip a
    version. The client gets a 502 saying so, and vLLM saw the request once."""
    with raw_upstream(answers=1, fault=fault, hold=0.3) as upstream:
        sidecar = await in_front_of(upstream, make_sidecar)
        assert (await post(sidecar, "first")).status == 200
        resp = await sidecar.client.post(path, json=COMPLETION, headers={"X-Request-Id": "once"})
        err = await assert_envelope(resp, 502, "upstream_disconnected")
        assert "not sent again" in err["message"]
    assert upstream.unanswered == ["once"]
    assert upstream.answered == ["first"]


async def test_a_resend_that_finds_vllm_gone_reports_the_drop_not_an_unsent_request(
    make_sidecar: MakeSidecar,
) -> None:
    """A request that met an idle close is sent again; when vLLM went down with the close, the
    new connection is refused. Nothing says the request was never sent to a vLLM that was
    going away, so the client is told the connection dropped (`upstream_disconnected`), never
    `upstream_unreachable`, which says that nothing was sent."""
    with raw_upstream(answers=1, fault="cross", then_down=True) as upstream:
        sidecar = await in_front_of(upstream, make_sidecar)
        assert (await post(sidecar, "first")).status == 200
        resp = await sidecar.client.post(
            "/v1/completions", json=COMPLETION, headers={"X-Request-Id": "gone"}
        )
        err = await assert_envelope(resp, 502, "upstream_disconnected")
        assert "sent again" in err["message"]
    assert upstream.answered == ["first"]


async def test_a_connection_of_its_own_closed_unanswered_is_not_sent_again(
    make_sidecar: MakeSidecar,
) -> None:
    """A new connection vLLM closes without an answer is vLLM failing on the request: it
    may have run, so the client gets the 502, and vLLM saw the request once."""
    with raw_upstream(answers=0, fault="read-close") as upstream:
        sidecar = await in_front_of(upstream, make_sidecar)
        resp = await sidecar.client.post(
            "/v1/completions", json=COMPLETION, headers={"X-Request-Id": "once"}
        )
        await assert_envelope(resp, 502, "upstream_disconnected")
    assert upstream.unanswered == ["once"]


async def test_the_proof_is_tcps_acknowledgement_of_the_request() -> None:
    """marks.Wire on a real socket pair: a request written after the peer closed is never
    acknowledged; one the peer received is, whether or not it answers."""
    loop = asyncio.get_running_loop()
    for peer_reads in (False, True):
        listener = socket.create_server(("127.0.0.1", 0))
        listener.setblocking(False)
        reader, writer = await asyncio.open_connection(*listener.getsockname())
        peer, _ = await loop.sock_accept(listener)
        wire = Wire(writer.transport)
        wire.sending()
        if peer_reads:
            writer.write(b"request")
            assert await loop.sock_recv(peer, 100) == b"request"
            peer.close()
        else:
            peer.close()  # the FIN crosses the request
            writer.write(b"request")
        try:
            assert await asyncio.wait_for(reader.read(), WAIT) == b""
            error: OSError | None = None
        except ConnectionError as exc:
            error = exc
        wire.lost(error)
        assert wire.unread is not peer_reads
        writer.close()
        listener.close()
