"""A continued answer that streams: relayed event by event; the events of a cut are kept back,
and the choice goes on in a continuation's events, under its own index and the first part's id
(parts.py decides when, and sends them)."""

from __future__ import annotations

import contextlib
from typing import Any

import aiohttp
import orjson
from aiohttp import web

from proxy.core import continuation as cont
from proxy.core.continuation import ABORT, joining
from proxy.core.continuation.joining import Joined
from proxy.core.errors import SidecarFailure
from proxy.core.sse import is_event_stream
from proxy.upstream.session import UPSTREAM_ERRORS, classify

from ..failures import sse_error
from ..flow import Flow, Relay
from .client_stream import ClientStream
from .parts import Parts

Json = dict[str, Any]


class Streamed:
    """A streamed answer, relayed event by event; the events of a cut are kept back and the
    choice goes on in a continuation's events, under its own index and the first part's id."""

    def __init__(self, parts: Parts, resp: aiohttp.ClientResponse) -> None:
        self.parts, self.flow, self.resp, self.plan = parts, parts.flow, resp, parts.plan
        self.client = ClientStream(parts.flow, resp, parts.plan)
        self.joined: dict[int, Joined] = {}
        self.starts: dict[int, int] = {}  # where each choice's part in flight began, in tokens
        self.usage: Json | None = None  # the first part's usage event, counted again at the end

    async def run(self, first: bytes) -> web.StreamResponse:
        parts = self.parts
        self.flow.rec.status = self.resp.status
        await self.client.prepare()
        if (failure := await self._pump(self.resp, first, None)) is not None:
            return await self._failed(failure)
        for index in range(self.plan.choices()):  # vLLM 0.32 sends no event for a 0-token abort
            if index not in self.joined and (prompt := self.plan.token_prompt(index)):
                self.joined[index] = Joined(index, prompt)
        todo = sorted(
            (j for j in self.joined.values() if j.finish_reason in (ABORT, None)),
            key=lambda j: j.index,
        )
        cut = bool(todo) and parts.phase_cut()
        for j in todo:
            if j.finish_reason is None:  # no event ended it: cut before its first token
                j.finish_reason, j.cuts = ABORT, j.cuts + 1
            if cut and j.prompt and not j.reasoning:
                try:
                    await parts.finish(j, self._part)
                except _Broken as broken:
                    return await self._failed(broken.failure)
            if j.index not in self.client.ended:  # as it ended: cut, or a probe's stop or length
                await self.client.flush(j, j.finish_reason)
        usage = None
        if self.usage is not None:
            usage = joining.usage_of(self.usage.get("usage"), list(self.joined.values()))
            await self.client.event({**self.usage, "usage": usage})
        self._generated(usage)
        await self.client.write(b"data: [DONE]\n\n")
        if not self.client.gone:
            with contextlib.suppress(ConnectionError):
                await self.client.out.write_eof()
        return self.client.out

    async def _part(self, j: Joined) -> bool:
        """One streamed part of the choice, its events relayed as they come; False when it
        could not be sent (the choice stays as it was cut)."""
        parts = self.parts
        if self.client.gone:
            return False
        await self.client.flush(j)  # what vLLM kept back for its stop check, and any probe's
        self.starts[j.index] = len(j.tokens)
        relay = self._relayed(j, parts.now)
        resp = await parts.send(j, relay, stream=True, most=parts.left(j))
        if resp is None or resp.status != 200:
            parts.count("failed")
            return False
        parts.count("continued")
        return not self.client.gone

    def _relayed(self, j: Joined, version: str | None) -> Relay:
        async def relay(flow: Flow, resp: aiohttp.ClientResponse, first: bytes) -> web.Response:
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
        while not self.client.gone:
            end = buffer.find(b"\n\n")
            if end < 0:
                try:
                    buffer += await anext(chunks)
                except StopAsyncIteration:
                    return None
                except UPSTREAM_ERRORS as exc:
                    where = f"while streaming {self.flow.rec.method} {self.flow.rec.path}"
                    return classify(exc, where=where)
                continue
            event, buffer = buffer[: end + 2], buffer[end + 2 :]
            await self._on_event(event, part)
        return None

    async def _failed(self, failure: SidecarFailure) -> web.StreamResponse:
        """vLLM's stream broke off: one SSE error event and [DONE], as the relay ends one."""
        flow = self.flow
        flow.rec.fail_with(flow.metrics, failure)
        self._generated(None)
        await self.client.write(b"\n\n" + sse_error(flow, failure, None))
        if not self.client.gone:
            with contextlib.suppress(ConnectionError):
                await self.client.out.write_eof()
        return self.client.out

    def _generated(self, usage: object) -> None:
        """Its tokens, counted by lag (engine/tally.py), before the client's [DONE]."""
        self.parts.counted(self.joined.values(), usage)

    async def _on_event(self, event: bytes, part: tuple[Joined, str | None] | None) -> None:
        data = event.strip()
        if not data.startswith(b"data:"):
            await self.client.write(event)  # a comment, or the sidecar's own events
            return
        data = data[5:].strip()
        if data == b"[DONE]":
            return  # the sidecar ends the stream itself, once every choice is done
        try:
            chunk = orjson.loads(data)
        except orjson.JSONDecodeError:
            chunk = None
        if not isinstance(chunk, dict) or not isinstance(chunk.get("choices"), list):
            await self.client.write(event)  # an in-band error: relayed as it is
            return
        if not chunk["choices"] and "usage" in chunk:
            if part is None:
                self.usage = chunk
            return
        if part is None and not self.client.head:
            self.client.head = {k: chunk[k] for k in _HEAD if k in chunk}
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
            await self.client.event({**chunk, **self.client.head, "choices": relayed})

    def _relayed_choice(
        self, choice: object, part: tuple[Joined, str | None] | None, chunk: Json
    ) -> Json | None:
        """A choice's event joined, and as the client gets it; None: kept back (a cut, or a
        chat continuation's opening role event)."""
        if not isinstance(choice, dict):
            return None
        j = self._choice(choice, chunk) if part is None else part[0]
        version = self.parts.version if part is None else part[1]
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
        self.client.sent[j.index] = (len(j.text), len(j.tokens))
        out = joining.stripped(self.plan, {**choice, "index": j.index})
        if part is not None and self.plan.kind == cont.CHAT:  # a /v1/completions part's event
            out = self.plan.with_text(_without(out, "text"), text, stream=True)
        if finish is not None:
            self.client.ended.add(j.index)
            if self.client.spans_shown():
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
