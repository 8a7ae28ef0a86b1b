"""The forwarding handler: request in -> resolve -> forward -> relay back, or an envelope."""

from __future__ import annotations

import asyncio
import time

import aiohttp
from aiohttp import web
from multidict import CIMultiDict

from . import headers as hdrs
from .errors import ShuttingDown, SidecarFailure
from .exchange import CLIENT_CLOSED, Exchange
from .inbound import StreamedBody, read_request
from .keys import DISCOVERY, IN_FLIGHT, METRICS, SESSION, SETTINGS, UPSTREAM
from .relay import (
    BUFFER_LIMIT,
    buffered_reply,
    checked_json_reply,
    chunked_json_read,
    error_reply,
    failure_response,
    stream_reply,
    unframed_json,
)
from .sse import is_event_stream
from .upstream import UPSTREAM_ERRORS, classify, target


async def handle(request: web.Request) -> web.StreamResponse:
    metrics = request.app[METRICS]
    ex = Exchange(request.method, request.path, hdrs.request_id(request.headers))
    in_flight = metrics.in_flight.labels(ex.route)
    in_flight.inc()
    task = request.app[IN_FLIGHT].add()
    try:
        return await _handle(request, ex)
    except asyncio.CancelledError:
        # The client hung up (handler cancellation), or the shutdown grace period ran out.
        if request.app[IN_FLIGHT].draining:
            ex.fail_with(metrics, ShuttingDown("the sidecar shut down"))
        else:
            metrics.disconnects.labels(ex.route).inc()
            ex.reason = ex.reason or "client_disconnected"
        ex.status = CLIENT_CLOSED if ex.status == 0 else ex.status
        raise
    finally:
        request.app[IN_FLIGHT].discard(task)
        in_flight.dec()
        ex.finish(metrics)


async def _handle(request: web.Request, ex: Exchange) -> web.StreamResponse:
    app = request.app
    metrics, discovery = app[METRICS], app[DISCOVERY]
    try:
        limit = app[SETTINGS].max_body_bytes
        body = await read_request(request, ex, discovery, metrics, limit)
        return await _exchange(request, ex, body)
    except SidecarFailure as failure:
        return failure_response(ex, failure, metrics, discovery)


def _origin_form(request: web.Request) -> str:
    """The raw path and query to forward; an absolute-form target (RFC 9112 section 3.2.2,
    `GET http://host/path`) keeps only those: the request still goes to the upstream."""
    raw = request.raw_path
    return raw if raw.startswith("/") else request.rel_url.raw_path_qs


async def _exchange(
    request: web.Request, ex: Exchange, body: bytes | StreamedBody
) -> web.StreamResponse:
    app = request.app
    headers = _upstream_headers(request, ex)
    sent = time.perf_counter()
    try:
        async with app[SESSION].request(
            request.method,
            target(app[UPSTREAM], _origin_form(request)),
            data=_payload(request, body, headers),
            headers=headers,
            allow_redirects=False,
        ) as resp:
            app[METRICS].ttfb.labels(ex.route).observe(time.perf_counter() - sent)
            try:
                return await _reply(request, ex, resp)
            finally:
                ex.upstream_time = time.perf_counter() - sent
    except UPSTREAM_ERRORS as exc:
        raise classify(exc, where=f"for {ex.method} {ex.path}") from exc


def _upstream_headers(request: web.Request, ex: Exchange) -> CIMultiDict[str]:
    peer = request.transport.get_extra_info("peername") if request.transport else None
    return hdrs.upstream_request_headers(
        request.headers,
        rid=ex.request_id,
        client_ip=peer[0] if isinstance(peer, tuple) else None,
        scheme=request.scheme,
        host=request.host,
    )


def _payload(request: web.Request, body: bytes | StreamedBody, headers: CIMultiDict[str]) -> object:
    if isinstance(body, StreamedBody):
        headers["Content-Length"] = str(body.length)  # a length, not chunked encoding, for vLLM
        return body.chunks()
    return body if body or request.method in ("POST", "PUT", "PATCH") else None


async def _reply(
    request: web.Request, ex: Exchange, resp: aiohttp.ClientResponse
) -> web.StreamResponse:
    """The upstream's answer, relayed the way its kind needs."""
    app = request.app
    metrics, discovery = app[METRICS], app[DISCOVERY]
    if resp.status >= 400:
        return await error_reply(ex, resp, metrics, discovery, app[SETTINGS].error_body_bytes)
    length = resp.content_length
    sse = is_event_stream(resp.headers.get("Content-Type"))
    if not sse and length is not None and length <= BUFFER_LIMIT:
        return await buffered_reply(ex, resp)
    if unframed_json(resp) or chunked_json_read(resp):
        return await checked_json_reply(ex, resp)
    return await stream_reply(request, ex, resp, metrics, discovery)
