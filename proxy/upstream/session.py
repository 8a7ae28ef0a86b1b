"""The upstream connection: client session settings, URL building, client errors -> failures."""

from __future__ import annotations

import asyncio
import functools
import logging
from typing import Any

import aiohttp
from aiohttp import web
from aiohttp.client_proto import ResponseHandler
from yarl import URL

from proxy.core.errors import (
    Interrupted,
    SidecarFailure,
    UpstreamDisconnected,
    UpstreamInvalidResponse,
    UpstreamPoolExhausted,
    UpstreamTimeout,
    UpstreamUnreachable,
)

from .marks import QUEUED as _QUEUED
from .marks import WIRE as _WIRE
from .marks import Wire
from .options import UpstreamOptions

log = logging.getLogger(__name__)


class _AnsweredOnce(ResponseHandler):
    """A pooled connection that closes itself when the upstream writes while no request waits,
    or writes a second final answer to one request.

    aiohttp parses such bytes into its queue and hands the connection to the next request,
    which then reads the stale response as its own, and every later request on it the previous
    one's (the pool checks only that the socket is open). nginx and Envoy close an idle
    upstream connection that receives data; so does this. Waiting starts when a request's
    response parameters are set, just before it is sent, and ends when a final (non-1xx)
    response has been read to its end. An answer that arrives in the same read as the end of
    the one before is parsed in that read, after the first has released the connection to the
    pool: it is dropped, and the connection closed, before any request can take it.
    """

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        super().__init__(loop)
        self._waiting = False
        self._answer: Any = None  # the payload of the final response, once its head is parsed
        self._wire: Wire | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)
        self._wire = Wire(transport)

    def set_response_params(self, **params: Any) -> None:
        self._waiting, self._answer = True, None
        if self._wire is not None:  # aiohttp calls this in the request's task, before sending
            self._wire.sending()
        super().set_response_params(**params)

    def connection_lost(self, exc: BaseException | None) -> None:
        if self._wire is not None and self._waiting and self._answer is None:
            self._wire.lost(exc)  # before any answer, while the socket is still open
        super().connection_lost(exc)

    def feed_data(self, data: Any, size: int = 0) -> None:
        message, payload = data
        if message.code >= 200:
            if self._answer is not None or not self._waiting:
                log.warning("closing an upstream connection that sent an answer nobody asked for")
                self._should_close = True
                if self.transport is not None:
                    self.transport.close()
                return
            self._answer = payload
        super().feed_data(data, size)

    def data_received(self, data: bytes) -> None:
        if data and not self._waiting:
            log.warning("closing an idle upstream connection that received %d bytes", len(data))
            if self.transport is not None:
                self.transport.close()
            return
        super().data_received(data)
        if self._answer is not None and self._answer.is_eof():
            self._waiting, self._answer = False, None


class _Connector(aiohttp.TCPConnector):
    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        # aiohttp has no public hook for the protocol class: the factory is the one seam.
        self._factory = functools.partial(_AnsweredOnce, loop=self._loop)  # type: ignore[assignment]


def make_session(settings: UpstreamOptions) -> aiohttp.ClientSession:
    """A session tuned for LLM traffic; each default below breaks it when left alone."""
    connector = _Connector(
        limit=settings.max_connections,  # 0: SkyRL sends 512 concurrent requests per engine
        limit_per_host=0,
        enable_cleanup_closed=False,
        ttl_dns_cache=60,
        # Idle connections are dropped before vLLM drops them (uvicorn's keep-alive timeout,
        # VLLM_HTTP_TIMEOUT_KEEP_ALIVE, is 5 s; aiohttp's default here is 15 s). Otherwise a
        # request can go out on a connection the upstream is closing that very moment, and a
        # POST is not retried: the client would get a 502 for a request vLLM never saw.
        keepalive_timeout=4.0,
    )
    timeout = aiohttp.ClientTimeout(
        total=None,  # generations can run for many minutes
        # aiohttp's `connect` spans the wait for a pooled connection and the connecting; with a
        # bounded pool that wait gets --pool-timeout, the connecting its own timeout after it.
        connect=settings.pool_timeout + settings.connect_timeout
        if settings.max_connections
        else None,
        sock_connect=settings.connect_timeout,
        sock_read=settings.read_timeout,
    )
    return aiohttp.ClientSession(
        connector=connector,
        timeout=timeout,
        # Only a bounded pool has a queue to tell apart; a trace costs every request ~13 us.
        trace_configs=[_pool_queue_trace()] if settings.max_connections else None,
        auto_decompress=False,  # relay Content-Encoding together with the bytes it describes
        # Relay the client's headers, not aiohttp's: add none of its defaults.
        skip_auto_headers=("User-Agent", "Accept", "Accept-Encoding", "Content-Type"),
        cookie_jar=aiohttp.DummyCookieJar(),
        trust_env=False,
    )


def _pool_queue_trace() -> aiohttp.TraceConfig:
    async def queued(*_: object) -> None:
        _QUEUED.set(True)

    async def dequeued(*_: object) -> None:
        _QUEUED.set(False)

    trace = aiohttp.TraceConfig()
    trace.on_connection_queued_start.append(queued)
    trace.on_connection_queued_end.append(dequeued)
    return trace


async def read_capped(resp: aiohttp.ClientResponse, limit: int) -> tuple[bytes, bool]:
    """At most `limit` bytes of the body, and whether there was more."""
    parts, size = [], 0
    async for chunk in resp.content.iter_any():
        parts.append(chunk)
        size += len(chunk)
        if size > limit:
            return b"".join(parts)[:limit], True
    return b"".join(parts), False


def target(base: URL, raw_path_qs: str) -> URL:
    """The upstream URL for a request's raw path and query, passed byte for byte.

    Built from raw parts with `encoded=True`: yarl's `join()` would drop a base path and
    `with_query()` would encode the query a second time.
    """
    return URL(str(base).rstrip("/") + raw_path_qs, encoded=True)


def classify(exc: BaseException, *, where: str) -> SidecarFailure:
    """A client-side exception from talking to the upstream -> the failure the client is told."""
    if isinstance(exc, Interrupted):
        return exc.failure
    if isinstance(exc, aiohttp.ConnectionTimeoutError) and _QUEUED.get():
        return UpstreamPoolExhausted(
            f"Every upstream connection (--max-connections) stayed busy {where}, past"
            " --pool-timeout; retry later."
        )
    if isinstance(exc, aiohttp.ServerTimeoutError | asyncio.TimeoutError):
        return UpstreamTimeout(f"The upstream timed out {where}: {exc or type(exc).__name__}")
    if isinstance(exc, aiohttp.ClientConnectorError):
        return UpstreamUnreachable(f"Could not connect to the upstream {where}: {exc.os_error}")
    if isinstance(exc, aiohttp.ClientResponseError):
        return UpstreamInvalidResponse(
            f"The upstream sent an invalid HTTP response {where}: {exc.message}"
        )
    detail = str(exc) or type(exc).__name__
    return UpstreamDisconnected(f"The upstream connection dropped {where}: {detail}")


def never_connected(exc: BaseException) -> bool:
    """A connect to the upstream that timed out (not a wait for the pool): nothing was sent."""
    return isinstance(exc, aiohttp.ConnectionTimeoutError) and not _QUEUED.get()


def closed_while_idle(exc: BaseException) -> bool:
    """The upstream closed a kept-alive connection as the request went out on it, before
    reading it: uvicorn closes one idle for VLLM_HTTP_TIMEOUT_KEEP_ALIVE (5 s), and its close
    can cross the next request on the wire. Such a request was never read, whatever its method,
    and may go again on a new connection (browsers do; aiohttp only for idempotent methods).

    Told apart by TCP, not by the kind of close (marks.Wire): only when vLLM's kernel had
    acknowledged no byte of the request when the connection went. A vLLM that read the request
    and then closed, reset or died had acknowledged it: that request may have run (a weight
    update waiting for a broadcast, a generation), and is never sent again. A connection of its
    own closed unanswered is no idle close either: not this."""
    if isinstance(exc, aiohttp.ClientConnectorError):  # a new connection that failed
        return False
    wire = _WIRE.get()
    return (
        wire is not None
        and wire.reused
        and wire.unread
        and isinstance(exc, aiohttp.ServerDisconnectedError | aiohttp.ClientOSError)
    )


# What `classify` understands: raised while sending to or reading from the upstream (or set on
# a read by the sidecar itself: core/errors.py's Interrupted).
UPSTREAM_ERRORS = (aiohttp.ClientError, asyncio.TimeoutError, ConnectionError, Interrupted)


# Its slot on an app (aiohttp's typed key, declared beside what it holds).
SESSION = web.AppKey("session", aiohttp.ClientSession)
UPSTREAM = web.AppKey("upstream", URL)
