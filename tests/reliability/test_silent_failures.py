"""Failures that were silent or misfiled: each now gets an envelope and a metric, or is
forwarded as the README says (issue 12, item 6)."""

from __future__ import annotations

import asyncio
import socket
import struct
from collections.abc import AsyncIterator

import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer
from prometheus_client import CollectorRegistry

from proxy.config.settings import Settings
from proxy.upstream.discovery import DISCOVERY
from proxy.upstream.hop import HOP
from proxy.upstream.session import SESSION
from proxy.wiring.app import create_app
from tests.fake_vllm import FakeVLLM, raw, start_sse
from tests.sidecar import MakeSidecar, Sidecar, failures, raw_http
from tests.support import eventually, free_port


def status_of(reply: bytes) -> int:
    return int(reply.split(b" ", 2)[1])


def requests_with(sidecar: Sidecar, status: str, route: str = "/v1/completions") -> float:
    return sidecar.metric("vllm_sidecar_requests_total", route=route, method="POST", status=status)


# -- (a) an exception nobody foresaw --------------------------------------------------------


async def test_unexpected_exception_gets_an_internal_error_envelope(
    sidecar: Sidecar, caplog: pytest.LogCaptureFixture
) -> None:
    # A closed upstream session (as in a shutdown race) raises RuntimeError, not a ClientError:
    # aiohttp answered it with its plain-text 500, counted as status 0.
    await sidecar.app[SESSION].close()
    await sidecar.app[HOP].close()  # the proxied requests' client, when it is not the session
    resp = await sidecar.client.post("/v1/completions", json={"model": "tiny-model"})
    assert resp.status == 500
    assert resp.headers["X-Sidecar-Error"] == "internal_error"
    error = (await resp.json())["error"]
    assert (error["reason"], error["code"], error["source"]) == ("internal_error", 500, "sidecar")
    assert "RuntimeError" in error["message"]
    assert error["request_id"] == resp.headers["X-Request-Id"]
    assert failures(sidecar, "internal_error", "500") == 1
    assert requests_with(sidecar, "500") == 1
    assert requests_with(sidecar, "0") == 0
    logged = [r for r in caplog.records if r.name == "proxy.client.failures"]
    assert logged
    assert logged[0].exc_info is not None  # the traceback is in the log


# -- (b) a client that resets while the answer is written -----------------------------------


@pytest.fixture
async def uncancelled(
    upstream: TestServer,
) -> AsyncIterator[tuple[int, CollectorRegistry, web.AppRunner]]:
    """The sidecar on aiohttp's default runner (`web.run_app`), which does not cancel a handler
    whose client left: the reset is then seen by the writes to the client."""
    registry = CollectorRegistry()
    settings = Settings(upstream_url=str(upstream.make_url("")), health_interval=0.05)
    runner = web.AppRunner(create_app(settings, registry=registry), handler_cancellation=False)
    await runner.setup()
    port = free_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    try:
        yield port, registry, runner
    finally:
        await runner.cleanup()


async def test_client_reset_while_writing_is_a_disconnect_not_an_upstream_failure(
    uncancelled: tuple[int, CollectorRegistry, web.AppRunner], fake: FakeVLLM
) -> None:
    port, registry, runner = uncancelled
    gone = asyncio.Event()

    async def stream_ends_after_the_client_left(request: web.Request) -> web.StreamResponse:
        resp = await start_sse(request)
        await gone.wait()
        return resp

    fake.script("POST /v1/completions", stream_ends_after_the_client_left)
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    body = b'{"model":"tiny-model","prompt":"x","stream":true}'
    writer.write(
        b"POST /v1/completions HTTP/1.1\r\nHost: s\r\nContent-Type: application/json\r\n"
        b"Content-Length: %d\r\n\r\n%s" % (len(body), body)
    )
    await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)
    sock = writer.get_extra_info("socket")
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    writer.transport.abort()  # RST
    assert runner.server is not None
    server = runner.server
    # The connection is lost to the sidecar (its handler, not cancelled, goes on).
    await eventually(
        lambda: all(h.transport is None for h in server.connections), "the sidecar saw the reset"
    )
    gone.set()  # the upstream ends the stream: the sidecar's last write meets the reset

    def metric(name: str, **labels: str) -> float:
        return registry.get_sample_value(name, {"route": "/v1/completions", **labels}) or 0.0

    await eventually(lambda: metric("vllm_sidecar_client_disconnects_total") == 1)
    await eventually(
        lambda: metric("vllm_sidecar_requests_total", method="POST", status="499") == 1
    )
    for reason in ("upstream_disconnected", "internal_error"):
        assert (
            metric("vllm_sidecar_failures_total", source="sidecar", reason=reason, status="502")
            == 0
        )


async def test_client_reset_during_a_streamed_upload_is_a_disconnect(
    uncancelled: tuple[int, CollectorRegistry, web.AppRunner], fake: FakeVLLM
) -> None:
    """A large body streams through to vLLM as it arrives; the client resets half way: the
    upstream request fails, but the client is to blame (it was counted an upstream 502)."""
    port, registry, _ = uncancelled
    _, writer = await asyncio.open_connection("127.0.0.1", port)
    head = b'{"model":"tiny-model","prompt":[' + b"1," * 40_000
    writer.write(
        b"POST /v1/completions HTTP/1.1\r\nHost: s\r\nContent-Type: application/json\r\n"
        b"Content-Length: %d\r\n\r\n%s" % (len(head) + (3 << 20), head + b"1," * 100_000)
    )
    await writer.drain()
    # The head is upstream, the rest never comes.
    await eventually(lambda: "/v1/completions" in fake.arriving, "the head is upstream")
    sock = writer.get_extra_info("socket")
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    writer.transport.abort()

    def metric(name: str, **labels: str) -> float:
        return registry.get_sample_value(name, {"route": "/v1/completions", **labels}) or 0.0

    await eventually(
        lambda: metric("vllm_sidecar_requests_total", method="POST", status="499") == 1
    )
    assert metric("vllm_sidecar_client_disconnects_total") == 1
    failed = metric(
        "vllm_sidecar_failures_total",
        source="sidecar",
        reason="upstream_disconnected",
        status="502",
    )
    assert failed == 0


# -- (c) background loops that die ----------------------------------------------------------


async def test_health_and_discovery_loops_survive_any_exception(
    make_sidecar: MakeSidecar, upstream: TestServer
) -> None:
    sidecar = await make_sidecar(str(upstream.make_url("")), discovery_interval=0.05)
    assert sidecar.metric("vllm_sidecar_upstream_up") == 1
    # Every check now raises RuntimeError("Session is closed"): the loops died of it, with
    # readiness and upstream_up frozen at "up".
    await sidecar.app[SESSION].close()
    errors = "vllm_sidecar_background_errors_total"
    await eventually(lambda: sidecar.metric(errors, task="health") >= 3)  # still going
    await eventually(lambda: sidecar.metric("vllm_sidecar_discoveries_total", outcome="error") >= 3)
    assert sidecar.metric("vllm_sidecar_upstream_up") == 0
    ready, body = sidecar.app[DISCOVERY].readiness()
    assert not ready
    assert "RuntimeError" in body["reason"]
    readyz = await sidecar.admin.get("/readyz")
    assert readyz.status == 503


# -- (d) one /v1/models read at a time ------------------------------------------------------


async def test_model_list_reads_are_single_flight(
    make_sidecar: MakeSidecar, upstream: TestServer, fake: FakeVLLM
) -> None:
    """Misses, the discovery loop and the health loop share the one read in flight."""
    sidecar = await make_sidecar(str(upstream.make_url("")), discovery_interval=0.05)
    in_flight, peak, reads = 0, 0, 0

    async def slow_models(request: web.Request) -> web.StreamResponse:
        nonlocal in_flight, peak, reads
        in_flight, reads = in_flight + 1, reads + 1
        peak = max(peak, in_flight)
        try:
            await asyncio.sleep(0.2)
            return await fake.models(request)
        finally:
            in_flight -= 1

    fake.script("GET /v1/models", slow_models, times=1000)
    misses = [
        sidecar.client.post("/v1/completions", json={"model": f"unknown-{i}", "prompt": "x"})
        for i in range(20)
    ]
    for wave in range(2):
        replies = await asyncio.gather(*misses[wave * 10 : wave * 10 + 10])
        assert [r.status for r in replies] == [404] * 10
        done = reads
        await eventually(lambda: reads > done, "the discovery loop reads again")  # noqa: B023
    assert reads >= 2  # the misses and the loop did read
    assert peak == 1  # but never two at once: one answer cannot overtake another
    assert reads < 20


# -- (e) a protocol switch nobody asked for -------------------------------------------------


async def test_unsolicited_101_is_a_502_envelope(sidecar: Sidecar, fake: FakeVLLM) -> None:
    fake.script(
        "GET /v1/models",
        raw(
            b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\r\n"
        ),
    )
    resp = await sidecar.client.get("/v1/models")
    assert resp.status == 502
    assert resp.headers["X-Sidecar-Error"] == "upstream_invalid_response"
    assert "101" in (await resp.json())["error"]["message"]
    assert failures(sidecar, "upstream_invalid_response", "502", route="/v1/models") == 1


# -- (f) shapes that stepped around the handler or the body rules ---------------------------


async def test_encoded_newline_in_the_path_is_forwarded_like_any_path(
    sidecar: Sidecar, fake: FakeVLLM
) -> None:
    reply = await raw_http(
        sidecar.client, b"GET /v1/x%0Ay HTTP/1.1\r\nHost: s\r\nConnection: close\r\n\r\n"
    )
    assert status_of(reply) == 404  # vLLM's answer, enveloped: the request got there
    assert b"X-Sidecar-Error: upstream_status" in reply
    assert fake.requests[-1].raw_path == "/v1/x%0Ay"


BODY = '{"model": "tiny-model", "prompt": "x"}'


@pytest.mark.parametrize(
    "body",
    [
        BODY.encode("utf-8-sig"),
        BODY.encode("utf-16"),  # with a BOM
        BODY.encode("utf-16-le"),
        BODY.encode("utf-16-be"),
        BODY.encode("utf-32"),
        BODY.encode("utf-32-be"),
    ],
    ids=["utf-8-bom", "utf-16", "utf-16-le", "utf-16-be", "utf-32", "utf-32-be"],
)
async def test_json_in_other_encodings_is_refused_not_forwarded_unresolved(
    sidecar: Sidecar, fake: FakeVLLM, body: bytes
) -> None:
    # json.loads (vLLM's reader) takes these; the sidecar read no `model` in them.
    before = len(fake.requests)
    resp = await sidecar.client.post(
        "/v1/completions", data=body, headers={"Content-Type": "application/json"}
    )
    assert resp.status == 400
    assert resp.headers["X-Sidecar-Error"] == "invalid_json"
    assert "UTF-8" in (await resp.json())["error"]["message"]
    assert [r for r in fake.requests[before:] if r.raw_path != "/health"] == []
    assert failures(sidecar, "invalid_json", "400") == 1


async def test_second_model_key_spelt_with_escapes_is_refused(
    sidecar: Sidecar, fake: FakeVLLM
) -> None:
    body = b'{"model": "tiny-model", "prompt": [1, 2], "mod\\u0065l": "other"}'
    resp = await sidecar.client.post(
        "/v1/completions", data=body, headers={"Content-Type": "application/json"}
    )
    assert resp.status == 400
    assert resp.headers["X-Sidecar-Error"] == "invalid_request"
    assert not any(r.raw_path == "/v1/completions" for r in fake.requests)
