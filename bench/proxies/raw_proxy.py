"""The floor of a Python proxy without aiohttp: asyncio protocols on uvloop, llhttp (httptools)
on both sides, and no coroutine on a request's path.

It does the baseline's work (baseline_proxy.py: the body's `model` swapped through an alias
table with the stdlib's json, hop-by-hop fields dropped, the answer streamed back), with one
kept-alive upstream connection per client connection, every step a parser callback. What it
leaves out is what a server owes its clients beyond the bench: limits, timeouts, backpressure,
`Expect`, pipelining beyond a queue, errors as answers. It answers one question for issue 35:
how far below aiohttp's server a proxy of our own on the hot routes could go.
"""

import argparse
import asyncio
import json
from collections import deque

import httptools
import uvloop

HOP_BY_HOP = frozenset(
    (
        b"connection",
        b"keep-alive",
        b"proxy-authenticate",
        b"proxy-authorization",
        b"te",
        b"trailer",
        b"transfer-encoding",
        b"upgrade",
        b"host",
        b"content-length",
    )
)
Request = tuple[bytes, bytes, list[tuple[bytes, bytes]], bytes, bool]


class _Parsed(asyncio.Protocol):
    """A connection whose bytes go to its llhttp parser; bytes it refuses close the client."""

    parser: httptools.HttpRequestParser | httptools.HttpResponseParser
    transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError:
            self.close()

    def close(self) -> None:
        raise NotImplementedError


class Upstream(_Parsed):
    """The client connection's own upstream connection: each answer relayed as it is parsed."""

    def __init__(self, client: "Client") -> None:
        self.client = client
        self.parser = httptools.HttpResponseParser(self)
        self.fields: list[tuple[bytes, bytes]] = []
        self.reason = b""
        self.chunked = False

    def close(self) -> None:
        self.client.close()

    def connection_lost(self, exc: Exception | None) -> None:
        self.client.upstream_lost(self)

    def on_message_begin(self) -> None:
        self.fields = []

    def on_status(self, reason: bytes) -> None:
        self.reason = reason

    def on_header(self, name: bytes, value: bytes) -> None:
        self.fields.append((name, value))

    def on_headers_complete(self) -> None:
        lines = [b"HTTP/1.1 %d %b\r\n" % (self.parser.get_status_code(), self.reason)]
        length = None
        for name, value in self.fields:
            low = name.lower()
            if low == b"content-length":
                length = value
            elif low not in HOP_BY_HOP:
                lines.append(b"%b: %b\r\n" % (name, value))
        self.chunked = length is None
        lines.append(
            b"Transfer-Encoding: chunked\r\n\r\n"
            if self.chunked
            else b"Content-Length: %b\r\n\r\n" % length
        )
        self.client.write(b"".join(lines))

    def on_body(self, data: bytes) -> None:
        self.client.write(b"%x\r\n%b\r\n" % (len(data), data) if self.chunked else data)

    def on_message_complete(self) -> None:
        if self.chunked:
            self.client.write(b"0\r\n\r\n")
        self.client.answered()


class Client(_Parsed):
    """One client connection: its requests parsed, queued, and sent upstream one at a time."""

    def __init__(self, host: str, port: int, aliases: dict[str, str]) -> None:
        self.host, self.port, self.aliases = host, port, aliases
        self.parser = httptools.HttpRequestParser(self)
        self.upstream: Upstream | None = None
        self.queue: deque[Request] = deque()
        self.busy = self.closing = False
        self.url, self.fields, self.body = b"", [], []  # type: ignore[var-annotated]

    def connection_lost(self, exc: Exception | None) -> None:
        self.closing = True
        if self.upstream is not None and self.upstream.transport is not None:
            self.upstream.transport.close()

    def on_message_begin(self) -> None:
        self.url, self.fields, self.body = b"", [], []

    def on_url(self, url: bytes) -> None:
        self.url += url

    def on_header(self, name: bytes, value: bytes) -> None:
        self.fields.append((name, value))

    def on_body(self, data: bytes) -> None:
        self.body.append(data)

    def on_message_complete(self) -> None:
        keep = self.parser.should_keep_alive()
        method = self.parser.get_method()
        self.queue.append((method, self.url, self.fields, b"".join(self.body), keep))
        if not self.busy:
            self.next()

    def next(self) -> None:
        if not self.queue or self.closing:
            self.busy = False
            return
        self.busy = True
        method, url, fields, body, keep = self.queue.popleft()
        if not keep:
            self.closing = True  # after this answer
        host = b"%b:%d" % (self.host.encode(), self.port)
        lines = [b"%b %b HTTP/1.1\r\nHost: %b\r\n" % (method, url, host)]
        json_body = False
        for name, value in fields:
            low = name.lower()
            if low == b"content-type":
                json_body = value.startswith(b"application/json")
            if low not in HOP_BY_HOP:
                lines.append(b"%b: %b\r\n" % (name, value))
        if body and json_body:
            payload = json.loads(body)
            model = payload.get("model") if isinstance(payload, dict) else None
            if model in self.aliases:
                payload["model"] = self.aliases[model]
                body = json.dumps(payload).encode()
        lines.append(b"Content-Length: %d\r\n\r\n" % len(body))
        self.send(b"".join(lines) + body)

    def send(self, data: bytes) -> None:
        upstream = self.upstream
        if upstream is not None and upstream.transport is not None:
            upstream.transport.write(data)
            return
        loop = asyncio.get_running_loop()
        connecting = loop.create_task(
            loop.create_connection(lambda: Upstream(self), self.host, self.port)
        )

        def connected(task: asyncio.Task) -> None:  # type: ignore[type-arg]
            if task.exception() is not None:
                self.close()
                return
            self.upstream = task.result()[1]
            self.send(data)

        connecting.add_done_callback(connected)

    def write(self, data: bytes) -> None:
        if self.transport is not None:
            self.transport.write(data)

    def answered(self) -> None:
        if self.closing:
            self.close()
        else:
            self.next()

    def upstream_lost(self, upstream: Upstream) -> None:
        if self.upstream is upstream:
            self.upstream = None
            if self.busy:  # mid-answer: nothing can be told the client any more
                self.close()

    def close(self) -> None:
        self.closing = True
        if self.transport is not None:
            self.transport.close()


async def serve(args: argparse.Namespace) -> None:
    host, _, port = args.upstream_url.removeprefix("http://").rstrip("/").partition(":")
    aliases = dict(a.split("=", 1) for a in args.alias)
    loop = asyncio.get_running_loop()
    server = await loop.create_server(
        lambda: Client(host, int(port or 80), aliases), "127.0.0.1", args.port
    )
    async with server:
        await server.serve_forever()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--upstream-url", required=True)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--alias", action="append", default=[], help="FROM=TO")
    uvloop.run(serve(parser.parse_args()))


if __name__ == "__main__":
    main()
