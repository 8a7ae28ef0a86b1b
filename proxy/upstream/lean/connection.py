"""One kept-alive HTTP/1.1 connection to the upstream: the asyncio.Protocol that owns the socket.

The failures it reports are aiohttp's own exception types for the same faults, so that
`session.classify`, `closed_while_idle` and the relay read them as they read aiohttp's.
"""

from __future__ import annotations

import asyncio
import logging
import socket
from collections.abc import Callable
from typing import cast

import aiohttp
import httptools
from yarl import URL

from ..marks import Wire
from .reader import AnswerReader, Head

log = logging.getLogger(__name__)

# A response head (interim ones included) past this is refused as invalid: llhttp has no bound
# of its own, so a runaway upstream would grow the sidecar's memory instead.
MAX_HEAD = 256 << 10


class Connection(asyncio.Protocol):
    """Carries one request at a time; closes itself when the upstream writes while none waits.

    An idle connection that receives bytes (a late answer, a stray one) would hand them to the
    next request as its own answer: nginx and Envoy close such a connection; so does this.
    Waiting starts when a request is sent and ends when its final answer has arrived whole.
    """

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.wire: Wire | None = None  # what vLLM's kernel acknowledged of the request on it
        self.lost = False
        self._reader = AnswerReader(self)  # llhttp's callbacks, and the answer they found
        self._head_bytes = 0
        self._drained: asyncio.Future[None] | None = None
        self.on_lost: Callable[[Connection], None] | None = None  # the pool's

    # -- one exchange -----------------------------------------------------------------------

    def begin(self, method: str, url: URL, read_timeout: float | None) -> asyncio.Future[Head]:
        """Expect the answer to a request about to be written; its head arrives on the future."""
        head = self._reader.begin(method, url, read_timeout)
        self._head_bytes = 0
        assert self.wire is not None
        self.wire.sending()
        return head

    @property
    def done(self) -> bool:
        """The last answer arrived whole and the connection may carry the next request."""
        reader, transport = self._reader, self.transport
        return (
            not reader.waiting
            and reader.keep
            and transport is not None
            and not transport.is_closing()
        )

    def write(self, data: bytes | memoryview) -> None:
        assert self.transport is not None
        self.transport.write(data)

    async def drain(self) -> None:
        """Wait while the socket's send buffer is full."""
        if self.lost:
            raise aiohttp.ServerDisconnectedError()
        if self._drained is not None:
            await asyncio.shield(self._drained)

    def fail(self, exc: BaseException) -> None:
        """End the exchange with `exc` (what its head or body readers get) and the connection."""
        self._reader.fail(exc)
        self.abort()

    # -- Backpressure: from the body's reader ----------------------------------------

    def pause(self) -> None:
        if self.transport is not None and not self.lost:
            self.transport.pause_reading()

    def resume(self) -> None:
        if self.transport is not None and not self.lost:
            self.transport.resume_reading()

    def abort(self) -> None:
        self._reader.stop()
        if self.transport is not None:
            self.transport.close()

    # -- asyncio.Protocol ---------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's TCPTransport is no asyncio.Transport subclass, though it is one in all but name
        self.transport = cast(asyncio.Transport, transport)
        self.wire = Wire(transport)
        sock = transport.get_extra_info("socket")
        if sock is not None and sock.family in (socket.AF_INET, socket.AF_INET6):
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def data_received(self, data: bytes) -> None:
        reader = self._reader
        if not reader.waiting:
            log.warning("closing an idle upstream connection that received %d bytes", len(data))
            self.abort()
            return
        if reader.body is None:  # still in the head, which llhttp does not bound
            self._head_bytes += len(data)
            if self._head_bytes > MAX_HEAD:
                self._refuse(httptools.HttpParserError(f"a response head over {MAX_HEAD} bytes"))
                return
        try:
            reader.parser.feed_data(data)  # which calls the reader back
        except httptools.HttpParserUpgrade:
            self.abort()  # a 101: the relay refuses it; the connection is not HTTP any more
        except httptools.HttpParserError as exc:
            self._refuse(exc)

    def _refuse(self, exc: httptools.HttpParserError) -> None:
        self.fail(self._reader.invalid(exc))

    def eof_received(self) -> bool:
        return False  # close the transport: connection_lost tells the exchange

    def pause_writing(self) -> None:
        if self._drained is None:
            self._drained = asyncio.get_running_loop().create_future()

    def resume_writing(self) -> None:
        if self._drained is not None:
            self._drained.set_result(None)
            self._drained = None

    def connection_lost(self, exc: Exception | None) -> None:
        self.lost = True
        if self._drained is not None:
            self._drained.set_exception(_dropped(exc))
            self._drained.exception()  # retrieved: nobody may be waiting on it
            self._drained = None
        reader = self._reader
        if reader.heading:
            assert self.wire is not None
            self.wire.lost(exc)  # the socket is still open here, on asyncio's loop and uvloop's
            reader.fail(_dropped(exc))
        else:
            reader.cut(exc)
        reader.stop()
        if self.on_lost is not None:
            self.on_lost(self)


def _dropped(exc: BaseException | None) -> aiohttp.ClientConnectionError:
    """aiohttp's error for a connection lost before the answer's head: a clean close or an OS
    error (a reset)."""
    if isinstance(exc, OSError):
        return aiohttp.ClientOSError(*exc.args)
    if exc is not None:
        return aiohttp.ClientConnectionError(str(exc))
    return aiohttp.ServerDisconnectedError()
