"""The upstream's answers below 400 back to the client: read whole, checked, or streamed."""

from __future__ import annotations

import asyncio

import aiohttp
import orjson
from aiohttp import web

from proxy.core.envelope import ModelInfo
from proxy.core.errors import ShuttingDown, SidecarFailure, UpstreamInvalidResponse
from proxy.core.headers import drop, response_headers
from proxy.core.sse import ErrorWatcher, EventFramer, is_event_stream
from proxy.core.upstream_body import no_choices
from proxy.upstream.session import UPSTREAM_ERRORS, classify, read_capped

from .failures import model_info, sse_error
from .flow import Flow
from .hooks import Counter

# Non-streamed bodies up to this size are read whole before answering, so that an upstream that
# drops mid-body still gets the client a proper 502 envelope instead of a cut body.
BUFFER_LIMIT = 16 * 1024 * 1024


async def buffered_reply(
    flow: Flow, resp: aiohttp.ClientResponse, body: bytes | None = None
) -> web.Response:
    rec = flow.rec
    body = await resp.read() if body is None else body
    if resp.status == 200 and rec.row.choices and no_choices(body):
        raise UpstreamInvalidResponse(
            f"The upstream answered 200 for {rec.method} {rec.path} with an empty `choices` "
            "list: a generation has at least one choice."
        )
    headers = response_headers(resp.headers, rid=rec.request_id)
    drop(headers, ("Content-Length",))
    rec.status = resp.status
    return web.Response(status=resp.status, body=body, headers=headers)


def unframed_json(resp: aiohttp.ClientResponse) -> bool:
    """A JSON body with neither Content-Length nor chunking: it ends when the connection closes
    (RFC 9112 section 6.3), so an upstream that dies half way looks complete to HTTP."""
    return (
        resp.content_length is None
        and resp.method != "HEAD"
        and resp.status not in (204, 304)
        and "chunked" not in resp.headers.get("Transfer-Encoding", "").lower()
        and "json" in resp.headers.get("Content-Type", "").lower()
    )


def chunked_json_read(resp: aiohttp.ClientResponse) -> bool:
    """A chunked JSON answer to a GET (`/get_world_size`, `/is_sleeping`): relayed with a
    Content-Length, because SkyRL 0.4's control plane reads no body without one."""
    return (
        resp.method == "GET"
        and resp.status < 300
        and "chunked" in resp.headers.get("Transfer-Encoding", "").lower()
        and "json" in resp.headers.get("Content-Type", "").lower()
    )


async def checked_json_reply(flow: Flow, resp: aiohttp.ClientResponse) -> web.Response:
    """An unframed JSON body, read whole and relayed only when it parses: a cut one is a 502."""
    body, over = await read_capped(resp, BUFFER_LIMIT)
    where = f"for {flow.rec.method} {flow.rec.path}"
    if over:
        raise UpstreamInvalidResponse(
            f"The upstream sent a JSON body over {BUFFER_LIMIT} bytes without Content-Length "
            f"or chunked framing {where}; the sidecar cannot tell whether it is complete."
        )
    try:
        orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        raise UpstreamInvalidResponse(
            f"The upstream's JSON body {where} ended before it was complete (no Content-Length;"
            f" the connection closed after {len(body)} bytes): {exc}"
        ) from None
    return await buffered_reply(flow, resp, body)


async def stream_reply(
    flow: Flow, resp: aiohttp.ClientResponse, first: bytes = b""
) -> web.StreamResponse:
    """Relay as bytes arrive (`first`: what was read of them already); a failure after the
    headers becomes an SSE error event."""
    rec, metrics, request = flow.rec, flow.metrics, flow.request
    sse = is_event_stream(resp.headers.get("Content-Type"))
    headers = response_headers(resp.headers, rid=rec.request_id)
    if sse:
        drop(headers, ("Content-Length",))  # an error event may have to be appended
    out = web.StreamResponse(status=resp.status, headers=headers)
    rec.status = resp.status
    engine = flow.engine
    stream = _Stream(out, flow, ErrorWatcher() if sse else None)
    if not await stream.start():
        return out
    tally = engine.streaming() if sse and resp.status == 200 else None  # hook
    try:
        failure = await stream.pump(resp, first, tally)
    except asyncio.CancelledError:
        if sse and flow.in_flight.draining:
            await stream.end_with(ShuttingDown(_GRACE_OVER), _info(flow))
        raise
    finally:
        # Engine lifecycle and off-policy counts, however the stream ended: what vLLM made.
        counts = tally.counts(stream.watcher) if tally and stream.watcher else None
        tail = engine.ended(stream.aborted, counts) if sse else b""  # hook
    if failure is not None:
        rec.fail_with(metrics, failure)
        if not sse:
            # A relayed Content-Length or chunked framing left incomplete tells the client.
            if request.transport is not None:
                request.transport.close()
            return out
        await stream.end_with(failure, _info(flow))
        return out  # ended: an error event and [DONE], nothing after them
    if stream.client_gone:
        return out
    if tail:
        await stream.write(tail)  # engine lifecycle: the weight version changed mid-stream
    await stream.finish()
    return out


def _info(flow: Flow) -> ModelInfo | None:
    # Built only for a stream that fails: most never need it.
    return model_info(flow, suggest=False)


_GRACE_OVER = "The sidecar shut down before the stream finished (--shutdown-grace ran out)."


class _Stream:
    """One relayed body: pumps chunks, watches SSE errors, notices a client that left."""

    def __init__(self, out: web.StreamResponse, flow: Flow, watcher: ErrorWatcher | None) -> None:
        self.out, self.flow, self.watcher = out, flow, watcher
        self.last = b"\n\n"  # the last chunk relayed (SSE): did it end an event?
        self.events = EventFramer()  # SSE only: the event the upstream has not ended yet
        self.client_gone = False

    async def pump(
        self, resp: aiohttp.ClientResponse, first: bytes, tally: Counter | None
    ) -> SidecarFailure | None:
        """Relay `first`, then until the upstream ends (None), fails (the failure) or the client
        leaves; `tally` counts a generation's tokens as they pass.

        Per chunk this is the whole of the sidecar's work, so it is kept flat: `readany()`
        and the response's `write()` awaited here directly (`iter_any()` and a write helper
        would each add a coroutine a chunk), and a chunk of whole events without an `"error"`
        passes the SSE watcher with two searches (`ErrorWatcher.passes`).
        """
        read, write = resp.content.readany, self.out.write
        watcher, events = self.watcher, self.events
        ended = tally.ended if tally is not None else None
        chunk = first
        while True:
            if not chunk:
                try:
                    chunk = await read()
                except UPSTREAM_ERRORS as exc:
                    rec = self.flow.rec
                    where = f"while streaming {rec.method} {rec.path}"
                    return classify(exc, where=where)
                if not chunk:  # the upstream's end
                    if events.held:  # relayed as sent: an SSE client drops an unended event
                        await self.write(events.held)
                    return None
            if watcher is not None:
                if events.held or not watcher.passes(chunk):
                    if watcher.feed(chunk):
                        self.count_errors()
                    chunk = events.whole(chunk)
                    if not chunk:
                        continue
                self.last = chunk
                if ended is not None and watcher.ends:
                    ended(chunk)
            try:
                await write(chunk)
            except ConnectionError:
                self._client_left()
                return None
            chunk = b""

    # A ConnectionError from any write to the client (the headers, a chunk, the end) means the
    # client left: it is counted as a disconnect, never as the upstream's failure, and no
    # second response is attempted.
    async def start(self) -> bool:
        try:
            await self.out.prepare(self.flow.request)
        except ConnectionError:
            return self._client_left()
        return True

    async def write(self, data: bytes) -> bool:
        try:
            await self.out.write(data)
        except ConnectionError:
            return self._client_left()
        return True

    async def finish(self) -> None:
        try:
            await self.out.write_eof()
        except ConnectionError:
            self._client_left()

    def _client_left(self) -> bool:
        self.flow.rec.client_left(self.flow.metrics)
        self.client_gone = True
        return False

    async def end_with(self, failure: SidecarFailure, info: ModelInfo | None) -> None:
        """One SSE error event and [DONE]. The event the upstream left unended is not sent (the
        framer holds it); only one over 64 KiB may have gone out half, and is ended first."""
        sep = b"" if self.last.endswith(b"\n\n") else b"\n\n"
        if await self.write(sep + sse_error(self.flow, failure, info)):
            await self.finish()

    @property
    def aborted(self) -> bool:
        return self.watcher is not None and self.watcher.aborted

    def count_errors(self) -> None:
        """Count the error events seen since the last call, before they reach the client."""
        assert self.watcher is not None
        rec, metrics = self.flow.rec, self.flow.metrics
        for event in self.watcher.take():
            code = event["error"].get("code") if isinstance(event["error"], dict) else None
            status = code if isinstance(code, int) and 100 <= code <= 599 else rec.status
            rec.fail(metrics, "upstream", "upstream_stream_error", status)
