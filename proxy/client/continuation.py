"""Continuation: a generation a pause or sleep cut short is finished, and joined into one answer.

Opt-in (`--continue-aborted`, or `X-Sidecar-Continue: on|off` per request) on /v1/completions,
/inference/v1/generate and /v1/chat/completions (continued on /v1/completions from the token
ids, docs/continuation.md). When vLLM ends a choice with `finish_reason: "abort"` because of a
phase the sidecar saw (an abort-mode pause or sleep; an `/abort_requests` someone sent while
serving is relayed as it is), the choice is held until the engine serves, then sent again from
its exact tokens (core/continuation.py) and joined. A streamed answer just goes on: the cut's
events are kept back, the continuation's are relayed under the first part's index and id.
Each choice says which weights made which tokens (`weight_versions` spans, as vLLM 0.33's
`return_weight_versions`), and the answer's `X-Weight-Versions` header says it for non-streams.

Bounded: at most --continue-max parts a phase cut per choice; a hold follows the lifecycle's
rules; a client that leaves cancels all of it (and vLLM's generation with it). What cannot be
continued is relayed as vLLM answered it: never worse than vLLM alone.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Any

import aiohttp
import orjson
from aiohttp import web

from proxy.core import continuation as cont
from proxy.core import joining
from proxy.core.continuation import ABORT, Plan
from proxy.core.errors import PhaseRefusal, SidecarFailure
from proxy.core.headers import drop, response_headers
from proxy.core.joining import Joined
from proxy.core.phase import SERVING
from proxy.core.routes import rule
from proxy.core.sse import is_event_stream
from proxy.engine.gate import ADMISSION
from proxy.engine.lifecycle import LIFECYCLE, Lifecycle
from proxy.observe.metrics import METRICS
from proxy.observe.record import RequestRecord
from proxy.upstream.session import read_capped

from .budget import BUDGET
from .continued_stream import Streamed
from .options import OPTIONS
from .relay import BUFFER_LIMIT

log = logging.getLogger("proxy.continuation")

CONTINUE = "X-Sidecar-Continue"
WEIGHT_VERSIONS = "X-Weight-Versions"
CONTINUED = "X-Sidecar-Continued"  # how many parts a phase cut, over all choices
_ON, _OFF = ("on", "1", "true", "yes"), ("off", "0", "false", "no")

Json = dict[str, Any]
# One upstream call of a part: the body, and what to do with vLLM's answer (exchange.py).
Send = Callable[[bytes, str, "Relay"], Awaitable[web.StreamResponse]]
Relay = Callable[[web.Request, RequestRecord, aiohttp.ClientResponse, bytes], Awaitable[Any]]


def wanted(request: web.Request, rec: RequestRecord, body: object) -> Plan | None:
    """The continuation plan of a request, or None: off, not a continuable route, or a body
    that cannot be continued exactly."""
    kind = rule(rec.route).continues
    if kind is None or request.method != "POST" or not isinstance(body, bytes):
        return None
    asked = request.headers.get(CONTINUE, "").strip().lower()
    if asked not in _ON and (asked in _OFF or not request.app[OPTIONS].continue_aborted):
        return None
    try:
        payload = orjson.loads(body)
    except orjson.JSONDecodeError:
        return None
    return cont.plan(kind, payload)


class Continuing:
    """One continuable request: its plan, its choices joined so far, and how to send a part."""

    def __init__(self, request: web.Request, rec: RequestRecord, plan: Plan, send: Send) -> None:
        self.request, self.rec, self.plan, self.send = request, rec, plan, send
        app = request.app
        self.lifecycle: Lifecycle = app[LIFECYCLE]
        self.most = app[OPTIONS].continue_max
        self.metrics = app[METRICS]
        admission = request.get(ADMISSION)
        self.version = admission.version if admission is not None else self.lifecycle.version
        self.cuts_before = self.lifecycle.cuts
        self.parts = 0

    def first_body(self) -> bytes:
        return orjson.dumps(self.plan.first_body())

    async def relay(
        self, request: web.Request, rec: RequestRecord, resp: aiohttp.ClientResponse, first: bytes
    ) -> web.StreamResponse | None:
        """vLLM's first answer, continued where a phase cut it; None: relay it as usual."""
        if resp.status != 200:
            return None
        if is_event_stream(resp.headers.get("Content-Type")):
            return await Streamed(self, resp).run(first)
        if not _budgeted(request, resp):
            return None  # read whole only within the memory budget; else relayed as it comes
        body, over = await read_capped(resp, BUFFER_LIMIT)
        body = first + body
        try:
            answer = orjson.loads(body)
        except orjson.JSONDecodeError:
            answer = None
        if over or not isinstance(answer, dict) or not isinstance(answer.get("choices"), list):
            return _raw(rec, resp, body)
        return await self._whole(resp, answer)

    # -- a non-streamed answer ----------------------------------------------------------------
    async def _whole(self, resp: aiohttp.ClientResponse, answer: Json) -> web.Response:
        choices: list[Json] = [c for c in answer["choices"] if isinstance(c, dict)]
        joined = [self._joined(c, i, answer) for i, c in enumerate(choices)]
        for j, choice in zip(joined, choices, strict=True):
            j.add(choice, self.version, self.plan.text_of(choice), self.plan.reasoning_of(choice))
        todo = [j for j in joined if j.finish_reason == ABORT and j.prompt and not j.reasoning]
        if todo and self.phase_cut():
            await asyncio.gather(*(self.finish(j) for j in todo))
        answer["choices"] = [
            joining.joined_choice(self.plan, c, j) for c, j in zip(choices, joined, strict=True)
        ]
        if (usage := joining.usage_of(answer.get("usage"), joined)) is not None:
            answer["usage"] = usage
        if not self.plan.token_ids_asked:
            answer.pop("prompt_token_ids", None)  # chat's: on the answer
        headers = response_headers(resp.headers, rid=self.rec.request_id)
        drop(headers, ("Content-Length", "Content-Encoding"))
        headers[WEIGHT_VERSIONS] = orjson.dumps([j.spans for j in joined]).decode()
        headers[CONTINUED] = str(sum(j.cuts for j in joined))
        self.rec.status = 200
        return web.Response(body=orjson.dumps(answer), headers=headers)

    def _joined(self, choice: Json, position: int, answer: Json) -> Joined:
        index = choice.get("index")
        prompt = self.plan.prompt_of(choice, answer) or []
        return Joined(index if isinstance(index, int) else position, prompt)

    def phase_cut(self) -> bool:
        """An abort a phase made: the engine does not serve, or an abort-mode pause or sleep
        was sent since the request was (an `/abort_requests` while serving is neither)."""
        return self.lifecycle.phase != SERVING or self.lifecycle.cuts != self.cuts_before

    async def finish(
        self, j: Joined, streamed: Callable[[Joined], Awaitable[bool]] | None = None
    ) -> None:
        """Parts, one after the other, until the choice ends of itself or cannot go on: a token
        at a time (not streamed) while a stop string may straddle the cut, the rest in one part
        here or, for a stream, by `streamed` (False: it could not go on)."""
        probing = False
        while self.owed(j, probing):
            if not await self.hold(j):
                return
            probing = self.near_stop(j)
            if streamed is not None and not probing:
                if not await streamed(j):
                    return
                continue
            cut = len(j.text)
            answer = await self.part(j, stream=False, most=1 if probing else None)
            if answer is None:
                return
            plan = self.plan
            j.add(answer, self.lifecycle.version, plan.text_of(answer), plan.reasoning_of(answer))
            if self.stopped(j, cut):
                return

    def owed(self, j: Joined, probing: bool) -> bool:
        if len(j.tokens) >= self.plan.max_tokens:
            return False
        if j.finish_reason == ABORT:
            if j.cuts > self.most:
                self.count("exhausted")
                return False
            return True
        return probing and j.finish_reason == "length"  # the sidecar's own limit of one token

    def near_stop(self, j: Joined) -> bool:
        """The text ends in the beginning of a stop string: continue a token at a time, so that
        the sidecar finds one that straddles the cut, and where."""
        return bool(self.plan.stops) and joining.ends_in_stop_prefix(j.text, self.plan.stops)

    def stopped(self, j: Joined, cut: int) -> bool:
        if not self.plan.stops or len(j.tokens) <= self.plan.min_tokens:
            return False
        hit = joining.straddling_stop(j.text, cut, self.plan.stops)
        if hit is None:
            return False
        j.stop_at(hit[0], hit[1], self.plan.include_stop)
        return True

    async def hold(self, j: Joined) -> bool:
        """Hold the choice until the engine serves (the lifecycle's rules); False when the hold
        is refused: the choice then stays as vLLM cut it."""
        lifecycle, admission = self.lifecycle, self.request.get(ADMISSION)
        lifecycle.running -= 1  # held, not running: an update may start meanwhile
        try:
            await lifecycle.admit(self.rec, admission.left() if admission is not None else None)
        except PhaseRefusal as refusal:
            log.warning("%s: not continued: %s", self.rec.path, refusal)
            self.count("refused")
            return False
        finally:
            lifecycle.running += 1
        return True

    async def part(self, j: Joined, *, stream: bool, most: int | None) -> Json | None:
        """One continuation part, non-streamed: its only choice, or None when vLLM refused it."""
        body = self.plan.part_body(j.prompt, j.tokens, stream=stream, most=most or self.left(j))
        self.parts += 1
        try:
            resp = await self.send(orjson.dumps(body), f"c{self.parts}", _captured)
        except SidecarFailure as failure:  # the client gets the cut answer, as from vLLM alone
            log.warning("%s: a continuation failed: not continued: %s", self.rec.path, failure)
            self.count("failed")
            return None
        choices = _choices(resp)
        if resp.status != 200 or not choices:
            log.warning(
                "%s: a continuation got %d from vLLM: not continued", self.rec.path, resp.status
            )
            self.count("failed")
            return None
        self.count("continued")
        return choices[0]

    def left(self, j: Joined) -> int:
        return self.plan.max_tokens - len(j.tokens)

    def count(self, outcome: str) -> None:
        self.metrics.continuations.labels(self.rec.route, outcome).inc()


async def _captured(
    request: web.Request, rec: RequestRecord, resp: aiohttp.ClientResponse, first: bytes
) -> web.Response:
    """A part's answer, kept for the joining instead of relayed (within the memory budget:
    past it, the part counts as refused, and the choice stays as it was cut)."""
    if not _budgeted(request, resp):
        return web.Response(status=503)
    body, _ = await read_capped(resp, BUFFER_LIMIT)
    return web.Response(status=resp.status, body=first + body)


def _budgeted(request: web.Request, resp: aiohttp.ClientResponse) -> bool:
    length = resp.content_length
    return length is not None and length <= BUFFER_LIMIT and request.app[BUDGET].try_hold(length)


def _choices(resp: web.StreamResponse) -> list[Json]:
    body = resp.body if isinstance(resp, web.Response) else None
    try:
        answer = orjson.loads(body) if isinstance(body, bytes) else None
    except orjson.JSONDecodeError:
        return []
    choices = answer.get("choices") if isinstance(answer, dict) else None
    return [c for c in choices if isinstance(c, dict)] if isinstance(choices, list) else []


def _raw(rec: RequestRecord, resp: aiohttp.ClientResponse, body: bytes) -> web.Response:
    headers = response_headers(resp.headers, rid=rec.request_id)
    drop(headers, ("Content-Length",))
    rec.status = resp.status
    return web.Response(status=resp.status, body=body, headers=headers)
