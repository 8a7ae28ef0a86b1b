"""The memory budget: bodies held whole take from it; past it answers stream, requests get 503."""

from __future__ import annotations

import asyncio
import io
import json
from collections.abc import AsyncIterator

from aiohttp.test_utils import TestServer

from proxy.client.inbound import STREAM_FROM
from proxy.engine.lifecycle import LIFECYCLE
from tests.fake_vllm import FakeVLLM, respond
from tests.sidecar import MakeSidecar, assert_envelope, control, failures
from tests.support import eventually

CHUNKED_BODY = 32 << 20
# A body that streams (past 1 MiB, `model` first) while the engine serves.
BIG = b'{"model": "org/tiny-model", "prompt": ' + json.dumps([[7] * 600_000]).encode() + b"}"
assert STREAM_FROM < len(BIG) < 2 * STREAM_FROM


async def test_request_body_past_the_budget_gets_a_retryable_503(
    upstream: TestServer, fake: FakeVLLM, make_sidecar: MakeSidecar
) -> None:
    sidecar = await make_sidecar(str(upstream.make_url("")), buffer_budget_bytes=1000)
    body = b'{"model": "tiny-model", "prompt": "' + b"x" * 2000 + b'"}'
    resp = await sidecar.client.post(
        "/v1/completions", data=body, headers={"Content-Type": "application/json"}
    )
    err = await assert_envelope(resp, 503, "buffer_budget_exhausted")
    assert err["retryable"] is True
    assert failures(sidecar, "buffer_budget_exhausted", "503") == 1
    assert not any(r.raw_path == "/v1/completions" for r in fake.requests)
    # The budget is given back: a body that fits goes through.
    ok = await sidecar.client.post("/v1/completions", json={"model": "tiny-model", "prompt": "x"})
    assert ok.status == 200
    assert sidecar.metric("vllm_sidecar_buffered_bytes") == 0


async def test_a_chunked_request_body_takes_from_the_budget_too(
    upstream: TestServer, fake: FakeVLLM, make_sidecar: MakeSidecar
) -> None:
    sidecar = await make_sidecar(str(upstream.make_url("")), buffer_budget_bytes=1000)
    body = b'{"model": "tiny-model", "prompt": "' + b"x" * 2000 + b'"}'

    async def chunks() -> AsyncIterator[bytes]:  # no Content-Length: chunked framing
        yield body[:1000]
        yield body[1000:]

    resp = await sidecar.client.post(
        "/v1/completions", data=chunks(), headers={"Content-Type": "application/json"}
    )
    await assert_envelope(resp, 503, "buffer_budget_exhausted")
    assert not any(r.raw_path == "/v1/completions" for r in fake.requests)
    assert sidecar.metric("vllm_sidecar_buffered_bytes") == 0


async def test_answer_past_the_budget_streams_through_whole(
    upstream: TestServer, fake: FakeVLLM, make_sidecar: MakeSidecar
) -> None:
    sidecar = await make_sidecar(str(upstream.make_url("")), buffer_budget_bytes=1000)
    answer = b'{"text": "' + b"y" * 5000 + b'"}'
    fake.script("POST /v1/tokenize", respond(200, answer))
    resp = await sidecar.client.post("/v1/tokenize", json={"prompt": "x"})
    assert resp.status == 200
    assert resp.headers["Content-Length"] == str(len(answer))
    assert await resp.read() == answer
    assert sidecar.metric("vllm_sidecar_buffer_budget_refusals_total") == 1
    assert sidecar.metric("vllm_sidecar_buffered_bytes") == 0


async def test_a_chunked_body_is_refused_at_the_budget_while_the_rest_is_on_the_wire(
    upstream: TestServer, fake: FakeVLLM, make_sidecar: MakeSidecar
) -> None:
    # Guards: inbound.read_counted taking each part from the budget as it arrives (it was read
    # whole first: 40 MiB chunked bodies took 343 MiB against an 8 MiB budget).
    sidecar = await make_sidecar(str(upstream.make_url("")), buffer_budget_bytes=256 << 10)
    assert sidecar.client.port is not None
    reader, writer = await asyncio.open_connection("127.0.0.1", sidecar.client.port)
    writer.write(
        b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        b"Transfer-Encoding: chunked\r\n\r\n"
    )
    answer = asyncio.create_task(reader.readuntil(b"\r\n\r\n"))
    part, sent = b'{"model": "tiny-model", "prompt": "' + b"x" * (64 << 10), 0
    # Far more than the budget and the socket buffers between: a sidecar that reads the whole
    # body before asking the budget answers only after the last chunk.
    while not answer.done() and sent < CHUNKED_BODY:
        writer.write(b"%x\r\n%s\r\n" % (len(part), part))
        await writer.drain()
        sent += len(part)
        part = b"x" * (64 << 10)
    writer.write(b'2\r\n"}\r\n0\r\n\r\n')
    head = await asyncio.wait_for(answer, 10)
    writer.close()
    assert head.startswith(b"HTTP/1.1 503 ")
    assert b"X-Sidecar-Error: buffer_budget_exhausted" in head
    assert sent < CHUNKED_BODY  # answered while the rest was still on the wire
    assert failures(sidecar, "buffer_budget_exhausted", "503") == 1
    assert not any(r.raw_path == "/v1/completions" for r in fake.requests)
    await eventually(lambda: sidecar.metric("vllm_sidecar_buffered_bytes") == 0)


async def test_a_held_streamed_body_takes_from_the_budget(
    upstream: TestServer, fake: FakeVLLM, make_sidecar: MakeSidecar
) -> None:
    """A large model-first body held in a pause: its size is taken from the budget for as long
    as it is held; one that does not fit gets the 503 instead of a hold outside it."""
    # Guards: inbound._read_whole (a held streamed body was outside the budget: 300 of them
    # held, `buffered_bytes` 0, RSS +224 MiB against a 72 MiB bound).
    sidecar = await make_sidecar(str(upstream.make_url("")), buffer_budget_bytes=2 << 20)
    lifecycle = sidecar.app[LIFECYCLE]
    await eventually(lambda: lifecycle.version == "default")
    await control(sidecar, "/pause?mode=keep")
    headers = {"Content-Type": "application/json"}
    first = asyncio.create_task(
        sidecar.client.post("/v1/completions", data=io.BytesIO(BIG), headers=headers)
    )
    await eventually(lambda: lifecycle.held == 1, "the first body is held")
    assert sidecar.metric("vllm_sidecar_buffered_bytes") == len(BIG)
    second = await sidecar.client.post("/v1/completions", data=io.BytesIO(BIG), headers=headers)
    await assert_envelope(second, 503, "buffer_budget_exhausted")
    assert (lifecycle.held, fake.forwarded()) == (1, 0)
    await control(sidecar, "/resume")
    resp = await asyncio.wait_for(first, 10)
    assert resp.status == 200
    assert fake.last("/v1/completions").body == BIG.replace(b"org/tiny-model", b"tiny-model", 1)
    assert fake.forwarded() == 1
    await eventually(lambda: sidecar.metric("vllm_sidecar_buffered_bytes") == 0)


async def test_a_body_whose_phase_begins_while_its_head_is_read_is_held_within_the_budget(
    upstream: TestServer, fake: FakeVLLM, make_sidecar: MakeSidecar
) -> None:
    # Guards: inbound._held_whole (the engine served when the head came, not once it was read).
    sidecar = await make_sidecar(str(upstream.make_url("")), buffer_budget_bytes=2 << 20)
    lifecycle = sidecar.app[LIFECYCLE]
    await eventually(lambda: lifecycle.version == "default")
    assert sidecar.client.port is not None
    reader, writer = await asyncio.open_connection("127.0.0.1", sidecar.client.port)
    writer.write(
        b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        b"Content-Length: %d\r\n\r\n%s" % (len(BIG), BIG[:1000])
    )
    route = {"route": "/v1/completions"}
    await eventually(lambda: sidecar.metric("vllm_sidecar_in_flight_requests", **route) == 1)
    await control(sidecar, "/pause?mode=keep")
    writer.write(BIG[1000:])
    await eventually(lambda: lifecycle.held == 1, "the request is held")
    rewritten = BIG.replace(b"org/tiny-model", b"tiny-model", 1)
    assert sidecar.metric("vllm_sidecar_buffered_bytes") == len(rewritten)
    await control(sidecar, "/resume")
    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)
    writer.close()
    assert head.startswith(b"HTTP/1.1 200 ")
    assert fake.last("/v1/completions").body == rewritten
