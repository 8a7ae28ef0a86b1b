"""Upstream faults not covered elsewhere: the client's exact answer, and the metric counting it.

Refused connections, read timeouts, a FIN before the headers, a cut JSON body, a reply that is not
HTTP, HTML and empty error bodies, error bodies past the limit, stream drops and vLLM's in-stream
error event are in tests/test_failures.py and tests/test_forward.py.
"""

from __future__ import annotations

import asyncio
import gzip
import json
import logging
import socket
from collections.abc import Iterator

import aiohttp
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from tests.fake_vllm import FakeVLLM, raw, reset, respond, sse_chunk, sse_then_reset, start_sse
from tests.sidecar import COMPLETION, MakeSidecar, Sidecar, assert_envelope, failures
from tests.support import eventually

STREAM = {**COMPLETION, "stream": True}


def requests_total(sidecar: Sidecar, status: str, route: str = "/v1/completions") -> float:
    return sidecar.metric("vllm_sidecar_requests_total", route=route, method="POST", status=status)


def in_flight(sidecar: Sidecar) -> float:
    return sidecar.metric("vllm_sidecar_in_flight_requests", route="/v1/completions")


async def test_unreachable_host_is_502(make_sidecar: MakeSidecar) -> None:
    # 127.255.255.255 is the loopback broadcast address: connect() fails at once with
    # ENETUNREACH, and nothing leaves the machine.
    sidecar = await make_sidecar("http://127.255.255.255:8000", ready=False)
    resp = await sidecar.client.post("/v1/completions", json=COMPLETION)
    err = await assert_envelope(resp, 502, "upstream_unreachable")
    assert "unreachable" in str(err["message"]).lower()
    assert err["retryable"] is True
    assert failures(sidecar, "upstream_unreachable", "502") == 1
    assert requests_total(sidecar, "502") == 1


@pytest.fixture
def full_backlog() -> Iterator[int]:
    """A loopback port whose accept queue is full: a SYN to it is dropped, connect() hangs."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(0)
    port = int(listener.getsockname()[1])
    filler = socket.create_connection(("127.0.0.1", port))  # fills the queue; never accepted
    try:
        yield port
    finally:
        filler.close()
        listener.close()


async def test_connect_timeout_is_504(make_sidecar: MakeSidecar, full_backlog: int) -> None:
    sidecar = await make_sidecar(
        f"http://127.0.0.1:{full_backlog}", ready=False, connect_timeout=0.3
    )
    resp = await sidecar.client.post("/v1/completions", json=COMPLETION)
    err = await assert_envelope(resp, 504, "upstream_timeout")
    assert "timed out" in str(err["message"])
    assert failures(sidecar, "upstream_timeout", "504") == 1
    assert requests_total(sidecar, "504") == 1


class SlowAccept:
    """A port in front of the fake vLLM that can stop accepting (its accept queue fills, as a
    busy vLLM's does): each accepted connection is piped to the fake."""

    def __init__(self, upstream: TestServer) -> None:
        self.target = (str(upstream.host), int(upstream.port or 0))
        self.listener = socket.socket()
        self.listener.bind(("127.0.0.1", 0))
        self.listener.listen(0)
        self.listener.setblocking(False)
        self.port = int(self.listener.getsockname()[1])
        self.pipes: set[asyncio.Task[None]] = set()
        self.accepting: asyncio.Task[None] | None = None

    def start(self) -> None:
        self.accepting = asyncio.create_task(self._accept())

    async def stall(self) -> socket.socket:
        """Accept nothing more, drop the connections piped so far (the sidecar's pooled ones),
        and fill the queue: a new connection's SYN is dropped. Returns the filler."""
        assert self.accepting is not None
        for task in (self.accepting, *self.pipes):
            task.cancel()
        await asyncio.gather(self.accepting, *self.pipes, return_exceptions=True)
        return socket.create_connection(("127.0.0.1", self.port))

    def close(self) -> None:
        for task in (self.accepting, *self.pipes):
            if task is not None:
                task.cancel()
        self.listener.close()

    async def _accept(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            conn, _ = await loop.sock_accept(self.listener)
            task = asyncio.create_task(self._pipe(conn))
            self.pipes.add(task)
            task.add_done_callback(self.pipes.discard)

    async def _pipe(self, conn: socket.socket) -> None:
        reader, writer = await asyncio.open_connection(sock=conn)
        up_reader, up_writer = await asyncio.open_connection(*self.target)

        async def copy(src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
            while data := await src.read(65536):
                dst.write(data)
                await dst.drain()
            dst.close()

        try:
            await asyncio.gather(copy(reader, up_writer), copy(up_reader, writer))
        finally:
            writer.close()
            up_writer.close()


async def test_a_healthy_vllm_that_accepts_late_is_connected_again_not_a_504(
    upstream: TestServer, make_sidecar: MakeSidecar, caplog: pytest.LogCaptureFixture
) -> None:
    """vLLM alone would have kept the client waiting: nothing was sent, so try again."""
    # Guards: exchange.call_upstream's reconnect of a healthy vLLM (never_connected).
    port = SlowAccept(upstream)
    port.start()
    sidecar = await make_sidecar(f"http://127.0.0.1:{port.port}", connect_timeout=0.3)
    filler = await port.stall()
    with caplog.at_level(logging.WARNING, logger="proxy.client.resend"):
        request = asyncio.create_task(sidecar.client.post("/v1/completions", json=COMPLETION))

        def timed_out() -> bool:  # or the request is over: without the retry, a 504
            return "trying again" in caplog.text or request.done()

        await eventually(timed_out, "a first connect timed out")
        port.start()  # the filler is accepted first, then the sidecar's next SYN
        resp = await asyncio.wait_for(request, 10)
    assert resp.status == 200, await resp.text()
    assert failures(sidecar, "upstream_timeout", "504") == 0
    filler.close()
    port.close()


async def test_reset_before_headers_is_502(sidecar: Sidecar, fake: FakeVLLM) -> None:
    # A reset is no idle close (that is a FIN): vLLM had the request, and it is not sent again.
    # The first request leaves a kept-alive connection (the proxy's pool need not be the checks').
    assert (await sidecar.client.get("/v1/models")).status == 200
    fake.script("POST /v1/completions", reset())
    resp = await sidecar.client.post("/v1/completions", json=COMPLETION)
    err = await assert_envelope(resp, 502, "upstream_disconnected")
    assert "dropped" in str(err["message"])
    assert failures(sidecar, "upstream_disconnected", "502") == 1
    assert fake.forwarded() == 1


async def test_reset_mid_body_is_502(sidecar: Sidecar, fake: FakeVLLM) -> None:
    head = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 400\r\n\r\n"
    fake.script("POST /v1/completions", reset(head + b'{"id":"cmpl-1","choi', delay=0.1))
    resp = await sidecar.client.post("/v1/completions", json=COMPLETION)
    await assert_envelope(resp, 502, "upstream_disconnected")
    assert failures(sidecar, "upstream_disconnected", "502") == 1
    assert requests_total(sidecar, "502") == 1


async def test_half_json_without_content_length_is_502(sidecar: Sidecar, fake: FakeVLLM) -> None:
    # No Content-Length and no chunking: the body ends when the connection closes (RFC 9112
    # section 6.3), so a crash half way looks like a complete body to the HTTP layer.
    head = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nConnection: close\r\n\r\n"
    fake.script("POST /v1/completions", raw(head + b'{"id": "cmpl-1", "choi'))
    resp = await sidecar.client.post("/v1/completions", json=COMPLETION)
    err = await assert_envelope(resp, 502, "upstream_invalid_response")
    assert err["source"] == "sidecar"
    assert failures(sidecar, "upstream_invalid_response", "502") == 1


async def test_whole_json_without_content_length_is_relayed(
    sidecar: Sidecar, fake: FakeVLLM
) -> None:
    head = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nConnection: close\r\n\r\n"
    body = b'{"id": "cmpl-1", "choices": [{"index": 0, "text": " t0"}]}'
    fake.script("POST /v1/completions", raw(head + body))
    resp = await sidecar.client.post("/v1/completions", json=COMPLETION)
    assert resp.status == 200
    assert await resp.read() == body
    assert requests_total(sidecar, "200") == 1


async def test_chunked_body_cut_is_not_relayed_as_complete(
    sidecar: Sidecar, fake: FakeVLLM
) -> None:
    # A chunked body is relayed as it comes, so the status is already sent when the cut comes:
    # the sidecar then cuts the client's framing too, and the client's HTTP library says so.
    head = (
        b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n"
    )
    fake.script("POST /v1/completions", raw(head + b"10\r\n" + b'{"id": "cmpl-1",' + b"\r\n"))
    resp = await sidecar.client.post("/v1/completions", json=COMPLETION)
    assert resp.status == 200
    with pytest.raises(aiohttp.ClientPayloadError):
        await resp.read()
    assert failures(sidecar, "upstream_disconnected", "502") == 1
    assert requests_total(sidecar, "200") == 1


async def test_reset_mid_sse_ends_with_an_error_event(sidecar: Sidecar, fake: FakeVLLM) -> None:
    fake.script("POST /v1/completions", sse_then_reset(2))
    resp = await sidecar.client.post("/v1/completions", json=STREAM)
    assert resp.status == 200
    events = (await resp.text()).split("\n\n")
    assert events[-2:] == ["data: [DONE]", ""]
    assert sum(1 for e in events if '"text"' in e) == 2
    error = json.loads(events[-3].removeprefix("data: "))["error"]
    assert (error["reason"], error["code"]) == ("upstream_disconnected", 502)
    assert failures(sidecar, "upstream_disconnected", "502") == 1


async def test_gzip_html_error_body_is_decoded_and_counted(
    sidecar: Sidecar, fake: FakeVLLM
) -> None:
    page = b"<html><body>502 Bad Gateway (nginx)</body></html>"
    fake.script(
        "POST /v1/completions",
        respond(502, gzip.compress(page), "text/html", headers={"Content-Encoding": "gzip"}),
    )
    resp = await sidecar.client.post("/v1/completions", json=COMPLETION)
    err = await assert_envelope(resp, 502, "upstream_status")
    assert err["upstream"]["body"] == page.decode()
    assert "502 Bad Gateway (nginx)" in str(err["message"])
    assert failures(sidecar, "upstream_status", "502", source="upstream") == 1


async def test_non_utf8_header_bytes_still_get_an_envelope(
    sidecar: Sidecar, fake: FakeVLLM
) -> None:
    fake.script(
        "POST /v1/completions",
        raw(b"HTTP/1.1 500 Oops\r\nContent-Type: text/\xff\xfe\r\nContent-Length: 2\r\n\r\nab"),
    )
    resp = await sidecar.client.post("/v1/completions", json=COMPLETION)
    err = await assert_envelope(resp, 500, "upstream_status")
    assert err["upstream"]["content_type"] == "text/??"
    assert err["upstream"]["body"] == "ab"
    assert failures(sidecar, "upstream_status", "500", source="upstream") == 1


async def test_trickle_is_relayed_event_by_event_without_timing_out(
    upstream: TestServer, make_sidecar: MakeSidecar, fake: FakeVLLM
) -> None:
    # Each event is sent only after the client has read the one before: a sidecar that buffered
    # would deadlock here. The whole stream lasts longer than the read timeout.
    sidecar = await make_sidecar(str(upstream.make_url("")), read_timeout=1.0)
    received = asyncio.Event()
    n = 8

    async def lockstep(request: web.Request) -> web.StreamResponse:
        resp = await start_sse(request)
        for i in range(n):
            received.clear()
            await resp.write(sse_chunk("tiny-model", i))
            await asyncio.wait_for(received.wait(), 5)
            await asyncio.sleep(0.2)  # 8 x 0.2 s: the stream outlasts the 1 s read timeout
        await resp.write(b"data: [DONE]\n\n")
        return resp

    fake.script("POST /v1/completions", lockstep)
    resp = await sidecar.client.post("/v1/completions", json=STREAM)
    for i in range(n):
        event = await asyncio.wait_for(resp.content.readuntil(b"\n\n"), 5)
        assert json.loads(event.removeprefix(b"data: "))["choices"][0]["text"] == f" t{i}"
        received.set()
    assert await resp.read() == b"data: [DONE]\n\n"
    assert failures(sidecar, "upstream_timeout", "504") == 0
    assert requests_total(sidecar, "200") == 1
    assert in_flight(sidecar) == 0
