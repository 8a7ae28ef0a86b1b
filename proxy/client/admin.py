"""The admin port: the sidecar's own metrics, liveness, readiness and model table."""

from __future__ import annotations

from aiohttp import web
from prometheus_client.aiohttp import make_aiohttp_handler

from proxy.engine.lifecycle import LIFECYCLE
from proxy.observe.metrics import METRICS
from proxy.upstream.discovery import DISCOVERY

from .connections import CONNECTIONS
from .drain import DRAIN, IN_FLIGHT
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
    after vLLM has exited). Answers when nothing is in flight, or when the grace is over."""
    proxy = request.app[PROXY]
    workers = proxy.get(DRAIN)
    if workers is not None:  # --workers N: each worker drains its own
        left = await workers()
    else:
        proxy[CONNECTIONS].start_draining()
        left = await proxy[IN_FLIGHT].settle(proxy[OPTIONS].shutdown_grace)
    return web.json_response({"draining": True, "in_flight": left})


async def engine(request: web.Request) -> web.Response:
    """The engine's phase, since when, and its weight version (see docs/lifecycle.md)."""
    return web.json_response(request.app[PROXY][LIFECYCLE].describe())


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
