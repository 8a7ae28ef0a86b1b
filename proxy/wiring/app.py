"""Wiring: settings -> the proxy application, its metrics, upstream session and discovery."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable

from aiohttp import web
from aiohttp.typedefs import Handler
from prometheus_client import CollectorRegistry
from yarl import URL

from proxy.client import connections
from proxy.client.budget import BUDGET, Budget
from proxy.client.connections import CONNECTIONS
from proxy.client.drain import IN_FLIGHT, InFlight
from proxy.client.exchange import prepared
from proxy.client.forward import expect, handle
from proxy.client.guard import Limits
from proxy.client.hooks import ENGINE, Engine
from proxy.client.options import OPTIONS
from proxy.client.redirects import redirect_here
from proxy.config.settings import SETTINGS, Settings
from proxy.core.phase import SERVING
from proxy.engine.addon import EngineAddon
from proxy.engine.lifecycle import LIFECYCLE, Lifecycle
from proxy.observe.metrics import METRICS, Metrics
from proxy.upstream.checks import checked_discovery
from proxy.upstream.discovery import DISCOVERY, Discovery
from proxy.upstream.hop import HOP, hop
from proxy.upstream.session import SESSION, UPSTREAM, make_session

from .reconcile import reconciling
from .tracing import install as tracing


async def _upstream_ctx(app: web.Application) -> AsyncIterator[None]:
    async with (
        make_session(app[SETTINGS]) as session,
        hop(app[SETTINGS], app[UPSTREAM], session) as proxied,
    ):
        app[SESSION], app[HOP] = session, proxied
        async with app[DISCOVERY].running(session):
            lifecycle = app[LIFECYCLE]
            if not lifecycle.role.leads:  # a worker's follows the supervisor's, which reconciles
                yield
                return
            async with reconciling(lifecycle, session, app[UPSTREAM], app[SETTINGS]):
                yield


@web.middleware
async def _every_target(request: web.Request, handler: Handler) -> web.StreamResponse:
    # `CONNECT host:443` has no path at all, so it reaches no resource: `handle` answers it
    # with an envelope and counts it, instead of aiohttp's plain 404.
    if request.match_info.http_exception is not None:
        return await handle(request)
    return await handler(request)


async def _prepared(request: web.Request, response: web.StreamResponse) -> None:
    # One signal receiver, the two steps plain calls: each receiver is a coroutine per answer.
    prepared(request, response)
    redirect_here(request, response)


class _Everything(web.PlainResource):
    """Every path (an encoded newline, `%0A`, is a path too), matched without a regular
    expression: aiohttp's router reaches the resource at `/` for every origin-form path."""

    def _match(self, path: str) -> dict[str, str] | None:
        return {}

    def raw_match(self, path: str) -> bool:
        return True


def create_app(
    settings: Settings,
    *,
    registry: CollectorRegistry | None = None,
    discovery: Callable[[Settings, Metrics, URL], Discovery] = checked_discovery,
    lifecycle: Callable[..., Lifecycle] = Lifecycle,
) -> web.Application:
    """The proxy application: every method and path is forwarded to the upstream.

    `discovery` and `lifecycle` make the served-name and health tracker and the engine's phase;
    with `--workers N` the supervisor's publish to the workers', which follow (`poddiscovery`)."""
    # A body up to the limit must reach the handler, which answers 413 with an envelope itself.
    app = web.Application(client_max_size=settings.max_body_bytes, middlewares=[_every_target])
    metrics = Metrics(registry if registry is not None else CollectorRegistry())
    app[SETTINGS] = app[OPTIONS] = settings
    app[METRICS] = metrics
    if settings.offpolicy_alert_share is not None:
        metrics.alert_share(settings.offpolicy_alert_share)
    app[UPSTREAM] = URL(settings.upstream_url)
    app[DISCOVERY] = discovery(settings, metrics, app[UPSTREAM])
    app[BUDGET] = budget = Budget(settings.buffer_budget_bytes, metrics)
    app[IN_FLIGHT] = in_flight = InFlight()
    app[CONNECTIONS] = connections.Connections(
        _limits(settings), metrics, in_flight, on_quiet=budget.trim
    )
    app[LIFECYCLE] = engine = lifecycle(
        metrics.engine,
        hold_timeout=settings.phase_hold_timeout,
        hold_queue=settings.phase_hold_queue,
        token=settings.control_secret(),
        long_after=settings.phase_long_after,
    )
    addon: Engine = EngineAddon(engine)  # the engine's hooks on every flow (client/hooks.py)
    app[ENGINE] = addon
    app[DISCOVERY].patient = lambda: engine.phase != SERVING or engine.state.calls > 0
    app.on_response_prepare.append(_prepared)
    app.cleanup_ctx.append(_upstream_ctx)
    everything = _Everything("/")
    app.router.register_resource(everything)
    everything.add_route("*", tracing(app, settings, metrics), expect_handler=expect)
    return app


def _limits(settings: Settings) -> Limits:
    return Limits(
        header=settings.client_header_timeout,
        body=settings.client_body_timeout,
        idle=settings.client_idle_timeout,
        send=settings.client_send_timeout,
        max_connections=settings.max_client_connections,
        min_body_rate=settings.client_body_min_rate,
    )
