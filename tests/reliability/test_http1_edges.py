"""HTTP/1 edges answered as nginx answers them: a chunked body the parser gives up on after its
head, a stream to an HTTP/1.0 client, and an expectation the sidecar does not know."""

from __future__ import annotations

import asyncio
import json

import pytest
from aiohttp.test_utils import TestServer

from tests.fake_vllm import FakeVLLM
from tests.metrics import sample, scrape
from tests.sidecar import Sidecar, StartSidecar
from tests.support import eventually

ROUTE = {"route": "/v1/completions"}
# Every wait here only turns a hang into a failure: the sidecar's own timeouts are far longer.
DEADLINE = 20.0
CHUNKED_HEAD = (
    b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
    b"Transfer-Encoding: chunked\r\n\r\n"
)


def parts(reply: bytes) -> tuple[int, dict[str, str], bytes]:
    """A raw answer's status, fields (names in lower case) and body as sent."""
    head, _, body = reply.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    fields = dict(line.split(": ", 1) for line in lines[1:])
    return int(lines[0].split(" ")[1]), {k.lower(): v for k, v in fields.items()}, body


@pytest.mark.parametrize(
    "bad",
    [
        pytest.param(b"zz\r\n", id="chunk-size-zz"),
        pytest.param(b'4\r\n{"model": "tiny-model"}\r\n0\r\n\r\n', id="data-past-its-size"),
    ],
)
async def test_a_malformed_chunked_body_after_its_head_gets_a_400_envelope_and_a_close(
    upstream: TestServer, fake: FakeVLLM, start_sidecar: StartSidecar, bad: bytes
) -> None:
    """nginx answers 400 at once. aiohttp's C parser queues its error as a next message and
    leaves the body unended: the handler waited for --client-body-timeout (60 s), then the
    client got a silent close, counted as 499."""
    proc = await start_sidecar(str(upstream.make_url("")), "--client-body-timeout", "600")
    url = proc.url
    admin = proc.admin_url
    reader, writer = await asyncio.open_connection("127.0.0.1", int(url.rsplit(":", 1)[1]))
    try:
        writer.write(CHUNKED_HEAD)
        await writer.drain()

        async def reading() -> bool:  # the head parsed, its handler waiting for the body
            return sample(await scrape(admin), "vllm_sidecar_in_flight_requests", **ROUTE) == 1

        await eventually(reading, "the handler reads the body")
        writer.write(bad)
        reply = await asyncio.wait_for(reader.read(), DEADLINE)  # to EOF: the connection closes
    finally:
        writer.close()
    status, fields, body = parts(reply)
    assert (status, fields["x-sidecar-error"]) == (400, "invalid_request")
    assert fields["connection"] == "close"
    error = json.loads(body)["error"]
    assert error["request_id"] == fields["x-request-id"]
    assert "chunk" in error["message"]
    assert fake.forwarded() == 0
    counted = sample(
        await scrape(admin), "vllm_sidecar_requests_total", **ROUTE, method="POST", status="400"
    )
    assert counted == 1


async def test_a_stream_to_an_http10_client_ends_with_the_close(
    sidecar: Sidecar, fake: FakeVLLM
) -> None:
    """Without a length, an HTTP/1.0 body ends only at the close (RFC 9112 section 6.3), so the
    connection closes after it whatever `Connection: keep-alive` asked, as nginx closes it.
    aiohttp wrote no `Connection` field but kept the connection open for its idle timeout."""
    body = json.dumps({"model": "tiny-model", "prompt": "x", "stream": True}).encode()
    reader, writer = await asyncio.open_connection("127.0.0.1", sidecar.client.port)
    try:
        writer.write(
            b"POST /v1/completions HTTP/1.0\r\nHost: x\r\nConnection: keep-alive\r\n"
            b"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body)
        )
        reply = await asyncio.wait_for(reader.read(), DEADLINE)  # to EOF, the body's end
    finally:
        writer.close()
    status, fields, events = parts(reply)
    assert status == 200
    assert "connection" not in fields  # HTTP/1.0's default: the close ends the body
    assert "content-length" not in fields
    assert events.endswith(b"data: [DONE]\n\n")


async def test_an_http10_answer_with_a_length_keeps_its_connection(
    sidecar: Sidecar, fake: FakeVLLM
) -> None:
    body = json.dumps({"model": "tiny-model", "prompt": "x"}).encode()
    ask = b"POST /v1/completions HTTP/1.0\r\nHost: x\r\nConnection: keep-alive\r\n"
    ask += b"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body)
    reader, writer = await asyncio.open_connection("127.0.0.1", sidecar.client.port)
    try:
        for _ in range(2):  # the second on the same connection
            writer.write(ask)
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), DEADLINE)
            status, fields, _ = parts(head)
            assert (status, fields["connection"].lower()) == (200, "keep-alive")
            await reader.readexactly(int(fields["content-length"]))
    finally:
        writer.close()
    assert fake.forwarded() == 2


async def test_an_unknown_expectation_is_ignored_and_the_request_served(
    sidecar: Sidecar, fake: FakeVLLM
) -> None:
    """As nginx and uvicorn do (RFC 9110 section 10.1.1 allows a 417; no peer sends one):
    aiohttp's plain-text 417 had no request id, no envelope, no count and no log line."""
    body = json.dumps({"model": "tiny-model", "prompt": "x"}).encode()
    reader, writer = await asyncio.open_connection("127.0.0.1", sidecar.client.port)
    try:
        writer.write(
            b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nExpect: x-unknown\r\n"
            b"Content-Type: application/json\r\nContent-Length: %d\r\nConnection: close\r\n\r\n%s"
            % (len(body), body)
        )
        reply = await asyncio.wait_for(reader.read(), DEADLINE)
    finally:
        writer.close()
    status, fields, _ = parts(reply)
    assert status == 200
    assert "x-request-id" in fields
    assert fake.forwarded() == 1
    assert "Expect" not in fake.last("/v1/completions").headers
    counted = sidecar.metric("vllm_sidecar_requests_total", **ROUTE, method="POST", status="200")
    assert counted == 1
