"""Wiring: settings -> the proxy application, its metrics, upstream session and discovery."""

from __future__ import annotations

from collections.abc import AsyncIterator

from aiohttp import web
from aiohttp.typedefs import Handler
from prometheus_client import CollectorRegistry

from .discovery import Discovery
from .drain import InFlight
from .forward import handle
from .keys import DISCOVERY, IN_FLIGHT, METRICS, SESSION, SETTINGS, UPSTREAM
from .metrics import Metrics
from .settings import Settings
from .upstream import base_url, make_session


async def _upstream_ctx(app: web.Application) -> AsyncIterator[None]:
    async with make_session(app[SETTINGS]) as session:
        app[SESSION] = session
        async with app[DISCOVERY].running(session):
            yield


@web.middleware
async def _every_target(request: web.Request, handler: Handler) -> web.StreamResponse:
    # `OPTIONS *` and `CONNECT host:443` match no route: `handle` answers them with an envelope
    # and counts them, instead of aiohttp's plain 404.
    if request.match_info.http_exception is not None:
        return await handle(request)
    return await handler(request)


def create_app(settings: Settings, *, registry: CollectorRegistry | None = None) -> web.Application:
    """The proxy application: every method and path is forwarded to the upstream."""
    # A body up to the limit must reach the handler, which answers 413 with an envelope itself.
    app = web.Application(client_max_size=settings.max_body_bytes, middlewares=[_every_target])
    metrics = Metrics(registry if registry is not None else CollectorRegistry())
    app[SETTINGS] = settings
    app[METRICS] = metrics
    app[UPSTREAM] = base_url(settings)
    app[DISCOVERY] = Discovery(settings, metrics, app[UPSTREAM])
    app[IN_FLIGHT] = InFlight()
    app.cleanup_ctx.append(_upstream_ctx)
    # `[\s\S]`, not `.`: a path with an encoded newline (`%0A`) is a path too.
    app.router.add_route("*", r"/{tail:[\s\S]*}", handle)
    return app
