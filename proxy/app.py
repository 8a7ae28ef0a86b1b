"""Wiring: settings -> the proxy application, its metrics, upstream session and discovery."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable

from aiohttp import web
from prometheus_client import CollectorRegistry
from yarl import URL

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


def create_app(
    settings: Settings,
    *,
    registry: CollectorRegistry | None = None,
    discovery: Callable[[Settings, Metrics, URL], Discovery] = Discovery,
) -> web.Application:
    """The proxy application: every method and path is forwarded to the upstream.

    `discovery` makes the served-name and health tracker; worker processes get one that follows
    the supervisor's (see `podstate`)."""
    # A body up to the limit must reach the handler, which answers 413 with an envelope itself.
    app = web.Application(client_max_size=settings.max_body_bytes)
    metrics = Metrics(registry if registry is not None else CollectorRegistry())
    app[SETTINGS] = settings
    app[METRICS] = metrics
    app[UPSTREAM] = base_url(settings)
    app[DISCOVERY] = discovery(settings, metrics, app[UPSTREAM])
    app[IN_FLIGHT] = InFlight()
    app.cleanup_ctx.append(_upstream_ctx)
    app.router.add_route("*", "/{tail:.*}", handle)
    return app
