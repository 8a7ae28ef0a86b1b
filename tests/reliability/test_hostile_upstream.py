"""A hostile upstream's answers: what reaches the client is HTTP a client can read, and what the
sidecar says about an answer is its own. Runs on both upstream clients (make faults-aiohttp)."""

from __future__ import annotations

import asyncio

import pytest
from aiohttp.test_utils import TestServer

from tests.fake_vllm import FakeVLLM, raw
from tests.sidecar import MakeSidecar, Sidecar

JSON = b'{"world_size": 1}'


def answer(*fields: bytes, body: bytes = JSON, status: bytes = b"200 OK") -> bytes:
    return b"HTTP/1.1 " + status + b"\r\n" + b"".join(f + b"\r\n" for f in fields) + b"\r\n" + body


def json_get(fake: FakeVLLM, *fields: bytes) -> None:
    """The next /get_world_size is answered JSON with its length and `fields` besides."""
    head = (b"content-type: application/json", b"content-length: %d" % len(JSON), *fields)
    fake.script("GET /get_world_size", raw(answer(*head)))


async def exchange(sidecar: Sidecar, request: bytes) -> tuple[int, dict[str, list[str]], bytes]:
    """One raw request to the sidecar: the status, the fields (lower-case names) and the body
    read by its framing as a strict client would (Content-Length, chunked, or to the close)."""
    assert sidecar.client.port is not None
    reader, writer = await asyncio.open_connection("127.0.0.1", sidecar.client.port)
    try:
        writer.write(request)
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)
        lines = head.decode("latin-1").split("\r\n")
        fields: dict[str, list[str]] = {}
        for line in lines[1:-2]:
            name, _, value = line.partition(":")
            fields.setdefault(name.lower(), []).append(value.strip())
        body = await asyncio.wait_for(reader.read(), 10)
        return int(lines[0].split(" ")[1]), fields, body
    finally:
        writer.close()


GET = b"GET /get_world_size HTTP/1.1\r\nHost: sidecar\r\nConnection: close\r\n\r\n"


@pytest.mark.parametrize(
    "hop",
    [
        b"transfer-encoding: chunked",
        b"TRANSFER-ENCODING: chunked",
        b"Transfer-encoding: chunked",
    ],
)
async def test_a_chunked_json_answer_in_lower_case_reaches_the_client_readable(
    sidecar: Sidecar, fake: FakeVLLM, hop: bytes
) -> None:
    """uvicorn writes `transfer-encoding: chunked` in lower case; SkyRL 0.4's /get_world_size
    takes this path. The sidecar reads it whole and relays it with its own Content-Length, never
    beside a Transfer-Encoding over a body it no longer chunks."""
    chunked = b"%x\r\n%s\r\n0\r\n\r\n" % (len(JSON), JSON)
    fake.script(
        "GET /get_world_size", raw(answer(b"content-type: application/json", hop, body=chunked))
    )
    status, fields, body = await exchange(sidecar, GET)
    assert status == 200
    assert "transfer-encoding" not in fields
    assert fields["content-length"] == [str(len(JSON))]
    assert body == JSON


async def test_hop_by_hop_fields_of_an_answer_go_in_any_case(
    sidecar: Sidecar, fake: FakeVLLM
) -> None:
    json_get(
        fake,
        b"connection: close, x-hop",
        b"x-hop: secret",
        b"X-HOP: secret",
        b"keep-alive: timeout=5",
        b"proxy-authenticate: Basic",
        b"upgrade: h2c",
        b"proxy-connection: keep-alive",
        b"x-kept: 1",
    )
    status, fields, body = await exchange(sidecar, GET)
    assert status == 200
    assert body == JSON
    for gone in ("x-hop", "keep-alive", "proxy-authenticate", "upgrade", "proxy-connection"):
        assert gone not in fields, gone
    assert fields["x-kept"] == ["1"]


async def test_a_requests_hop_by_hop_fields_never_reach_vllm_in_any_case(
    sidecar: Sidecar, fake: FakeVLLM
) -> None:
    body = b'{"model": "org/tiny-model", "prompt": "x"}'
    request = (
        b"POST /v1/completions HTTP/1.1\r\nHost: sidecar\r\nContent-Type: application/json\r\n"
        b"proxy-connection: keep-alive\r\nConnection: close, X-Secret\r\nx-secret: 1\r\n"
        b"X-SECRET: 2\r\nkeep-alive: 5\r\nte: trailers\r\nx-kept: 1\r\n"
        b"Content-Length: %d\r\n\r\n%s" % (len(body), body)
    )
    status, _, _ = await exchange(sidecar, request)
    assert status == 200
    seen = {k.lower() for k in fake.last("/v1/completions").headers}
    for gone in ("proxy-connection", "x-secret", "keep-alive", "te"):
        assert gone not in seen, gone
    assert "x-kept" in seen


async def test_what_the_sidecar_says_of_an_answer_is_never_the_upstreams(
    sidecar: Sidecar, fake: FakeVLLM
) -> None:
    """A forged X-Sidecar-Error or weight version on a plain 200 is dropped; the answer carries
    the sidecar's own X-Weight-Version, and nothing of the rest (continuation is off)."""
    json_get(
        fake,
        b"X-Sidecar-Error: upstream_timeout",
        b"x-weight-version-end: 99",
        b"X-Weight-Versions: 99",
        b"x-sidecar-continued: 3",
        b"x-weight-version: 99",
    )
    status, fields, body = await exchange(sidecar, GET)
    assert (status, body) == (200, JSON)
    for forged in ("x-sidecar-error", "x-weight-version-end", "x-weight-versions"):
        assert forged not in fields, forged
    assert "x-sidecar-continued" not in fields
    assert fields.get("x-weight-version", ["0"]) != ["99"]


@pytest.mark.parametrize(
    "location", [b"//evil.example/x", b"http://127.0.0.1:99999/x", b"http://[::1/x"]
)
async def test_every_location_ends_in_an_answer(
    sidecar: Sidecar, fake: FakeVLLM, location: bytes
) -> None:
    """A Location that is not the upstream's (or no URL at all) is relayed as it is: the client
    gets its redirect, never a dropped connection."""
    fake.script(
        "GET /get_world_size",
        raw(
            answer(
                b"Location: " + location, b"content-length: 0", status=b"307 Temporary", body=b""
            )
        ),
    )
    status, fields, _ = await exchange(sidecar, GET)
    assert status == 307
    assert fields["location"] == [location.decode()]


@pytest.mark.parametrize(
    "fields",
    [
        [b"x-big: " + b"a" * 100_000],
        [b"x-f%d: v" % i for i in range(5_000)],
        [b"x-f%d: v" % i for i in range(129)],
        [b"x-big: " + b"a" * 8_200],
    ],
    ids=["100-KB-field", "5000-fields", "129-fields", "a-field-past-8190"],
)
async def test_a_head_past_aiohttps_bounds_is_an_invalid_response(
    sidecar: Sidecar, fake: FakeVLLM, fields: list[bytes]
) -> None:
    """aiohttp's client refuses a field over 8190 bytes or more than 128 fields; so does the
    lean hop (nginx: "upstream sent too big header"), with the sidecar's 502."""
    json_get(fake, *fields)
    status, got, body = await exchange(sidecar, GET)
    assert status == 502
    assert got["x-sidecar-error"] == ["upstream_invalid_response"]
    assert b"upstream_invalid_response" in body


async def test_a_head_within_the_bounds_passes(sidecar: Sidecar, fake: FakeVLLM) -> None:
    fields = [b"x-f%d: v" % i for i in range(100)] + [b"x-big: " + b"a" * 8_000]
    json_get(fake, *fields)
    status, got, body = await exchange(sidecar, GET)
    assert (status, body) == (200, JSON)
    assert got["x-big"] == ["a" * 8_000]


CLIENTS = pytest.mark.parametrize("client", ["lean", "aiohttp"])


@CLIENTS
async def test_a_field_repeated_in_other_spellings_reaches_vllm_whole(
    upstream: TestServer, make_sidecar: MakeSidecar, fake: FakeVLLM, client: str
) -> None:
    """RFC 9110 section 5.3: a repeated field is one list, whatever its spellings. aiohttp's
    client (3.14's `_prepare_headers`) kept only the last spelling's values."""
    sidecar = await make_sidecar(str(upstream.make_url("")), upstream_client=client)
    json_get(fake)
    request = (
        b"GET /get_world_size HTTP/1.1\r\nHost: sidecar\r\nX-Foo: 1\r\nx-foo: 2\r\n"
        b"X-FOO: 3\r\nx-foo: 4\r\nConnection: close\r\n\r\n"
    )
    status, _, _ = await exchange(sidecar, request)
    assert status == 200
    assert fake.last("/get_world_size").headers.getall("X-Foo") == ["1", "2", "3", "4"]


class StrayAfterLong:
    """A raw upstream that answers `/long` with a 70 KB body and, in the same write, a second
    answer no request asked for; `/n/<i>` with its own target, anything else `{}`."""

    LONG = b"a" * 70_000

    def __init__(self) -> None:
        self.server: asyncio.Server | None = None

    async def __aenter__(self) -> str:
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        return f"http://127.0.0.1:{self.server.sockets[0].getsockname()[1]}"

    async def __aexit__(self, *_: object) -> None:
        assert self.server is not None
        self.server.close()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while head := await reader.readuntil(b"\r\n\r\n"):
                target = head.split(b" ", 2)[1]
                if target == b"/long":
                    writer.write(answer(b"content-length: 70000", body=self.LONG))
                    writer.write(answer(b"content-length: 5", body=b"stale"))
                elif target.startswith(b"/n/"):
                    writer.write(answer(b"content-length: %d" % len(target), body=target))
                else:
                    writer.write(answer(b"content-length: 2", body=b"{}"))
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()


@CLIENTS
async def test_a_stray_answer_behind_a_long_body_is_nobodys(
    make_sidecar: MakeSidecar, client: str
) -> None:
    """An answer the upstream wrote right behind another's body, in the same write, belongs to
    no request: the connection it came on is not used again (nginx closes it too), and every
    later request gets its own answer. aiohttp's client had queued it as the next answer, so
    each later request on that pooled connection got the one before it."""
    async with StrayAfterLong() as url:
        sidecar = await make_sidecar(
            url, upstream_client=client, served_model_names=["m"], discovery_interval=3600
        )
        resp = await sidecar.client.get("/long")
        assert (resp.status, await resp.read()) == (200, StrayAfterLong.LONG)
        for i in range(4):
            resp = await sidecar.client.get(f"/n/{i}")
            assert (resp.status, await resp.text()) == (200, f"/n/{i}")
