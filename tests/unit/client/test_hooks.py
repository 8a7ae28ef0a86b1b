"""client/ through the engine's hooks (client/hooks.py): the request path with a recording set
of hooks in place of the engine and a small upstream on a real socket; no sidecar wiring, no
engine, no fake vLLM."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from types import SimpleNamespace
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from prometheus_client import CollectorRegistry
from yarl import URL

from proxy.client.budget import BUDGET, Budget
from proxy.client.connections import CONNECTIONS, Connections
from proxy.client.drain import IN_FLIGHT, InFlight
from proxy.client.exchange import prepared
from proxy.client.forward import handle
from proxy.client.guard import Limits
from proxy.client.hooks import ENGINE, NoHooks
from proxy.client.options import OPTIONS
from proxy.core.errors import Unauthorized
from proxy.core.resolution import ModelTable
from proxy.observe.metrics import METRICS, Metrics
from proxy.upstream.discovery import DISCOVERY
from proxy.upstream.hop import HOP
from proxy.upstream.session import UPSTREAM


class _Recording(NoHooks):
    """One flow's hooks: each call written down, in order."""

    def __init__(self, calls: list[Any], body: bytes | None) -> None:
        self.calls, self._body = calls, body

    def body(self, body: bytes) -> bytes | None:
        self.calls.append(("body", body))
        return self._body

    @contextlib.asynccontextmanager
    async def _held(self) -> AsyncIterator[None]:
        self.calls.append("hold")
        yield
        self.calls.append("released")

    def hold(self) -> Any:
        return self._held()

    def answered(self, resp: Any) -> None:
        self.calls.append(("answered", resp.status))

    def prepared(self, response: web.StreamResponse) -> None:
        self.calls.append(("prepared", response.status))
        response.headers["X-Hooked"] = "1"

    def streaming(self) -> None:
        self.calls.append("streaming")

    def ended(self, aborted: bool, counts: Any) -> bytes:
        self.calls.append(("ended", aborted))
        return b"event: tail\ndata: {}\n\n"


class _Engine:
    """The engine addon, recording: what client/hooks.py's `Engine` names."""

    token, version, cuts, holds = None, None, 0, None

    def __init__(self, *, refuse: bool = False, body: bytes | None = None) -> None:
        self.calls: list[Any] = []
        self.refuse, self.body = refuse, body

    def head(self, flow: Any) -> None:
        self.calls.append(("head", flow.rec.method, flow.rec.path))
        flow.engine = _Recording(self.calls, self.body)
        if self.refuse:
            raise Unauthorized("no token")

    def admissible(self, request: web.Request) -> bool:
        return True

    def serving(self) -> bool:
        return True

    def describe(self) -> dict[str, object]:
        return {}


async def _upstream(request: web.Request) -> web.StreamResponse:
    body = await request.read()
    if request.path == "/v1/stream":
        out = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await out.prepare(request)
        await out.write(b"data: {}\n\ndata: [DONE]\n\n")
        await out.write_eof()
        return out
    return web.json_response({"got": body.decode()})


async def _prepare(request: web.Request, response: web.StreamResponse) -> None:
    prepared(request, response)


@pytest.fixture
async def proxy(aiohttp_server: Any, aiohttp_client: Any) -> Any:
    upstream = web.Application()
    upstream.router.add_route("*", "/{tail:.*}", _upstream)
    server = await aiohttp_server(upstream)
    session = aiohttp.ClientSession(auto_decompress=False)

    async def make(engine: _Engine) -> Any:
        app = web.Application()
        app[METRICS] = metrics = Metrics(CollectorRegistry())
        app[OPTIONS] = SimpleNamespace(
            max_body_bytes=1 << 20,
            max_connections=0,
            error_body_bytes=4096,
            shutdown_grace=1.0,
            continue_aborted=False,
            continue_max=0,
            upstream_api_key=None,
        )
        app[DISCOVERY] = SimpleNamespace(table=ModelTable([]), healthy=True)
        app[IN_FLIGHT] = in_flight = InFlight()
        app[BUDGET] = Budget(1 << 24, metrics)
        app[CONNECTIONS] = Connections(Limits(60, 60, 60, 60, 0), metrics, in_flight)
        app[UPSTREAM], app[HOP] = URL(str(server.make_url("/"))), session
        app[ENGINE] = engine
        app.on_response_prepare.append(_prepare)
        app.router.add_route("*", "/{tail:.*}", handle)
        return await aiohttp_client(app)

    yield make
    await session.close()


async def test_a_request_fires_each_hook_once_in_order(proxy: Any) -> None:
    engine = _Engine()
    client = await proxy(engine)
    resp = await client.post("/v1/echo", data=b'{"a":1}', headers={"Content-Type": "text/plain"})
    assert resp.status == 200
    assert await resp.json() == {"got": '{"a":1}'}
    assert resp.headers["X-Hooked"] == "1"  # the prepared hook stamps the answer
    assert engine.calls == [
        ("head", "POST", "/v1/echo"),
        "hold",  # around the upstream call: the body is read, then held
        ("body", b'{"a":1}'),
        ("answered", 200),
        "released",  # the answer is read whole within the hold, prepared after it
        ("prepared", 200),
    ]


async def test_the_body_hook_names_the_body_sent(proxy: Any) -> None:
    client = await proxy(_Engine(body=b'{"named":true}'))
    resp = await client.post("/v1/echo", data=b"{}", headers={"Content-Type": "text/plain"})
    assert await resp.json() == {"got": '{"named":true}'}


async def test_a_stream_is_counted_and_its_tail_appended(proxy: Any) -> None:
    engine = _Engine()
    client = await proxy(engine)
    resp = await client.get("/v1/stream")
    assert await resp.read() == b"data: {}\n\ndata: [DONE]\n\nevent: tail\ndata: {}\n\n"
    assert engine.calls == [
        ("head", "GET", "/v1/stream"),
        "hold",
        ("body", b""),
        ("answered", 200),
        ("prepared", 200),
        "streaming",
        ("ended", False),
        "released",
    ]


async def test_a_head_refused_sends_nothing_upstream(proxy: Any) -> None:
    engine = _Engine(refuse=True)
    client = await proxy(engine)
    resp = await client.post("/pause", data=b"{}")
    assert resp.status == 401
    assert (await resp.json())["error"]["reason"] == "unauthorized"
    # Set on the flow before it raised: the refusal is stamped by the flow's own hooks.
    assert engine.calls == [("head", "POST", "/pause"), ("prepared", 401)]
