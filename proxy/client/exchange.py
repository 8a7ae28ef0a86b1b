"""One request's exchange with vLLM: sent (again, where it provably did not run: resend.py),
relayed back the way its answer needs. /health is answered within a bound whatever vLLM is busy
with.
"""

from __future__ import annotations

import asyncio
import time
from typing import cast

import aiohttp
from aiohttp import web
from multidict import CIMultiDict

from proxy.core import headers as hdrs
from proxy.core.continuation import PART_PATH, Plan
from proxy.core.errors import UpstreamInvalidResponse, UpstreamTimeout
from proxy.core.sse import is_event_stream
from proxy.upstream.session import UPSTREAM_ERRORS, read_capped, target

from . import continuing
from .failures import error_reply
from .flow import Body, Flow, Relay, StreamedBody
from .hooks import HOOKS, NO_HOOKS
from .peek import paused_rejection
from .relay import (
    BUFFER_LIMIT,
    buffered_reply,
    checked_json_reply,
    chunked_json_read,
    stream_reply,
    unframed_json,
)
from .resend import ONCE, RESENT, Allowed, Rejected, Resends, not_sent_again


def origin_form(flow: Flow) -> str:
    """The raw path and query to forward; an absolute-form target (RFC 9112 section 3.2.2,
    `GET http://host/path`) keeps only those: the request still goes to the upstream."""
    request = flow.request
    raw = request.raw_path
    return raw if raw.startswith("/") else request.rel_url.raw_path_qs


def head(flow: Flow) -> None:
    """The engine's `head` hook: the flow's handle set on it and judged now (it may refuse the
    request), and kept on the request for `prepared`. Not the flow itself: the flow holds the
    request, and a cycle through it would leave every request to the cyclic collector."""
    try:
        flow.addon.head(flow)
    finally:
        flow.request[HOOKS] = flow.engine


def prepared(request: web.Request, response: web.StreamResponse) -> None:
    """The response-prepare signal (wiring/app.py): the engine's `prepared` hook, which stamps
    the answer's headers (a phase's, the weight version's)."""
    request.get(HOOKS, NO_HOOKS).prepared(response)


async def call_upstream(flow: Flow) -> web.StreamResponse:
    """The flow's body (read: client/inbound.py) sent upstream, and the answer relayed."""
    headers = _upstream_headers(flow)
    body = flow.body
    if isinstance(body, bytes) and (named := flow.engine.body(body)) is not None:
        flow.body = body = named
        headers["Content-Type"] = "application/json"
    if flow.rec.row.own_health and flow.request.method in ("GET", "HEAD"):
        return await _health(flow, headers)
    if (plan := continuing.wanted(flow)) is not None:
        return await _continuing(flow, plan, headers)
    return await _exchange(flow, body, headers)


async def _continuing(flow: Flow, plan: Plan, headers: CIMultiDict[str]) -> web.StreamResponse:
    """A continuable request (client/continuing/): its parts go through the same exchange,
    each with a request id of its own (vLLM refuses a duplicate while parts run at once)."""

    async def send(body: bytes, part: str, relay: Relay) -> web.StreamResponse:
        own = CIMultiDict(headers)
        own[hdrs.REQUEST_ID] = f"{flow.rec.request_id}-{part}"
        return await _exchange(flow, body, own, relay, PART_PATH.get(plan.kind))

    parts = continuing.Continuing(flow, plan, send)

    async def first(flow: Flow, resp: aiohttp.ClientResponse, head: bytes) -> web.StreamResponse:
        answer = await parts.relay(resp, head)
        return answer if answer is not None else await _relay(flow, resp, head)

    return await _exchange(flow, parts.first_body(), headers, first)


async def _exchange(
    flow: Flow,
    body: Body,
    headers: CIMultiDict[str],
    relay: Relay | None = None,
    path: str | None = None,
) -> web.StreamResponse:
    """Send and relay (`relay`, or `_relay`), sending again where the request did not run
    (resend.py); `path`: where to, when not the request's own."""
    resends = Resends(flow, replayable=isinstance(body, bytes) or body.rest is None)
    while True:
        try:
            return await _send(flow, body, headers, resends.allowed(), relay, path)
        except RESENT as exc:
            await resends.after(exc)


async def _send(
    flow: Flow,
    body: Body,
    headers: CIMultiDict[str],
    allowed: Allowed = ONCE,
    relay: Relay | None = None,
    path: str | None = None,
) -> web.StreamResponse:
    """One upstream call and its relayed answer; what `allowed` lets go again is raised as
    `Rejected`, `Unconnected` or `ClosedIdle` (resend.py)."""
    request, rec = flow.request, flow.rec
    sent = time.perf_counter()
    answered = False
    try:
        async with flow.hop.request(
            request.method,
            target(flow.upstream, path or origin_form(flow)),
            data=_payload(request.method, body, headers),
            headers=headers,
            allow_redirects=False,
        ) as answer:
            answered = True
            # The lean hop's Answer has the surface of a ClientResponse that the relay reads.
            resp = cast(aiohttp.ClientResponse, answer)
            flow.metrics.ttfb.labels(rec.route).observe(time.perf_counter() - sent)
            flow.engine.answered(resp)  # hook: a stream a phase may stall
            first = b""
            if allowed.again:
                first, rejected = await paused_rejection(resp)
                if rejected:
                    raise Rejected
            try:
                return await (relay or _relay)(flow, resp, first)
            finally:
                rec.upstream_time = time.perf_counter() - sent
    except UPSTREAM_ERRORS as exc:
        if flow.client_gone:
            # The client's side broke (its upload of a streamed body, say): the upstream is
            # not to blame, and nobody is left to answer.
            rec.client_left(flow.metrics)
            return web.Response()
        resend = allowed.resend(exc, answered=answered, healthy=flow.discovery.healthy)
        if resend is not None:
            raise resend from exc
        raise not_sent_again(exc, answered=answered, where=f"for {rec.method} {rec.path}") from exc


# A health check is answered within this, whatever vLLM's API server is busy with: vllm-router
# (its check gives up after 5 s) and Kubernetes would take a busy engine out of rotation.
HEALTH_PROMPT = 2.0


async def _health(flow: Flow, headers: CIMultiDict[str]) -> web.StreamResponse:
    """vLLM's /health, relayed; when it is slow to answer (its API server is busy taking in
    weights) and the sidecar's own last check found it healthy, the sidecar answers 200 for it
    (`X-Sidecar-Health: cached`) rather than let a router eject a busy engine."""
    try:
        async with asyncio.timeout(HEALTH_PROMPT):
            return await _send(flow, b"", headers)
    except TimeoutError:
        if not flow.discovery.healthy:
            raise UpstreamTimeout(
                f"vLLM did not answer {flow.rec.method} /health within {HEALTH_PROMPT:g}s, and its"
                " last health check failed."
            ) from None
        return web.Response(headers={"X-Sidecar-Health": "cached"})


def _upstream_headers(flow: Flow) -> CIMultiDict[str]:
    request = flow.request
    peer = request.transport.get_extra_info("peername") if request.transport else None
    headers = hdrs.upstream_request_headers(
        request.headers,
        rid=flow.rec.request_id,
        client_ip=peer[0] if isinstance(peer, tuple) else None,
        scheme=request.scheme,
        host=request.host,
    )
    if flow.engine.token_used:
        # The sidecar's own token is not vLLM's API key: vLLM gets what it needs, or nothing.
        key = flow.options.upstream_api_key
        if key:
            headers[hdrs.AUTHORIZATION] = f"Bearer {key}"
        else:
            headers.popall(hdrs.AUTHORIZATION, None)
    return headers


def _payload(method: str, body: Body, headers: CIMultiDict[str]) -> object:
    if isinstance(body, StreamedBody):
        headers["Content-Length"] = str(body.length)  # a length, not chunked encoding, for vLLM
        return body.chunks()
    return body if body or method in ("POST", "PUT", "PATCH") else None


async def _relay(
    flow: Flow, resp: aiohttp.ClientResponse, first: bytes = b""
) -> web.StreamResponse:
    """The upstream's answer, relayed the way its kind needs."""
    rec = flow.rec
    if resp.status == 101:  # the sidecar drops Upgrade (hop-by-hop): nobody asked to switch
        raise UpstreamInvalidResponse(
            f"The upstream answered 101 Switching Protocols for {rec.method} {rec.path}, which "
            "asked for no protocol switch."
        )
    if resp.status >= 400:
        limit = flow.options.error_body_bytes
        raw, truncated = (
            (first[:limit], len(first) > limit) if first else await read_capped(resp, limit)
        )
        if resp.status == 404 and rec.resolved is not None:
            # vLLM no longer serves the name we resolved to (restarted under another name,
            # adapter unloaded): re-read the list now rather than at the next scheduled
            # discovery, before the envelope suggests names from it.
            await flow.discovery.refresh_on_miss()
        return error_reply(flow, resp, raw, truncated)
    length = resp.content_length
    sse = is_event_stream(resp.headers.get("Content-Type"))
    # Read whole only within the memory budget; past it the answer streams, with backpressure.
    if not sse and length is not None and length <= BUFFER_LIMIT and flow.budget.try_hold(length):
        return await buffered_reply(flow, resp, first or None)
    if unframed_json(resp) or chunked_json_read(resp):
        return await checked_json_reply(flow, resp)
    return await stream_reply(flow, resp, first)
