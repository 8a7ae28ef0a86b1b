"""Two clients, one answer: generated upstream answers written on a raw socket, relayed by the
sidecar on the lean hop and on aiohttp's client, compared as a client sees them.

`Peers` runs a raw upstream and the two sidecars on an event loop of their own thread, so that
hypothesis (which drives synchronous tests) can send each generated answer through both and
compare. What the client sees: the status, the fields after `normalised`, the body bytes, or
the error a strict client (aiohttp's) raises; and whether the next request on the same client
connection gets its own answer. A difference either is a defect or is a row of `ACCEPTED`.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import threading
from collections.abc import Iterator
from dataclasses import dataclass

import aiohttp
from aiohttp import web
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry

from proxy.config.settings import Settings
from proxy.wiring.app import create_app

WAIT = 10.0

# Fields whose value the sidecar sets or recomputes for its own hop (the framing of what it
# sends, its id, its clock): compared by presence of a readable body, not by value.
_SET_BY_THE_HOP = frozenset(
    ("date", "server", "x-request-id", "content-length", "transfer-encoding", "x-weight-version")
)

# An envelope names the request's id, which differs by request; a sidecar envelope's message
# quotes its client's parser, whose words differ (the reason and status are compared).
_REQUEST_ID = re.compile(rb'"request_id":"[^"]*"')
_OWN_MESSAGE = re.compile(rb'^\{"error":\{"message":"(?:[^"\\]|\\.)*"(?=.*"source":"sidecar")')

# Differences between the two clients that are by design, each with why. Keyed by a short name
# that `explain` gives a difference; docs/reliability.md mirrors this table.
ACCEPTED: dict[str, str] = {}


@dataclass(frozen=True)
class Seen:
    """What a client saw of one answer, and of the next one on the same connection."""

    status: int | None
    fields: tuple[tuple[str, str], ...]
    body: bytes
    error: str | None
    next_ok: bool


def normalised(headers: aiohttp.typedefs.LooseHeaders) -> tuple[tuple[str, str], ...]:
    items = headers.items() if hasattr(headers, "items") else headers
    return tuple(
        sorted((k.lower(), v) for k, v in items if k.lower() not in _SET_BY_THE_HOP)  # type: ignore[union-attr]
    )


# -- generated answers -------------------------------------------------------------------------
_NAMES = [
    "Content-Type",
    "X-Custom",
    "Connection",
    "Keep-Alive",
    "Proxy-Authenticate",
    "Proxy-Connection",
    "Trailer",
    "TE",
    "Upgrade",
    "X-Sidecar-Error",
    "X-Weight-Versions",
    "Cache-Control",
    "Retry-After",
]


def _spelt(name: str) -> st.SearchStrategy[str]:
    return st.sampled_from([name, name.lower(), name.upper(), name.swapcase()])


_field = st.sampled_from(_NAMES).flatmap(
    lambda name: st.tuples(
        _spelt(name),
        st.sampled_from(["close", "keep-alive", "x-custom", "1", "text/plain", "application/json"]),
    )
)


@st.composite
def answers(draw: st.DrawFn) -> tuple[bytes, bool]:
    """One upstream answer as bytes: interim answers, a status line, fields in any case, a body
    framed by length, by chunks (extensions, trailers) or by the close, sometimes a huge head."""
    out = b""
    for _ in range(draw(st.integers(0, 2))):
        out += draw(
            st.sampled_from(
                [
                    b"HTTP/1.1 100 Continue\r\n\r\n",
                    b"HTTP/1.1 103 Early Hints\r\nLink: </a>\r\n\r\n",
                ]
            )
        )
    status = draw(st.sampled_from([200, 200, 201, 204, 304, 400, 404, 500, 503]))
    fields = draw(st.lists(_field, max_size=6))
    size = draw(st.sampled_from(["small", "small", "small", "long-field", "many-fields"]))
    if size == "long-field":
        fields.append(("X-Big", "a" * draw(st.sampled_from([8_000, 9_000, 100_000]))))
    elif size == "many-fields":
        fields += [(f"X-F{i}", "v") for i in range(draw(st.sampled_from([100, 129, 5_000])))]
    body = draw(st.binary(max_size=64)) if status not in (204, 304) else b""
    framing = draw(st.sampled_from(["length", "chunked", "close"]))
    if status in (204, 304):
        framing = "length"
    te = draw(_spelt("Transfer-Encoding"))
    if framing == "length":
        fields.append((draw(_spelt("Content-Length")), str(len(body))))
        payload = body
    elif framing == "chunked":
        fields.append((te, "chunked"))
        cut = draw(st.integers(0, len(body)))
        ext = draw(st.sampled_from(["", ";x=1"]))
        payload = b"".join(
            b"%x%s\r\n%s\r\n" % (len(p), ext.encode(), p) for p in (body[:cut], body[cut:]) if p
        )
        trailer = draw(st.sampled_from([b"", b"X-Trailer: 1\r\n"]))
        payload += b"0\r\n" + trailer + b"\r\n"
    else:
        fields.append(("Connection", "close"))
        payload = body
    head = f"HTTP/1.1 {status} {draw(st.sampled_from(['OK', 'Fine', 'x']))}\r\n"
    head += "".join(f"{k}: {v}\r\n" for k, v in fields)
    out += head.encode() + b"\r\n" + payload
    if framing != "close" and draw(st.booleans()):
        out += draw(
            st.sampled_from([b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nstale", b"\r\n"])
        )
    return out, framing == "close"


# -- the peers ---------------------------------------------------------------------------------
class _Upstream:
    """Answers `/probe` with the current generated bytes, anything else plainly."""

    def __init__(self) -> None:
        self.answer, self.closes = b"", False
        self.server: asyncio.Server | None = None

    async def serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), WAIT)
                if head.startswith(b"GET /probe"):
                    writer.write(self.answer)
                    await writer.drain()
                    if self.closes:
                        break
                else:
                    body = b'{"object":"list","data":[]}' if b"/v1/models" in head else b"{}"
                    writer.write(
                        b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                        b"Content-Length: %d\r\n\r\n%s" % (len(body), body)
                    )
                    await writer.drain()
        except (
            asyncio.IncompleteReadError,
            asyncio.LimitOverrunError,
            ConnectionError,
            TimeoutError,
        ):
            pass
        finally:
            writer.close()


class Peers:
    """The raw upstream and a sidecar per upstream client, on a loop in a thread of their own."""

    CLIENTS = ("lean", "aiohttp")

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self._thread.start()
        self.upstream = _Upstream()
        self.urls: dict[str, str] = {}
        self._runners: list[web.AppRunner] = []
        self._sessions: dict[str, aiohttp.ClientSession] = {}
        self.call(self._start())

    def call(self, coro: object) -> object:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout=60)  # type: ignore[arg-type]

    async def _start(self) -> None:
        self.upstream.server = await asyncio.start_server(self.upstream.serve, "127.0.0.1", 0)
        port = self.upstream.server.sockets[0].getsockname()[1]
        for client in self.CLIENTS:
            settings = Settings(
                upstream_url=f"http://127.0.0.1:{port}",
                upstream_client=client,
                served_model_names=["tiny-model"],
                health_interval=3600,
                discovery_interval=3600,
                read_timeout=5,
            )
            runner = web.AppRunner(create_app(settings, registry=CollectorRegistry()))
            await runner.setup()
            site = web.TCPSite(runner, "127.0.0.1", 0)
            await site.start()
            self._runners.append(runner)
            sock = site._server.sockets[0]  # type: ignore[union-attr]
            self.urls[client] = f"http://127.0.0.1:{sock.getsockname()[1]}"

    async def _seen(self, client: str) -> Seen:
        # One connection per probe: the next request on it must get its own answer.
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=1)) as session:
            url = self.urls[client]
            status, fields, body, error = None, (), b"", None
            try:
                async with asyncio.timeout(WAIT):
                    async with session.get(f"{url}/probe") as resp:
                        status, fields = resp.status, normalised(resp.headers)
                        body = _REQUEST_ID.sub(b'"request_id":"-"', await resp.read())
                        body = _OWN_MESSAGE.sub(b'{"error":{"message":"-"', body)
            except (aiohttp.ClientError, TimeoutError) as exc:
                error = type(exc).__name__
            try:
                async with asyncio.timeout(WAIT):
                    async with session.get(f"{url}/next") as resp:
                        next_ok = await resp.read() == b"{}"
            except (aiohttp.ClientError, TimeoutError):
                next_ok = False
            return Seen(status, fields, body, error, next_ok)

    def through_both(self, answer: bytes, closes: bool) -> dict[str, Seen]:
        self.upstream.answer, self.upstream.closes = answer, closes
        return {client: self.call(self._seen(client)) for client in self.CLIENTS}  # type: ignore[misc]

    def close(self) -> None:
        async def stop() -> None:
            for runner in self._runners:
                await runner.cleanup()
            assert self.upstream.server is not None
            self.upstream.server.close()

        self.call(stop())
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(WAIT)
        self.loop.close()


@contextlib.contextmanager
def peers() -> Iterator[Peers]:
    running = Peers()
    try:
        yield running
    finally:
        running.close()


def explain(seen: dict[str, Seen]) -> str | None:
    """None when both clients saw the same; else what differs, for a message or ACCEPTED."""
    lean, ours = seen["lean"], seen["aiohttp"]
    if lean == ours:
        return None
    return f"lean={lean!r}\naiohttp={ours!r}"
