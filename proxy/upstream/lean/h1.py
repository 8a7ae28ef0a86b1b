"""One kept-alive HTTP/1.1 connection to the upstream: an asyncio.Protocol, llhttp parsing answers.

The failures it reports are aiohttp's own exception types for the same faults, so that
`session.classify`, `closed_while_idle` and the relay read them as they read aiohttp's.
"""

from __future__ import annotations

import asyncio
import logging
import socket
from collections.abc import Callable
from dataclasses import dataclass
from typing import cast

import aiohttp
import httptools
from multidict import CIMultiDict, CIMultiDictProxy
from yarl import URL

from ..marks import Wire
from .body import Body

log = logging.getLogger("proxy.upstream")

# A response head (interim ones included) past this is refused as invalid: llhttp has no bound
# of its own, so a runaway upstream would grow the sidecar's memory instead.
MAX_HEAD = 256 << 10
# aiohttp's client bounds (ClientSession's max_line_size, max_field_size, max_headers): a status
# line over 8190 bytes, a field whose name and value pass 8190, or more than 128 fields (trailers
# counted) is an invalid answer, as nginx's "upstream sent too big header" is one.
MAX_LINE = 8190
MAX_FIELD = 8190
MAX_FIELDS = 128


class _TooBig(Exception):
    """A part of the head past aiohttp's bound: raised from a parser callback, reported invalid."""


@dataclass(slots=True)
class Head:
    """A final answer's status line and fields, and its body as it comes."""

    status: int
    headers: CIMultiDictProxy[str]
    body: Body


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
        self.keep = False  # the answer now complete lets the connection carry another
        self._waiting = False
        self._parser: httptools.HttpResponseParser | None = None
        self._head: asyncio.Future[Head] | None = None
        self._fields: list[tuple[str, str]] = []
        self._head_bytes = 0
        self._body: Body | None = None
        self._framed = True  # the answer's end is told by its framing, not by a close
        self._interim = False
        self._no_body = False  # the answer to a HEAD: its Content-Length describes nothing here
        self._read_timeout: float | None = None
        self._drained: asyncio.Future[None] | None = None
        self.on_lost: Callable[[Connection], None] | None = None  # the pool's
        self.method = ""
        self.url: URL | None = None

    # -- one exchange -----------------------------------------------------------------------

    def begin(self, method: str, url: URL, read_timeout: float | None) -> asyncio.Future[Head]:
        """Expect the answer to a request about to be written; its head arrives on the future."""
        loop = asyncio.get_running_loop()
        self._parser = httptools.HttpResponseParser(self)
        self._head = loop.create_future()
        self._body, self._fields, self.keep, self._head_bytes = None, [], False, 0
        self._no_body, self._interim = method == "HEAD", False
        self.method, self.url, self._read_timeout = method, url, read_timeout
        self._waiting = True
        assert self.wire is not None
        self.wire.sending()
        return self._head

    @property
    def done(self) -> bool:
        """The last answer arrived whole and the connection may carry the next request."""
        transport = self.transport
        return (
            not self._waiting and self.keep and transport is not None and not transport.is_closing()
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
        if self._head is not None and not self._head.done():
            self._head.set_exception(exc)
        elif self._body is not None and not self._body.is_eof():
            self._body.set_exception(exc)
        self.abort()

    # -- Flow: backpressure from the body's reader ----------------------------------------

    def pause(self) -> None:
        if self.transport is not None and not self.lost:
            self.transport.pause_reading()

    def resume(self) -> None:
        if self.transport is not None and not self.lost:
            self.transport.resume_reading()

    def abort(self) -> None:
        self._waiting = False
        self.keep = False
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
        if not self._waiting:
            log.warning("closing an idle upstream connection that received %d bytes", len(data))
            self.abort()
            return
        assert self._parser is not None
        if self._body is None:  # still in the head, which llhttp does not bound
            self._head_bytes += len(data)
            if self._head_bytes > MAX_HEAD:
                self._invalid(httptools.HttpParserError(f"a response head over {MAX_HEAD} bytes"))
                return
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            self.abort()  # a 101: the relay refuses it; the connection is not HTTP any more
        except httptools.HttpParserError as exc:
            self._invalid(exc)

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
        self.keep = False
        if self._drained is not None:
            self._drained.set_exception(_dropped(exc))
            self._drained.exception()  # retrieved: nobody may be waiting on it
            self._drained = None
        head, body = self._head, self._body
        if head is not None and not head.done():
            assert self.wire is not None
            self.wire.lost(exc)  # the socket is still open here, on asyncio's loop and uvloop's
            head.set_exception(_dropped(exc))
        elif body is not None and not body.is_eof():
            if self._framed or exc is not None:
                detail = f": {exc!r}" if exc is not None else ""
                body.set_exception(
                    aiohttp.ClientPayloadError(f"Response payload is not completed{detail}")
                )
            else:  # RFC 9112 section 6.3: without framing, the close is the body's end
                body.feed_eof()
        self._waiting = False
        if self.on_lost is not None:
            self.on_lost(self)

    # -- httptools callbacks ----------------------------------------------------------------

    def on_status(self, reason: bytes) -> None:
        if len(reason) + 13 > MAX_LINE:  # "HTTP/1.1 200 " before the reason
            raise _TooBig(f"a status line over {MAX_LINE} bytes")

    def on_header(self, name: bytes, value: bytes) -> None:
        if len(name) + len(value) > MAX_FIELD:
            raise _TooBig(f"a header field over {MAX_FIELD} bytes: {name[:100]!r}")
        if len(self._fields) >= MAX_FIELDS:
            raise _TooBig(f"more than {MAX_FIELDS} header fields")
        self._fields.append(
            (name.decode("utf-8", "surrogateescape"), value.decode("utf-8", "surrogateescape"))
        )

    def on_headers_complete(self) -> None:
        assert self._parser is not None
        assert self._head is not None
        if not self._waiting:  # a stray answer, already refused (on_message_begin)
            return
        status = self._parser.get_status_code()
        if status < 200 and status != 101:  # RFC 9110 section 15.2: interim, then the answer
            self._interim, self._fields = True, []
            return
        headers = CIMultiDictProxy(CIMultiDict(self._fields))
        self.keep = self._parser.should_keep_alive() and status != 101
        body = self._body = Body(self, self._read_timeout)
        te = headers.get("Transfer-Encoding")
        self._framed = "Content-Length" in headers or (te is not None and "chunked" in te.lower())
        if not self._head.done():
            self._head.set_result(Head(status, headers, body))
        if self._no_body:
            self._finish()

    def on_body(self, data: bytes) -> None:
        if self._body is None or not self._waiting:  # after a HEAD's answer: bytes nobody asked
            self._stray(len(data))
            return
        self._body.feed_data(data)

    def on_message_complete(self) -> None:
        if self._interim:
            self._interim = False
            return
        if self._waiting:
            assert self._parser is not None
            self.keep = self.keep and self._parser.should_keep_alive()
            self._finish()

    def on_message_begin(self) -> None:
        if self._head is not None and self._head.done() and not self._waiting:
            self._stray(0)

    def _finish(self) -> None:
        self._waiting = False
        assert self._body is not None
        self._body.feed_eof()

    def _stray(self, size: int) -> None:
        log.warning("closing an upstream connection that sent %d bytes past its answer", size)
        self.abort()

    def _invalid(self, exc: httptools.HttpParserError) -> None:
        if isinstance(exc.__context__, _TooBig):  # raised by a callback: its reason, not llhttp's
            exc = httptools.HttpParserError(str(exc.__context__))
        if self._head is not None and not self._head.done():
            assert self.url is not None
            info = aiohttp.RequestInfo(self.url, self.method, CIMultiDictProxy(CIMultiDict()))
            self.fail(aiohttp.ClientResponseError(info, (), status=400, message=str(exc)))
        else:
            self.fail(aiohttp.ClientPayloadError(f"Response payload is not completed: {exc}"))


def _dropped(exc: BaseException | None) -> aiohttp.ClientConnectionError:
    """aiohttp's error for a connection lost before the answer's head: a clean close or an OS
    error (a reset)."""
    if isinstance(exc, OSError):
        return aiohttp.ClientOSError(*exc.args)
    if exc is not None:
        return aiohttp.ClientConnectionError(str(exc))
    return aiohttp.ServerDisconnectedError()
