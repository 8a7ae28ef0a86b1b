"""The forwarding handler: request in -> resolve -> forward -> relay back, or an envelope."""

from __future__ import annotations

import asyncio
import time

import aiohttp
from aiohttp import web
from multidict import CIMultiDict

from . import headers as hdrs
from .catchall import unexpected
from .errors import InvalidRequest, ShuttingDown, SidecarFailure, UpstreamInvalidResponse
from .exchange import CLIENT_CLOSED, Exchange
from .gate import passage, upstream_started
from .inbound import StreamedBody, read_request
from .keys import BUDGET, DISCOVERY, IN_FLIGHT, METRICS, SESSION, SETTINGS, UPSTREAM
from .relay import (
    BUFFER_LIMIT,
    buffered_reply,
    checked_json_reply,
    chunked_json_read,
    client_left,
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
    ex.client_request_id = hdrs.refused_request_id(request.headers, ex.request_id)
    in_flight = metrics.in_flight.labels(ex.route)
    in_flight.inc()
    task = request.app[IN_FLIGHT].add()
    try:
        return await _handle(request, ex)
    except asyncio.CancelledError:
        # The client hung up (handler cancellation), or the shutdown grace period ran out.
        if request.app[IN_FLIGHT].draining:
            if ex.status == 0 and (task := asyncio.current_task()) is not None:
                task.uncancel()  # nothing sent yet: the client still gets its envelope
                return failure_response(ex, ShuttingDown(_CUT), metrics, request.app[DISCOVERY])
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
        if app[IN_FLIGHT].draining:
            raise ShuttingDown(_REFUSED)
        _check_target(request)
        limit = app[SETTINGS].max_body_bytes
        async with passage(request, ex):  # engine lifecycle: hold, token, phase
            body = await read_request(request, ex, discovery, metrics, limit)
            return await _exchange(request, ex, body)
    except SidecarFailure as failure:
        return failure_response(ex, failure, metrics, discovery)
    except Exception as exc:
        return unexpected(request, ex, exc, metrics, discovery)


_CUT = "The sidecar shut down before the upstream answered (--shutdown-grace ran out); retry."
_REFUSED = "The sidecar is shutting down and takes no new requests; retry on another replica."


def _origin_form(request: web.Request) -> str:
    """The raw path and query to forward; an absolute-form target (RFC 9112 section 3.2.2,
    `GET http://host/path`) keeps only those: the request still goes to the upstream."""
    raw = request.raw_path
    return raw if raw.startswith("/") else request.rel_url.raw_path_qs


def _check_target(request: web.Request) -> None:
    """`OPTIONS *` and `CONNECT host:port` name no path to forward (RFC 9112 section 3.2)."""
    if not _origin_form(request).startswith("/"):
        raise InvalidRequest(
            f"The request target `{request.raw_path[:100]}` is not a path: the sidecar forwards "
            "origin-form (`/v1/...`) and absolute-form targets only."
        )


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
            upstream_started(request, resp)  # engine lifecycle: a stream a phase may stall
            try:
                return await _reply(request, ex, resp)
            finally:
                ex.upstream_time = time.perf_counter() - sent
    except UPSTREAM_ERRORS as exc:
        if request.transport is None or request.transport.is_closing():
            # The client's side broke (its upload of a streamed body, say): the upstream is
            # not to blame, and nobody is left to answer.
            client_left(ex, app[METRICS])
            return web.Response()
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
    if resp.status == 101:  # the sidecar drops Upgrade (hop-by-hop): nobody asked to switch
        raise UpstreamInvalidResponse(
            f"The upstream answered 101 Switching Protocols for {ex.method} {ex.path}, which "
            "asked for no protocol switch."
        )
    if resp.status >= 400:
        return await error_reply(ex, resp, metrics, discovery, app[SETTINGS].error_body_bytes)
    length = resp.content_length
    sse = is_event_stream(resp.headers.get("Content-Type"))
    # Read whole only within the memory budget; past it the answer streams, with backpressure.
    if not sse and length is not None and length <= BUFFER_LIMIT and app[BUDGET].held(length):
        return await buffered_reply(ex, resp)
    if unframed_json(resp) or chunked_json_read(resp):
        return await checked_json_reply(ex, resp)
    return await stream_reply(request, ex, resp, metrics, discovery)
