"""Every failure reason: the client's status, envelope and header, and the failure metric."""

from __future__ import annotations

import asyncio
import json

import openai
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from tests.fake_vllm import (
    FakeVLLM,
    hang,
    raw,
    respond,
    sse_chunk,
    sse_then_drop,
    start_sse,
)
from tests.sidecar import COMPLETION, MakeSidecar, Sidecar, assert_envelope, failures
from tests.support import free_port


async def test_refused_connection_is_502(make_sidecar: MakeSidecar) -> None:
    sidecar = await make_sidecar(f"http://127.0.0.1:{free_port()}", ready=False)
    resp = await sidecar.client.post("/v1/completions", json=COMPLETION)
    err = await assert_envelope(resp, 502, "upstream_unreachable")
    assert err["source"] == "sidecar"
    assert err["retryable"] is True
    assert "Could not connect to the upstream" in str(err["message"])
    assert failures(sidecar, "upstream_unreachable", "502") == 1


async def test_read_timeout_is_504(
    upstream: TestServer, make_sidecar: MakeSidecar, fake: FakeVLLM
) -> None:
    sidecar = await make_sidecar(str(upstream.make_url("")), read_timeout=0.2)
    fake.script("POST /v1/completions", hang())
    resp = await sidecar.client.post("/v1/completions", json=COMPLETION)
    await assert_envelope(resp, 504, "upstream_timeout")
    assert failures(sidecar, "upstream_timeout", "504") == 1


async def test_reset_before_headers_is_502(sidecar: Sidecar, fake: FakeVLLM) -> None:
    # A kept-alive connection closed unanswered after vLLM read the request: it may have run, so
    # it is not sent again (tests/reliability/test_resend.py). The first request leaves a
    # kept-alive connection (the proxy's pool need not be the checks').
    assert (await sidecar.client.get("/v1/models")).status == 200
    fake.script("POST /v1/completions", raw(b""), times=2)
    resp = await sidecar.client.post("/v1/completions", json=COMPLETION)
    err = await assert_envelope(resp, 502, "upstream_disconnected")
    assert "not sent again" in str(err["message"])
    assert failures(sidecar, "upstream_disconnected", "502") == 1
    assert fake.forwarded() == 1


async def test_cut_json_body_is_502(sidecar: Sidecar, fake: FakeVLLM) -> None:
    fake.script(
        "POST /v1/completions",
        raw(
            b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 500\r\n\r\n"
            b'{"id": "cmpl-1", "choi'
        ),
    )
    resp = await sidecar.client.post("/v1/completions", json=COMPLETION)
    await assert_envelope(resp, 502, "upstream_disconnected")
    assert failures(sidecar, "upstream_disconnected", "502") == 1


@pytest.mark.parametrize("reply", [b"SSH-2.0-OpenSSH_9.6\r\n\r\n", b"\x00\x01garbage\r\n\r\n"])
async def test_not_http_is_502(sidecar: Sidecar, fake: FakeVLLM, reply: bytes) -> None:
    fake.script("POST /v1/completions", raw(reply))
    resp = await sidecar.client.post("/v1/completions", json=COMPLETION)
    err = await assert_envelope(resp, 502, "upstream_invalid_response")
    assert "invalid HTTP response" in str(err["message"])
    assert failures(sidecar, "upstream_invalid_response", "502") == 1


@pytest.mark.parametrize(
    "body", ['{"choices": []}', '{"id":"cmpl-1","choices":[],"usage":{}}', '{"choices":[ ]}']
)
async def test_a_generation_with_no_choices_is_502(
    sidecar: Sidecar, fake: FakeVLLM, body: str
) -> None:
    # Relayed, SkyRL's stock clients index the empty list and die with an IndexError.
    fake.script("POST /v1/completions", respond(200, body))
    resp = await sidecar.client.post("/v1/completions", json=COMPLETION)
    err = await assert_envelope(resp, 502, "upstream_invalid_response")
    assert "empty `choices`" in str(err["message"])
    assert failures(sidecar, "upstream_invalid_response", "502") == 1


async def test_choices_that_are_text_or_another_route_pass(
    sidecar: Sidecar, fake: FakeVLLM
) -> None:
    # A prompt about `"choices": []` is escaped inside its string; other routes are not judged.
    text = json.dumps({"choices": [{"index": 0, "text": '{"choices": []}'}]})
    fake.script("POST /v1/completions", respond(200, text))
    resp = await sidecar.client.post("/v1/completions", json=COMPLETION)
    assert resp.status == 200
    assert await resp.text() == text
    fake.script("POST /v1/embeddings", respond(200, '{"choices": []}'))
    assert (await sidecar.client.post("/v1/embeddings", json=COMPLETION)).status == 200


async def test_html_500_is_enveloped_with_its_text(sidecar: Sidecar, fake: FakeVLLM) -> None:
    fake.script(
        "POST /v1/completions",
        respond(500, "<html><h1>Internal Server Error</h1></html>", content_type="text/html"),
    )
    resp = await sidecar.client.post("/v1/completions", json=COMPLETION)
    err = await assert_envelope(resp, 500, "upstream_status")
    assert err["upstream"]["body"] == "<html><h1>Internal Server Error</h1></html>"
    assert err["retryable"] is True
    assert failures(sidecar, "upstream_status", "500", source="upstream") == 1


async def test_503_empty_body_keeps_retry_after(sidecar: Sidecar, fake: FakeVLLM) -> None:
    fake.script("POST /v1/completions", respond(503, b"", headers={"Retry-After": "7"}))
    resp = await sidecar.client.post("/v1/completions", json=COMPLETION)
    err = await assert_envelope(resp, 503, "upstream_status")
    assert resp.headers["Retry-After"] == "7"
    assert str(err["message"]).endswith("(empty body)")
    assert err["upstream"]["body"] == ""
    assert err["retryable"] is True
    assert failures(sidecar, "upstream_status", "503", source="upstream") == 1


@pytest.mark.parametrize(("options", "limit"), [({}, 1 << 20), ({"error_body_bytes": 1000}, 1000)])
async def test_10mb_error_body_is_cut_at_the_limit_and_marked(
    upstream: TestServer,
    make_sidecar: MakeSidecar,
    fake: FakeVLLM,
    options: dict[str, int],
    limit: int,
) -> None:
    sidecar = await make_sidecar(str(upstream.make_url("")), **options)
    fake.script("POST /v1/completions", respond(500, b"E" * 10_000_000, content_type="text/plain"))
    resp = await sidecar.client.post("/v1/completions", json=COMPLETION)
    err = await assert_envelope(resp, 500, "upstream_status")
    up = err["upstream"]
    assert up["body_truncated"] is True
    assert up["body"] == "E" * limit
    assert len(await resp.read()) < 2 * limit + 1000
    assert failures(sidecar, "upstream_status", "500", source="upstream") == 1


async def test_stream_dropped_mid_way_ends_with_an_error_event(
    sidecar: Sidecar, fake: FakeVLLM
) -> None:
    fake.script("POST /v1/completions", sse_then_drop(2))
    resp = await sidecar.client.post("/v1/completions", json={**COMPLETION, "stream": True})
    assert resp.status == 200
    events = (await resp.text()).split("\n\n")
    assert events[-2:] == ["data: [DONE]", ""]
    error = json.loads(events[-3].removeprefix("data: "))["error"]
    assert (error["reason"], error["code"], error["source"]) == (
        "upstream_disconnected",
        502,
        "sidecar",
    )
    assert error["request_id"] == resp.headers["X-Request-Id"]
    assert sum(1 for e in events if '"text"' in e) == 2
    assert failures(sidecar, "upstream_disconnected", "502") == 1


# Where vLLM's third event is cut: its first byte, inside the JSON, all of the `data:` line
# but its newline, and all but the blank line that would end the event.
EVENT = sse_chunk("tiny-model", 2)


@pytest.mark.parametrize("cut", [1, 40, len(EVENT) - 2, len(EVENT) - 1])
async def test_a_stream_cut_inside_an_event_drops_the_unended_event(
    sidecar: Sidecar, fake: FakeVLLM, cut: int
) -> None:
    # An unended event is never dispatched (WHATWG HTML 9.2.6); relayed, its half JSON line
    # would reach the client glued before the error event.
    fake.script("POST /v1/completions", sse_then_drop(2, cut=cut))
    resp = await sidecar.client.post("/v1/completions", json={**COMPLETION, "stream": True})
    events = [e for e in (await resp.text()).split("\n\n") if e.strip()]
    assert events[-1] == "data: [DONE]"
    payloads = [json.loads(e.removeprefix("data: ")) for e in events[:-1]]
    assert [p["choices"][0]["text"] for p in payloads[:-1]] == [" t0", " t1"]
    assert payloads[-1]["error"]["reason"] == "upstream_disconnected"
    assert failures(sidecar, "upstream_disconnected", "502") == 1


async def test_the_openai_sdk_reads_the_error_of_a_stream_cut_inside_an_event(
    sidecar: Sidecar, fake: FakeVLLM
) -> None:
    fake.script("POST /v1/completions", sse_then_drop(2, cut=40))
    client = openai.AsyncOpenAI(base_url=str(sidecar.client.make_url("/v1")), api_key="x")
    stream = await client.completions.create(model="tiny-model", prompt="x", stream=True)
    texts: list[str] = []

    async def read_all() -> None:
        async for chunk in stream:
            texts.append(chunk.choices[0].text)

    with pytest.raises(openai.APIError) as caught:
        await read_all()
    await client.close()
    assert texts == [" t0", " t1"]
    assert "The upstream connection dropped" in caught.value.message


async def test_an_event_split_across_reads_is_relayed_whole(
    sidecar: Sidecar, fake: FakeVLLM
) -> None:
    async def split(request: web.Request) -> web.StreamResponse:
        resp = await start_sse(request)
        for i in range(3):
            event = sse_chunk("tiny-model", i)
            await resp.write(event[:30])
            await asyncio.sleep(0.05)
            await resp.write(event[30:])
        await resp.write(b"data: [DONE]\n\n")
        return resp

    fake.script("POST /v1/completions", split)
    resp = await sidecar.client.post("/v1/completions", json={**COMPLETION, "stream": True})
    expected = b"".join(sse_chunk("tiny-model", i) for i in range(3)) + b"data: [DONE]\n\n"
    assert await resp.read() == expected
    assert failures(sidecar, "upstream_disconnected", "502") == 0


async def test_stream_read_timeout_ends_with_an_error_event(
    upstream: TestServer, make_sidecar: MakeSidecar, fake: FakeVLLM
) -> None:
    sidecar = await make_sidecar(str(upstream.make_url("")), read_timeout=0.3)
    fake.script("POST /v1/completions", sse_then_drop(1, delay=2))
    resp = await sidecar.client.post("/v1/completions", json={**COMPLETION, "stream": True})
    text = await resp.text()
    assert '"reason":"upstream_timeout"' in text
    assert text.endswith("data: [DONE]\n\n")
