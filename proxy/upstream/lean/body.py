"""An upstream answer's body as it arrives: the part of aiohttp's `StreamReader` the relay reads."""

from __future__ import annotations

import asyncio
from collections import deque
from typing import Protocol

import aiohttp

# Past this many unread bytes the connection stops reading until the consumer has taken them
# down to LOW_WATER: a client slower than vLLM holds back vLLM's socket, not the sidecar's memory.
# (aiohttp's reader pauses at twice its 64 KiB limit.)
HIGH_WATER = 1 << 17
LOW_WATER = 1 << 15


class Backpressure(Protocol):
    """The connection's side of backpressure."""

    def pause(self) -> None: ...
    def resume(self) -> None: ...
    def abort(self) -> None: ...


class Body:
    """Chunks in arrival order; an exception, once set, is what every later read raises."""

    __slots__ = (
        "_chunks",
        "_eof",
        "_exc",
        "_flow",
        "_paused",
        "_size",
        "_timeout",
        "_waiter",
        "total_bytes",
    )

    def __init__(self, flow: Backpressure, read_timeout: float | None) -> None:
        self._chunks: deque[bytes] = deque()
        self._size = 0
        self.total_bytes = 0
        self._eof = False
        self._exc: BaseException | None = None
        self._waiter: asyncio.Future[None] | None = None
        self._flow = flow
        self._paused = False
        self._timeout = read_timeout

    # -- the connection's side ------------------------------------------------------------

    def feed_data(self, data: bytes) -> None:
        self._chunks.append(data)
        self._size += len(data)
        self.total_bytes += len(data)
        if self._size > HIGH_WATER and not self._paused:
            self._paused = True
            self._flow.pause()
        self._wake()

    def feed_eof(self) -> None:
        self._eof = True
        self._wake()

    def set_exception(self, exc: BaseException) -> None:
        """What every later read raises (aiohttp's behaviour: before any data still held); the
        first one set stays."""
        if self._exc is None:
            self._exc = exc
        self._wake()

    def is_eof(self) -> bool:
        """The whole body arrived (not necessarily read)."""
        return self._eof

    # -- the reader's side ----------------------------------------------------------------

    def at_eof(self) -> bool:
        return self._eof and not self._chunks

    def read_nowait(self) -> bytes:
        if self._exc is not None:
            raise self._exc
        return self._take()

    async def readany(self) -> bytes:
        """What arrived since the last read, waiting for some; b"" at the end."""
        while True:
            if self._exc is not None:
                raise self._exc
            if self._chunks:
                return self._take()
            if self._eof:
                return b""
            await self._wait()

    async def read(self) -> bytes:
        """The rest of the body."""
        parts = []
        while chunk := await self.readany():
            parts.append(chunk)
        return b"".join(parts)

    def iter_any(self) -> _Chunks:
        return _Chunks(self)

    def _take(self) -> bytes:
        chunks = self._chunks
        data = chunks.popleft() if len(chunks) == 1 else b"".join(chunks)
        chunks.clear()
        self._size = 0
        if self._paused:
            self._paused = False
            self._flow.resume()
        return data

    async def _wait(self) -> None:
        loop = asyncio.get_running_loop()
        self._waiter = waiter = loop.create_future()
        timer = loop.call_later(self._timeout, self._time_out) if self._timeout else None
        try:
            await waiter
        finally:
            self._waiter = None
            if timer is not None:
                timer.cancel()

    def _time_out(self) -> None:
        # aiohttp's sock_read: no byte for that long is the connection's end, not just this read's.
        self.set_exception(aiohttp.SocketTimeoutError("Timeout on reading data from socket"))
        self._flow.abort()

    def _wake(self) -> None:
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)


class _Chunks:
    """`async for chunk in body.iter_any()`, without an async generator's frame per chunk."""

    __slots__ = ("_body",)

    def __init__(self, body: Body) -> None:
        self._body = body

    def __aiter__(self) -> _Chunks:
        return self

    async def __anext__(self) -> bytes:
        chunk = await self._body.readany()
        if not chunk:
            raise StopAsyncIteration
        return chunk
