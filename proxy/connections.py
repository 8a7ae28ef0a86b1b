"""Client connections on the proxy port: nginx's timeouts, a connection limit, the drain's close.

aiohttp's server has no header, body or send timeout, and keeps an idle connection for an hour;
one client trickling bytes, or not reading, can hold descriptors and memory forever. Each
connection's protocol is wrapped here (the plain asyncio Protocol interface, nothing private),
and one sweep closes those that owe the sidecar bytes, or will not take them, for too long:

- header: a request's head not complete this long after its first byte (`client_header_timeout`);
- body: no byte of a request body this long while the handler is reading (`client_body_timeout`),
  or fewer than `min_body_rate` bytes a second over that long (a body trickled to hold the slot);
- idle: no new request this long after the last answer (`keepalive_timeout`);
- send: the client has not taken a byte of the answer this long (`send_timeout`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import resource
import socket
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, cast

from aiohttp import StreamReader, web

from .drain import InFlight
from .metrics import Metrics

log = logging.getLogger(__name__)

# Descriptors kept for everything but client connections: listeners, the admin port, logs.
RESERVED_FDS = 64


@dataclass(frozen=True, slots=True)
class Limits:
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


class Guard(asyncio.Protocol):
    """One client connection: aiohttp's protocol inside, the times that bound it outside."""

    def __init__(self, watch: Watch, inner: asyncio.Protocol) -> None:
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

    def eof_received(self) -> bool | None:
        return self.inner.eof_received()

    def pause_writing(self) -> None:
        self.paused_since = self.watch.now()
        self.inner.pause_writing()

    def resume_writing(self) -> None:
        self.paused_since = None
        self.inner.resume_writing()

    def started(self, body: StreamReader) -> None:
        self.busy, self.body, self.head_since = True, body, None
        self.window_start, self.window_bytes = self.watch.now(), 0

    def finished(self) -> None:
        self.busy, self.body = False, None
        self.idle_since = self.watch.now()

    def idle(self) -> bool:
        """Between requests, with the last answer written out."""
        idle = not self.busy and self.head_since is None
        return idle and self.transport is not None and not self.transport.get_write_buffer_size()

    def expired(self, now: float, limits: Limits) -> str | None:
        """Why this connection is to be closed now, if it is."""
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
            return self._body_expired(now, limits) if reading else None
        if transport.get_write_buffer_size():
            self.idle_since = now  # an answer still on its way out: not idle
        if self.head_since is not None:
            return "header_timeout" if now - self.head_since > limits.header else None
        return "idle_timeout" if now - self.idle_since > limits.idle else None

    def _body_expired(self, now: float, limits: Limits) -> str | None:
        if now - self.last_rx > limits.body:
            return "body_timeout"
        span = now - self.window_start
        if span < limits.body:
            return None
        slow = self.window_bytes < limits.min_body_rate * span
        self.window_start, self.window_bytes = now, 0
        return "body_too_slow" if slow else None


class _Refused(asyncio.Protocol):
    """A connection over the limit: closed as soon as it is accepted."""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        transport.close()


class Watch:
    """The proxy port's connections: the limit at accept, the timeouts by a periodic sweep."""

    def __init__(
        self,
        limits: Limits,
        metrics: Metrics,
        in_flight: InFlight,
        on_quiet: Callable[[], None] | None = None,
    ) -> None:
        self.limits, self.metrics, self.in_flight = limits, metrics, in_flight
        self.on_quiet = on_quiet  # called when the last client connection has closed
        self.guards: dict[object, Guard] = {}

    @property
    def draining(self) -> bool:
        return self.in_flight.draining

    @staticmethod
    def now() -> float:
        return asyncio.get_running_loop().time()

    def add(self, guard: Guard) -> None:
        self.guards[guard.inner] = guard
        self.metrics.client_connections.set(len(self.guards))

    def discard(self, guard: Guard) -> None:
        self.guards.pop(guard.inner, None)
        self.metrics.client_connections.set(len(self.guards))
        if not self.guards and self.on_quiet is not None:
            self.on_quiet()

    def factory(self, make: Callable[[], asyncio.Protocol]) -> Callable[[], asyncio.Protocol]:
        def build() -> asyncio.Protocol:
            if len(self.guards) >= self.limits.max_connections:
                self.metrics.connections_closed.labels("connection_limit").inc()
                return _Refused()
            return Guard(self, make())

        return build

    def close(self, guard: Guard, reason: str) -> None:
        log.debug("closing a client connection: %s", reason)
        self.metrics.connections_closed.labels(reason).inc()
        if guard.transport is not None:
            # A request in progress ends as a client hang-up: its handler is cancelled, and with
            # it the upstream request, so a stalled body does not hold a pooled connection.
            guard.transport.abort() if guard.busy else guard.transport.close()

    def sweep(self) -> None:
        now = self.now()
        for guard in list(self.guards.values()):
            reason = self.expired(guard, now)
            if reason is not None:
                self.close(guard, reason)

    def expired(self, guard: Guard, now: float) -> str | None:
        if self.draining and guard.idle():
            return "draining"
        return guard.expired(now, self.limits)

    async def run(self) -> None:
        while True:
            await asyncio.sleep(self.limits.tick)
            self.sweep()

    def start_draining(self) -> None:
        """No new request on a kept-alive connection: idle ones close now, busy ones after."""
        self.in_flight.draining = True
        self.sweep()


def middleware(watch: Watch) -> Callable[..., Awaitable[web.StreamResponse]]:
    """Tells each connection's guard when a request starts and ends."""

    @web.middleware
    async def track(
        request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
    ) -> web.StreamResponse:
        guard = watch.guards.get(request.protocol)
        if guard is None:  # a server that is not guarded (aiohttp's test server)
            return await handler(request)
        guard.started(request.content)
        try:
            response = await handler(request)
            if watch.draining:
                response.force_close()  # answered with `Connection: close`
            return response
        finally:
            guard.finished()

    return track


def raise_fd_limit() -> int:
    """Raise the soft open-files limit to the hard one (containerd's soft default is 1024)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != hard:
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
            soft = hard
    return soft


def connection_cap(wanted: int, fd_limit: int) -> int:
    """Client connections allowed: each may hold an upstream connection too, so two descriptors."""
    return max(1, min(wanted, (fd_limit - RESERVED_FDS) // 2))


async def serve_guarded(
    watch: Watch, server: Any, host: str, port: int, *, sock: socket.socket | None = None
) -> tuple[asyncio.Server, asyncio.Task[None]]:
    """The proxy listener, each accepted connection guarded, and the sweep that bounds them.

    `sock`: a worker's listening socket (`--workers N`), in place of (host, port)."""
    loop = asyncio.get_running_loop()
    factory = watch.factory(server)
    if sock is not None:
        listener = await loop.create_server(factory, sock=sock, backlog=1024)
    else:
        listener = await loop.create_server(factory, host, port, backlog=1024, reuse_address=True)
    return listener, asyncio.create_task(watch.run())
