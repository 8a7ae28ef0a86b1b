"""Header rules for a forwarding proxy: hop-by-hop removal, X-Forwarded-*, the request id."""

from __future__ import annotations

import functools
import itertools
import os
import re
from collections.abc import Iterable

from multidict import CIMultiDict, MultiMapping, istr

REQUEST_ID = istr("X-Request-Id")
AUTHORIZATION = istr("Authorization")
EXPECT = istr("Expect")
SIDECAR_ERROR = istr("X-Sidecar-Error")

# RFC 9110 section 7.6.1: connection-specific fields a proxy must not forward, plus the fields
# RFC 7230 listed as hop-by-hop that clients still send. Field names are case-insensitive
# (section 5.1) and arrive in any case (uvicorn writes lower case, the lean hop keeps it): every
# set of names here is lower case, and a name is looked up by its `.lower()`. (An `istr` in a
# frozenset does not help: it hashes as the string it was made from, so `"upgrade"` misses it.)
HOP_BY_HOP = frozenset(
    (
        "connection",
        "proxy-connection",
        "keep-alive",
        "te",
        "trailer",
        "transfer-encoding",
        "upgrade",
        "proxy-authenticate",
        "proxy-authorization",
    )
)
# Recomputed for the next hop: the host is the upstream's, the length is that of what we send.
# Expect: the sidecar has already read the whole body (and answered 100 Continue itself), so
# asking the upstream for permission to send it would only cost a round trip.
_REQUEST_DROP = HOP_BY_HOP | {"host", "content-length", "expect"}
# What the sidecar says about an answer is the sidecar's alone: an upstream's own X-Sidecar-* or
# weight-version fields would be read as the sidecar's word (a forged error reason, a version
# the engine never served), so they go before the sidecar adds its own.
_OWN = frozenset(("x-weight-version", "x-weight-version-end", "x-weight-versions"))
_OWN_PREFIX = "x-sidecar-"
_RESPONSE_DROP = HOP_BY_HOP | _OWN


# The encodings aiohttp's server inflates as it reads a request body (http_parser.py: exactly
# one of these, case-insensitive). The handler sees the inflated bytes, which are what the
# sidecar forwards: the label goes, since the body it named is gone.
INFLATED = frozenset(("gzip", "deflate", "br", "zstd"))


def inflated(headers: MultiMapping[str]) -> bool:
    """Whether the request's body reached the handler inflated (its Content-Encoding is one
    the server decodes); any other encoding is relayed as sent, label and bytes."""
    encoding = headers.get("Content-Encoding", "")
    return encoding.isascii() and encoding.lower() in INFLATED


def _connection_tokens(headers: MultiMapping[str]) -> frozenset[str]:
    # RFC 9110 section 7.6.1: fields named by Connection are hop-by-hop too, in any case.
    return frozenset(
        token.strip().lower()
        for value in headers.getall("Connection", ())
        for token in value.split(",")
        if token.strip()
    )


def _filtered(
    headers: MultiMapping[str], drop: frozenset[str], prefix: str | None = None
) -> CIMultiDict[str]:
    named = _connection_tokens(headers) if "Connection" in headers else frozenset()
    out: CIMultiDict[str] = CIMultiDict()
    # A field repeated in other spellings (`X-Foo`, `x-foo`) keeps its first: aiohttp's client
    # (`ClientSession._prepare_headers`, 3.14) tracks the names it has added case-sensitively,
    # so each new spelling would replace the values before it, and vLLM would get only the last.
    spelt: dict[str, str] = {}
    for key, value in headers.items():
        name = key.lower()
        if name in drop or name in named or (prefix is not None and name.startswith(prefix)):
            continue
        out.add(spelt.setdefault(name, key), value)
    return out


# A token of visible ASCII: it is logged, passed to vLLM (which builds its own ids from it) and
# returned, so no spaces, quotes, backslashes or control characters.
_SANE_REQUEST_ID = re.compile(r"[!#-\[\]-~]{1,200}")


def request_id(headers: MultiMapping[str]) -> str:
    """The client's X-Request-Id when it sent a sane one, else a new one."""
    given = headers.get(REQUEST_ID, "")
    if _SANE_REQUEST_ID.fullmatch(given):
        return given
    return _new_id()


class _RequestIds:
    """32 hex digits: 16 random per process, then a count. Unique within and across processes
    without a system call per request (os.urandom is one); ids name requests, they guard
    nothing, so that the next is guessable is fine. A forked child draws its own prefix."""

    def __init__(self) -> None:
        self.renew()

    def renew(self) -> None:
        self._prefix, self._count = os.urandom(8).hex(), itertools.count()

    def __call__(self) -> str:
        return f"{self._prefix}{next(self._count) & 0xFFFF_FFFF_FFFF_FFFF:016x}"


_new_id = _RequestIds()
os.register_at_fork(after_in_child=_new_id.renew)


def refused_request_id(headers: MultiMapping[str], rid: str) -> str | None:
    """The X-Request-Id the client sent when `request_id` replaced it, for the log."""
    given = headers.get(REQUEST_ID)
    return given if given is not None and given != rid else None


# Fields the sidecar writes anew for the upstream (the client's own X-Forwarded-For and Forwarded
# values are read, and their chains extended); X-Forwarded-Host only when the request has a host.
_REBUILT = frozenset(("x-forwarded-for", "x-forwarded-proto", "x-real-ip", "forwarded"))
_REQUEST_SKIP = _REQUEST_DROP | _REBUILT | {"x-request-id"}
_REQUEST_SKIP_HOST = _REQUEST_SKIP | {"x-forwarded-host"}


def upstream_request_headers(
    headers: MultiMapping[str],
    *,
    rid: str,
    client_ip: str | None,
    scheme: str,
    host: str | None,
) -> CIMultiDict[str]:
    """The request's fields for the upstream, filtered and the proxy's own added, in one pass
    over them (a filtered copy, then a look-up and a replace per added field, cost twice as
    much)."""
    named = _connection_tokens(headers) if "Connection" in headers else frozenset()
    drop = _REQUEST_SKIP_HOST if host else _REQUEST_SKIP
    out: CIMultiDict[str] = CIMultiDict()
    spelt: dict[str, str] = {}  # as in `_filtered`: a field's first spelling is kept
    chains: dict[str, list[str]] = {"x-forwarded-for": [], "forwarded": []}
    for key, value in headers.items():
        name = key.lower()
        if name in drop:
            if name in chains:  # read even when Connection names it
                chains[name].append(value)
            continue
        if name not in named:
            out.add(spelt.setdefault(name, key), value)
    if inflated(headers):
        out.popall("Content-Encoding")
    forwarded_for = ", ".join(v for v in (*chains["x-forwarded-for"], client_ip) if v)
    if forwarded_for:
        out.add("X-Forwarded-For", forwarded_for)
    out.add("X-Forwarded-Proto", scheme)
    if host:
        out.add("X-Forwarded-Host", host)
    # X-Real-IP names one address, the client's: only the sidecar knows it, so a client's own
    # value is replaced, never passed on. Forwarded (RFC 7239) is a chain like X-Forwarded-For:
    # each proxy appends its element (section 4), so the upstream can trust the last one.
    if client_ip:
        out.add("X-Real-IP", client_ip)
    chain = [*chains["forwarded"], _forwarded_element(client_ip, scheme, host)]
    out.add("Forwarded", ", ".join(chain))
    out.add(REQUEST_ID, rid)
    return out


_TOKEN = re.compile(r"[!#$%&'*+.^_`|~0-9A-Za-z-]+")


# Pure, and its arguments repeat from request to request (one client, one Host): a bounded memo.
@functools.lru_cache(maxsize=256)
def _forwarded_element(client_ip: str | None, scheme: str, host: str | None) -> str:
    """One RFC 7239 element; values that are not tokens (IPv6, host:port) are quoted."""

    def pair(name: str, value: str) -> str:
        if _TOKEN.fullmatch(value):
            return f"{name}={value}"
        escaped = value.replace("\\", "\\\\").replace('"', '\\"')
        return f'{name}="{escaped}"'

    ip = f"[{client_ip}]" if client_ip and ":" in client_ip else client_ip
    parts = [pair("for", ip or "unknown"), pair("proto", scheme)]
    if host:
        parts.append(pair("host", host))
    return ";".join(parts)


def response_headers(headers: MultiMapping[str], *, rid: str) -> CIMultiDict[str]:
    out = _filtered(headers, _RESPONSE_DROP, _OWN_PREFIX)
    out[REQUEST_ID] = rid
    return out


def drop(headers: CIMultiDict[str], names: Iterable[str]) -> None:
    for name in names:
        headers.popall(name, None)
