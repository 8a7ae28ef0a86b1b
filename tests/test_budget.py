"""The memory budget: bodies held whole take from it; past it answers stream, requests get 503."""

from __future__ import annotations

from collections.abc import AsyncIterator

from aiohttp.test_utils import TestServer

from tests.fake_vllm import FakeVLLM, respond
from tests.sidecar import MakeSidecar, assert_envelope, failures


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
