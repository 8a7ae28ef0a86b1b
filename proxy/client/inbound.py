"""The client's side of a request: its body, read within limits, and its model, resolved."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass

from aiohttp import StreamReader, web
from aiohttp.http_exceptions import BadHttpMessage, ContentEncodingError, HttpProcessingError

from proxy.core.body import (
    MAX_SLICES,
    ModelField,
    Scan,
    replace_model,
    scan_model,
    scan_model_in_head,
    step,
)
from proxy.core.errors import BodyTooLarge, InvalidRequest, ModelAmbiguous
from proxy.core.headers import inflated
from proxy.core.modelkeys import TooComplex
from proxy.core.resolution import ABSENT, AMBIGUOUS, UNRESOLVED, Resolution
from proxy.engine.gate import NOTHING, EngineHandle
from proxy.observe.metrics import Metrics
from proxy.observe.record import RequestRecord
from proxy.upstream.discovery import Discovery

from .budget import BUDGET, Lease

_BODY_METHODS = frozenset(("POST", "PUT", "PATCH"))
STREAM_FROM = 1 << 20  # bodies larger than this are streamed through once their head is read
HEAD_BYTES = 64 << 10


async def read_body(request: web.Request, limit: int) -> bytes:
    """The whole request body; a declared or actual size over `limit` is refused unread."""
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
        raise _unreadable(request, exc) from None


def _unreadable(request: web.Request, exc: Exception) -> InvalidRequest:
    """What a body that could not be read is, to the client: every read of a body asks here.
    The parser's error is raised as is or as the cause (aiohttp's C parser wraps it). (From a
    `try`: a context manager on every request's path cost 1.5% of its instructions.)"""
    cause = exc.__cause__ if isinstance(exc, web.RequestPayloadError) else exc
    if isinstance(cause, ContentEncodingError):
        encoding = request.headers.get("Content-Encoding", "")
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


async def read_counted(request: web.Request, limit: int) -> bytes:
    """A body of unknown size (chunked; inflated as it is read): each part taken from the
    memory budget as it arrives, so that one past the budget or `limit` is refused while the
    rest is still on the wire, having cost no more than the budget. (Read whole first, six
    40 MiB gzip bodies took 470 MiB before the budget was asked.)"""
    lease, parts, size = Lease(request.app[BUDGET]), [], 0
    try:
        async for part in request.content.iter_any():
            size += len(part)
            if size > limit:
                raise BodyTooLarge(_TOO_LARGE.format(limit))
            lease.take(len(part))
            parts.append(part)
    except (web.RequestPayloadError, BadHttpMessage) as exc:
        raise _unreadable(request, exc) from None
    return b"".join(parts)


def _fault(exc: BaseException) -> str:
    # The parser's message goes on to quote the client's bytes; its first line names the fault.
    text = exc.message if isinstance(exc, HttpProcessingError) else str(exc)
    return str(text).partition("\n")[0].rstrip(":")[:200]


def _wants_model(request: web.Request) -> bool:
    encoding = request.headers.get("Content-Encoding", "identity")
    return (
        request.method in _BODY_METHODS
        and request.content_type.endswith("json")
        # An encoding the server does not inflate is relayed as sent: its model is unreadable.
        and (encoding.lower() == "identity" or inflated(request.headers))
    )


@dataclass(frozen=True, slots=True)
class StreamedBody:
    """A large body on its way: its (rewritten) head now, the rest as the client sends it."""

    head: bytes
    rest: StreamReader | None
    length: int

    async def chunks(self) -> AsyncIterator[bytes]:
        # In slices, so that the socket's backpressure applies to a large held body too: given
        # whole, its unsent rest would be copied into the transport's buffer at once.
        view = memoryview(self.head)
        for start in range(0, len(view), STREAM_FROM):
            yield view[start : start + STREAM_FROM]  # type: ignore[misc]
        if self.rest is not None:
            async for chunk in self.rest.iter_any():
                yield chunk


def _outgoing(body: bytes) -> bytes | StreamedBody:
    # aiohttp warns that one write of a megabytes-long bytes body may stall the loop, and
    # would have it copied through a thread; handing it over as a stream does neither.
    return StreamedBody(body, None, len(body)) if len(body) > STREAM_FROM else body


async def read_request(
    request: web.Request,
    rec: RequestRecord,
    discovery: Discovery,
    metrics: Metrics,
    limit: int,
    *,
    bounded_pool: bool = False,
    engine: EngineHandle = NOTHING,
) -> bytes | StreamedBody:
    """The body to forward, with only its `model` value replaced by the served name.

    A large JSON body whose model sits in its first bytes (SkyRL and the openai SDK put it
    first) is not stored: its head is rewritten and the rest streams through as it arrives,
    so megabytes of token ids cost no extra round of waiting. (A second `model` key further
    on is then vLLM's to judge.)

    With a `bounded_pool` (--max-connections), a body the memory budget can hold is read whole
    first, as nginx does (`proxy_request_buffering on`): a streamed one holds a pooled
    connection for as long as its client takes to send it, and a few clients that stall half
    way would hold them all. Only what the budget cannot hold streams. A body the `engine`
    would hold (it does not serve) is read whole too, into the budget.
    """
    length, json_body = request.content_length, _wants_model(request)
    if inflated(request.headers):
        # aiohttp inflates it as it is read, so Content-Length (the compressed size) says
        # nothing of what arrives: it is read as a chunked body is, each part counted (a small
        # bomb meets the budget or --max-body-bytes, not the memory), and forwarded as what it
        # now is, unlabelled, with its own length. vLLM's server inflates no request body.
        length = None
    held = False
    if length is not None and STREAM_FROM < length <= limit:
        held = _read_whole(request, length, bounded_pool, engine)
        if not held:
            streamed = (
                await _head_first(request, rec, discovery, metrics, length)
                if json_body
                else StreamedBody(b"", request.content, length)  # nothing to find: straight on
            )
            return await _held_whole(request, streamed) if engine.would_hold() else streamed
    if length is None:  # chunked or inflated: its size is known only as it arrives
        body = await read_counted(request, limit)
    else:
        if not held and length <= limit:
            request.app[BUDGET].hold(length)
        body = await read_body(request, limit)  # a declared size over `limit` is refused unread
    field = await _locate(scan_model(body)) if body and json_body else None
    return _outgoing(await _resolved(body, field, rec, discovery, metrics))


def _read_whole(
    request: web.Request, length: int, bounded_pool: bool, engine: EngineHandle
) -> bool:
    """Whether a large body is read whole, its size taken from the budget now. One the engine
    would hold is, or refused with the 503 before a byte of it is read: its unread rest would
    be held outside the budget, and would hide its client's FIN (which comes after the body),
    so that a client that left was sent upstream after /resume."""
    if engine.would_hold():
        request.app[BUDGET].hold(length)
        return True
    return bounded_pool and request.app[BUDGET].try_hold(length)


async def _held_whole(request: web.Request, body: bytes | StreamedBody) -> bytes | StreamedBody:
    """A streamed body the engine is about to hold, a phase having begun while its head was
    read: read whole first, its size taken from the budget, as `_read_whole` does."""
    if not isinstance(body, StreamedBody) or body.rest is None:
        return body
    request.app[BUDGET].hold(body.length)
    parts = [body.head]
    try:
        async for part in body.rest.iter_any():
            parts.append(part)
    except (web.RequestPayloadError, BadHttpMessage) as exc:
        raise _unreadable(request, exc) from None
    return _outgoing(b"".join(parts))


async def _head_first(
    request: web.Request, rec: RequestRecord, discovery: Discovery, metrics: Metrics, length: int
) -> bytes | StreamedBody:
    """A large JSON body: its model found in its head, which is rewritten while the rest
    streams through; or, when the model is further on, the whole body read and rewritten."""
    try:
        head = await request.content.readexactly(HEAD_BYTES)
    except asyncio.IncompleteReadError:
        raise InvalidRequest("The request body ended before its Content-Length.") from None
    field = await _locate(scan_model_in_head(head))
    if field is None:  # the model is further on: the whole body it is
        request.app[BUDGET].hold(length)
        body = head + await request.content.read()
        field = await _locate(scan_model(body))
        return _outgoing(await _resolved(body, field, rec, discovery, metrics))
    new_head = await _resolved(head, field, rec, discovery, metrics)
    return StreamedBody(new_head, request.content, length - len(head) + len(new_head))


async def _locate(scan: Scan) -> ModelField | None:
    """Run a body scan on the loop a slice (a millisecond or two) at a time, letting every
    other request and the admin port in between: a hostile body costs a bounded amount of
    CPU time and stalls nothing. (A thread would not do: it holds the GIL for as long as the
    OS leaves it running, tens of ms on a loaded machine.)"""
    slices = 0
    while True:
        try:
            done, field = step(scan, slices)
        except TooComplex:
            raise InvalidRequest(
                f"The request body needs more than {MAX_SLICES} slices of scanning before its "
                "`model` key (millions of values, keys or escapes); send `model` first.",
                param="model",
            ) from None
        if done:
            return field
        slices += 1
        await asyncio.sleep(0)


async def _resolved(
    body: bytes,
    field: ModelField | None,
    rec: RequestRecord,
    discovery: Discovery,
    metrics: Metrics,
) -> bytes:
    if field is None or field.value is None:
        metrics.resolutions.labels(ABSENT, "").inc()
        return body
    rec.requested = field.value
    res = discovery.table.resolve(field.value)
    if res.rule == UNRESOLVED:
        await discovery.refresh_on_miss()
        res = discovery.table.resolve(field.value)
    _record(res, rec, metrics)
    if res.rule == AMBIGUOUS:
        raise ModelAmbiguous(
            f"The model `{res.requested}` is ambiguous: it matches {' and '.join(res.candidates)}."
            " Ask for one of them by its served name.",
            candidates=res.candidates,
        )
    if res.served is not None and res.changed:
        return replace_model(body, field, res.served)
    return body


def _record(res: Resolution, rec: RequestRecord, metrics: Metrics) -> None:
    rec.rule, rec.resolved = res.rule, res.served
    metrics.resolutions.labels(res.rule, res.served or "").inc()
