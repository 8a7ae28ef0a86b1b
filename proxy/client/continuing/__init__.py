"""Continuation: a generation a pause or sleep cut short is finished, and joined into one answer.

Opt-in (`--continue-aborted`, or `X-Sidecar-Continue: on|off` per request) on /v1/completions,
/inference/v1/generate and /v1/chat/completions (continued on /v1/completions from the token
ids, docs/continuation.md). When vLLM ends a choice with `finish_reason: "abort"` because of a
phase the sidecar saw (an abort-mode pause or sleep; an `/abort_requests` someone sent while
serving is relayed as it is), the choice is held until the engine serves, then sent again from
its exact tokens (core/continuation/) and joined. Each choice says which weights made which
tokens (`weight_versions` spans, as vLLM 0.33's `return_weight_versions`), and a non-streamed
answer's `X-Weight-Versions` header says it too.

- `parts`: the plan's side, the one surface both answers use: holds, parts sent, outcomes.
- `whole`: an answer read whole, its choices joined, sent as one.
- `streamed`: a stream relayed event by event; a cut's events kept back, the continuation's
  relayed under the first part's index and id.

Bounded: at most --continue-max parts a phase cut per choice; a hold follows the lifecycle's
rules; a client that leaves cancels all of it (and vLLM's generation with it). What cannot be
continued is relayed as vLLM answered it: never worse than vLLM alone.
"""

from __future__ import annotations

import aiohttp
import orjson
from aiohttp import web

from proxy.core import continuation as cont
from proxy.core.continuation import Plan
from proxy.core.sse import is_event_stream

from ..flow import Flow
from . import whole
from .parts import Parts, Send
from .streamed import Streamed

CONTINUE = "X-Sidecar-Continue"
_ON, _OFF = ("on", "1", "true", "yes"), ("off", "0", "false", "no")

__all__ = ["CONTINUE", "Continuing", "Send", "wanted"]


def wanted(flow: Flow) -> Plan | None:
    """The continuation plan of the flow, or None: off, not a continuable route, or a body
    that cannot be continued exactly."""
    kind, request, body = flow.rec.row.continues, flow.request, flow.body
    if kind is None or request.method != "POST" or not isinstance(body, bytes):
        return None
    asked = request.headers.get(CONTINUE, "").strip().lower()
    if asked not in _ON and (asked in _OFF or not flow.options.continue_aborted):
        return None
    try:
        payload = orjson.loads(body)
    except orjson.JSONDecodeError:
        return None
    return cont.plan(kind, payload)


class Continuing:
    """One continuable request: its first body, and vLLM's first answer continued."""

    def __init__(self, flow: Flow, plan: Plan, send: Send) -> None:
        self.parts = Parts(flow, plan, send, whole.captured)

    def first_body(self) -> bytes:
        return orjson.dumps(self.parts.plan.first_body())

    async def relay(self, resp: aiohttp.ClientResponse, first: bytes) -> web.StreamResponse | None:
        """vLLM's first answer, continued where a phase cut it; None: relay it as usual."""
        if resp.status != 200:
            return None
        if is_event_stream(resp.headers.get("Content-Type")):
            return await Streamed(self.parts, resp).run(first)
        flow = self.parts.flow
        answer = await whole.read(flow, resp, first)
        if answer is None:
            return None  # read whole only within the memory budget; else relayed as it comes
        if isinstance(answer, bytes):
            return whole.raw(flow, resp, answer)
        return await whole.whole(self.parts, resp, answer)
