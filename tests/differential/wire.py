"""HTTP/1.1 framing as both ends of the harness read it (RFC 9112): a head's fields as sent, and a
body by its length, its chunks or the close, with whatever breaks the framing written down."""

from __future__ import annotations

import asyncio
import re
from dataclasses import dataclass

# Every wait of the harness: loopback answers in milliseconds, so one that takes this long is
# an answer that never comes (a hop waiting for bytes the framing promised).
WAIT = 5.0
MAX_HEAD = 4 << 20  # past the largest generated head (5,000 fields, a 100 KB field)
MAX_BODY = 16 << 20

Fields = tuple[tuple[str, str], ...]


_RUN = re.compile(rb"(.)\1{31,}", re.DOTALL)
_FIELDS = re.compile(rb"(?:X-F\d+: v\r\n){8,}")


def shown(data: bytes, limit: int = 1200) -> str:
    """Bytes as a reproducer's repr, long runs (a 100 KB field, thousands of fields) counted."""
    data = _FIELDS.sub(lambda m: b"<%d X-Fn: v fields>" % m.group().count(b"\r\n"), data)
    data = _RUN.sub(lambda m: b"<%d x %r>" % (len(m.group()), m.group(1)), data)
    text = repr(data)
    return text if len(text) <= limit else text[:limit] + "..."


class WireError(Exception):
    """Bytes that are not an HTTP/1.1 message head."""


def tokens(fields: Fields, name: str) -> set[str]:
    """The comma-separated tokens of every `name` field (lower case), lower case."""
    return {
        t.strip().lower() for k, v in fields if k.lower() == name for t in v.split(",") if t.strip()
    }


@dataclass(frozen=True)
class Head:
    """A start line and its fields, names spelt as sent (latin-1, so any byte survives)."""

    line: str
    fields: Fields

    def values(self, name: str) -> list[str]:
        return [v for k, v in self.fields if k.lower() == name]

    def tokens(self, name: str) -> list[str]:
        """The comma-separated tokens of every `name` field, lower case."""
        return [t.strip().lower() for v in self.values(name) for t in v.split(",") if t.strip()]

    @property
    def status(self) -> int:
        parts = self.line.split(" ", 2)
        if len(parts) < 2 or not parts[1].isdigit():
            raise WireError(f"not a status line: {self.line[:80]!r}")
        return int(parts[1])


def parse_head(raw: bytes) -> Head:
    """A head without its final blank line."""
    lines = raw.decode("latin-1").split("\r\n")
    fields = []
    for line in lines[1:]:
        name, colon, value = line.partition(":")
        if not colon or not name or name != name.strip():
            raise WireError(f"not a field line: {line[:80]!r}")
        fields.append((name, value.strip(" \t")))
    return Head(lines[0], tuple(fields))


async def read_head(reader: asyncio.StreamReader, wait: float = WAIT) -> Head | None:
    """The next head on the connection, or None at a clean close before its first byte."""
    try:
        raw = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), wait)
    except asyncio.IncompleteReadError as exc:
        if not exc.partial:
            return None
        raise WireError(f"closed inside a head: {exc.partial[:80]!r}") from None
    except asyncio.LimitOverrunError:
        raise WireError("a head past MAX_HEAD") from None
    return parse_head(raw[:-4])


@dataclass(frozen=True)
class Body:
    """A body as its framing delimits it: the bytes, how it was framed, the chunked trailers,
    and what broke (a framing conflict, a bad chunk, a close or a wait before its end)."""

    data: bytes
    framing: str  # "none", "length", "chunked" or "close"
    trailers: Fields = ()
    problem: str | None = None


def framing(head: Head, *, bodiless: bool, request: bool) -> tuple[str, str | None]:
    """How the body after `head` ends (RFC 9112 section 6.3), and a conflict the sender made."""
    te, lengths = head.tokens("transfer-encoding"), head.values("content-length")
    problem = None
    if te and lengths:
        problem = "Content-Length with Transfer-Encoding"
    elif len(lengths) > 1:
        problem = "Content-Length repeated"
    elif te.count("chunked") > 1:
        problem = "chunked applied twice"  # RFC 9112 section 7: at most once
    if bodiless:
        return "none", problem
    if te:
        return ("chunked" if te[-1] == "chunked" else "close"), problem
    if lengths:
        return "length", problem
    return ("none" if request else "close"), problem


async def read_body(
    reader: asyncio.StreamReader, head: Head, *, bodiless: bool = False, request: bool = False
) -> Body:
    how, problem = framing(head, bodiless=bodiless, request=request)
    if problem is not None:  # as a strict parser (llhttp) does: where it ends is anybody's guess
        return Body(b"", how, (), problem)
    try:
        async with asyncio.timeout(WAIT):
            if how == "length":
                value = head.values("content-length")[0]
                if not value.isdigit():
                    return Body(b"", how, (), f"Content-Length {value[:40]!r}")
                return Body(await reader.readexactly(int(value)), how)
            if how == "chunked":
                data, trailers, bad = await _chunks(reader)
                return Body(data, how, trailers, bad)
            if how == "close":
                return Body(await _to_close(reader), how)
    except asyncio.IncompleteReadError as exc:
        return Body(exc.partial, how, (), "closed before the body's end")
    except TimeoutError:
        return Body(b"", how, (), "no end of the body within WAIT")
    except WireError as exc:
        return Body(b"", how, (), str(exc))
    return Body(b"", how)


async def _to_close(reader: asyncio.StreamReader) -> bytes:
    """A body the close ends: all of it, to the close (one read may return a first part)."""
    data = bytearray()
    while len(data) <= MAX_BODY and (part := await reader.read(1 << 16)):
        data += part
    return bytes(data)


async def _chunks(reader: asyncio.StreamReader) -> tuple[bytes, Fields, str | None]:
    data = bytearray()
    while True:
        line = (await reader.readuntil(b"\r\n"))[:-2]
        size = line.split(b";", 1)[0].strip()
        try:
            n = int(size, 16)
        except ValueError:
            return bytes(data), (), f"bad chunk size {line[:40]!r}"
        if n == 0:
            break
        data += await reader.readexactly(n)
        if await reader.readexactly(2) != b"\r\n":
            return bytes(data), (), "a chunk not ended by CRLF"
    trailers = []
    while line := (await reader.readuntil(b"\r\n"))[:-2]:
        trailers.append(line)
    fields = parse_head(b"\r\n".join([b"-", *trailers])).fields
    return bytes(data), fields, None
