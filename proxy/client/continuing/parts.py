"""A continuation's parts: when a choice a phase cut goes on, held, sent, and counted; the one
surface the two ways of answering (whole.py, streamed.py) use."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Iterable
from typing import Any

import orjson
from aiohttp import web

from proxy.core.continuation import ABORT, Plan, joining
from proxy.core.continuation.joining import Joined
from proxy.core.errors import PhaseRefusal, SidecarFailure

from ..flow import Flow, Relay

log = logging.getLogger(__name__)

Json = dict[str, Any]
# One upstream call of a part: the body, its name (the request id's suffix), what to do with
# vLLM's answer (client/exchange.py).
Send = Callable[[bytes, str, Relay], Awaitable[web.StreamResponse]]
# One part of a streamed answer, relayed as it comes (streamed.py): False, it could not go on.
StreamedPart = Callable[[Joined], Awaitable[bool]]
# A part's answer, kept for the joining (whole.py's `captured`).
Captured = Relay


class Parts:
    """One continuable request's plan and its parts: holds until the engine serves, sends each
    part through the exchange (`send`), joins what comes back, counts the outcome."""

    def __init__(self, flow: Flow, plan: Plan, send: Send, captured: Captured) -> None:
        self.flow, self.plan, self._send, self._captured = flow, plan, send, captured
        self.lifecycle = lifecycle = flow.addon  # the engine addon (client/hooks.py)
        self.most = flow.options.continue_max
        self.version = flow.engine.version or lifecycle.version  # the first part's
        self._cuts_before = lifecycle.cuts
        self._sent = 0

    @property
    def now(self) -> str | None:
        """The engine's weight version now: what a part sent now runs under."""
        return self.lifecycle.version

    def phase_cut(self) -> bool:
        """An abort a phase made: the engine does not serve, or an abort-mode pause or sleep
        was sent since the request was (an `/abort_requests` while serving is neither)."""
        return not self.lifecycle.serving() or self.lifecycle.cuts != self._cuts_before

    async def finish(self, j: Joined, streamed: StreamedPart | None = None) -> None:
        """Parts, one after the other, until the choice ends of itself or cannot go on: a token
        at a time (not streamed) while a stop string may straddle the cut, the rest in one part
        here or, for a stream, by `streamed` (False: it could not go on)."""
        probing = False
        while self._owed(j, probing):
            if not await self._hold():
                return
            probing = self._near_stop(j)
            if streamed is not None and not probing:
                if not await streamed(j):
                    return
                continue
            cut = len(j.text)
            answer = await self._part(j, most=1 if probing else None)
            if answer is None:
                return
            plan = self.plan
            j.add(answer, self.now, plan.text_of(answer), plan.reasoning_of(answer))
            if self._stopped(j, cut):
                return

    def _owed(self, j: Joined, probing: bool) -> bool:
        if len(j.tokens) >= self.plan.max_tokens:
            return False
        if j.finish_reason == ABORT:
            if j.cuts > self.most:
                self.count("exhausted")
                return False
            return True
        return probing and j.finish_reason == "length"  # the sidecar's own limit of one token

    def _near_stop(self, j: Joined) -> bool:
        """The text ends in the beginning of a stop string: continue a token at a time, so that
        the sidecar finds one that straddles the cut, and where."""
        return bool(self.plan.stops) and joining.ends_in_stop_prefix(j.text, self.plan.stops)

    def _stopped(self, j: Joined, cut: int) -> bool:
        if not self.plan.stops or len(j.tokens) <= self.plan.min_tokens:
            return False
        hit = joining.straddling_stop(j.text, cut, self.plan.stops)
        if hit is None:
            return False
        j.stop_at(hit[0], hit[1], self.plan.include_stop)
        return True

    async def _hold(self) -> bool:
        """Hold the choice until the engine serves (the lifecycle's rules, the client's own
        deadline); False when the hold is refused: the choice then stays as vLLM cut it."""
        lifecycle, flow = self.lifecycle, self.flow
        try:
            with lifecycle.holds.not_running():  # held, not running: an update may start
                await lifecycle.holds.until_serving(flow.rec, flow.engine.left())
        except PhaseRefusal as refusal:
            log.warning("%s: not continued: %s", flow.rec.path, refusal)
            self.count("refused")
            return False
        return True

    async def send(self, j: Joined, relay: Relay, *, stream: bool, most: int | None) -> Any:
        """One part of the choice sent, `relay` taking vLLM's answer; None when it could not be
        sent (not connected: the choice stays as it was cut)."""
        body = self.plan.part_body(j.prompt, j.tokens, stream=stream, most=most or self.left(j))
        self._sent += 1
        try:
            return await self._send(orjson.dumps(body), f"c{self._sent}", relay)
        except SidecarFailure as failure:  # the client gets the cut answer, as from vLLM alone
            log.warning("%s: a continuation failed: not continued: %s", self.flow.rec.path, failure)
            return None

    async def _part(self, j: Joined, *, most: int | None) -> Json | None:
        """One continuation part, non-streamed: its only choice, or None when vLLM refused it."""
        resp = await self.send(j, self._captured, stream=False, most=most)
        choices = _choices(resp) if resp is not None else []
        if resp is None or resp.status != 200 or not choices:
            if resp is not None:
                log.warning(
                    "%s: a continuation got %d from vLLM: not continued",
                    self.flow.rec.path,
                    resp.status,
                )
            self.count("failed")
            return None
        self.count("continued")
        return choices[0]

    def left(self, j: Joined) -> int:
        return self.plan.max_tokens - len(j.tokens)

    def count(self, outcome: str) -> None:
        self.flow.metrics.continuations.labels(self.flow.rec.route, outcome).inc()

    def counted(self, joined: Iterable[Joined], usage: object) -> None:
        """The continued answer's tokens, each choice joined from its parts: the engine's
        `continued` hook (client/hooks.py), counted by lag there."""
        self.flow.engine.continued(((len(j.tokens), j.spans, j.cuts) for j in joined), usage)


def _choices(resp: web.StreamResponse) -> list[Json]:
    body = resp.body if isinstance(resp, web.Response) else None
    try:
        answer = orjson.loads(body) if isinstance(body, bytes) else None
    except orjson.JSONDecodeError:
        return []
    choices = answer.get("choices") if isinstance(answer, dict) else None
    return [c for c in choices if isinstance(c, dict)] if isinstance(choices, list) else []
