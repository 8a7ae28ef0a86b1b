"""The accepted differences: each a rule that recognises a difference between the hops that is
by design, and why. docs/hardening.md mirrors this table; anything no rule takes is open.

No rule accepts a difference between the sidecar on the lean hop and on aiohttp's client unless
the lean hop is the one that agrees with nginx: the lean hop is held to a well-kept client.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from tests.differential.answers import Answer
from tests.differential.client_requests import Ask
from tests.differential.compare import HOP_BY_HOP, Difference, View
from tests.differential.wire import tokens

Case = Answer | Ask
SIDECARS = ("lean", "aiohttp")

# Fields a server refuses to see twice in a request: nginx 1.22 ("client sent duplicate header
# line") and aiohttp's server (http_parser.SINGLETON_HEADERS, "Duplicate '...' header found").
NGINX_UNIQUE = frozenset(("host", "authorization", "expect", "transfer-encoding", "content-length"))
AIOHTTP_SINGLETONS = frozenset(
    (
        "content-length",
        "content-location",
        "content-range",
        "content-type",
        "etag",
        "host",
        "max-forwards",
        "server",
        "transfer-encoding",
        "user-agent",
    )
)


@dataclass(frozen=True)
class Accepted:
    why: str
    applies: Callable[[Case, Difference, Mapping[str, View]], bool]
    # whether it may take a difference between the two sidecars (only where lean is right)
    between_sidecars: bool = False


def _sidecars_vs_nginx(d: Difference) -> bool:
    """The sidecars in `d` agree, and nginx says otherwise."""
    values = dict(d.values)
    ours = {values[hop] for hop in SIDECARS if hop in values}
    return "nginx" in values and len(ours) == 1 and values["nginx"] not in ours


def _field(d: Difference) -> str:
    return d.aspect.removeprefix("field ") if d.aspect.startswith("field ") else ""


def _repeated(case: Case) -> set[str]:
    names = [name.lower() for name, _ in case.fields]
    return {name for name in names if names.count(name) > 1}


def _hop_by_hop_nginx_passes(case: Case, d: Difference, views: Mapping[str, View]) -> bool:
    if d.aspect == "hop-by-hop":  # the sidecars passed none (else `run.broken` says so)
        return _sidecars_vs_nginx(d)
    name = _field(d)
    dropped = all(d.of(hop) == "-" for hop in SIDECARS if hop in dict(d.values))
    named = name in HOP_BY_HOP or name in case.connection_tokens()
    return named and dropped and _sidecars_vs_nginx(d)


def _envelope(case: Case, d: Difference, views: Mapping[str, View]) -> bool:
    sidecar = next(hop for hop in (*SIDECARS, "nginx") if hop in dict(d.values))
    enveloped = views[sidecar].get("body", "").startswith("envelope ")
    return (
        enveloped
        and d.aspect in ("body", "field content-type", "field x-sidecar-error")
        and _sidecars_vs_nginx(d)
    )


def _own_fields(case: Case, d: Difference, views: Mapping[str, View]) -> bool:
    name = _field(d)
    own = name.startswith("x-sidecar-") or name.startswith("x-weight-version")
    return own and _sidecars_vs_nginx(d)


def _reason(case: Case, d: Difference, views: Mapping[str, View]) -> bool:
    return d.aspect == "reason" and _sidecars_vs_nginx(d)


def _octet_stream(case: Case, d: Difference, views: Mapping[str, View]) -> bool:
    added = d.aspect == "field content-type" and "content-type" not in case.names()
    return added and d.of("nginx") == "-" and _sidecars_vs_nginx(d)


def _nginx_one_content_type(case: Case, d: Difference, views: Mapping[str, View]) -> bool:
    repeated = "content-type" in _repeated(case)
    return d.aspect == "field content-type" and repeated and _sidecars_vs_nginx(d)


def _head_bounds(case: Case, d: Difference, views: Mapping[str, View]) -> bool:
    if not isinstance(case, Answer) or not case.big or d.aspect != "status":
        return False
    return {v for _, v in d.values} <= {"502", str(case.status)}


def _refused_after(case: Case, d: Difference, views: Mapping[str, View]) -> bool:
    if not isinstance(case, Answer) or not case.extra or d.aspect != "status":
        return False
    said_close = "close" in tokens(case.fields, "connection") | tokens(
        case.fields, "proxy-connection"
    )
    if case.extra != b"junk" and not said_close:
        return False
    status = str(case.status)
    nginx = {status, "502"} if case.big else {status}  # its own head bound may refuse it
    return d.of("aiohttp") == "502" and d.of("lean") == status and d.of("nginx") in nginx | {"-"}


def _length_beside_chunks(case: Case, d: Difference, views: Mapping[str, View]) -> bool:
    names = case.names()
    both = "content-length" in names and "transfer-encoding" in names
    return both and _refused_by_both(case, d)


def _refused_by_both(case: Case, d: Difference) -> bool:
    """A status difference: both sidecars 502, nginx relayed the answer's status."""
    refused = d.of("lean") == "502" == d.of("aiohttp")
    return (
        isinstance(case, Answer)
        and d.aspect == "status"
        and refused
        and (d.of("nginx") == str(case.status))
    )


def _json_checked(case: Case, d: Difference, views: Mapping[str, View]) -> bool:
    if not isinstance(case, Answer) or case.framing not in ("chunked", "close"):
        return False
    kinds = [v.lower() for k, v in case.fields if k.lower() == "content-type"]
    try:
        json.loads(case.body)
    except ValueError:
        return bool(kinds) and "json" in kinds[0] and _refused_by_both(case, d)
    return False


def _lengths(case: Case, d: Difference, views: Mapping[str, View]) -> bool:
    lengths = [name for name, _ in case.fields if name.lower() == "content-length"]
    return len(lengths) > 1 and _refused_by_both(case, d)


def _duplicate_refused(case: Case, d: Difference, views: Mapping[str, View]) -> bool:
    repeated = _repeated(case)
    nginx_refuses = d.of("nginx") == "400" and repeated & NGINX_UNIQUE
    ours_refuse = d.of("lean") == "400" == d.of("aiohttp") and repeated & AIOHTTP_SINGLETONS
    return isinstance(case, Ask) and d.aspect == "status" and bool(nginx_refuses or ours_refuse)


def _proxy_connection_close(case: Case, d: Difference, views: Mapping[str, View]) -> bool:
    said = any(k.lower() == "proxy-connection" and v.lower() == "close" for k, v in case.fields)
    return said and d.aspect == "next" and d.of("lean") == "closed" and _sidecars_vs_nginx(d)


ACCEPTED: dict[str, Accepted] = {
    "reason phrase": Accepted(
        "aiohttp's server writes the registered reason phrase of the status; nginx relays the "
        "upstream's. RFC 9112 section 4: a client should ignore the reason phrase",
        _reason,
    ),
    "envelope": Accepted(
        "an upstream 4xx/5xx, and every failure of the sidecar's own, is the sidecar's JSON "
        "envelope (the upstream's body inside it): its body, Content-Type and X-Sidecar-Error "
        "are not what nginx relays or writes",
        _envelope,
    ),
    "default content type": Accepted(
        "aiohttp's server sets Content-Type: application/octet-stream on an answer the upstream "
        "sent without one; RFC 9110 section 8.3 lets a recipient assume exactly that type",
        _octet_stream,
    ),
    "own fields": Accepted(
        "X-Sidecar-* and X-Weight-Version* in an answer are the sidecar's word: the upstream's "
        "are dropped before the sidecar adds its own; nginx has no such fields",
        _own_fields,
    ),
    "hop-by-hop fields nginx passes": Accepted(
        "RFC 9110 section 7.6.1: a proxy removes the hop-by-hop fields and those Connection "
        "names; nginx 1.22 passes the named ones, and of the others Proxy-Authenticate, "
        "Proxy-Authorization, Proxy-Connection, Trailer, TE, Upgrade and Keep-Alive in answers, "
        "Proxy-Authorization, Proxy-Connection and Trailer in requests. The sidecar drops them",
        _hop_by_hop_nginx_passes,
    ),
    "nginx keeps one Content-Type": Accepted(
        "of a repeated Content-Type nginx relays the last; the sidecar relays them as they came",
        _nginx_one_content_type,
    ),
    "head bounds": Accepted(
        "nginx bounds an answer's whole head by proxy_buffer_size (4 KiB by default: 'upstream "
        "sent too big header'), the sidecar by aiohttp's client bounds (8190 bytes a field or "
        "the status line, 128 fields): each refuses, with a 502, heads the other passes",
        _head_bounds,
    ),
    "bytes after the answer (aiohttp)": Accepted(
        "aiohttp's client (llhttp) parses the bytes that follow a complete answer in the same "
        "read, and fails the request (502 upstream_invalid_response) when they are no HTTP "
        "answer ('Bad status line') or follow one that said Connection: close or "
        "Proxy-Connection: close ('Data after Connection: close'); the lean hop relays the "
        "answer and closes the connection, as nginx does",
        _refused_after,
        between_sidecars=True,
    ),
    "length beside chunks": Accepted(
        "RFC 9112 section 6.3: an answer with both Content-Length and Transfer-Encoding "
        "'ought to be handled as an error'; the sidecar refuses it (502 "
        "upstream_invalid_response), nginx 1.22 reads the chunks and drops the length",
        _length_beside_chunks,
    ),
    "JSON checked": Accepted(
        "a JSON answer without a length (chunked to a GET, or ended by the close) is read whole "
        "and must parse, so that a cut one is never relayed as complete (see Limits): one that "
        "does not is a 502 upstream_invalid_response; nginx relays it",
        _json_checked,
    ),
    "repeated Content-Length": Accepted(
        "RFC 9112 section 6.3: differing Content-Lengths are an unrecoverable error after which "
        "a proxy 'MUST ... send a 502'; identical ones a recipient may take or refuse, and both "
        "of the sidecar's parsers (llhttp) refuse them. nginx 1.22 relays both",
        _lengths,
    ),
    "repeated fields a server refuses": Accepted(
        "a request repeating a field its server takes as single is a 400: nginx for "
        "Authorization, Expect, Transfer-Encoding, Content-Length, Host; aiohttp's server (the "
        "sidecar's) for Content-Type, User-Agent, Content-Length, Host, ETag and the other "
        "RFC 9110 singletons",
        _duplicate_refused,
    ),
    "Proxy-Connection: close": Accepted(
        "aiohttp's server (llhttp) takes Proxy-Connection: close as Connection: close and closes "
        "the client's connection after the answer; nginx ignores it. The client connects again",
        _proxy_connection_close,
    ),
}


def accepted_as(case: Case, difference: Difference, views: Mapping[str, View]) -> str | None:
    """The name of the first rule that takes `difference`, or None: it is open."""
    values = dict(difference.values)
    split = "lean" in values and "aiohttp" in values and values["lean"] != values["aiohttp"]
    for name, rule in ACCEPTED.items():
        if (rule.between_sidecars or not split) and rule.applies(case, difference, views):
            return name
    return None
