"""The proxy over real sockets, in front of the scripted fake vLLM."""

from __future__ import annotations

import asyncio
import gzip
import json
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from proxy.upstream.discovery import DISCOVERY
from tests.fake_vllm import FakeVLLM, respond, sse_chunk, start_sse
from tests.sidecar import MakeSidecar, Sidecar, raw_http

pytestmark = pytest.mark.usefixtures("upstream")


def resolutions(sidecar: Sidecar, rule: str, served: str) -> float:
    return sidecar.metric("vllm_sidecar_model_resolutions_total", rule=rule, served_model=served)


@pytest.mark.parametrize(
    ("requested", "rule"),
    [
        ("tiny-model", "exact"),
        ("/models/sidecar-test/tiny-model", "root"),
        ("sidecar-test/tiny-model", "basename"),
        ("Some-Org/Tiny-Model", "case"),
    ],
)
async def test_each_rule_reaches_the_served_name(
    sidecar: Sidecar, fake: FakeVLLM, requested: str, rule: str
) -> None:
    resp = await sidecar.client.post(
        "/v1/completions", json={"model": requested, "prompt": [[1, 2], [3]], "max_tokens": 4}
    )
    assert resp.status == 200
    body = await resp.json()
    assert [c["index"] for c in body["choices"]] == [0, 1]
    assert fake.last("/v1/completions").json()["model"] == "tiny-model"
    assert resolutions(sidecar, rule, "tiny-model") == 1


async def test_alias_from_configuration(
    upstream: TestServer, make_sidecar: MakeSidecar, fake: FakeVLLM
) -> None:
    sidecar = await make_sidecar(str(upstream.make_url("")), aliases={"policy": "tiny-model"})
    resp = await sidecar.client.post(
        "/v1/chat/completions",
        json={"model": "policy", "messages": [{"role": "user", "content": "hi"}]},
    )
    assert resp.status == 200
    assert fake.last("/v1/chat/completions").json()["model"] == "tiny-model"
    assert resolutions(sidecar, "alias", "tiny-model") == 1


async def test_only_the_model_bytes_change(sidecar: Sidecar, fake: FakeVLLM) -> None:
    raw = (
        b'{ "prompt" : [[1,2 ,3]],\n"model":"org/tiny-model",  "temperature": 1.50,'
        b' "extra": "\\u00e9"}'
    )
    resp = await sidecar.client.post(
        "/v1/completions", data=raw, headers={"Content-Type": "application/json"}
    )
    assert resp.status == 200
    assert fake.last("/v1/completions").body == raw.replace(b'"org/tiny-model"', b'"tiny-model"')


async def test_served_name_passes_byte_for_byte(sidecar: Sidecar, fake: FakeVLLM) -> None:
    raw = b'{"model":"tiny-model","prompt":"x","n":1.0e0}'
    await sidecar.client.post(
        "/v1/completions", data=raw, headers={"Content-Type": "application/json"}
    )
    assert fake.last("/v1/completions").body == raw


async def test_non_json_bodies_are_not_touched(sidecar: Sidecar, fake: FakeVLLM) -> None:
    fake.script("POST /v1/completions", respond(200, b"{}"))
    raw = b'{"model": "org/tiny-model"}'
    await sidecar.client.post("/v1/completions", data=raw, headers={"Content-Type": "text/plain"})
    assert fake.last("/v1/completions").body == raw
    assert resolutions(sidecar, "absent", "") == 1


async def test_encoded_request_bodies_are_not_parsed(sidecar: Sidecar, fake: FakeVLLM) -> None:
    # An encoding aiohttp does not inflate: relayed as sent (test_hostile has the ones it does).
    raw = b"\x00opaque" + gzip.compress(b'{"model": "org/tiny-model"}')
    fake.script("POST /v1/completions", respond(200, b"{}"))
    headers = {"Content-Type": "application/json", "Content-Encoding": "x-opaque"}
    resp = await sidecar.client.post("/v1/completions", data=raw, headers=headers)
    assert resp.status == 200
    assert fake.last("/v1/completions").body == raw


async def test_expect_100_continue_is_answered_here(sidecar: Sidecar, fake: FakeVLLM) -> None:
    body = b'{"model": "org/tiny-model", "prompt": "x"}'
    reply = await raw_http(
        sidecar.client,
        b"POST /v1/completions HTTP/1.1\r\nHost: h\r\nContent-Type: application/json\r\n"
        b"Expect: 100-continue\r\nConnection: close\r\nContent-Length: "
        + str(len(body)).encode()
        + b"\r\n\r\n"
        + body,
    )
    assert reply.startswith(b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK")
    assert "Expect" not in fake.last("/v1/completions").headers


async def expect_only(sidecar: Sidecar, head: bytes) -> bytes:
    """Send a head with `Expect: 100-continue` and no body: what comes back before the body."""
    assert sidecar.client.port is not None
    reader, writer = await asyncio.open_connection("127.0.0.1", sidecar.client.port)
    try:
        writer.write(head + b"Expect: 100-continue\r\nConnection: close\r\n\r\n")
        await writer.drain()
        return await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)
    finally:
        writer.close()


@pytest.mark.parametrize(
    ("head", "status"),
    [
        # Over --max-body-bytes: refused at its head, not after its bytes were invited.
        (b"POST /v1/completions HTTP/1.1\r\nHost: h\r\nContent-Length: 4096\r\n", 413),
        # A control call without the token: refused before its body is.
        (b"POST /pause HTTP/1.1\r\nHost: h\r\nContent-Length: 10\r\n", 401),
    ],
)
async def test_a_body_that_would_be_refused_is_not_invited(
    upstream: TestServer, make_sidecar: MakeSidecar, fake: FakeVLLM, head: bytes, status: int
) -> None:
    url = str(upstream.make_url(""))
    sidecar = await make_sidecar(url, control_token="s3cret", max_body_bytes=1024)
    first = await expect_only(sidecar, head)
    assert first.startswith(f"HTTP/1.1 {status} ".encode()), first
    assert fake.forwarded() == 0
    assert fake.forwarded("/pause") == 0


async def test_unknown_model_gets_the_upstream_404_enveloped(sidecar: Sidecar) -> None:
    resp = await sidecar.client.post(
        "/v1/completions", json={"model": "other/tiny-modl", "prompt": "x"}
    )
    assert resp.status == 404
    assert resp.headers["X-Sidecar-Error"] == "upstream_status"
    err = (await resp.json())["error"]
    assert err["upstream"]["body"] == {
        "error": {
            "message": "The model `other/tiny-modl` does not exist. Valid aliases: tiny-model.",
            "type": "NotFoundError",
            "param": "model",
            "code": 404,
        }
    }
    assert err["model"]["served"] == ["tiny-model"]
    assert err["model"]["suggestions"] == ["tiny-model"]
    assert "Served: tiny-model" in err["message"]
    assert err["request_id"] == resp.headers["X-Request-Id"]
    assert (
        sidecar.metric(
            "vllm_sidecar_failures_total",
            route="/v1/completions",
            source="upstream",
            reason="upstream_status",
            status="404",
        )
        == 1
    )
    assert resolutions(sidecar, "unresolved", "") == 1


async def test_unknown_name_triggers_one_refresh_then_resolves(
    sidecar: Sidecar, fake: FakeVLLM
) -> None:
    fake.served.append(("lora-a", "/adapters/lora-a"))  # loaded after discovery
    resp = await sidecar.client.post(
        "/v1/completions", json={"model": "team/lora-a", "prompt": "x"}
    )
    assert resp.status == 200
    assert fake.last("/v1/completions").json()["model"] == "lora-a"


async def test_refresh_on_miss_is_rate_limited(
    upstream: TestServer, make_sidecar: MakeSidecar, fake: FakeVLLM
) -> None:
    sidecar = await make_sidecar(str(upstream.make_url("")), miss_refresh_interval=3600)
    before = fake.forwarded("/v1/models")
    for _ in range(5):
        await sidecar.client.post("/v1/completions", json={"model": "nope", "prompt": "x"})
    after = fake.forwarded("/v1/models")
    assert after - before <= 1


async def test_ambiguous_model_is_a_400(
    upstream: TestServer, make_sidecar: MakeSidecar, fake: FakeVLLM
) -> None:
    fake.served = [("a/tiny", "/a/tiny"), ("b/tiny", "/b/tiny")]
    sidecar = await make_sidecar(str(upstream.make_url("")))
    n = len(fake.requests)
    resp = await sidecar.client.post("/v1/completions", json={"model": "c/tiny", "prompt": "x"})
    assert resp.status == 400
    assert resp.headers["X-Sidecar-Error"] == "model_ambiguous"
    err = (await resp.json())["error"]
    assert (err["reason"], err["source"], err["param"]) == ("model_ambiguous", "sidecar", "model")
    assert "a/tiny" in err["message"]
    assert "b/tiny" in err["message"]
    assert not any(r.raw_path == "/v1/completions" for r in fake.requests[n:])
    assert resolutions(sidecar, "ambiguous", "") == 1


async def test_malformed_json_is_a_400_from_the_sidecar(sidecar: Sidecar, fake: FakeVLLM) -> None:
    resp = await sidecar.client.post(
        "/v1/completions",
        data=b'{"prompt": [1,, "model": "x"}',
        headers={"Content-Type": "application/json"},
    )
    assert resp.status == 400
    assert resp.headers["X-Sidecar-Error"] == "invalid_json"
    err = (await resp.json())["error"]
    assert err["source"] == "sidecar"
    assert "not valid JSON" in err["message"]
    assert not any(r.raw_path == "/v1/completions" for r in fake.requests)


async def test_body_over_the_limit_is_413(
    upstream: TestServer, make_sidecar: MakeSidecar, fake: FakeVLLM
) -> None:
    sidecar = await make_sidecar(str(upstream.make_url("")), max_body_bytes=1000)
    resp = await sidecar.client.post(
        "/v1/completions", data=b"x" * 5000, headers={"Content-Type": "application/json"}
    )
    assert resp.status == 413
    assert resp.headers["X-Sidecar-Error"] == "body_too_large"
    assert (await resp.json())["error"]["code"] == 413
    assert (
        sidecar.metric(
            "vllm_sidecar_failures_total",
            route="/v1/completions",
            source="sidecar",
            reason="body_too_large",
            status="413",
        )
        == 1
    )


async def test_chunked_body_over_the_limit_is_413(
    upstream: TestServer, make_sidecar: MakeSidecar
) -> None:
    sidecar = await make_sidecar(str(upstream.make_url("")), max_body_bytes=1000)

    async def chunks() -> Any:
        for _ in range(10):
            yield b"y" * 500

    resp = await sidecar.client.post(
        "/v1/completions", data=chunks(), headers={"Content-Type": "application/json"}
    )
    assert resp.status == 413
    assert resp.headers["X-Sidecar-Error"] == "body_too_large"


async def test_vllm_400_keeps_status_and_body(sidecar: Sidecar) -> None:
    resp = await sidecar.client.post(
        "/v1/completions", json={"model": "tiny-model", "prompt": "x", "max_tokens": -1}
    )
    assert resp.status == 400
    err = (await resp.json())["error"]
    assert err["type"] == "BadRequestError"
    assert err["param"] == "max_tokens"
    assert err["upstream"]["body"]["error"]["message"].startswith("max_tokens must be at least 1")


async def test_streaming_is_not_buffered(sidecar: Sidecar, fake: FakeVLLM) -> None:
    release = asyncio.Event()

    async def first_then_wait(request: web.Request) -> web.StreamResponse:
        resp = await start_sse(request)
        await resp.write(sse_chunk("tiny-model", 0))
        await release.wait()
        await resp.write(b"data: [DONE]\n\n")
        return resp

    fake.script("POST /v1/completions", first_then_wait)
    resp = await sidecar.client.post(
        "/v1/completions", json={"model": "org/tiny-model", "prompt": "x", "stream": True}
    )
    assert resp.status == 200
    assert resp.headers["Content-Type"].startswith("text/event-stream")
    first = await asyncio.wait_for(resp.content.readuntil(b"\n\n"), 5)
    assert json.loads(first.removeprefix(b"data: "))["choices"][0]["text"] == " t0"
    release.set()
    assert (await resp.read()) == b"data: [DONE]\n\n"


async def test_sse_framing_passes_unchanged(sidecar: Sidecar) -> None:
    resp = await sidecar.client.post(
        "/v1/chat/completions",
        json={
            "model": "tiny-model",
            "messages": [{"role": "user", "content": "x"}],
            "stream": True,
        },
    )
    text = await resp.text()
    events = text.split("\n\n")
    assert events[-2:] == ["data: [DONE]", ""]
    assert all(e.startswith("data: {") for e in events[:-2])
    assert len(events) == 5


async def test_vllm_in_stream_error_passes_and_is_counted(sidecar: Sidecar) -> None:
    resp = await sidecar.client.post(
        "/v1/completions", json={"model": "tiny-model", "prompt": [5000], "stream": True}
    )
    assert resp.status == 200
    text = await resp.text()
    assert '"Token id 5000 is out of vocabulary"' in text
    assert text.endswith("data: [DONE]\n\n")
    assert (
        sidecar.metric(
            "vllm_sidecar_failures_total",
            route="/v1/completions",
            source="upstream",
            reason="upstream_stream_error",
            status="400",
        )
        == 1
    )


async def test_in_stream_error_is_counted_as_it_passes(sidecar: Sidecar, fake: FakeVLLM) -> None:
    release = asyncio.Event()
    event = b'data: {"error": {"message": "boom", "type": "BadRequestError", "code": 400}}\n\n'

    async def error_then_wait(request: web.Request) -> web.StreamResponse:
        resp = await start_sse(request)
        await resp.write(event)
        await release.wait()
        await resp.write(b"data: [DONE]\n\n")
        return resp

    fake.script("POST /v1/completions", error_then_wait)
    resp = await sidecar.client.post(
        "/v1/completions", json={"model": "tiny-model", "prompt": "x", "stream": True}
    )
    assert await asyncio.wait_for(resp.content.readuntil(b"\n\n"), 5) == event
    labels = {"route": "/v1/completions", "source": "upstream", "status": "400"}
    assert (
        sidecar.metric("vllm_sidecar_failures_total", reason="upstream_stream_error", **labels) == 1
    )
    release.set()
    assert await resp.read() == b"data: [DONE]\n\n"


async def test_404_for_a_resolved_name_rereads_the_model_list(
    sidecar: Sidecar, fake: FakeVLLM
) -> None:
    fake.served = [("renamed", "/models/renamed")]  # vLLM restarted under another name
    resp = await sidecar.client.post("/v1/completions", json={"model": "org/tiny-model"})
    assert resp.status == 404
    assert sidecar.app[DISCOVERY].table.names == ("renamed",)
    resp = await sidecar.client.post("/v1/completions", json={"model": "org/renamed"})
    assert resp.status == 200


async def test_query_string_and_path_byte_for_byte(sidecar: Sidecar, fake: FakeVLLM) -> None:
    # The unnamed path first: after /sleep, a POST to it is held (a path the table does not name
    # is a data route) until the engine wakes.
    for target in (b"/v1/x%2Fy/../z?q=%E2%9C%93;a", b"/sleep?level=1&tags=a%2Cb&x=%20+&&="):
        reply = await raw_http(
            sidecar.client,
            b"POST " + target + b" HTTP/1.1\r\nHost: h\r\n"
            b"Content-Length: 0\r\nConnection: close\r\n\r\n",
        )
        assert reply.startswith(b"HTTP/1.1 ")
        assert fake.requests[-1].raw_path == target.decode()


@pytest.mark.parametrize(
    "path",
    [
        "/sleep",
        "/wake_up",
        "/pause",
        "/resume",
        "/metrics",
        "/v1/models",
        "/update_weights",
        "/never/heard/of",
    ],
)
async def test_every_path_is_forwarded(sidecar: Sidecar, fake: FakeVLLM, path: str) -> None:
    method = "GET" if path in ("/metrics", "/v1/models", "/never/heard/of") else "POST"
    resp = await sidecar.client.request(method, path)
    assert fake.last(path).method == method
    assert resp.status in (200, 404)


async def test_unknown_route_404_is_enveloped_and_counted_as_other(sidecar: Sidecar) -> None:
    resp = await sidecar.client.get("/never/heard/of")
    assert resp.status == 404
    assert (await resp.json())["error"]["upstream"]["body"] == {"detail": "Not Found"}
    assert (
        sidecar.metric("vllm_sidecar_requests_total", route="other", method="GET", status="404")
        == 1
    )


async def test_request_id_passed_through_or_made(sidecar: Sidecar, fake: FakeVLLM) -> None:
    resp = await sidecar.client.get("/v1/models", headers={"X-Request-Id": "trace-42"})
    assert resp.headers["X-Request-Id"] == "trace-42"
    assert fake.last("/v1/models").headers["X-Request-Id"] == "trace-42"
    resp = await sidecar.client.get("/v1/models")
    made = resp.headers["X-Request-Id"]
    assert len(made) == 32
    assert fake.last("/v1/models").headers["X-Request-Id"] == made


async def test_hop_by_hop_headers_are_dropped(sidecar: Sidecar, fake: FakeVLLM) -> None:
    fake.script(
        "GET /v1/models",
        respond(200, b"{}", headers={"X-Upstream-Hop": "1", "Connection": "X-Upstream-Hop"}),
    )
    resp = await sidecar.client.get(
        "/v1/models",
        headers={
            "Connection": "keep-alive, X-Hop",
            "X-Hop": "secret",
            "Keep-Alive": "timeout=5",
            "Proxy-Authorization": "Basic x",
            "Authorization": "Bearer k",
        },
    )
    seen = fake.last("/v1/models").headers
    assert "X-Hop" not in seen
    assert "Keep-Alive" not in seen
    assert "Proxy-Authorization" not in seen
    assert seen["Authorization"] == "Bearer k"
    assert seen["X-Forwarded-Proto"] == "http"
    assert seen["X-Forwarded-For"] == "127.0.0.1"
    assert "X-Upstream-Hop" not in resp.headers


async def test_no_client_library_headers_are_added(sidecar: Sidecar, fake: FakeVLLM) -> None:
    await raw_http(
        sidecar.client, b"GET /v1/models HTTP/1.1\r\nHost: h\r\nConnection: close\r\n\r\n"
    )
    seen = fake.last("/v1/models").headers
    for added in ("Accept", "Accept-Encoding", "User-Agent", "Content-Type"):
        assert added not in seen


async def test_gzip_body_is_relayed_not_reencoded(sidecar: Sidecar, fake: FakeVLLM) -> None:
    payload = gzip.compress(b'{"ok": true}')
    fake.script("GET /v1/models", respond(200, payload, headers={"Content-Encoding": "gzip"}))
    resp = await sidecar.client.get("/v1/models", auto_decompress=False)
    assert resp.headers["Content-Encoding"] == "gzip"
    assert await resp.read() == payload


async def test_gzip_error_body_is_decoded_into_the_envelope(
    sidecar: Sidecar, fake: FakeVLLM
) -> None:
    err = b'{"error":{"message":"bad","type":"BadRequestError","param":null,"code":400}}'
    fake.script(
        "POST /v1/completions",
        respond(400, gzip.compress(err), headers={"Content-Encoding": "gzip"}),
    )
    resp = await sidecar.client.post("/v1/completions", json={"model": "tiny-model"})
    assert resp.status == 400
    assert "Content-Encoding" not in resp.headers
    assert (await resp.json())["error"]["upstream"]["body"] == json.loads(err)


async def test_counts_requests_duration_and_in_flight(sidecar: Sidecar) -> None:
    await sidecar.client.get("/v1/models")
    assert (
        sidecar.metric(
            "vllm_sidecar_requests_total", route="/v1/models", method="GET", status="200"
        )
        == 1
    )
    assert sidecar.metric("vllm_sidecar_request_duration_seconds_count", route="/v1/models") == 1
    assert (
        sidecar.metric("vllm_sidecar_upstream_time_to_first_byte_seconds_count", route="/v1/models")
        == 1
    )
    assert sidecar.metric("vllm_sidecar_in_flight_requests", route="/v1/models") == 0
