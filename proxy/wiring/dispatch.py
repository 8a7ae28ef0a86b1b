"""The proxy port's dispatch: a request with a path goes straight to the one route.

The proxy app has one resource that matches every path and every method (`app._Everything`),
and one middleware that only acts on a request without a path (`CONNECT host:port`). For every
other request aiohttp's `Application._handle` walks the router, builds a match, freezes it and
calls the handler through the middleware chain, each time to the same end. Here the match is
built and frozen once, as `_handle` would build it, and set on the request (`_match_info`, the
one private attribute it takes: `request.app` and `request.match_info` read it), then the
route's handler runs. A request without a path, or with `Expect` (its handler answers before
the body), takes aiohttp's own path; the app, its router, middlewares and signals are unchanged.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from aiohttp import hdrs, web
from aiohttp.web_urldispatcher import UrlMappingMatchInfo

Dispatch = Callable[[web.BaseRequest], Awaitable[web.StreamResponse]]


def dispatch(app: web.Application) -> Dispatch:
    """The request handler for the proxy app's server: `runner.server.request_handler`."""
    (resource,) = app.router.resources()
    (route,) = resource
    match = UrlMappingMatchInfo({}, route)
    match.add_app(app)
    match.freeze()
    handler, full = route.handler, app._handle

    async def dispatched(request: web.BaseRequest) -> web.StreamResponse:
        if request.raw_path[:1] != "/" or hdrs.EXPECT in request.headers:
            return await full(request)  # type: ignore[arg-type]
        request._match_info = match  # type: ignore[attr-defined]
        return await handler(request)  # type: ignore[arg-type]

    return dispatched


def install(runner: web.BaseRunner | None, app: web.Application) -> None:
    """Serve `app` through this dispatch on a set-up runner; connections accepted afterwards
    take it."""
    server = runner.server if runner is not None else None
    if not isinstance(server, web.Server):
        raise RuntimeError("the dispatch needs a runner that is set up")
    server.request_handler = dispatch(app)
