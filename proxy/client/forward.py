"""The forwarding handler: request in -> resolve -> forward -> relay back, or an envelope."""

from __future__ import annotations

import asyncio

from aiohttp import web
from aiohttp.http import HttpVersion11

from proxy.core import headers as hdrs
from proxy.core.errors import InvalidRequest, ShuttingDown, SidecarFailure
from proxy.observe.record import CLIENT_CLOSED, RequestRecord
from proxy.observe.tracing import RECORD

from . import connections
from .connections import CONNECTIONS
from .exchange import call_upstream, head, origin_form
from .failures import failure_response, unexpected
from .flow import Flow
from .hooks import ENGINE
from .inbound import read_request
from .options import OPTIONS


async def handle(request: web.Request) -> web.StreamResponse:
    """The proxy's one handler: its connection's guard told when it starts and ends."""
    app = request.app  # (a property of a property: read once a request)
    conns = app[CONNECTIONS]
    guard = connections.started(conns, request)
    try:
        response = await _handle(request, app)
        if (guard is not None and conns.draining) or _ends_at_close(request, response):
            response.force_close()  # answered with `Connection: close` (HTTP/1.1)
        return response
    finally:
        if guard is not None:
            guard.finished()


def _ends_at_close(request: web.Request, response: web.StreamResponse) -> bool:
    """Whether nothing can follow this answer on its connection: its request's body could not
    be framed (what comes next is unknowable), or it is a body without a length to an HTTP/1.0
    client, which ends only at the close (RFC 9112 section 6.3), as nginx closes it, whatever
    `Connection: keep-alive` asked. (aiohttp drops the field then, but keeps the connection.)"""
    if request.content.exception() is not None:
        return True
    return (
        request.version < HttpVersion11
        and response.content_length is None
        and request.method != "HEAD"
        and response.status not in (204, 304)
    )


async def _handle(request: web.Request, app: web.Application) -> web.StreamResponse:
    """The request's record, its in-flight count, and its end."""
    rec = RequestRecord(request.method, request.path, hdrs.request_id(request.headers))
    rec.client_request_id = hdrs.refused_request_id(request.headers, rec.request_id)
    flow = Flow(request, rec, app)  # the exchange: every step below takes it
    metrics = flow.metrics
    if metrics.traced:  # the server span (client/traced.py) reads it at the end
        request[RECORD] = rec
    in_flight = metrics.in_flight.labels(rec.route)
    in_flight.inc()
    handlers = flow.in_flight
    task = handlers.add()
    try:
        return await _respond(flow)
    except asyncio.CancelledError:
        # The shutdown grace period ran out (the drain cut it), or the client hung up.
        if handlers.cut(task):
            if rec.status == 0 and task is not None:
                task.uncancel()  # nothing sent yet: the client still gets its envelope
                return failure_response(flow, ShuttingDown(_CUT))
            rec.fail_with(metrics, ShuttingDown("the sidecar shut down"))
        else:
            rec.disconnected(metrics)
        rec.status = CLIENT_CLOSED if rec.status == 0 else rec.status
        raise
    finally:
        handlers.discard(task)
        in_flight.dec()
        rec.finish(metrics)


async def _respond(flow: Flow) -> web.StreamResponse:
    """The upstream's answer, or the envelope for whatever stood in its way."""
    try:
        if flow.in_flight.draining:
            raise ShuttingDown(_REFUSED)
        _check_target(flow)
        head(flow)  # hook: the flow's engine handle, the token, a deadline
        await read_request(flow)
        async with flow.engine.hold():  # a data request's hold; the phase a control call enters
            return await call_upstream(flow)
    except SidecarFailure as failure:
        return failure_response(flow, failure)
    except Exception as exc:
        return unexpected(flow, exc)


_CUT = "The sidecar shut down before the upstream answered (--shutdown-grace ran out); retry."
_REFUSED = "The sidecar is shutting down and takes no new requests; retry on another replica."


def _check_target(flow: Flow) -> None:
    """`OPTIONS *` and `CONNECT host:port` name no path to forward (RFC 9112 section 3.2); a
    CONNECT of any form asks for a tunnel, which the sidecar does not open (aiohttp's client
    would write even `CONNECT /path` to vLLM in authority form, with the upstream's address)."""
    request = flow.request
    if request.method == "CONNECT":
        raise InvalidRequest(
            "CONNECT asks for a tunnel; the sidecar opens none: it forwards HTTP requests to vLLM."
        )
    if not origin_form(flow).startswith("/"):
        raise InvalidRequest(
            f"The request target `{request.raw_path[:100]}` is not a path: the sidecar forwards "
            "origin-form (`/v1/...`) and absolute-form targets only."
        )


async def expect(request: web.Request) -> None:
    """`Expect: 100-continue`: the body is invited only for a request that will be taken. One
    over --max-body-bytes, or a control call without the token, gets no invitation, and the
    handler answers it (413, 401) before a byte of its body is sent (RFC 9110 section 10.1.1).
    aiohttp's own handler invites every body first."""
    if request.version != HttpVersion11:
        return
    if request.headers.get(hdrs.EXPECT, "").lower() != "100-continue":
        # RFC 9110 section 10.1.1 allows a 417; nginx and uvicorn ignore an expectation they do
        # not know and serve the request, and so does the sidecar (it goes no further).
        return
    limit = request.app[OPTIONS].max_body_bytes
    too_large = request.content_length is not None and request.content_length > limit
    if too_large or not request.app[ENGINE].admissible(request):
        return
    assert request.writer is not None
    await request.writer.write(b"HTTP/1.1 100 Continue\r\n\r\n")
