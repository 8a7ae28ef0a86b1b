"""The lean upstream hop: one request out as one buffer, its answer back with what the relay reads.

aiohttp's ClientSession builds a ClientRequest, a connector key, a writer and a response with
its traces and cookies for every request: about a fifth of the sidecar's CPU. This writes the
already-filtered header block with the body, on a kept-alive connection from a LIFO pool, and
raises aiohttp's own exception types for the same faults (see connection.py, reader.py).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterable, Mapping
from types import TracebackType

import aiohttp
from aiohttp.client_reqrep import ConnectionKey
from multidict import CIMultiDictProxy
from yarl import URL

from ..options import UpstreamOptions
from .body import Body
from .connection import Connection
from .pool import Pool

# RFC 9110 section 9.3: these carry no body unless given one; the rest say Content-Length: 0.
_BODILESS = frozenset(("GET", "HEAD", "OPTIONS", "TRACE"))
_ONE_WRITE = 1 << 16  # a body up to this is copied behind the head: one write, one segment


class Answer:
    """An upstream answer: the surface of aiohttp's ClientResponse that the relay reads."""

    __slots__ = ("_body", "content", "headers", "method", "status", "url")

    def __init__(
        self, method: str, url: URL, status: int, headers: CIMultiDictProxy[str], body: Body
    ) -> None:
        self.method, self.url, self.status, self.headers = method, url, status, headers
        self.content = body
        self._body: bytes | None = None

    @property
    def content_length(self) -> int | None:
        value = self.headers.get("Content-Length")
        return int(value) if value is not None else None

    async def read(self) -> bytes:
        if self._body is None:
            self._body = await self.content.read()
        return self._body


class LeanClient:
    """Requests to one upstream (`base`); used as `async with client.request(...) as answer`."""

    def __init__(self, base: URL, options: UpstreamOptions) -> None:
        self._host = base.raw_host or "127.0.0.1"
        self._port = base.port or (443 if base.scheme == "https" else 80)
        self._ssl = base.scheme == "https"
        self._key = ConnectionKey(self._host, self._port, self._ssl, self._ssl, None, None, None)
        self._connect_timeout = options.connect_timeout
        self.read_timeout = options.read_timeout
        self.pool = Pool(self._connect, limit=options.max_connections, wait=options.pool_timeout)
        self.host = base.host_port_subcomponent or self._host
        self.closed = False

    def request(
        self,
        method: str,
        url: URL,
        *,
        data: bytes | AsyncIterable[bytes] | None = None,
        headers: Mapping[str, str],
        allow_redirects: bool = False,  # never followed: accepted as aiohttp's is
    ) -> Exchange:
        if self.closed:
            raise RuntimeError("Session is closed")
        return Exchange(self, method, url, data, headers)

    async def close(self) -> None:
        self.closed = True
        self.pool.close()

    async def __aenter__(self) -> LeanClient:
        return self

    async def __aexit__(self, *_: object) -> None:
        await self.close()

    async def _connect(self) -> Connection:
        loop = asyncio.get_running_loop()
        try:
            async with asyncio.timeout(self._connect_timeout):
                _, conn = await loop.create_connection(
                    Connection, self._host, self._port, ssl=self._ssl or None
                )
        except TimeoutError:
            raise aiohttp.ConnectionTimeoutError(
                f"Connection timeout to host {self._host}:{self._port}"
            ) from None
        except OSError as exc:
            raise aiohttp.ClientConnectorError(self._key, exc) from exc
        return conn


class Exchange:
    """One request and its answer on one pooled connection, released when the block ends."""

    __slots__ = ("_client", "_conn", "_data", "_headers", "_method", "_sending", "_url")

    def __init__(
        self,
        client: LeanClient,
        method: str,
        url: URL,
        data: bytes | AsyncIterable[bytes] | None,
        headers: Mapping[str, str],
    ) -> None:
        self._client, self._method, self._url = client, method, url
        self._data, self._headers = data, headers
        self._conn: Connection | None = None
        self._sending: asyncio.Task[None] | None = None

    async def __aenter__(self) -> Answer:
        client = self._client
        conn = self._conn = await client.pool.acquire()
        head = conn.begin(self._method, self._url, client.read_timeout)
        try:
            self._send(conn)
            timer = None
            if client.read_timeout:
                timer = asyncio.get_running_loop().call_later(
                    client.read_timeout, _head_timeout, conn
                )
            try:
                got = await head
            finally:
                if timer is not None:
                    timer.cancel()
        except BaseException:
            self._end(conn)
            raise
        return Answer(self._method, self._url, got.status, got.headers, got.body)

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self._conn is not None:
            self._end(self._conn)

    def _end(self, conn: Connection) -> None:
        sending = self._sending
        if sending is not None and not sending.done():
            sending.cancel()
            conn.abort()  # the request is not whole on the wire: the connection is done with
        self._conn = None
        self._client.pool.release(conn)

    def _send(self, conn: Connection) -> None:
        data, method, headers = self._data, self._method, self._headers
        lines = [f"{method} {self._url.raw_path_qs} HTTP/1.1\r\nHost: {self._client.host}\r\n"]
        if headers:  # `name: value` lines joined in C, not an f-string a field
            lines += ("\r\n".join(map(": ".join, headers.items())), "\r\n")
        if isinstance(data, bytes):
            lines.append(f"Content-Length: {len(data)}\r\n\r\n")
        elif data is None and method not in _BODILESS and "Content-Length" not in headers:
            lines.append("Content-Length: 0\r\n\r\n")
        else:  # no body, or a stream whose Content-Length is among the headers (never chunked)
            lines.append("\r\n")
        # As aiohttp writes them: what the server decoded from bytes that are not UTF-8 is dropped.
        head = "".join(lines).encode("utf-8", "ignore")
        if isinstance(data, bytes):
            if len(data) <= _ONE_WRITE:
                conn.write(head + data)
            else:
                conn.write(head)
                conn.write(data)
        elif data is None:
            conn.write(head)
        else:
            conn.write(head)
            self._sending = asyncio.get_running_loop().create_task(_stream(conn, data))


async def _stream(conn: Connection, data: AsyncIterable[bytes]) -> None:
    """A streamed body, chunk by chunk, as fast as the upstream's socket takes it."""
    try:
        async for chunk in data:
            conn.write(chunk)
            await conn.drain()
    except asyncio.CancelledError:
        raise
    except OSError as exc:
        conn.fail(aiohttp.ClientOSError(*exc.args))
    except Exception as exc:
        conn.fail(
            aiohttp.ClientPayloadError(
                f"Failed to send bytes into the underlying connection: {exc!r}"
            )
        )


def _head_timeout(conn: Connection) -> None:
    conn.fail(aiohttp.SocketTimeoutError("Timeout on reading data from socket"))
