"""The client end: exact request bytes on a fresh loopback connection to a hop, the answer read
as RFC 9112 frames it, then a next request on the same connection to see whose answer it gets."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from tests.differential.wire import MAX_HEAD, WAIT, Body, Fields, WireError, read_body, read_head


@dataclass(frozen=True)
class Seen:
    """What a client saw of one answer, and what the next request on its connection got:
    `own` (its own answer), `closed` (the hop closed or said it would: a client reconnects),
    `crossed: ...` (another request's bytes), `no answer: ...`, or `not tried` after a body
    whose end the client could not find."""

    line: str | None  # the status line, or None when no answer came
    interim: tuple[int, ...]  # 1xx answers the hop relayed before the final one
    fields: Fields
    body: Body | None
    error: str | None
    next: str

    @property
    def status(self) -> int | None:
        return int(self.line.split(" ")[1]) if self.line else None

    @property
    def reason(self) -> str:
        parts = (self.line or "").split(" ", 2)
        return parts[2] if len(parts) == 3 else ""


# What to send after the request, once the awaitable returns (the hop has read the request).
Then = tuple[Callable[[], Awaitable[None]], bytes]


async def through(
    port: int,
    request: bytes,
    next_target: str,
    *,
    head_only: bool = False,
    then: Then | None = None,
) -> Seen:
    """Send `request` to the hop at `port`; then `GET next_target` on the same connection.
    `then`: its bytes too, once its awaitable returns."""
    reader, writer = await asyncio.wait_for(
        asyncio.open_connection("127.0.0.1", port, limit=MAX_HEAD), WAIT
    )
    try:
        writer.write(request)
        await asyncio.wait_for(writer.drain(), WAIT)
        if then is not None:
            ready, rest = then
            await asyncio.wait_for(ready(), WAIT)
            writer.write(rest)
        interim: list[int] = []
        try:
            while (head := await read_head(reader)) is not None and 100 <= head.status < 200:
                interim.append(head.status)
        except (WireError, TimeoutError, ConnectionError) as exc:
            return Seen(None, tuple(interim), (), None, _error(exc), "not tried")
        if head is None:
            return Seen(None, tuple(interim), (), None, "closed before an answer", "not tried")
        bodiless = head_only or head.status in (204, 304)
        body = await read_body(reader, head, bodiless=bodiless)
        if body.problem is not None:
            after = "not tried"
        elif body.framing == "close" or "close" in head.tokens("connection"):
            after = "closed"
        else:
            after = await _next(reader, writer, next_target)
        return Seen(head.line, tuple(interim), head.fields, body, None, after)
    finally:
        writer.close()


async def _next(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, target: str) -> str:
    try:
        writer.write(f"GET {target} HTTP/1.1\r\nHost: differential\r\n\r\n".encode())
        await asyncio.wait_for(writer.drain(), WAIT)
        head = await read_head(reader)
        if head is None:
            return "closed"
        body = await read_body(reader, head)
    except ConnectionError:
        return "closed"  # a reset as the request went out: the client connects again
    except (WireError, TimeoutError) as exc:
        return f"no answer: {_error(exc)}"
    if body.data == target.encode():
        return "own"
    return f"crossed: {head.line} {body.data[:60]!r}"


def _error(exc: BaseException) -> str:
    if isinstance(exc, TimeoutError):
        return "no answer within WAIT"
    if isinstance(exc, ConnectionError):
        return f"connection {type(exc).__name__}"
    return f"not HTTP: {exc}"
