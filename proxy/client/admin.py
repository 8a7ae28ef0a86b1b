"""The admin port: the sidecar's own metrics, liveness, readiness and model table."""

from __future__ import annotations

import ipaddress

from aiohttp import web
from prometheus_client.aiohttp import make_aiohttp_handler

from proxy.core import envelope
from proxy.core.control import authorized
from proxy.core.errors import Unauthorized
from proxy.core.headers import request_id
from proxy.observe.metrics import METRICS
from proxy.upstream.discovery import DISCOVERY

from .connections import CONNECTIONS
from .drain import DRAIN, IN_FLIGHT
from .hooks import ENGINE
from .options import OPTIONS

PROXY = web.AppKey("proxy", web.Application)


async def livez(request: web.Request) -> web.Response:
    # Never depends on the upstream: restarting the sidecar cannot fix a dead vLLM.
    return web.json_response({"live": True})


async def readyz(request: web.Request) -> web.Response:
    proxy = request.app[PROXY]
    ready, detail = proxy[DISCOVERY].readiness(draining=proxy[IN_FLIGHT].draining)
    return web.json_response(detail, status=200 if ready else 503)


async def models(request: web.Request) -> web.Response:
    discovery = request.app[PROXY][DISCOVERY]
    return web.json_response({"models_known": discovery.models_known, **discovery.table.describe()})


async def drain(request: web.Request) -> web.Response:
    """Stop taking requests and wait for those in flight: the pod's preStop hook calls this, so
    that the sidecar drains while vLLM still runs (a native sidecar's own SIGTERM comes only
    after vLLM has exited). Answers when nothing is in flight, or when the grace is over.
    It takes a pod out of service, so it is guarded (`_may_drain`)."""
    proxy = request.app[PROXY]
    token = proxy[ENGINE].token
    if not _may_drain(request, token):
        return _drain_refused(request, token_set=token is not None)
    workers = proxy.get(DRAIN)
    if workers is not None:  # --workers N: each worker drains its own
        left = await workers()
    else:
        proxy[CONNECTIONS].start_draining()
        left = await proxy[IN_FLIGHT].settle(proxy[OPTIONS].shutdown_grace)
    return web.json_response({"draining": True, "in_flight": left})


def _may_drain(request: web.Request, token: bytes | None) -> bool:
    """With a control token, only a request carrying `Authorization: Bearer <token>`, from any
    peer: behind a service mesh every inbound connection comes from loopback (Linkerd's proxy
    connects from 127.0.0.1, Istio's from 127.0.0.6), so there a loopback peer is anyone who
    reaches the pod. Without one, a loopback peer only (the pod's own preStop: containers of a
    pod share its network); the admin port listens on the pod's IP for Prometheus."""
    if token is not None:
        return authorized(request.headers.get("Authorization"), token)
    peer = request.transport.get_extra_info("peername") if request.transport else None
    return isinstance(peer, tuple) and _loopback(peer[0])


def _loopback(host: str) -> bool:
    try:
        address = ipaddress.ip_address(host.partition("%")[0])
    except ValueError:
        return False
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        address = address.ipv4_mapped  # a dual-stack listener's view of 127.0.0.1
    return address.is_loopback


_REFUSED = "POST /drain takes the pod out of service: {}. Nothing was drained."
_NEEDS_TOKEN = (
    "it needs `Authorization: Bearer <token>` (--control-token) from every peer, loopback "
    "included (behind a service mesh every connection comes from loopback)"
)
_LOOPBACK_ONLY = (
    "without --control-token it is taken only from a loopback peer (inside the pod, as the "
    "preStop hook calls it)"
)


def _drain_refused(request: web.Request, *, token_set: bool) -> web.Response:
    failure = Unauthorized(_REFUSED.format(_NEEDS_TOKEN if token_set else _LOOPBACK_ONLY))
    rid = request_id(request.headers)
    return web.Response(
        status=failure.status,
        body=envelope.encode(envelope.from_failure(failure, request_id=rid)),
        content_type="application/json",
        headers={
            "WWW-Authenticate": 'Bearer realm="vllm-sidecar admin"',
            "X-Request-Id": rid,
        },
    )


async def engine(request: web.Request) -> web.Response:
    """The engine's phase, since when, and its weight version (see docs/lifecycle.md)."""
    return web.json_response(request.app[PROXY][ENGINE].describe())


def create_admin_app(proxy: web.Application) -> web.Application:
    """The admin application, reading the state of the proxy application it watches."""
    app = web.Application()
    app[PROXY] = proxy
    # prometheus_client's own handler: content negotiation (text or OpenMetrics) and gzip.
    app.router.add_get("/metrics", make_aiohttp_handler(proxy[METRICS].registry))
    app.router.add_get("/livez", livez)
    app.router.add_get("/readyz", readyz)
    app.router.add_get("/models", models)
    app.router.add_post("/drain", drain)
    app.router.add_get("/engine", engine)
    return app
