"""The answers one upstream connection receives, as llhttp parses them: heads in aiohttp's bounds.

The connection feeds the parser; what the callbacks find wrong is told as aiohttp's own exception
type for the fault, so that `session.classify` and the relay read it as they read aiohttp's.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass

import aiohttp
import httptools
from multidict import CIMultiDict, CIMultiDictProxy
from yarl import URL

from .body import Backpressure, Body

log = logging.getLogger(__name__)

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


class AnswerReader:
    """llhttp's callbacks for one connection, and what they found of the answer it waits for.

    `waiting` holds from `begin` until the final answer has arrived whole; bytes past it (a
    stray answer, a body after a HEAD's answer) close the connection, through its `Backpressure`.
    """

    __slots__ = (
        "_fields",
        "_flow",
        "_framed",
        "_head",
        "_interim",
        "_method",
        "_no_body",
        "_read_timeout",
        "_url",
        "at_boundary",
        "body",
        "keep",
        "parser",
        "waiting",
    )

    def __init__(self, flow: Backpressure) -> None:
        self._flow = flow  # the connection
        self.waiting = False
        self.keep = False  # the answer now complete lets the connection carry another
        self.parser = httptools.HttpResponseParser(self)  # what the connection feeds
        self.at_boundary = True  # the parser is between messages: the next answer may use it
        self._head: asyncio.Future[Head] | None = None
        self._fields: list[tuple[str, str]] = []
        self.body: Body | None = None  # the final answer's, once its head is parsed
        self._framed = True  # the answer's end is told by its framing, not by a close
        self._interim = False
        self._no_body = False  # the answer to a HEAD: its Content-Length describes nothing here
        self._read_timeout: float | None = None
        self._method = ""
        self._url: URL | None = None

    def begin(self, method: str, url: URL, read_timeout: float | None) -> asyncio.Future[Head]:
        """Expect the answer to a request about to be written, fed to `parser`; its head
        arrives on the future."""
        if not self.at_boundary:  # (a parser looks up its ten callbacks as it is made)
            self.parser = httptools.HttpResponseParser(self)
        self.at_boundary = False
        self._head = asyncio.get_running_loop().create_future()
        self.body, self._fields, self.keep = None, [], False
        self._no_body, self._interim = method == "HEAD", False
        self._method, self._url, self._read_timeout = method, url, read_timeout
        self.waiting = True
        return self._head

    @property
    def heading(self) -> bool:
        """The answer's head is still awaited."""
        return self._head is not None and not self._head.done()

    def fail(self, exc: BaseException) -> None:
        """End the answer with `exc`: what its head's or its body's reader gets."""
        if self._head is not None and not self._head.done():
            self._head.set_exception(exc)
        elif self.body is not None and not self.body.is_eof():
            self.body.set_exception(exc)

    def cut(self, exc: BaseException | None) -> None:
        """The connection is gone after the head: the body's end where it has no framing."""
        body = self.body
        if body is not None and not body.is_eof():
            if self._framed or exc is not None:
                detail = f": {exc!r}" if exc is not None else ""
                body.set_exception(
                    aiohttp.ClientPayloadError(f"Response payload is not completed{detail}")
                )
            else:  # RFC 9112 section 6.3: without framing, the close is the body's end
                body.feed_eof()

    def stop(self) -> None:
        """The connection closes: it waits for nothing and carries nothing more."""
        self.waiting = False
        self.keep = False

    def invalid(self, exc: httptools.HttpParserError) -> aiohttp.ClientError:
        """What the exchange fails with when llhttp, or a bound here, refuses the answer."""
        if isinstance(exc.__context__, _TooBig):  # raised by a callback: its reason, not llhttp's
            exc = httptools.HttpParserError(str(exc.__context__))
        if self.heading:
            assert self._url is not None
            info = aiohttp.RequestInfo(self._url, self._method, CIMultiDictProxy(CIMultiDict()))
            return aiohttp.ClientResponseError(info, (), status=400, message=str(exc))
        return aiohttp.ClientPayloadError(f"Response payload is not completed: {exc}")

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
        assert self._head is not None
        if not self.waiting:  # a stray answer, already refused (on_message_begin)
            return
        status = self.parser.get_status_code()
        if status < 200 and status != 101:  # RFC 9110 section 15.2: interim, then the answer
            self._interim, self._fields = True, []
            return
        headers = CIMultiDictProxy(CIMultiDict(self._fields))
        self.keep = self.parser.should_keep_alive() and status != 101
        body = self.body = Body(self._flow, self._read_timeout)
        te = headers.get("Transfer-Encoding")
        self._framed = "Content-Length" in headers or (te is not None and "chunked" in te.lower())
        if not self._head.done():
            self._head.set_result(Head(status, headers, body))
        if self._no_body:
            self._finish()

    def on_body(self, data: bytes) -> None:
        if self.body is None or not self.waiting:  # after a HEAD's answer: bytes nobody asked
            self._stray(len(data))
            return
        self.body.feed_data(data)

    def on_message_complete(self) -> None:
        if self._interim:
            self._interim = False
            return
        if self.waiting:
            self.keep = self.keep and self.parser.should_keep_alive()
            # A HEAD's answer ended at its head: llhttp, told nothing of the HEAD, still waits
            # for the body its Content-Length names, so that parser is not used again.
            self.at_boundary = not self._no_body
            self._finish()

    def on_message_begin(self) -> None:
        if self._head is not None and self._head.done() and not self.waiting:
            self._stray(0)

    def _finish(self) -> None:
        self.waiting = False
        assert self.body is not None
        self.body.feed_eof()

    def _stray(self, size: int) -> None:
        log.warning("closing an upstream connection that sent %d bytes past its answer", size)
        self._flow.abort()
