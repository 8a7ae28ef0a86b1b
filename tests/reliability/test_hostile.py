"""Hostile requests: the sidecar forwards what it need not parse and lets vLLM answer; where it
must decide it answers with an envelope; a client's mistake never gets a 5xx of its own."""

from __future__ import annotations

import asyncio
import functools
import gzip
import io
import json
import random
import zlib
from collections.abc import Callable

import brotli
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer
from backports import zstd

from proxy.client.inbound import STREAM_FROM
from tests.fake_vllm import FakeVLLM, respond
from tests.sidecar import MakeSidecar, Sidecar, assert_envelope, failures, raw_http

# vLLM's answer to a body its request model rejects (shape from vllm-samples/f5_max_tokens_type).
VLLM_422 = (
    b"{\"error\":{\"message\":\"1 validation error:\\n  {'type': 'string_type', 'loc': "
    b"'body.model', 'msg': 'Input should be a valid string', 'input': 5}\","
    b'"type":"Bad Request","param":"body.model","code":400}}'
)


def head(status: int) -> bytes:
    return f"HTTP/1.1 {status} ".encode()


def post(path: bytes, body: bytes, extra: bytes = b"") -> bytes:
    return (
        b"POST "
        + path
        + b" HTTP/1.1\r\nHost: sidecar\r\nContent-Type: application/json\r\n"
        + extra
        + b"Content-Length: "
        + str(len(body)).encode()
        + b"\r\nConnection: close\r\n\r\n"
        + body
    )


async def first_response(sidecar: Sidecar, request: bytes) -> bytes:
    """The first response to `request`, read by its Content-Length, without waiting for EOF."""
    assert sidecar.client.port is not None
    reader, writer = await asyncio.open_connection("127.0.0.1", sidecar.client.port)
    try:
        writer.write(request)
        head_ = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)
        length = int(head_.lower().split(b"content-length:")[1].split(b"\r\n")[0])
        return head_ + await asyncio.wait_for(reader.readexactly(length), 10)
    finally:
        writer.close()


def last_seen(fake: FakeVLLM) -> str:
    """The raw target of the last request the fake saw, health checks aside."""
    return next(r.raw_path for r in reversed(fake.requests) if r.raw_path != "/health")


def completions_seen(fake: FakeVLLM) -> int:
    return sum(1 for r in fake.requests if r.method == "POST")


def status_of(reply: bytes) -> int:
    return int(reply.split(b" ", 2)[1])


def envelope_of(reply: bytes) -> dict[str, object]:
    head_, _, body = reply.partition(b"\r\n\r\n")
    assert b"application/json" in head_.lower()
    return json.loads(body)["error"]  # type: ignore[no-any-return]


# -- bodies the sidecar must read: it decides, with an envelope -----------------------------
@pytest.mark.parametrize(
    ("body", "reason", "param"),
    [
        (b'{"prompt" "x", "model": "tiny-model"}', "invalid_json", None),
        (b'{"prompt": "x", "model": "a", "model": "b"}', "invalid_request", "model"),
        (b'{"model": "tiny-\xff\xfe-model", "prompt": "x"}', "invalid_json", "model"),
        (b'{"model": "\\ud800", "prompt": "x"}', "invalid_json", "model"),
        (b"{prompt: 1, 'model': 'tiny-model'}", "invalid_json", None),
    ],
    ids=["malformed", "duplicate-model", "non-utf8-model", "lone-surrogate-model", "js-object"],
)
async def test_bodies_the_sidecar_must_parse_get_a_400_envelope(
    sidecar: Sidecar, fake: FakeVLLM, body: bytes, reason: str, param: str | None
) -> None:
    reply = await raw_http(sidecar.client, post(b"/v1/completions", body))
    assert reply.startswith(head(400)), reply[:300]
    assert f"X-Sidecar-Error: {reason}".encode() in reply
    err = envelope_of(reply)
    assert (err["reason"], err["source"], err["code"], err["param"]) == (
        reason,
        "sidecar",
        400,
        param,
    )
    assert completions_seen(fake) == 0
    assert failures(sidecar, reason, "400") == 1


# -- bodies the sidecar need not understand: forwarded byte for byte, vLLM answers ----------
@pytest.mark.parametrize(
    "body",
    [
        b"[1, 2, 3]",
        b'"model"',
        b"12",
        b"null",
        b'{"model": 5, "prompt": "x"}',
        b'{"model": null}',
        b'{"model": ["tiny-model"]}',
        b'{"model": "tiny-model", "p": [1,, 2]}',
        b'{"model": "tiny-model"',
    ],
    ids=[
        "array",
        "string",
        "number",
        "null",
        "int-model",
        "null-model",
        "list-model",
        "malformed-after-model",
        "unclosed-after-model",
    ],
)
async def test_bodies_the_sidecar_need_not_parse_reach_vllm_unchanged(
    sidecar: Sidecar, fake: FakeVLLM, body: bytes
) -> None:
    fake.script("POST /v1/completions", respond(400, VLLM_422))
    reply = await raw_http(sidecar.client, post(b"/v1/completions", body))
    assert reply.startswith(head(400)), reply[:300]
    assert fake.last("/v1/completions").body == body
    err = envelope_of(reply)
    assert (err["reason"], err["source"]) == ("upstream_status", "upstream")
    assert err["upstream"]["body"] == json.loads(VLLM_422)  # type: ignore[index]
    assert failures(sidecar, "upstream_status", "400", source="upstream") == 1
    rule = "exact" if body.startswith(b'{"model": "tiny-model"') else "absent"
    served = "tiny-model" if rule == "exact" else ""
    assert (
        sidecar.metric("vllm_sidecar_model_resolutions_total", rule=rule, served_model=served) == 1
    )


async def test_missing_model_is_left_to_vllm_default(sidecar: Sidecar, fake: FakeVLLM) -> None:
    body = b'{"prompt": "x", "max_tokens": 2}'
    reply = await raw_http(sidecar.client, post(b"/v1/completions", body))
    assert reply.startswith(head(200))
    assert fake.last("/v1/completions").body == body
    assert json.loads(reply.partition(b"\r\n\r\n")[2])["model"] == "tiny-model"


# -- sizes: the limit is enforced before the body is read ------------------------------------
async def test_declared_huge_body_gets_413_before_it_is_sent(
    upstream: TestServer, make_sidecar: MakeSidecar, fake: FakeVLLM
) -> None:
    sidecar = await make_sidecar(str(upstream.make_url("")), max_body_bytes=1000)
    # Declares 10 GiB, sends 2 bytes: the answer comes without waiting for the rest.
    reply = await first_response(
        sidecar,
        b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        b"Content-Length: 10737418240\r\n\r\n{}",
    )
    assert reply.startswith(head(413)), reply[:200]
    err = envelope_of(reply)
    assert (err["reason"], err["code"]) == ("body_too_large", 413)
    assert "10737418240" in str(err["message"])
    assert completions_seen(fake) == 0
    assert failures(sidecar, "body_too_large", "413") == 1


async def test_endless_chunked_body_gets_413_once_over_the_limit(
    upstream: TestServer, make_sidecar: MakeSidecar, fake: FakeVLLM
) -> None:
    sidecar = await make_sidecar(str(upstream.make_url("")), max_body_bytes=1000)
    # 2,000 bytes in one chunk and no last chunk: the body never ends, the answer still comes.
    reply = await first_response(
        sidecar,
        b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        b"Transfer-Encoding: chunked\r\n\r\n7d0\r\n" + b"y" * 2000 + b"\r\n",
    )
    assert reply.startswith(head(413)), reply[:200]
    assert envelope_of(reply)["reason"] == "body_too_large"
    assert completions_seen(fake) == 0
    assert failures(sidecar, "body_too_large", "413") == 1


async def test_long_url_and_header_under_the_parser_limit_pass_byte_for_byte(
    sidecar: Sidecar, fake: FakeVLLM
) -> None:
    query = b"q=" + b"%41" * 2500  # 7.5 kB, stays encoded
    value = b"v" * 8000
    reply = await raw_http(
        sidecar.client,
        b"GET /v1/models?"
        + query
        + b" HTTP/1.1\r\nHost: x\r\nX-Long: "
        + value
        + b"\r\nConnection: close\r\n\r\n",
    )
    assert reply.startswith(head(200))
    seen = fake.last("/v1/models")
    assert seen.raw_path == "/v1/models?" + query.decode()
    assert seen.headers["X-Long"] == value.decode()


# -- the HTTP parser refuses: a plain 400, nothing forwarded, nothing smuggled ---------------
SMUGGLED = b"GET /smuggled HTTP/1.1\r\nHost: x\r\n\r\n"
PARSER_REJECTS = {
    "cl-then-te": b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n"
    b"Transfer-Encoding: chunked\r\n\r\n0\r\n\r\n" + SMUGGLED,
    "te-then-cl": b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n"
    b"Content-Length: 5\r\n\r\n0\r\n\r\n" + SMUGGLED,
    "te-not-chunked-last": b"POST /v1/completions HTTP/1.1\r\nHost: x\r\n"
    b"Transfer-Encoding: chunked, identity\r\n\r\n0\r\n\r\n" + SMUGGLED,
    "te-obfuscated": b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: xchunked"
    b"\r\n\r\n0\r\n\r\n" + SMUGGLED,
    "two-content-lengths": b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n"
    b"Content-Length: 39\r\n\r\n{}" + SMUGGLED,
    "bare-cr-in-value": b"GET /v1/models HTTP/1.1\r\nHost: x\r\nX-A: a\rX-Injected: 1\r\n\r\n",
    "bare-lf-in-value": b"GET /v1/models HTTP/1.1\r\nHost: x\r\nX-A: a\nX-Injected: 1\r\n\r\n",
    "obs-fold": b"GET /v1/models HTTP/1.1\r\nHost: x\r\nX-A: a\r\n X-Injected: 1\r\n\r\n",
    "nul-in-value": b"GET /v1/models HTTP/1.1\r\nHost: x\r\nX-A: a\x00b\r\n\r\n",
    "two-hosts": b"GET /v1/models HTTP/1.1\r\nHost: a\r\nHost: b\r\n\r\n",
    "raw-non-utf8-path": b"GET /v1/\xff\xfe HTTP/1.1\r\nHost: x\r\n\r\n",
    "space-in-path": b"GET /v1/mo dels HTTP/1.1\r\nHost: x\r\n\r\n",
    "negative-length": b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: -1\r\n\r\n",
    "overflowing-length": b"POST /v1/completions HTTP/1.1\r\nHost: x\r\n"
    b"Content-Length: 99999999999999999999999\r\n\r\n",
    "url-over-8190": b"GET /v1/models?q=" + b"a" * 10_000 + b" HTTP/1.1\r\nHost: x\r\n\r\n",
    "header-over-8190": b"GET /v1/models HTTP/1.1\r\nHost: x\r\nX-Big: "
    + b"b" * 10_000
    + b"\r\n\r\n",
    "too-many-headers": b"GET /v1/models HTTP/1.1\r\nHost: x\r\n"
    + b"".join(b"X-H%d: v\r\n" % i for i in range(200))
    + b"\r\n",
    "invalid-method": b"G@T /v1/models HTTP/1.1\r\nHost: x\r\n\r\n",
}


@pytest.mark.parametrize("request_bytes", PARSER_REJECTS.values(), ids=PARSER_REJECTS.keys())
async def test_malformed_http_is_refused_by_the_parser(
    sidecar: Sidecar, fake: FakeVLLM, request_bytes: bytes
) -> None:
    before = len(fake.requests)
    assert sidecar.client.port is not None
    reader, writer = await asyncio.open_connection("127.0.0.1", sidecar.client.port)
    writer.write(request_bytes)
    # The whole reply up to the sidecar closing the connection: one answer, and no second.
    reply = await asyncio.wait_for(reader.read(), 10)
    writer.close()
    assert status_of(reply) == 400, reply[:300]
    head_, _, body = reply.partition(b"\r\n\r\n")
    length = next(
        int(line.split(b":")[1])
        for line in head_.split(b"\r\n")
        if line.lower().startswith(b"content-length:")
    )
    assert len(body) == length  # nothing after the one answer
    # Nothing reached the upstream: not the request, and not a second one hidden in its body.
    assert [r for r in fake.requests[before:] if r.raw_path != "/health"] == []
    assert sidecar.metric("vllm_sidecar_in_flight_requests", route="/v1/models") == 0


# -- targets and hosts: only ever the configured upstream ------------------------------------
@pytest.mark.parametrize(
    ("target", "host", "forwarded"),
    [
        (b"http://evil.example/v1/models", b"evil.example", "/v1/models"),
        (b"http://127.0.0.1:1/v1/models?x=%2F", b"other", "/v1/models?x=%2F"),
        (b"/v1/models", b"user@evil.example:99/x?y", "/v1/models"),
        (b"/v1/models", b"evil.example\t", "/v1/models"),
    ],
    ids=["absolute-form", "absolute-form-other-port", "odd-host", "host-with-tab"],
)
async def test_targets_and_hosts_never_redirect_the_request(
    sidecar: Sidecar,
    fake: FakeVLLM,
    upstream: TestServer,
    target: bytes,
    host: bytes,
    forwarded: str,
) -> None:
    reply = await raw_http(
        sidecar.client,
        b"GET " + target + b" HTTP/1.1\r\nHost: " + host + b"\r\nConnection: close\r\n\r\n",
    )
    assert reply.startswith(head(200)), reply[:300]
    seen = fake.last("/v1/models")
    assert seen.raw_path == forwarded
    assert seen.headers["Host"] == f"127.0.0.1:{upstream.port}"
    assert (
        sidecar.metric(
            "vllm_sidecar_requests_total", route="/v1/models", method="GET", status="200"
        )
        == 1
    )


@pytest.mark.parametrize(
    "target",
    [
        b"/v1/../v1/models",
        b"/%2e%2e/%2E%2E/etc/passwd",
        b"/v1%2Fmodels",
        b"/..\\..\\x",
        b"/v1/%ff%fe",
        b"//v1/models",
        b"/v1/models/.",
        b"/./v1/models",
    ],
)
async def test_dot_segments_and_encoded_slashes_pass_raw(
    sidecar: Sidecar, fake: FakeVLLM, target: bytes
) -> None:
    reply = await raw_http(
        sidecar.client, b"GET " + target + b" HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
    )
    assert status_of(reply) in (200, 404), reply[:300]  # the fake's answer, relayed
    assert last_seen(fake) == target.decode()
    if status_of(reply) == 404:
        assert envelope_of(reply)["source"] == "upstream"


async def test_base_path_is_not_escaped_by_dot_segments(
    upstream: TestServer, make_sidecar: MakeSidecar, fake: FakeVLLM
) -> None:
    sidecar = await make_sidecar(str(upstream.make_url("/base")), ready=False)
    await raw_http(
        sidecar.client, b"GET /../v1/models HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
    )
    assert last_seen(fake) == "/base/../v1/models"


async def test_envelope_survives_odd_bytes_in_the_path(make_sidecar: MakeSidecar) -> None:
    # Upstream down: the sidecar writes the path into its own envelope.
    sidecar = await make_sidecar("http://127.255.255.255:8000", ready=False)
    for target in (b"/v1/%ff%fe%00", b"/%ED%A0%80", b'/"\\</script>'):
        reply = await raw_http(
            sidecar.client, b"GET " + target + b" HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
        )
        assert reply.startswith(head(502)), reply[:300]
        assert envelope_of(reply)["reason"] == "upstream_unreachable"
    assert failures(sidecar, "upstream_unreachable", "502", route="other") == 3


async def test_header_bytes_that_are_not_utf8_do_not_break_the_request(
    sidecar: Sidecar, fake: FakeVLLM
) -> None:
    # Valid UTF-8 passes byte for byte; bytes that are not UTF-8 are dropped from the value
    # (aiohttp decodes and re-encodes header values), and the request still goes through.
    reply = await raw_http(
        sidecar.client,
        b"GET /v1/models HTTP/1.1\r\nHost: x\r\nX-Utf8: caf\xc3\xa9\r\nX-Latin1: \xff\xfe\r\n"
        b"X-Request-Id: \xff\r\nConnection: close\r\n\r\n",
    )
    assert reply.startswith(head(200))
    seen = fake.last("/v1/models").headers
    assert seen["X-Utf8"] == "café"
    assert seen["X-Latin1"] == ""
    made = seen["X-Request-Id"]
    assert len(made) == 32  # not printable as sent: a new one is made
    assert f"X-Request-Id: {made}".encode() in reply


@pytest.mark.parametrize(
    "request_line",
    [
        b"OPTIONS * HTTP/1.1",
        b"CONNECT evil.example:443 HTTP/1.1",
        # A path-form CONNECT: aiohttp's client would write it in authority form, upstream's.
        b"CONNECT /%40x HTTP/1.1",
    ],
)
async def test_asterisk_and_authority_forms_are_not_forwarded(
    sidecar: Sidecar, fake: FakeVLLM, request_line: bytes
) -> None:
    before = len(fake.requests)
    reply = await raw_http(
        sidecar.client, request_line + b"\r\nHost: evil.example\r\nConnection: close\r\n\r\n"
    )
    # No route matches a target without "/"; it still gets an envelope and is counted.
    assert status_of(reply) == 400
    assert b"X-Sidecar-Error: invalid_request" in reply
    assert b'"reason":"invalid_request"' in reply
    assert [r for r in fake.requests[before:] if r.raw_path != "/health"] == []
    method = "OPTIONS" if request_line.startswith(b"OPTIONS") else "other"
    assert (
        sidecar.metric("vllm_sidecar_requests_total", route="other", method=method, status="400")
        == 1
    )


async def test_a_served_name_cannot_forge_a_log_line(
    upstream: TestServer,
    fake: FakeVLLM,
    make_sidecar: MakeSidecar,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A served id is the upstream's to choose (a LoRA adapter's name): logged escaped, and a
    list of thousands is not one line of megabytes."""
    forged = "lora\nFORGED-H3 WARNING proxy.access: POST /pause 200"
    fake.served = [(forged, "/adapters/x"), *((f"m{i}", f"/m/{i}") for i in range(40))]
    with caplog.at_level("INFO", logger="proxy.upstream"):
        await make_sidecar(str(upstream.make_url("")))
    [line] = [r.getMessage() for r in caplog.records if "upstream serves" in r.getMessage()]
    assert "\n" not in line
    assert '"lora\\nFORGED-H3 WARNING proxy.access: POST /pause 200"' in line
    assert line.endswith(" and 21 more")


async def test_a_redirect_to_vllm_leads_back_to_the_sidecar(
    sidecar: Sidecar, fake: FakeVLLM
) -> None:
    """Starlette redirects `POST /pause/` to `/pause` on the Host it was sent (the upstream's): a
    client that followed it would skip the control token, the hold and the model rewrite."""

    async def slash_redirect(request: web.Request) -> web.Response:
        where = f"http://{request.host}{request.path.rstrip('/')}"
        return web.Response(status=307, headers={"Location": where})

    fake.script("POST /pause/", slash_redirect)
    resp = await sidecar.client.post("/pause/", allow_redirects=False)
    assert resp.status == 307
    assert resp.headers["Location"] == f"http://{resp.url.host}:{resp.url.port}/pause"
    assert fake.last("/pause/").headers["Host"] != f"{resp.url.host}:{resp.url.port}"


# -- compressed request bodies: forwarded as what they are once inflated ---------------------
@pytest.mark.parametrize(
    ("encoding", "compress"),
    [
        ("gzip", gzip.compress),
        ("deflate", zlib.compress),
        ("GZip", gzip.compress),
        ("br", functools.partial(brotli.compress, quality=5)),  # 11, the default, takes 15 s
        ("zstd", zstd.compress),
        ("ZSTD", zstd.compress),
    ],
)
async def test_a_compressed_body_reaches_vllm_inflated_and_labelled_so(
    sidecar: Sidecar, fake: FakeVLLM, encoding: str, compress: Callable[[bytes], bytes]
) -> None:
    """aiohttp inflates gzip/deflate/br/zstd as it reads a request: the sidecar forwards the
    inflated body with its own length and no Content-Encoding (it was labelled gzip and cut
    at the compressed length past 1 MiB), its model resolved like any other."""
    # Random ids: even compressed the body is over STREAM_FROM, the size that was streamed and
    # cut at the compressed length (4.6 MB inflated, ~2 MB compressed).
    draw = random.Random(20)
    ids = [draw.randrange(1000) for _ in range(1_200_000)]
    body = json.dumps({"model": "org/tiny-model", "prompt": [ids], "max_tokens": 1}).encode()
    sent_bytes = compress(body)
    assert len(sent_bytes) > STREAM_FROM
    resp = await sidecar.client.post(
        "/v1/completions",
        data=io.BytesIO(sent_bytes),
        headers={"Content-Type": "application/json", "Content-Encoding": encoding},
    )
    assert resp.status == 200, await resp.text()
    got = fake.last("/v1/completions")
    assert "Content-Encoding" not in got.headers
    assert int(got.headers["Content-Length"]) == len(got.body)
    sent = json.loads(got.body)
    assert sent["model"] == "tiny-model"
    assert sent["prompt"] == [ids]
    assert got.body == body.replace(b'"org/tiny-model"', b'"tiny-model"')


async def test_a_compression_bomb_meets_the_body_limit(
    upstream: TestServer, make_sidecar: MakeSidecar, fake: FakeVLLM
) -> None:
    sidecar = await make_sidecar(str(upstream.make_url("")), max_body_bytes=100_000)
    bomb = gzip.compress(b'{"model": "org/tiny-model", "prompt": "' + b"a" * 50_000_000 + b'"}')
    assert len(bomb) < 100_000  # under the limit as sent
    resp = await sidecar.client.post(
        "/v1/completions",
        data=bomb,
        headers={"Content-Type": "application/json", "Content-Encoding": "gzip"},
    )
    await assert_envelope(resp, 413, "body_too_large")
    assert completions_seen(fake) == 0


async def test_a_body_that_does_not_inflate_is_a_400(sidecar: Sidecar, fake: FakeVLLM) -> None:
    resp = await sidecar.client.post(
        "/v1/completions",
        data=b"\x1f\x8b\x08\x00 not gzip at all",
        headers={"Content-Type": "application/json", "Content-Encoding": "gzip"},
    )
    err = await assert_envelope(resp, 400, "invalid_request")
    assert "gzip" in err["message"]
    assert completions_seen(fake) == 0


async def test_an_encoding_the_server_does_not_inflate_passes_byte_for_byte(
    sidecar: Sidecar, fake: FakeVLLM
) -> None:
    """Stacked or unknown encodings are not inflated: label and bytes go on as sent."""
    raw = gzip.compress(gzip.compress(b'{"model": "org/tiny-model"}')) + b"x" * (2 << 20)
    for encoding in ("gzip, gzip", "compress"):
        resp = await sidecar.client.post(
            "/v1/completions",
            data=io.BytesIO(raw),
            headers={"Content-Type": "application/json", "Content-Encoding": encoding},
        )
        await resp.read()
        got = fake.last("/v1/completions")
        assert got.body == raw
        assert got.headers["Content-Encoding"] == encoding
