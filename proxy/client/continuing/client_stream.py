"""A continued stream's side toward the client: what it has of each choice, the events still
owed it, and whether it is still there."""

from __future__ import annotations

from typing import Any

import aiohttp
import orjson
from aiohttp import web

from proxy.core import continuation as cont
from proxy.core.continuation import Plan
from proxy.core.continuation.joining import Joined
from proxy.core.headers import drop, response_headers

from ..flow import Flow

Json = dict[str, Any]


class ClientStream:
    """The client's stream of a continued answer (its events written once, in order)."""

    def __init__(self, flow: Flow, resp: aiohttp.ClientResponse, plan: Plan) -> None:
        self.flow, self.plan = flow, plan
        headers = response_headers(resp.headers, rid=flow.rec.request_id)
        drop(headers, ("Content-Length",))
        self.out = web.StreamResponse(status=resp.status, headers=headers)
        self.sent: dict[int, tuple[int, int]] = {}  # what the client has: characters, tokens
        self.ended: set[int] = set()  # choices whose finishing event went out
        self.head: Json = {}  # the first part's id, created, model: every event carries them
        self.gone = False

    def spans_shown(self) -> bool:
        return self.plan.versions_asked or self.plan.kind == cont.GENERATE

    async def flush(self, j: Joined, finish: str | None = None) -> None:
        """One event with what the client does not have of the choice yet, and its end."""
        plan = self.plan
        chars, count = self.sent.get(j.index, (0, 0))
        text, tokens = j.text[chars:], j.tokens[count:]
        if not text and not tokens and finish is None:
            return
        self.sent[j.index] = (max(chars, len(j.text)), len(j.tokens))
        choice = plan.with_text({"index": j.index, "finish_reason": finish}, text, stream=True)
        if plan.kind == cont.GENERATE or plan.token_ids_asked:
            choice["token_ids"] = tokens
        if finish is not None:
            self.ended.add(j.index)
            choice["stop_reason"] = j.stop_reason
            if self.spans_shown():
                choice["weight_versions"] = j.spans
        await self.event({**self.head, "choices": [choice]})

    async def event(self, chunk: Json) -> None:
        await self.write(b"data: " + orjson.dumps(chunk) + b"\n\n")

    async def prepare(self) -> None:
        try:
            await self.out.prepare(self.flow.request)
        except ConnectionError:
            self._left()

    async def write(self, data: bytes) -> None:
        if not data or self.gone:
            return
        try:
            await self.out.write(data)
        except ConnectionError:
            self._left()

    def _left(self) -> None:
        self.gone = True
        self.flow.rec.client_left(self.flow.metrics)
