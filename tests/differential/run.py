"""One case through every hop, compared: a generated answer (the upstream writes it) or a
generated request (the client sends it), and the differences found, each accepted or open."""

from __future__ import annotations

import asyncio
from collections import Counter
from dataclasses import dataclass, field

import hypothesis
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from tests.differential.accepted import Case, accepted_as
from tests.differential.answers import Answer, answers
from tests.differential.client import Seen, Then, through
from tests.differential.client_requests import Ask, asks
from tests.differential.compare import (
    Difference,
    View,
    answer_view,
    differences,
    request_view,
)
from tests.differential.peers import SIDECARS, Peers


@dataclass(frozen=True)
class Outcome:
    """A case's differences: those an `ACCEPTED` rule explains (by its name), and the open."""

    case: Case
    accepted: tuple[tuple[str, Difference], ...]
    open: tuple[Difference, ...]

    def report(self, accepted: bool = False) -> str:
        lines = [self.case.describe()]
        lines += [f"  open: {d}" for d in self.open]
        if accepted:
            lines += [f"  accepted ({name}): {d}" for name, d in self.accepted]
        return "\n".join(lines)


def broken(views: dict[str, View]) -> list[Difference]:
    """What a sidecar did that no hop should, whatever the others did: a hop-by-hop field
    passed (RFC 9110 section 7.6.1). nginx is the reference, so its own are only differences."""
    return [
        Difference("hop-by-hop passed (RFC 9110 section 7.6.1: none)", ((hop, view["hop-by-hop"]),))
        for hop, view in views.items()
        if hop in SIDECARS and view.get("hop-by-hop", "[]") != "[]"
    ]


def _judge(case: Case, views: dict[str, View]) -> Outcome:
    accepted, open_ = [], broken(views)
    for difference in differences(views):
        name = accepted_as(case, difference, views)
        if name is None:
            open_.append(difference)
        else:
            accepted.append((name, difference))
    return Outcome(case, tuple(accepted), tuple(open_))


async def _each_hop(
    peers: Peers, request: dict[str, bytes], case: str, then: dict[str, Then] | None = None
) -> dict[str, Seen]:
    hops = tuple(request)
    seen = await asyncio.gather(
        *(
            through(peers.ports[hop], request[hop], f"/n/{case}/{hop}", then=(then or {}).get(hop))
            for hop in hops
        )
    )
    return dict(zip(hops, seen, strict=True))


def answer_case(peers: Peers, answer: Answer, *, version: bytes = b"1.1") -> Outcome:
    """`answer` to a request from each hop; an HTTP/1.0 one asks to keep its connection."""
    case = peers.case()
    peers.upstream.answers[case] = (answer.data, answer.closes)
    body = b'{"x":1}' if answer.method == "POST" else b""
    framing = b"Content-Length: %d\r\n" % len(body) if body else b""
    framing += b"Connection: keep-alive\r\n" if version == b"1.0" else b""
    request = {
        hop: b"%s /a/%s/%s HTTP/%s\r\nHost: differential\r\n%s\r\n%s"
        % (answer.method.encode(), case.encode(), hop.encode(), version, framing, body)
        for hop in peers.hops
        if hop != "nginx" or not answer.interim  # nginx 1.22 knows no interim answers
    }
    try:
        seen = peers.call(_each_hop(peers, request, case))
    finally:
        del peers.upstream.answers[case]
    named = answer.connection_tokens()
    views = {hop: answer_view(s, f"/a/{case}/{hop}", named) for hop, s in seen.items()}
    return _judge(answer, views)


def request_case(peers: Peers, ask: Ask, *, split: bool = False) -> Outcome:
    """`ask` through each hop; `split`: its head first, its body once the hop has read the head
    (a sidecar: its handler is in flight; nginx answers alike however the bytes arrive)."""
    case = peers.case()
    request = {hop: ask.bytes_to(f"/q/{case}/{hop}") for hop in peers.hops}
    then: dict[str, Then] = {}
    if split:
        cut = len(ask.payload)
        request = {hop: wire[:-cut] for hop, wire in request.items()}
        then = {hop: (peers.head_read(hop), ask.payload) for hop in peers.hops}
    seen = peers.call(_each_hop(peers, request, case, then))
    named = ask.connection_tokens()
    views = {
        hop: request_view(s, peers.upstream.arrivals.pop(f"/q/{case}/{hop}", []), hop, named)
        for hop, s in seen.items()
    }
    return _judge(ask, views)


@dataclass
class Tally:
    """A run's figures: cases, those alike, each accepted rule's count, the open outcomes."""

    cases: int = 0
    alike: int = 0
    accepted: Counter[str] = field(default_factory=Counter)
    open: list[Outcome] = field(default_factory=list)

    def add(self, outcome: Outcome) -> None:
        self.cases += 1
        self.alike += not outcome.accepted and not outcome.open
        self.accepted.update({name for name, _ in outcome.accepted})
        if outcome.open:
            self.open.append(outcome)


def sweep(peers: Peers, kind: str, examples: int, seed: int | None = None) -> Tally:
    """`examples` generated cases of `kind` ("answers" or "requests") through every hop: the
    same cases each run (`derandomize`) when `seed` is None. Nothing is shrunk: every open
    outcome is kept, each a reproducer as generated."""
    tally = Tally()
    strategy: st.SearchStrategy[Case] = answers() if kind == "answers" else asks()

    @settings(
        max_examples=examples,
        derandomize=seed is None,
        database=None,
        deadline=None,
        phases=[Phase.explicit, Phase.generate],
        suppress_health_check=list(HealthCheck),
    )
    @given(case=strategy)
    def run(case: Case) -> None:
        if isinstance(case, Answer):
            tally.add(answer_case(peers, case))
        else:
            tally.add(request_case(peers, case))

    (run if seed is None else hypothesis.seed(seed)(run))()
    for process in peers.processes.values():
        process.check_alive()
    return tally
