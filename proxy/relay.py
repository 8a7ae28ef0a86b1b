"""The upstream's answer back to the client: errors enveloped, bodies relayed, streams watched."""

from __future__ import annotations

import asyncio

import aiohttp
import orjson
from aiohttp import web
from multidict import CIMultiDict

from . import envelope
from .discovery import Discovery
from .errors import ShuttingDown, SidecarFailure, UpstreamInvalidResponse
from .exchange import CLIENT_CLOSED, Exchange
from .gate import stream_ended
from .headers import SIDECAR_ERROR, drop, response_headers
from .inbound import model_info
from .keys import IN_FLIGHT
from .metrics import Metrics
from .sse import ErrorWatcher, is_event_stream
from .upstream import UPSTREAM_ERRORS, classify

# Non-streamed bodies up to this size are read whole before answering, so that an upstream that
# drops mid-body still gets the client a proper 502 envelope instead of a cut body.
BUFFER_LIMIT = 16 * 1024 * 1024
_ENTITY = ("Content-Length", "Content-Type", "Content-Encoding")


def client_left(ex: Exchange, metrics: Metrics) -> None:
    """Count a client that left before its answer was complete (status 499, nginx's)."""
    metrics.disconnects.labels(ex.route).inc()
    ex.reason = ex.reason or "client_disconnected"
    ex.status = CLIENT_CLOSED


def envelope_response(
    ex: Exchange, status: int, env: dict[str, object], headers: CIMultiDict[str] | None = None
) -> web.Response:
    out = headers if headers is not None else CIMultiDict()
    drop(out, _ENTITY)
    out[SIDECAR_ERROR] = str(env["error"]["reason"])  # type: ignore[index]
    out["X-Request-Id"] = ex.request_id
    ex.status = status
    return web.Response(
        status=status, body=envelope.encode(env), content_type="application/json", headers=out
    )


def failure_response(
    ex: Exchange, failure: SidecarFailure, metrics: Metrics, discovery: Discovery
) -> web.Response:
    ex.fail_with(metrics, failure)
    info = model_info(ex, discovery, suggest=False)
    env = envelope.from_failure(failure, request_id=ex.request_id, model=info)
    if "candidates" in failure.extra and info is not None:
        env["error"]["model"]["suggestions"] = failure.extra["candidates"]
    return envelope_response(ex, failure.status, env)


async def _read_capped(resp: aiohttp.ClientResponse, limit: int) -> tuple[bytes, bool]:
    parts, size = [], 0
    async for chunk in resp.content.iter_any():
        parts.append(chunk)
        size += len(chunk)
        if size > limit:
            return b"".join(parts)[:limit], True
    return b"".join(parts), False


async def error_reply(
    ex: Exchange, resp: aiohttp.ClientResponse, metrics: Metrics, discovery: Discovery, limit: int
) -> web.Response:
    """An upstream 4xx/5xx: its status kept, its body parsed and attached to the envelope."""
    raw, truncated = await _read_capped(resp, limit)
    if resp.status == 404 and ex.resolved is not None:
        # vLLM no longer serves the name we resolved to (restarted under another name, adapter
        # unloaded): re-read the list now rather than at the next scheduled discovery.
        await discovery.refresh_on_miss()
    reply = envelope.UpstreamReply(
        status=resp.status,
        method=ex.method,
        path=ex.path,
        content_type=resp.headers.get("Content-Type"),
        body=envelope.decode_body(
            raw,
            content_type=resp.headers.get("Content-Type"),
            content_encoding=resp.headers.get("Content-Encoding"),
            truncated=truncated,
        ),
        body_truncated=truncated,
    )
    info = model_info(ex, discovery, suggest=resp.status == 404)
    env = envelope.from_upstream_status(reply, request_id=ex.request_id, model=info)
    ex.fail(metrics, "upstream", "upstream_status", resp.status)
    return envelope_response(
        ex, resp.status, env, response_headers(resp.headers, rid=ex.request_id)
    )


async def buffered_reply(
    ex: Exchange, resp: aiohttp.ClientResponse, body: bytes | None = None
) -> web.Response:
    body = await resp.read() if body is None else body
    headers = response_headers(resp.headers, rid=ex.request_id)
    drop(headers, ("Content-Length",))
    ex.status = resp.status
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


async def checked_json_reply(ex: Exchange, resp: aiohttp.ClientResponse) -> web.Response:
    """An unframed JSON body, read whole and relayed only when it parses: a cut one is a 502."""
    body, over = await _read_capped(resp, BUFFER_LIMIT)
    where = f"for {ex.method} {ex.path}"
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
    return await buffered_reply(ex, resp, body)


async def stream_reply(
    request: web.Request,
    ex: Exchange,
    resp: aiohttp.ClientResponse,
    metrics: Metrics,
    discovery: Discovery,
) -> web.StreamResponse:
    """Relay as bytes arrive; a failure after the headers becomes an SSE error event."""
    sse = is_event_stream(resp.headers.get("Content-Type"))
    headers = response_headers(resp.headers, rid=ex.request_id)
    if sse:
        drop(headers, ("Content-Length",))  # an error event may have to be appended
    out = web.StreamResponse(status=resp.status, headers=headers)
    ex.status = resp.status
    stream = _Stream(out, ex, metrics, ErrorWatcher() if sse else None)
    if not await stream.start(request):
        return out
    info = model_info(ex, discovery, suggest=False)
    try:
        failure = await stream.pump(resp)
    except asyncio.CancelledError:
        if sse and request.app[IN_FLIGHT].draining:
            await stream.end_with(ShuttingDown(_GRACE_OVER), info)
        raise
    if failure is not None:
        ex.fail_with(metrics, failure)
        if not sse:
            # A relayed Content-Length or chunked framing left incomplete tells the client.
            if request.transport is not None:
                request.transport.close()
            return out
        await stream.end_with(failure, info)
    if stream.client_gone:
        return out
    if sse and (tail := stream_ended(request, aborted=stream.aborted)):
        await stream.write(tail)  # engine lifecycle: an abort counted, a weight-version change
    await stream.finish()
    return out


_GRACE_OVER = "The sidecar shut down before the stream finished (--shutdown-grace ran out)."


class _Stream:
    """One relayed body: pumps chunks, watches SSE errors, notices a client that left."""

    def __init__(
        self, out: web.StreamResponse, ex: Exchange, metrics: Metrics, watcher: ErrorWatcher | None
    ) -> None:
        self.out, self.ex, self.metrics, self.watcher = out, ex, metrics, watcher
        self.tail = b"\n\n"
        self.client_gone = False

    async def pump(self, resp: aiohttp.ClientResponse) -> SidecarFailure | None:
        """Relay until the upstream ends (None), fails (the failure) or the client leaves."""
        chunks = resp.content.iter_any().__aiter__()
        while True:
            try:
                chunk = await anext(chunks)
            except StopAsyncIteration:
                return None
            except UPSTREAM_ERRORS as exc:
                return classify(exc, where=f"while streaming {self.ex.method} {self.ex.path}")
            if self.watcher is not None:
                self.tail = chunk[-2:]
                if self.watcher.feed(chunk):
                    self.count_errors()
            if not await self.write(chunk):
                return None

    # A ConnectionError from any write to the client (the headers, a chunk, the end) means the
    # client left: it is counted as a disconnect, never as the upstream's failure, and no
    # second response is attempted.
    async def start(self, request: web.Request) -> bool:
        try:
            await self.out.prepare(request)
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
        client_left(self.ex, self.metrics)
        self.client_gone = True
        return False

    async def end_with(self, failure: SidecarFailure, info: envelope.ModelInfo | None) -> None:
        """One SSE error event and [DONE], after whatever event the upstream left unfinished."""
        env = envelope.from_failure(failure, request_id=self.ex.request_id, model=info)
        sep = b"" if self.tail.endswith(b"\n\n") else b"\n\n"
        if await self.write(sep + envelope.sse_event(env)):
            await self.finish()

    @property
    def aborted(self) -> bool:
        return self.watcher is not None and self.watcher.aborted

    def count_errors(self) -> None:
        """Count the error events seen since the last call, before they reach the client."""
        assert self.watcher is not None
        for event in self.watcher.take():
            code = event["error"].get("code") if isinstance(event["error"], dict) else None
            status = code if isinstance(code, int) and 100 <= code <= 599 else self.ex.status
            self.ex.fail(self.metrics, "upstream", "upstream_stream_error", status)
