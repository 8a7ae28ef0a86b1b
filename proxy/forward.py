"""The forwarding handler: request in -> resolve -> forward -> relay back, or an envelope."""

from __future__ import annotations

import asyncio
import time

import aiohttp
from aiohttp import web
from multidict import CIMultiDict

from . import headers as hdrs
from .errors import InvalidRequest, ShuttingDown, SidecarFailure, UpstreamInvalidResponse
from .failures import error_reply, failure_response, unexpected
from .gate import passage, upstream_started
from .inbound import StreamedBody, read_request
from .keys import BUDGET, DISCOVERY, IN_FLIGHT, METRICS, SESSION, SETTINGS, UPSTREAM
from .record import CLIENT_CLOSED, RequestRecord
from .relay import (
    BUFFER_LIMIT,
    buffered_reply,
    checked_json_reply,
    chunked_json_read,
    stream_reply,
    unframed_json,
)
from .sse import is_event_stream
from .upstream import UPSTREAM_ERRORS, classify, target


async def handle(request: web.Request) -> web.StreamResponse:
    """The proxy's one handler: the request's record, its in-flight count, and its end."""
    metrics = request.app[METRICS]
    rec = RequestRecord(request.method, request.path, hdrs.request_id(request.headers))
    rec.client_request_id = hdrs.refused_request_id(request.headers, rec.request_id)
    in_flight = metrics.in_flight.labels(rec.route)
    in_flight.inc()
    task = request.app[IN_FLIGHT].add()
    try:
        return await _respond(request, rec)
    except asyncio.CancelledError:
        # The client hung up (handler cancellation), or the shutdown grace period ran out.
        if request.app[IN_FLIGHT].draining:
            if rec.status == 0 and task is not None:
                task.uncancel()  # nothing sent yet: the client still gets its envelope
                table = request.app[DISCOVERY].table
                return failure_response(rec, ShuttingDown(_CUT), metrics, table)
            rec.fail_with(metrics, ShuttingDown("the sidecar shut down"))
        else:
            rec.disconnected(metrics)
        rec.status = CLIENT_CLOSED if rec.status == 0 else rec.status
        raise
    finally:
        request.app[IN_FLIGHT].discard(task)
        in_flight.dec()
        rec.finish(metrics)


async def _respond(request: web.Request, rec: RequestRecord) -> web.StreamResponse:
    """The upstream's answer, or the envelope for whatever stood in its way."""
    app = request.app
    metrics, discovery = app[METRICS], app[DISCOVERY]
    try:
        if app[IN_FLIGHT].draining:
            raise ShuttingDown(_REFUSED)
        _check_target(request)
        limit = app[SETTINGS].max_body_bytes
        async with passage(request, rec):  # engine lifecycle: hold, token, phase
            body = await read_request(request, rec, discovery, metrics, limit)
            return await _call_upstream(request, rec, body)
    except SidecarFailure as failure:
        return failure_response(rec, failure, metrics, discovery.table)
    except Exception as exc:
        return unexpected(request, rec, exc, metrics, discovery.table)


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


async def _call_upstream(
    request: web.Request, rec: RequestRecord, body: bytes | StreamedBody
) -> web.StreamResponse:
    app = request.app
    headers = _upstream_headers(request, rec)
    sent = time.perf_counter()
    try:
        async with app[SESSION].request(
            request.method,
            target(app[UPSTREAM], _origin_form(request)),
            data=_payload(request, body, headers),
            headers=headers,
            allow_redirects=False,
        ) as resp:
            app[METRICS].ttfb.labels(rec.route).observe(time.perf_counter() - sent)
            upstream_started(request, resp)  # engine lifecycle: a stream a phase may stall
            try:
                return await _relay(request, rec, resp)
            finally:
                rec.upstream_time = time.perf_counter() - sent
    except UPSTREAM_ERRORS as exc:
        if request.transport is None or request.transport.is_closing():
            # The client's side broke (its upload of a streamed body, say): the upstream is
            # not to blame, and nobody is left to answer.
            rec.client_left(app[METRICS])
            return web.Response()
        raise classify(exc, where=f"for {rec.method} {rec.path}") from exc


def _upstream_headers(request: web.Request, rec: RequestRecord) -> CIMultiDict[str]:
    peer = request.transport.get_extra_info("peername") if request.transport else None
    return hdrs.upstream_request_headers(
        request.headers,
        rid=rec.request_id,
        client_ip=peer[0] if isinstance(peer, tuple) else None,
        scheme=request.scheme,
        host=request.host,
    )


def _payload(request: web.Request, body: bytes | StreamedBody, headers: CIMultiDict[str]) -> object:
    if isinstance(body, StreamedBody):
        headers["Content-Length"] = str(body.length)  # a length, not chunked encoding, for vLLM
        return body.chunks()
    return body if body or request.method in ("POST", "PUT", "PATCH") else None


async def _relay(
    request: web.Request, rec: RequestRecord, resp: aiohttp.ClientResponse
) -> web.StreamResponse:
    """The upstream's answer, relayed the way its kind needs."""
    app = request.app
    metrics, discovery = app[METRICS], app[DISCOVERY]
    if resp.status == 101:  # the sidecar drops Upgrade (hop-by-hop): nobody asked to switch
        raise UpstreamInvalidResponse(
            f"The upstream answered 101 Switching Protocols for {rec.method} {rec.path}, which "
            "asked for no protocol switch."
        )
    if resp.status >= 400:
        return await error_reply(rec, resp, metrics, discovery, app[SETTINGS].error_body_bytes)
    length = resp.content_length
    sse = is_event_stream(resp.headers.get("Content-Type"))
    # Read whole only within the memory budget; past it the answer streams, with backpressure.
    if not sse and length is not None and length <= BUFFER_LIMIT and app[BUDGET].held(length):
        return await buffered_reply(rec, resp)
    if unframed_json(resp) or chunked_json_read(resp):
        return await checked_json_reply(rec, resp)
    return await stream_reply(request, rec, resp, metrics, discovery, app[IN_FLIGHT])
