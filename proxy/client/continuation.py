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
import contextlib
import logging
from collections.abc import Awaitable, Callable
from typing import Any

import aiohttp
import orjson
from aiohttp import web

from proxy.core import continuation as cont
from proxy.core.continuation import ABORT, Joined, Plan
from proxy.core.errors import PhaseRefusal, SidecarFailure
from proxy.core.headers import drop, response_headers
from proxy.core.phase import SERVING
from proxy.core.routes import rule
from proxy.core.sse import is_event_stream
from proxy.engine.gate import ADMISSION
from proxy.engine.lifecycle import LIFECYCLE, Lifecycle
from proxy.observe.metrics import METRICS
from proxy.observe.record import RequestRecord
from proxy.upstream.session import UPSTREAM_ERRORS, classify, read_capped

from .budget import BUDGET
from .failures import sse_error
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
            return await _Stream(self, resp).run(first)
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
        if todo and self._phase_cut():
            await asyncio.gather(*(self._finish(j) for j in todo))
        answer["choices"] = [
            cont.joined_choice(self.plan, c, j) for c, j in zip(choices, joined, strict=True)
        ]
        if (usage := cont.usage_of(answer.get("usage"), joined)) is not None:
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

    def _phase_cut(self) -> bool:
        """An abort a phase made: the engine does not serve, or an abort-mode pause or sleep
        was sent since the request was (an `/abort_requests` while serving is neither)."""
        return self.lifecycle.phase != SERVING or self.lifecycle.cuts != self.cuts_before

    async def _finish(self, j: Joined) -> None:
        """Parts, one after the other, until the choice ends of itself or cannot go on."""
        probing = False
        while self._owed(j, probing):
            if not await self._wait(j):
                return
            probing = self._near_stop(j)
            cut = len(j.text)
            answer = await self._part(j, stream=False, most=1 if probing else None)
            if answer is None:
                return
            plan = self.plan
            j.add(answer, self.lifecycle.version, plan.text_of(answer), plan.reasoning_of(answer))
            if self._stopped(j, cut):
                return

    def _owed(self, j: Joined, probing: bool) -> bool:
        if len(j.tokens) >= self.plan.max_tokens:
            return False
        if j.finish_reason == ABORT:
            if j.cuts > self.most:
                self._count("exhausted")
                return False
            return True
        return probing and j.finish_reason == "length"  # the sidecar's own limit of one token

    def _near_stop(self, j: Joined) -> bool:
        """The text ends in the beginning of a stop string: continue a token at a time, so that
        the sidecar finds one that straddles the cut, and where."""
        return bool(self.plan.stops) and cont.ends_in_stop_prefix(j.text, self.plan.stops)

    def _stopped(self, j: Joined, cut: int) -> bool:
        if not self.plan.stops or len(j.tokens) <= self.plan.min_tokens:
            return False
        hit = cont.straddling_stop(j.text, cut, self.plan.stops)
        if hit is None:
            return False
        j.stop_at(hit[0], hit[1], self.plan.include_stop)
        return True

    async def _wait(self, j: Joined) -> bool:
        """Hold the choice until the engine serves (the lifecycle's rules); False when the hold
        is refused: the choice then stays as vLLM cut it."""
        lifecycle, admission = self.lifecycle, self.request.get(ADMISSION)
        lifecycle.running -= 1  # held, not running: an update may start meanwhile
        try:
            await lifecycle.admit(self.rec, admission.left() if admission is not None else None)
        except PhaseRefusal as refusal:
            log.warning("%s: not continued: %s", self.rec.path, refusal)
            self._count("refused")
            return False
        finally:
            lifecycle.running += 1
        return True

    async def _part(self, j: Joined, *, stream: bool, most: int | None) -> Json | None:
        """One continuation part, non-streamed: its only choice, or None when vLLM refused it."""
        body = self.plan.part_body(j.prompt, j.tokens, stream=stream, most=most or self._left(j))
        self.parts += 1
        try:
            resp = await self.send(orjson.dumps(body), f"c{self.parts}", _captured)
        except SidecarFailure as failure:  # the client gets the cut answer, as from vLLM alone
            log.warning("%s: a continuation failed: not continued: %s", self.rec.path, failure)
            self._count("failed")
            return None
        choices = _choices(resp)
        if resp.status != 200 or not choices:
            log.warning(
                "%s: a continuation got %d from vLLM: not continued", self.rec.path, resp.status
            )
            self._count("failed")
            return None
        self._count("continued")
        return choices[0]

    def _left(self, j: Joined) -> int:
        return self.plan.max_tokens - len(j.tokens)

    def _count(self, outcome: str) -> None:
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


class _Stream:
    """A streamed answer, relayed event by event; the events of a cut are kept back and the
    choice goes on in a continuation's events, under its own index and the first part's id."""

    def __init__(self, owner: Continuing, resp: aiohttp.ClientResponse) -> None:
        self.owner, self.resp, self.plan = owner, resp, owner.plan
        headers = response_headers(resp.headers, rid=owner.rec.request_id)
        drop(headers, ("Content-Length",))
        self.out = web.StreamResponse(status=resp.status, headers=headers)
        self.joined: dict[int, Joined] = {}
        self.sent: dict[int, tuple[int, int]] = {}  # what the client has: characters, tokens
        self.ended: set[int] = set()  # choices whose finishing event went out
        self.starts: dict[int, int] = {}  # where each choice's part in flight began, in tokens
        self.usage: Json | None = None  # the first part's usage event, counted again at the end
        self.head: Json = {}  # the first part's id, created, model: every event carries them
        self.gone = False

    async def run(self, first: bytes) -> web.StreamResponse:
        owner = self.owner
        owner.rec.status = self.resp.status
        await self._write(b"", prepare=True)
        if (failure := await self._pump(self.resp, first, None)) is not None:
            return await self._failed(failure)
        for index in range(self.plan.choices()):  # vLLM 0.32 sends no event for a 0-token abort
            if index not in self.joined and (prompt := self.plan.token_prompt(index)):
                self.joined[index] = Joined(index, prompt)
        todo = sorted(
            (j for j in self.joined.values() if j.finish_reason in (ABORT, None)),
            key=lambda j: j.index,
        )
        cut = bool(todo) and owner._phase_cut()
        for j in todo:
            if j.finish_reason is None:  # no event ended it: cut before its first token
                j.finish_reason, j.cuts = ABORT, j.cuts + 1
            if cut and j.prompt and not j.reasoning:
                try:
                    await self._finish(j)
                except _Broken as broken:
                    return await self._failed(broken.failure)
            if j.index not in self.ended:  # as it ended: cut, or a probe's stop or length
                await self._flush(j, j.finish_reason)
        if self.usage is not None:
            usage = cont.usage_of(self.usage.get("usage"), list(self.joined.values()))
            await self._event({**self.usage, "usage": usage})
        await self._write(b"data: [DONE]\n\n")
        if not self.gone:
            with contextlib.suppress(ConnectionError):
                await self.out.write_eof()
        return self.out

    async def _finish(self, j: Joined) -> None:
        """Parts until the choice ends of itself or cannot go on: a token at a time (not
        streamed) while a stop string may straddle the cut, then streamed."""
        owner = self.owner
        probing = False
        while not self.gone and owner._owed(j, probing):
            if not await owner._wait(j):
                return
            probing = owner._near_stop(j)
            if probing:
                cut = len(j.text)
                answer = await owner._part(j, stream=False, most=1)
                if answer is None:
                    return
                j.add(answer, owner.lifecycle.version, self.plan.text_of(answer))
                if owner._stopped(j, cut):
                    return
                continue
            await self._flush(j)  # what vLLM kept back for its stop check, and any probe's
            body = self.plan.part_body(j.prompt, j.tokens, stream=True, most=owner._left(j))
            owner.parts += 1
            self.starts[j.index] = len(j.tokens)
            relay = self._relayed(j, owner.lifecycle.version)
            try:
                resp = await owner.send(orjson.dumps(body), f"c{owner.parts}", relay)
            except SidecarFailure as failure:  # not connected: the choice stays as it was cut
                log.warning("%s: a continuation failed: %s", owner.rec.path, failure)
                owner._count("failed")
                return
            if resp.status != 200:
                log.warning("%s: a continuation got %d: not continued", owner.rec.path, resp.status)
                owner._count("failed")
                return
            owner._count("continued")

    def _relayed(self, j: Joined, version: str | None) -> Relay:
        async def relay(
            request: web.Request, rec: RequestRecord, resp: aiohttp.ClientResponse, first: bytes
        ) -> web.Response:
            if resp.status != 200 or not is_event_stream(resp.headers.get("Content-Type")):
                await resp.read()
                return web.Response(status=resp.status if resp.status != 200 else 502)
            if (failure := await self._pump(resp, first, (j, version))) is not None:
                raise _Broken(failure)  # not an upstream error: it passes the exchange as it is
            return web.Response()

        return relay

    async def _pump(
        self, resp: aiohttp.ClientResponse, first: bytes, part: tuple[Joined, str | None] | None
    ) -> SidecarFailure | None:
        """Relay one part's events, until it ends (None) or breaks off (the failure); `part`:
        the continued choice and its version (None: the first part, all the client's)."""
        buffer = first
        chunks = resp.content.iter_any().__aiter__()
        while not self.gone:
            end = buffer.find(b"\n\n")
            if end < 0:
                try:
                    buffer += await anext(chunks)
                except StopAsyncIteration:
                    return None
                except UPSTREAM_ERRORS as exc:
                    where = f"while streaming {self.owner.rec.method} {self.owner.rec.path}"
                    return classify(exc, where=where)
                continue
            event, buffer = buffer[: end + 2], buffer[end + 2 :]
            await self._on_event(event, part)
        return None

    async def _failed(self, failure: SidecarFailure) -> web.StreamResponse:
        """vLLM's stream broke off: one SSE error event and [DONE], as the relay ends one."""
        owner = self.owner
        owner.rec.fail_with(owner.metrics, failure)
        await self._write(b"\n\n" + sse_error(owner.rec, failure, None))
        if not self.gone:
            with contextlib.suppress(ConnectionError):
                await self.out.write_eof()
        return self.out

    async def _on_event(self, event: bytes, part: tuple[Joined, str | None] | None) -> None:
        data = event.strip()
        if not data.startswith(b"data:"):
            await self._write(event)  # a comment, or the sidecar's own events
            return
        data = data[5:].strip()
        if data == b"[DONE]":
            return  # the sidecar ends the stream itself, once every choice is done
        try:
            chunk = orjson.loads(data)
        except orjson.JSONDecodeError:
            chunk = None
        if not isinstance(chunk, dict) or not isinstance(chunk.get("choices"), list):
            await self._write(event)  # an in-band error: relayed as it is
            return
        if not chunk["choices"] and "usage" in chunk:
            if part is None:
                self.usage = chunk
            return
        if part is None and not self.head:
            self.head = {k: chunk[k] for k in _HEAD if k in chunk}
        relayed = [
            c
            for choice in chunk["choices"]
            if (c := self._relayed_choice(choice, part, chunk)) is not None
        ]
        if part is not None or not self.plan.token_ids_asked:
            chunk.pop(
                "prompt_token_ids", None
            )  # chat's, on a first event; a part's: not the client's
        if relayed:
            await self._event({**chunk, **self.head, "choices": relayed})

    def _relayed_choice(
        self, choice: object, part: tuple[Joined, str | None] | None, chunk: Json
    ) -> Json | None:
        """A choice's event joined, and as the client gets it; None: kept back (a cut, or a
        chat continuation's opening role event)."""
        if not isinstance(choice, dict):
            return None
        j = self._choice(choice, chunk) if part is None else part[0]
        version = self.owner.version if part is None else part[1]
        tokens = choice.get("token_ids") or []
        text = self.plan.text_of(choice)
        if part is not None and _role_only(choice, text, tokens):
            return None
        for key, value in self.plan.reasoning_of(choice).items():  # not joinable: not continued
            j.reasoning[key] = j.reasoning.get(key, "") + value
        j.add_tokens(tokens, text, choice.get("logprobs"))
        spans = choice.get("weight_versions")
        if isinstance(spans, list) and spans:  # the part's last event: vLLM's, over all of it
            j.part_spans(self.starts.get(j.index, 0), spans)
        else:
            j.add_spans(None, len(tokens), version)
        finish = choice.get("finish_reason")
        if finish is not None:
            j.finish(choice)
        if finish == ABORT:
            return None
        self.sent[j.index] = (len(j.text), len(j.tokens))
        out = cont.stripped(self.plan, {**choice, "index": j.index})
        if part is not None and self.plan.kind == cont.CHAT:  # a /v1/completions part's event
            out = self.plan.with_text(_without(out, "text"), text, stream=True)
        if finish is not None:
            self.ended.add(j.index)
            if self._spans_shown():
                out["weight_versions"] = j.spans
        return out

    def _choice(self, choice: Json, chunk: Json) -> Joined:
        index = choice.get("index")
        index = index if isinstance(index, int) else 0
        j = self.joined.get(index)
        if j is None:
            j = self.joined[index] = Joined(index, self.plan.prompt_of(choice, chunk) or [])
        elif not j.prompt and (prompt := self.plan.prompt_of(choice, chunk)):
            j.prompt = prompt
        return j

    def _spans_shown(self) -> bool:
        return self.plan.versions_asked or self.plan.kind == cont.GENERATE

    async def _flush(self, j: Joined, finish: str | None = None) -> None:
        """One event with what the client does not have of the choice yet, and its end."""
        chars, count = self.sent.get(j.index, (0, 0))
        text, tokens = j.text[chars:], j.tokens[count:]
        if not text and not tokens and finish is None:
            return
        self.sent[j.index] = (max(chars, len(j.text)), len(j.tokens))
        choice = self.plan.with_text({"index": j.index, "finish_reason": finish}, text, stream=True)
        if self.plan.kind == cont.GENERATE or self.plan.token_ids_asked:
            choice["token_ids"] = tokens
        if finish is not None:
            self.ended.add(j.index)
            choice["stop_reason"] = j.stop_reason
            if self._spans_shown():
                choice["weight_versions"] = j.spans
        await self._event({**self.head, "choices": [choice]})

    async def _event(self, chunk: Json) -> None:
        await self._write(b"data: " + orjson.dumps(chunk) + b"\n\n")

    async def _write(self, data: bytes, *, prepare: bool = False) -> None:
        if self.gone:
            return
        try:
            if prepare:
                await self.out.prepare(self.owner.request)
            elif data:
                await self.out.write(data)
        except ConnectionError:
            self.gone = True
            self.owner.rec.client_left(self.owner.metrics)


_HEAD = ("id", "object", "created", "model", "request_id")


def _without(choice: Json, key: str) -> Json:
    return {k: v for k, v in choice.items() if k != key}


def _role_only(choice: Json, text: str, tokens: list[int]) -> bool:
    """A chat stream's opening event (`delta: {"role": "assistant", "content": ""}`): a
    continuation's is not the client's, which had one already."""
    delta = choice.get("delta")
    return isinstance(delta, dict) and "role" in delta and not text and not tokens


class _Broken(Exception):
    """A continuation's stream broke off after its events began to reach the client."""

    def __init__(self, failure: SidecarFailure) -> None:
        super().__init__(failure)
        self.failure = failure
