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
import time
from collections.abc import Callable
from typing import Any

from aiohttp import web

from proxy.observe.metrics import Metrics

from .drain import InFlight
from .guard import Guard, Limits

log = logging.getLogger(__name__)

# Descriptors kept for everything but client connections: listeners, the admin port, logs.
RESERVED_FDS = 64


class _Refused(asyncio.Protocol):
    """A connection over the limit: closed as soon as it is accepted."""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        transport.close()


class Connections:
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
        # Called on every read from a client: the clock itself, not a lookup of the loop first.
        return time.monotonic()

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
            reason = self._reason(guard, now)
            if reason is not None:
                self.close(guard, reason)

    def _reason(self, guard: Guard, now: float) -> str | None:
        """Why `guard`'s connection is to be closed now, if it is (this sweep's step of it)."""
        if self.draining and guard.idle():
            return "draining"
        return guard.sweep(now, self.limits)

    async def run(self) -> None:
        while True:
            await asyncio.sleep(self.limits.tick)
            self.sweep()

    def start_draining(self) -> None:
        """No new request on a kept-alive connection: idle ones close now, busy ones after."""
        self.in_flight.begin_draining()
        self.sweep()


def started(conns: Connections, request: web.Request) -> Guard | None:
    """Tell the request's connection guard that a request started on it; the guard, to be told
    `finished()` when it ends. Called by the handler itself: a middleware would cost every
    request a layer of coroutine calls. None: a server that is not guarded (aiohttp's test one)."""
    guard = conns.guards.get(request.protocol)
    if guard is not None:
        guard.started(request.content)
    return guard


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
    conns: Connections, server: Any, host: str, port: int, *, sock: socket.socket | None = None
) -> tuple[asyncio.Server, asyncio.Task[None]]:
    """The proxy listener, each accepted connection guarded, and the sweep that bounds them.

    `sock`: a worker's listening socket (`--workers N`), in place of (host, port)."""
    loop = asyncio.get_running_loop()
    factory = conns.factory(server)
    if sock is not None:
        listener = await loop.create_server(factory, sock=sock, backlog=1024)
    else:
        listener = await loop.create_server(factory, host, port, backlog=1024, reuse_address=True)
    return listener, asyncio.create_task(conns.run())


# Its slot on an app (aiohttp's typed key, declared beside what it holds).
CONNECTIONS = web.AppKey("connections", Connections)
