"""Generated client requests (hypothesis): hop-by-hop fields in any case (`Proxy-Connection`,
`Connection` naming another field, `TE`, `Keep-Alive`, `Upgrade`, `Trailer`), plain ones, and a
body framed by its length or by chunks in any spelling of `Transfer-Encoding`."""

from __future__ import annotations

from dataclasses import dataclass

from hypothesis import strategies as st

from tests.differential.answers import spelt
from tests.differential.wire import Fields, shown, tokens

_VALUES: dict[str, tuple[str, ...]] = {
    "Proxy-Connection": ("keep-alive", "close"),
    "Connection": ("x-foo", "X-Foo, x-bar", "keep-alive", "TE", "Upgrade"),
    "X-Foo": ("foo", "foo2"),
    "X-Bar": ("bar", "bar2"),
    "TE": ("trailers", "gzip"),
    "Keep-Alive": ("300",),
    "Upgrade": ("h2c", "websocket"),
    "Proxy-Authorization": ("Basic eDp5",),
    "Trailer": ("X-Checksum",),
    "Expect": ("100-continue",),
    "User-Agent": ("differential/1",),
    "Accept": ("*/*", "text/event-stream"),
    "Accept-Encoding": ("gzip", "identity"),
    "Content-Type": ("application/json", "text/plain"),
    "Cookie": ("a=1",),
    "Authorization": ("Bearer t",),
    "Cache-Control": ("no-cache",),
}

field = st.sampled_from(sorted(_VALUES)).flatmap(
    lambda name: st.tuples(spelt(name), st.sampled_from(_VALUES[name]))
)


@dataclass(frozen=True)
class Ask:
    """One generated request, but for its target and `Host` (each hop's own)."""

    method: str
    fields: Fields  # as written, framing fields included
    body: bytes
    framing: str  # "none", "length" or "chunked"
    payload: bytes  # the body as framed on the wire

    def bytes_to(self, target: str) -> bytes:
        lines = "".join(f"{k}: {v}\r\n" for k, v in self.fields)
        return f"{self.method} {target} HTTP/1.1\r\nHost: differential\r\n{lines}\r\n".encode() + (
            self.payload
        )

    def names(self) -> set[str]:
        return {name.lower() for name, _ in self.fields}

    def connection_tokens(self) -> set[str]:
        return tokens(self.fields, "connection")

    def describe(self) -> str:
        return f"request {shown(self.bytes_to('/q/<case>/<hop>'))}"


def _chunks(draw: st.DrawFn, body: bytes) -> bytes:
    cut = draw(st.integers(0, len(body)))
    ext = draw(st.sampled_from(["", ";ext=1"]))
    out = b"".join(
        b"%x%s\r\n%s\r\n" % (len(p), ext.encode(), p) for p in (body[:cut], body[cut:]) if p
    )
    trailer = draw(st.sampled_from([b"", b"X-Checksum: 1\r\n"]))
    return out + b"0\r\n" + trailer + b"\r\n"


@st.composite
def asks(draw: st.DrawFn) -> Ask:
    method = draw(st.sampled_from(["GET", "GET", "POST", "POST", "PUT"]))
    fields = draw(st.lists(field, max_size=6))
    body = b"" if method == "GET" else draw(st.binary(max_size=64))
    how = "none" if method == "GET" else draw(st.sampled_from(["length", "chunked"]))
    if how == "length":
        fields.append((draw(spelt("Content-Length")), str(len(body))))
        payload = body
    elif how == "chunked":
        coding = draw(st.sampled_from(["chunked", "chunked", "Chunked", "CHUNKED"]))
        fields.append((draw(spelt("Transfer-Encoding")), coding))
        payload = _chunks(draw, body)
    else:
        payload = b""
    return Ask(method, tuple(draw(st.permutations(fields))), body, how, payload)
