"""What is compared, after which normalisation: each hop's view of a case, and the differences.

A hop's view of a case is a set of aspects (the status, each field by its lower-case name, the
body, whether the next request got its own answer, ...), each a string. A difference is an
aspect on which the hops do not all agree; `accepted.ACCEPTED` says which are by design.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass

from tests.differential.client import Seen
from tests.differential.upstream import Arrival
from tests.differential.wire import Fields, tokens

View = dict[str, str]

# Fields each hop writes for itself, so their values say nothing about what it relayed. The
# framing fields are left out because a hop may reframe (a length for chunks, chunks for a
# close): what is compared instead is the body they delimit and whether they conflict
# (`wire.framing`: both at once, a length twice, chunked twice).
ANSWER_OWN = {
    "date": "each hop's clock (RFC 9110 section 6.6.1: a proxy may set its own)",
    "server": "each hop names itself",
    "x-request-id": "the sidecar's id for the request",
    "content-length": "framing: the body bytes and framing conflicts are compared instead",
    "transfer-encoding": "framing: the body bytes and framing conflicts are compared instead",
}
REQUEST_OWN = {
    "host": "each hop names the upstream it connects to",
    "x-forwarded-for": "the sidecar's (nginx sets none by default)",
    "x-forwarded-proto": "the sidecar's",
    "x-forwarded-host": "the sidecar's",
    "forwarded": "the sidecar's (RFC 7239)",
    "x-real-ip": "the sidecar's",
    "x-request-id": "the sidecar's id for the request",
    "content-length": "framing: the body bytes and framing conflicts are compared instead",
    "transfer-encoding": "framing: the body bytes and framing conflicts are compared instead",
}
# `Connection: close` or `keep-alive` is each hop's word about its own connection (compared
# through the next request); any other token names a field, and is kept.
_OWN_TOKENS = frozenset(("close", "keep-alive"))
# RFC 9110 section 7.6.1, and the fields RFC 2616 section 13.5.1 listed: the harness's own list,
# not the sidecar's, so that it judges the sidecar's.
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


def hop_by_hop(items: Fields, named: set[str]) -> str:
    """The `hop-by-hop` aspect: the fields a proxy must not pass that it passed (RFC 9110
    section 7.6.1), hop-by-hop by name or `named` by the Connection it received. A hop's own
    framing (Transfer-Encoding) and its own word on its connection (`close`, `keep-alive`) are
    its to send."""
    passed = sorted(
        name
        for name, _ in items
        if name.lower() != "transfer-encoding"
        and (name.lower() in HOP_BY_HOP - {"connection"} or name.lower() in named)
    )
    passed += sorted(f"Connection: {t}" for t in tokens(items, "connection") - _OWN_TOKENS)
    return repr(passed)


def fields(items: Fields, own: Mapping[str, str]) -> View:
    """`field NAME` aspects: each name lower case, its values in the order sent."""
    out: dict[str, list[str]] = {}
    for name, value in items:
        key = name.lower()
        if key in own:
            continue
        if key == "connection":
            value = ", ".join(sorted(tokens(((key, value),), key) - _OWN_TOKENS))
            if not value:
                continue
        out.setdefault(key, []).append(value)
    return {f"field {k}": repr(v) for k, v in out.items()}


def envelope_free(body: bytes, target: str) -> str:
    """The body, with what differs by request in the sidecar's envelope left out: its
    `request_id`, the request's target (each hop's own), and a sidecar-sourced `message`, which
    quotes its upstream client's parser."""
    body = body.replace(target.encode(), b"<target>")
    try:
        doc = json.loads(body)
    except ValueError:
        return repr(body)
    error = doc.get("error") if isinstance(doc, dict) else None
    if not isinstance(error, dict) or "request_id" not in error:
        return repr(body)
    error["request_id"] = "-"
    if error.get("source") == "sidecar":
        error["message"] = "-"
    return "envelope " + json.dumps(doc, sort_keys=True)


def answer_view(seen: Seen, target: str, named: set[str]) -> View:
    view = {
        "status": str(seen.status),
        "reason": seen.reason,
        "interim": repr(seen.interim),
        "error": str(seen.error),
        "next": seen.next,
    }
    if seen.body is not None:
        view["body"] = envelope_free(seen.body.data, target)
        view["problem"] = str(seen.body.problem)
        view["trailers"] = repr(seen.body.trailers)
        view["hop-by-hop"] = hop_by_hop(seen.fields, named)
    return view | fields(seen.fields, ANSWER_OWN)


def request_view(seen: Seen, arrivals: list[Arrival], hop: str, named: set[str]) -> View:
    """What reached the upstream for a client's request, and what the client got back."""
    view = {"status": str(seen.status), "next": seen.next, "arrivals": str(len(arrivals))}
    if len(arrivals) == 1:
        (got,) = arrivals
        method, target = got.head.line.split(" ")[:2]
        view["request line"] = f"{method} {target.replace(hop, '<hop>')}"
        view["body"] = repr(got.body.data)
        view["problem"] = str(got.body.problem)
        view["trailers"] = repr(got.body.trailers)
        view["hop-by-hop"] = hop_by_hop(got.head.fields, named)
        view |= fields(got.head.fields, REQUEST_OWN)
    return view


@dataclass(frozen=True)
class Difference:
    """One aspect the hops do not agree on: each hop's value (`-` where it has none)."""

    aspect: str
    values: tuple[tuple[str, str], ...]

    def of(self, hop: str) -> str:
        return dict(self.values).get(hop, "-")

    def __str__(self) -> str:
        return f"{self.aspect}: " + "; ".join(f"{h}={_cut(v)}" for h, v in self.values)


def _cut(value: str, limit: int = 300) -> str:
    return value if len(value) <= limit else f"{value[:limit]}... ({len(value)} characters)"


def differences(views: Mapping[str, View]) -> list[Difference]:
    """The aspects the hops disagree on. A status decides what the rest means (an envelope's
    fields and body are not the relayed answer's), so hops are compared on the other aspects
    only with those of the same status."""
    found = []
    status = tuple((hop, view.get("status", "-")) for hop, view in views.items())
    if len({v for _, v in status}) > 1:
        found.append(Difference("status", status))
    groups: dict[str, list[str]] = {}
    for hop, value in status:
        groups.setdefault(value, []).append(hop)
    for hops in groups.values():
        aspects = sorted({a for hop in hops for a in views[hop]} - {"status"})
        for aspect in aspects:
            values = tuple((hop, views[hop].get(aspect, "-")) for hop in hops)
            if len({v for _, v in values}) > 1:
                found.append(Difference(aspect, values))
    return found
