"""The client's side of a request: its body, read within limits, and its model, resolved."""

from __future__ import annotations

import asyncio

from aiohttp import web
from aiohttp.http_exceptions import BadHttpMessage, ContentEncodingError, HttpProcessingError

from proxy.core.body import scan_model, scan_model_in_head
from proxy.core.errors import BodyTooLarge, InvalidRequest
from proxy.core.headers import inflated

from .budget import Lease
from .flow import STREAM_FROM, Body, Flow, StreamedBody
from .model import locate, resolved

_BODY_METHODS = frozenset(("POST", "PUT", "PATCH"))
HEAD_BYTES = 64 << 10


async def read_body(flow: Flow, limit: int) -> bytes:
    """The whole request body; a declared or actual size over `limit` is refused unread."""
    request = flow.request
    if request.content_length is not None and request.content_length > limit:
        raise BodyTooLarge(
            f"The request body of {request.content_length} bytes exceeds the limit of {limit} "
            "bytes (--max-body-bytes)."
        )
    try:
        return await request.read()
    except web.HTTPRequestEntityTooLarge:
        raise BodyTooLarge(_TOO_LARGE.format(limit)) from None
    except (web.RequestPayloadError, BadHttpMessage) as exc:
        raise _unreadable(flow, exc) from None


def _unreadable(flow: Flow, exc: Exception) -> InvalidRequest:
    """What a body that could not be read is, to the client: every read of a body asks here.
    The parser's error is raised as is or as the cause (aiohttp's C parser wraps it). (From a
    `try`: a context manager on every request's path cost 1.5% of its instructions.)"""
    cause = exc.__cause__ if isinstance(exc, web.RequestPayloadError) else exc
    if isinstance(cause, ContentEncodingError):
        encoding = flow.request.headers.get("Content-Encoding", "")
        return InvalidRequest(
            f"The request body is labelled `Content-Encoding: {encoding[:40]}` but does not"
            " inflate as that; send it as labelled, or uncompressed."
        )
    # A chunk size `zz`, data past a chunk's size: nothing after it can be framed, so the
    # answer closes the connection (forward.py), as nginx's does.
    return InvalidRequest(
        f"The request body's framing is malformed ({_fault(cause or exc)}); nothing after "
        "it can be read, and the connection is closed."
    )


_TOO_LARGE = "The request body exceeds the limit of {} bytes (--max-body-bytes)."


async def read_counted(flow: Flow, limit: int) -> bytes:
    """A body of unknown size (chunked; inflated as it is read): each part taken from the
    memory budget as it arrives, so that one past the budget or `limit` is refused while the
    rest is still on the wire, having cost no more than the budget. (Read whole first, six
    40 MiB gzip bodies took 470 MiB before the budget was asked.)"""
    lease, parts, size = Lease(flow.budget), [], 0
    try:
        async for part in flow.request.content.iter_any():
            size += len(part)
            if size > limit:
                raise BodyTooLarge(_TOO_LARGE.format(limit))
            lease.take(len(part))
            parts.append(part)
    except (web.RequestPayloadError, BadHttpMessage) as exc:
        raise _unreadable(flow, exc) from None
    return b"".join(parts)


def _fault(exc: BaseException) -> str:
    # The parser's message goes on to quote the client's bytes; its first line names the fault.
    text = exc.message if isinstance(exc, HttpProcessingError) else str(exc)
    return str(text).partition("\n")[0].rstrip(":")[:200]


def _wants_model(flow: Flow) -> bool:
    request = flow.request
    encoding = request.headers.get("Content-Encoding", "identity")
    return (
        request.method in _BODY_METHODS
        and request.content_type.endswith("json")
        # An encoding the server does not inflate is relayed as sent: its model is unreadable.
        and (encoding.lower() == "identity" or inflated(request.headers))
    )


def _outgoing(body: bytes) -> Body:
    # aiohttp warns that one write of a megabytes-long bytes body may stall the loop, and
    # would have it copied through a thread; handing it over as a stream does neither.
    return StreamedBody(body, None, len(body)) if len(body) > STREAM_FROM else body


async def read_request(flow: Flow) -> Body:
    """The flow's body to forward (also kept as `flow.body`), with only its `model` value
    replaced by the served name.

    A large JSON body whose model sits in its first bytes (SkyRL and the openai SDK put it
    first) is not stored: its head is rewritten and the rest streams through as it arrives,
    so megabytes of token ids cost no extra round of waiting. (A second `model` key further
    on is then vLLM's to judge.)

    With a bounded pool (--max-connections), a body the memory budget can hold is read whole
    first, as nginx does (`proxy_request_buffering on`): a streamed one holds a pooled
    connection for as long as its client takes to send it, and a few clients that stall half
    way would hold them all. Only what the budget cannot hold streams. A body the engine
    would hold (it does not serve) is read whole too, into the budget.
    """
    request, limit = flow.request, flow.options.max_body_bytes
    length, json_body = request.content_length, _wants_model(flow)
    if inflated(request.headers):
        # aiohttp inflates it as it is read, so Content-Length (the compressed size) says
        # nothing of what arrives: it is read as a chunked body is, each part counted (a small
        # bomb meets the budget or --max-body-bytes, not the memory), and forwarded as what it
        # now is, unlabelled, with its own length. vLLM's server inflates no request body.
        length = None
    held = False
    if length is not None and STREAM_FROM < length <= limit:
        held = _read_whole(flow, length)
        if not held:
            streamed = (
                await _head_first(flow, length)
                if json_body
                else StreamedBody(b"", request.content, length)  # nothing to find: straight on
            )
            flow.body = await _held_whole(flow, streamed) if flow.engine.would_hold() else streamed
            return flow.body
    if length is None:  # chunked or inflated: its size is known only as it arrives
        body = await read_counted(flow, limit)
    else:
        if not held and length <= limit:
            flow.budget.hold(length)
        body = await read_body(flow, limit)  # a declared size over `limit` is refused unread
    field = await locate(scan_model(body)) if body and json_body else None
    flow.body = _outgoing(await resolved(flow, body, field))
    return flow.body


def _read_whole(flow: Flow, length: int) -> bool:
    """Whether a large body is read whole, its size taken from the budget now. One the engine
    would hold is, or refused with the 503 before a byte of it is read: its unread rest would
    be held outside the budget, and would hide its client's FIN (which comes after the body),
    so that a client that left was sent upstream after /resume."""
    if flow.engine.would_hold():
        flow.budget.hold(length)
        return True
    return flow.options.max_connections > 0 and flow.budget.try_hold(length)


async def _held_whole(flow: Flow, body: Body) -> Body:
    """A streamed body the engine is about to hold, a phase having begun while its head was
    read: read whole first, its size taken from the budget, as `_read_whole` does."""
    if not isinstance(body, StreamedBody) or body.rest is None:
        return body
    flow.budget.hold(body.length)
    parts = [body.head]
    try:
        async for part in body.rest.iter_any():
            parts.append(part)
    except (web.RequestPayloadError, BadHttpMessage) as exc:
        raise _unreadable(flow, exc) from None
    return _outgoing(b"".join(parts))


async def _head_first(flow: Flow, length: int) -> Body:
    """A large JSON body: its model found in its head, which is rewritten while the rest
    streams through; or, when the model is further on, the whole body read and rewritten."""
    content = flow.request.content
    try:
        head = await content.readexactly(HEAD_BYTES)
    except asyncio.IncompleteReadError:
        raise InvalidRequest("The request body ended before its Content-Length.") from None
    field = await locate(scan_model_in_head(head))
    if field is None:  # the model is further on: the whole body it is
        flow.budget.hold(length)
        body = head + await content.read()
        field = await locate(scan_model(body))
        return _outgoing(await resolved(flow, body, field))
    new_head = await resolved(flow, head, field)
    return StreamedBody(new_head, content, length - len(head) + len(new_head))
