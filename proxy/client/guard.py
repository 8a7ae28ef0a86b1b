"""One client connection's guard: aiohttp's protocol inside, the times that bound it outside.

The limits are declared here; the sweep that applies them, and the limit at accept, are
connections.py's, which this module knows only as a `Keeper`.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Protocol, cast

from aiohttp import StreamReader, web
from aiohttp.http import RawRequestMessage


@dataclass(frozen=True, slots=True)
class Limits:
    """A client connection's bounds (seconds; bytes a second) and the port's connection limit."""

    header: float
    body: float
    idle: float
    send: float
    max_connections: int
    min_body_rate: int = 0

    @property
    def tick(self) -> float:
        """How often the sweep runs: a timeout fires at most a quarter of itself late."""
        return min(1.0, max(0.02, min(self.header, self.body, self.idle, self.send) / 4))


class Keeper(Protocol):
    """What keeps the guards (connections.Connections): its clock and the open connections."""

    def now(self) -> float: ...

    def add(self, guard: Guard) -> None: ...

    def discard(self, guard: Guard) -> None: ...


class Guard(asyncio.Protocol):
    """One client connection: aiohttp's protocol inside, the times that bound it outside."""

    def __init__(self, watch: Keeper, inner: asyncio.Protocol) -> None:
        self.watch, self.inner = watch, inner
        self.transport: asyncio.Transport | None = None
        now = watch.now()
        self.last_rx = self.idle_since = now
        self.head_since: float | None = None
        self.paused_since: float | None = None
        self.body: StreamReader | None = None
        self.busy = False
        self.window_start, self.window_bytes = now, 0  # the body's rate, over one body timeout

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's is not a subclass
        self.watch.add(self)
        self.inner.connection_made(transport)

    def connection_lost(self, exc: Exception | None) -> None:
        self.watch.discard(self)
        self.inner.connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        self.last_rx = self.watch.now()
        self.window_bytes += len(data)
        if not self.busy and self.head_since is None:
            self.head_since = self.last_rx
        self.inner.data_received(data)
        if self.body is not None and not self.body.is_eof():
            self._check_body()

    def eof_received(self) -> bool | None:
        keep_open = self.inner.eof_received()
        if self.busy and self.transport is not None:
            # The client closed its side mid-request (nginx's 499): aiohttp writes no more to a
            # closing transport, so nobody gets the rest of this answer. Abort, so the handler
            # and its upstream request (a vLLM generation) end now; a close would first flush
            # the answer into a window a gone client never opens, for as long as the kernel's
            # zero-window probes take to draw its reset (tens of seconds) or the send timeout.
            self.transport.abort()
        return keep_open

    def pause_writing(self) -> None:
        self.paused_since = self.watch.now()
        self.inner.pause_writing()

    def resume_writing(self) -> None:
        self.paused_since = None
        self.inner.resume_writing()

    def started(self, body: StreamReader) -> None:
        self.busy, self.body, self.head_since = True, body, None
        self.window_start, self.window_bytes = self.watch.now(), 0
        if not body.is_eof():
            self._check_body()  # its bad bytes may have come before its handler started

    def _check_body(self) -> None:
        """A body the parser gave up on ends, with the parser's error, for whoever reads it.

        aiohttp's C parser raises a body's framing error (a chunk size `zz`, data past a
        chunk's size) from `feed_data`, and its protocol queues it as the next message, leaving
        the body unended: the handler would wait on it until the body timeout. No message can
        follow a body that has not ended but that error, so one queued now is it. Ended as
        well, the body is not read on after its answer (aiohttp's lingering close)."""
        queued = getattr(self.inner, "_messages", ())  # aiohttp 3.14's queue: no public view
        if not queued or self.body is None:
            return
        error = next((m for m, _ in queued if not isinstance(m, RawRequestMessage)), None)
        if error is None:
            return
        if self.body.exception() is None:  # aiohttp's pure-Python parser sets its own
            cause = getattr(error, "exc", None)
            failure = web.RequestPayloadError(str(getattr(cause, "message", "bad framing")))
            failure.__cause__ = cause
            self.body.set_exception(failure)
        self.body.feed_eof()

    def finished(self) -> None:
        self.busy, self.body = False, None
        self.idle_since = self.watch.now()

    def idle(self) -> bool:
        """Between requests, with the last answer written out."""
        idle = not self.busy and self.head_since is None
        return idle and self.transport is not None and not self.transport.get_write_buffer_size()

    def sweep(self, now: float, limits: Limits) -> str | None:
        """One sweep's step: the clocks catch up, then why to close this connection now, if so.

        Not a plain query: time the sidecar itself held the connection back (not reading, an
        answer still going out) restarts its body and idle clocks, and a full rate window
        starts the next one.
        """
        transport = self.transport
        if transport is None:
            return None
        if self.paused_since is not None:
            return "send_timeout" if now - self.paused_since > limits.send else None
        if not transport.is_reading():
            # Held back by the sidecar itself (a full buffer), not by the client.
            self.last_rx = self.window_start = now
            self.window_bytes = 0
        if self.busy:
            reading = self.body is not None and not self.body.is_eof()
            return self._body_step(now, limits) if reading else None
        if transport.get_write_buffer_size():
            self.idle_since = now  # an answer still on its way out: not idle
        if self.head_since is not None:
            return "header_timeout" if now - self.head_since > limits.header else None
        return "idle_timeout" if now - self.idle_since > limits.idle else None

    def _body_step(self, now: float, limits: Limits) -> str | None:
        if now - self.last_rx > limits.body:
            return "body_timeout"
        span = now - self.window_start
        if span < limits.body:
            return None
        slow = self.window_bytes < limits.min_body_rate * span
        self.window_start, self.window_bytes = now, 0
        return "body_too_slow" if slow else None
