"""The request path with tracing on (wiring/tracing.py puts these in the plain handler's and
hop's places, so that with tracing off nothing here runs): a server span per request that
continues the client's trace, and a client span per upstream call, resends and continuation
parts each their own, whose context vLLM is sent."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from contextvars import ContextVar
from typing import Any

import aiohttp
from aiohttp import web
from multidict import CIMultiDict
from opentelemetry.context import Context
from opentelemetry.trace import (
    Span,
    SpanKind,
    Status,
    StatusCode,
    Tracer,
    set_span_in_context,
    use_span,
)
from yarl import URL

from proxy.core import headers as hdrs
from proxy.core.routes import route_label
from proxy.observe.otel import hop as spans
from proxy.observe.tracing import RECORD
from proxy.upstream.hop import Hop
from proxy.upstream.lean import Answer

from .forward import handle
from .hooks import ENGINE, HOOKS

TRACER = web.AppKey("tracer", Tracer)


class _Calls:
    """One request's upstream calls, seen by the hop: the server span they are children of."""

    __slots__ = ("context", "parts", "request_id", "sent")

    def __init__(self, context: Context, request_id: str | None) -> None:
        self.context, self.request_id = context, request_id
        self.sent = 0
        self.parts: set[str] = set()


# Continuation parts run in tasks of their own, which copy the handler's context: they see it.
_CALLS: ContextVar[_Calls | None] = ContextVar("vllm_sidecar_calls", default=None)


async def handle_traced(request: web.Request) -> web.StreamResponse:
    """`forward.handle` inside the request's server span."""
    route = route_label(request.path)
    span = request.app[TRACER].start_span(
        f"{request.method} {route}",
        context=spans.continued(request.headers),
        kind=SpanKind.SERVER,
        attributes=spans.server_start(request.method, request.path, route),
    )
    calls = _Calls(set_span_in_context(span), None)
    token = _CALLS.set(calls)
    try:
        with use_span(span, end_on_exit=True):
            try:
                return await handle(request)
            finally:
                _describe(request, calls, span)
    finally:
        _CALLS.reset(token)


def _describe(request: web.Request, calls: _Calls, span: Span) -> None:
    rec = request.get(RECORD)
    if rec is None:
        return
    span.set_attributes(spans.server_end(rec))
    span.set_attributes(spans.attempts(calls.sent, len(calls.parts)))
    hooks, engine = request.get(HOOKS), request.app.get(ENGINE)
    if hooks is not None and engine is not None:
        span.set_attributes(spans.weights(hooks.version, engine.version))
    if rec.status >= 500:
        span.set_status(Status(StatusCode.ERROR, rec.reason or str(rec.status)))


class TracedHop:
    """The hop (upstream/hop.py) with a client span around each call, its context sent on."""

    __slots__ = ("_hop", "_tracer")

    def __init__(self, inner: Hop, tracer: Tracer) -> None:
        self._hop, self._tracer = inner, tracer

    def request(
        self,
        method: str,
        url: URL,
        *,
        data: Any = None,
        headers: CIMultiDict[str],
        allow_redirects: bool = False,
    ) -> contextlib.AbstractAsyncContextManager[aiohttp.ClientResponse | Answer]:
        return self._call(method, url, data, headers, allow_redirects)

    @contextlib.asynccontextmanager
    async def _call(
        self, method: str, url: URL, data: Any, headers: CIMultiDict[str], redirects: bool
    ) -> AsyncIterator[aiohttp.ClientResponse | Answer]:
        calls = _CALLS.get()
        rid = headers.get(hdrs.REQUEST_ID)
        if calls is not None:
            calls.sent += 1
            if calls.request_id is None:
                calls.request_id = rid
            elif rid is not None and rid != calls.request_id:
                calls.parts.add(rid)
        attempt = calls.sent if calls is not None else 1
        span = self._tracer.start_span(
            method,
            context=calls.context if calls is not None else None,
            kind=SpanKind.CLIENT,
            attributes=spans.client_start(method, str(url), rid, attempt),
        )
        with use_span(span, end_on_exit=True):
            spans.inject(headers, span)
            async with self._hop.request(
                method, url, data=data, headers=headers, allow_redirects=redirects
            ) as resp:
                span.set_attribute("http.response.status_code", resp.status)
                if resp.status >= 500:
                    span.set_status(Status(StatusCode.ERROR, str(resp.status)))
                yield resp

    async def close(self) -> None:
        await self._hop.close()
