"""Generated upstream answers (hypothesis): interim 1xx answers, a status line, fields in any
case (hop-by-hop ones, names listed in `Connection`, the sidecar's own), a body framed by its
length, by chunks (extensions, trailers) or by the close, now and then a huge head, and
sometimes bytes after the answer."""

from __future__ import annotations

from dataclasses import dataclass

from hypothesis import strategies as st

from tests.differential.wire import Fields, shown, tokens

INTERIM = (
    b"HTTP/1.1 100 Continue\r\n\r\n",
    b"HTTP/1.1 102 Processing\r\n\r\n",
    b"HTTP/1.1 103 Early Hints\r\nLink: </style.css>; rel=preload\r\n\r\n",
)
STATUSES = (200, 200, 200, 201, 202, 204, 206, 302, 304, 400, 404, 429, 500, 503)
REASONS = ("OK", "Fine", "", "Some Other Words")
# After the answer on the same connection: a stray answer, a stray CRLF, junk.
EXTRA = (b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nstale", b"\r\n", b"junk")


def spelt(name: str) -> st.SearchStrategy[str]:
    """A field name as sent: as registered, lower, upper or swapped case (RFC 9110 section 5.1:
    names are case-insensitive, so a hop must treat every spelling alike)."""
    return st.sampled_from([name, name.lower(), name.upper(), name.swapcase()])


# Each field with the values it is drawn with. `x-foo` and `x-bar` are what a `Connection`
# field may name; the rest are hop-by-hop (RFC 9110 section 7.6.1), the sidecar's own, or plain.
_VALUES: dict[str, tuple[str, ...]] = {
    "Content-Type": ("text/plain", "application/json", "text/event-stream"),
    "Cache-Control": ("no-store",),
    "Set-Cookie": ("a=1", "b=2; Path=/"),
    "Retry-After": ("3",),
    "ETag": ('"v1"',),
    "Vary": ("Accept-Encoding",),
    "Location": ("/elsewhere",),
    "Link": ("</x>; rel=next",),
    "Connection": ("close", "keep-alive", "x-foo", "X-Foo, x-bar", "Keep-Alive, Upgrade"),
    "X-Foo": ("foo",),
    "X-Bar": ("bar",),
    "Keep-Alive": ("timeout=5, max=100",),
    "Proxy-Authenticate": ('Basic realm="upstream"',),
    "Proxy-Authorization": ("Basic eDp5",),
    "Proxy-Connection": ("keep-alive", "close"),
    "Trailer": ("X-Checksum",),
    "TE": ("trailers",),
    "Upgrade": ("h2c", "websocket"),
    "X-Sidecar-Error": ("forged",),
    "X-Weight-Version": ("forged",),
}

field = st.sampled_from(sorted(_VALUES)).flatmap(
    lambda name: st.tuples(spelt(name), st.sampled_from(_VALUES[name]))
)


@dataclass(frozen=True)
class Answer:
    """One generated answer: the bytes, the request it answers, and what went into it."""

    data: bytes
    method: str  # GET or POST
    status: int
    fields: Fields  # the final answer's, as written
    framing: str  # "length", "chunked", "close" or "none" (204, 304)
    body: bytes
    interim: int
    extra: bytes
    big: str  # "", "a long field", "many fields"

    @property
    def closes(self) -> bool:
        """Whether the upstream closes the connection after writing it."""
        return self.framing == "close"

    def names(self) -> set[str]:
        return {name.lower() for name, _ in self.fields}

    def connection_tokens(self) -> set[str]:
        return tokens(self.fields, "connection")

    def describe(self) -> str:
        return f"{self.method} answered by {shown(self.data)} ({len(self.data)} bytes)"


def _big_fields(draw: st.DrawFn) -> tuple[str, list[tuple[str, str]]]:
    kind = draw(st.sampled_from(["", "", "", "", "", "", "a long field", "many fields"]))
    if kind == "a long field":
        return kind, [("X-Big", "a" * draw(st.sampled_from([4_000, 8_000, 9_000, 100_000])))]
    if kind == "many fields":
        count = draw(st.sampled_from([100, 128, 129, 5_000]))
        return kind, [(f"X-F{i}", "v") for i in range(count)]
    return kind, []


def _chunked(draw: st.DrawFn, body: bytes) -> bytes:
    cuts = sorted(draw(st.lists(st.integers(0, len(body)), max_size=3)))
    parts = [body[a:b] for a, b in zip([0, *cuts], [*cuts, len(body)], strict=True)]
    out = b""
    for part in (p for p in parts if p):
        size = draw(st.sampled_from(["%x", "%X", "%04x"])) % len(part)
        ext = draw(st.sampled_from(["", "", ";ext=1", ';name="quoted"']))
        out += f"{size}{ext}\r\n".encode() + part + b"\r\n"
    trailers = draw(st.sampled_from(["", "", "X-Checksum: 1\r\n", "X-A: 1\r\nX-B: 2\r\n"]))
    return out + b"0\r\n" + trailers.encode() + b"\r\n"


def _conflict(draw: st.DrawFn, how: str, size: int, wire: int) -> list[tuple[str, str]]:
    """Now and then a framing field more (RFC 9112 section 6.3): the same length again, another
    length, or a length beside chunks (the wire size: what a smuggler would send)."""
    kind = draw(st.sampled_from(["", "", "", "", "", "", "", "", "again", "another"]))
    if how == "length" and kind == "again":
        return [(draw(spelt("Content-Length")), str(size))]
    if how == "length" and kind == "another":
        return [("Content-Length", str(size + 3))]
    if how == "chunked" and kind:
        return [(draw(spelt("Content-Length")), str(wire))]
    return []


@st.composite
def answers(draw: st.DrawFn) -> Answer:
    interim = b"".join(draw(st.lists(st.sampled_from(INTERIM), max_size=2)))
    status = draw(st.sampled_from(STATUSES))
    reason = draw(st.sampled_from(REASONS))
    fields = draw(st.lists(field, max_size=6))
    big, more = _big_fields(draw)
    fields += more
    body = draw(st.one_of(st.binary(max_size=64), st.just(b"x" * 70_000)))
    if status in (204, 304):
        how, body = "none", b""
        if draw(st.booleans()):  # a 304's length is the representation's (RFC 9110 8.6)
            fields.append((draw(spelt("Content-Length")), "0" if status == 204 else "42"))
    else:
        how = draw(st.sampled_from(["length", "chunked", "close"]))
    if how == "length":
        fields.append((draw(spelt("Content-Length")), str(len(body))))
        payload = body
    elif how == "chunked":
        coding = draw(st.sampled_from(["chunked", "Chunked"]))
        fields.append((draw(spelt("Transfer-Encoding")), coding))
        payload = _chunked(draw, body)
    else:
        payload = body
    fields += _conflict(draw, how, len(body), len(payload))
    fields = draw(st.permutations(fields)) if len(fields) < 20 else fields
    head = (
        f"HTTP/1.1 {status} {reason}".rstrip(" ")
        if draw(st.booleans())
        else f"HTTP/1.1 {status} {reason}"
    )
    text = head + "\r\n" + "".join(f"{k}: {v}\r\n" for k, v in fields) + "\r\n"
    extra = draw(st.sampled_from([b"", b"", b"", *EXTRA])) if how != "close" else b""
    return Answer(
        data=interim + text.encode() + payload + extra,
        method=draw(st.sampled_from(["GET", "GET", "GET", "POST"])),
        status=status,
        fields=tuple(fields),
        framing=how,
        body=body,
        interim=interim.count(b"HTTP/1.1 1"),
        extra=extra,
        big=big,
    )
