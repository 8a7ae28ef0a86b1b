"""A continued answer that is not streamed: its choices joined, then sent as one answer."""

from __future__ import annotations

import asyncio
from typing import Any

import aiohttp
import orjson
from aiohttp import web

from proxy.core.continuation import ABORT, joining
from proxy.core.continuation.joining import Joined
from proxy.core.headers import drop, response_headers
from proxy.upstream.session import read_capped

from ..flow import Flow
from ..relay import BUFFER_LIMIT
from .parts import Parts

Json = dict[str, Any]
WEIGHT_VERSIONS = "X-Weight-Versions"
CONTINUED = "X-Sidecar-Continued"  # how many parts a phase cut, over all choices


async def read(flow: Flow, resp: aiohttp.ClientResponse, first: bytes) -> Json | bytes | None:
    """vLLM's first answer read whole: the answer to join, or the bytes to relay as they are
    (not the shape of one); None when it is past the memory budget (relayed as it comes)."""
    if not budgeted(flow, resp):
        return None
    body, over = await read_capped(resp, BUFFER_LIMIT)
    body = first + body
    try:
        answer = orjson.loads(body)
    except orjson.JSONDecodeError:
        answer = None
    if over or not isinstance(answer, dict) or not isinstance(answer.get("choices"), list):
        return body
    return answer


async def whole(parts: Parts, resp: aiohttp.ClientResponse, answer: Json) -> web.Response:
    """Each choice a phase cut continued, then the answer with every choice joined."""
    plan, rec = parts.plan, parts.flow.rec
    choices: list[Json] = [c for c in answer["choices"] if isinstance(c, dict)]
    joined = [_joined(parts, c, i, answer) for i, c in enumerate(choices)]
    for j, choice in zip(joined, choices, strict=True):
        j.add(choice, parts.version, plan.text_of(choice), plan.reasoning_of(choice))
    todo = [j for j in joined if j.finish_reason == ABORT and j.prompt and not j.reasoning]
    if todo and parts.phase_cut():
        await asyncio.gather(*(parts.finish(j) for j in todo))
    answer["choices"] = [
        joining.joined_choice(plan, c, j) for c, j in zip(choices, joined, strict=True)
    ]
    if (usage := joining.usage_of(answer.get("usage"), joined)) is not None:
        answer["usage"] = usage
    if not plan.token_ids_asked:
        answer.pop("prompt_token_ids", None)  # chat's: on the answer
    headers = response_headers(resp.headers, rid=rec.request_id)
    drop(headers, ("Content-Length", "Content-Encoding"))
    headers[WEIGHT_VERSIONS] = orjson.dumps([j.spans for j in joined]).decode()
    headers[CONTINUED] = str(sum(j.cuts for j in joined))
    rec.status = 200
    parts.counted(joined, usage)
    return web.Response(body=orjson.dumps(answer), headers=headers)


def _joined(parts: Parts, choice: Json, position: int, answer: Json) -> Joined:
    index = choice.get("index")
    prompt = parts.plan.prompt_of(choice, answer) or []
    return Joined(index if isinstance(index, int) else position, prompt)


async def captured(flow: Flow, resp: aiohttp.ClientResponse, first: bytes) -> web.Response:
    """A part's answer, kept for the joining instead of relayed (within the memory budget:
    past it, the part counts as refused, and the choice stays as it was cut)."""
    if not budgeted(flow, resp):
        return web.Response(status=503)
    body, _ = await read_capped(resp, BUFFER_LIMIT)
    return web.Response(status=resp.status, body=first + body)


def budgeted(flow: Flow, resp: aiohttp.ClientResponse) -> bool:
    length = resp.content_length
    return length is not None and length <= BUFFER_LIMIT and flow.budget.try_hold(length)


def raw(flow: Flow, resp: aiohttp.ClientResponse, body: bytes) -> web.Response:
    """vLLM's answer, read whole, as it sent it."""
    headers = response_headers(resp.headers, rid=flow.rec.request_id)
    drop(headers, ("Content-Length",))
    flow.rec.status = resp.status
    return web.Response(status=resp.status, body=body, headers=headers)
