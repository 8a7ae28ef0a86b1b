"""The lean client's keep-alive pool: last in, first out, idle ones dropped at 4 s, bounded."""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Awaitable, Callable

import aiohttp

from ..marks import QUEUED
from .connection import Connection

# Dropped before vLLM drops them (uvicorn's keep-alive timeout, VLLM_HTTP_TIMEOUT_KEEP_ALIVE, is
# 5 s): a request sent on a connection the upstream is closing that very moment is lost.
KEEPALIVE = 4.0


class Pool:
    """Connections to one upstream. The most recently used idle one goes first: it is the least
    likely to be closing, and the rest age out together. With a `limit`, a request waits at
    most `wait` seconds for a connection (aiohttp's ConnectionTimeoutError, with QUEUED set)."""

    def __init__(
        self,
        connect: Callable[[], Awaitable[Connection]],
        *,
        limit: int,
        wait: float,
        keepalive: float = KEEPALIVE,
    ) -> None:
        self._connect = connect
        self._limit, self._wait, self._keepalive = limit, wait, keepalive
        self._idle: deque[tuple[float, Connection]] = deque()  # oldest on the left
        self._waiters: deque[asyncio.Future[Connection | None]] = deque()
        self.count = 0  # open or opening
        self.all: set[Connection] = set()
        self._sweep: asyncio.TimerHandle | None = None

    async def acquire(self) -> Connection:
        idle = self._idle
        if idle:
            self._expire(asyncio.get_running_loop().time())
            while idle:
                conn = idle.pop()[1]
                if conn.done:  # not lost, nor closing (an EOF seen, connection_lost not yet)
                    return conn
                conn.abort()
        if self._limit and self.count >= self._limit:
            handed = await self._queue()
            if handed is not None:
                return handed
        self.count += 1
        try:
            conn = await self._connect()
        except BaseException:
            self._freed()
            raise
        conn.on_lost = self._lost
        self.all.add(conn)
        return conn

    def release(self, conn: Connection) -> None:
        """Back into the pool when its answer arrived whole and it may carry another; closed
        otherwise (a body not read to its end, `Connection: close`, a failure)."""
        if not conn.done:
            conn.abort()
            return
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_result(conn)
                return
        loop = asyncio.get_running_loop()
        if not self._idle and self._sweep is None:
            self._sweep = loop.call_later(self._keepalive, self._swept)
        self._idle.append((loop.time(), conn))

    def close(self) -> None:
        if self._sweep is not None:
            self._sweep.cancel()
            self._sweep = None
        for conn in list(self.all):
            conn.abort()
        self._idle.clear()

    def _swept(self) -> None:
        """A connection left idle past the keep-alive is closed then, as aiohttp's pool does,
        not only when the next request looks (one timer for the pool, not one per request)."""
        self._sweep = None
        loop = asyncio.get_running_loop()
        self._expire(loop.time())
        if self._idle:
            wait = self._idle[0][0] + self._keepalive - loop.time()
            self._sweep = loop.call_later(max(wait, 0.05), self._swept)

    def _expire(self, now: float) -> None:
        idle = self._idle
        while idle and now - idle[0][0] >= self._keepalive:
            idle.popleft()[1].abort()

    def _lost(self, conn: Connection) -> None:
        self.all.discard(conn)
        self._freed()

    def _freed(self) -> None:
        self.count -= 1
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)  # a slot: open a connection
                return

    async def _queue(self) -> Connection | None:
        """Wait for a connection handed back (it) or a slot freed (None)."""
        waiter: asyncio.Future[Connection | None] = asyncio.get_running_loop().create_future()
        self._waiters.append(waiter)
        QUEUED.set(True)
        try:
            async with asyncio.timeout(self._wait):
                got = await waiter
        except BaseException as exc:
            self._pass_on(waiter)
            if isinstance(exc, TimeoutError):
                # QUEUED stays set: classify() tells the client the pool, not the upstream.
                raise aiohttp.ConnectionTimeoutError(
                    f"No upstream connection free within {self._wait:g}s"
                ) from None
            raise
        QUEUED.set(False)
        return got

    def _pass_on(self, waiter: asyncio.Future[Connection | None]) -> None:
        """A waiter that gave up after being served hands what it got to the next one."""
        if not waiter.done():
            waiter.cancel()
            return
        if waiter.cancelled():
            return
        got = waiter.result()
        if got is None:
            self.count += 1  # it was given a slot: give it back
            self._freed()
        else:
            self.release(got)
