"""Where a request meets the engine lifecycle: its plane, its hold, its weight-version stamp."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass

import aiohttp
import orjson
from aiohttp import web

from .control import CONTROL, DATA, normalized, plane
from .errors import SidecarFailure, Unauthorized
from .exchange import Exchange
from .keys import LIFECYCLE
from .lifecycle import Lifecycle
from .metrics import route_label
from .phase import SERVING
from .sse import is_event_stream

WEIGHT_VERSION = "X-Weight-Version"
# The version at the end, when it differs from the one the answer started with.
WEIGHT_VERSION_END = "X-Weight-Version-End"
_ABORT = b'"finish_reason":"abort"'  # vLLM's compact JSON, in bodies and SSE events alike


@dataclass(slots=True, eq=False)
class Passage:
    """One request's dealings with the lifecycle, read again when its answer goes out."""

    plane: str
    version: str | None = None
    retry_after: int | None = None
    unauthorized: bool = False


PASSAGE = web.RequestKey("passage", Passage)


_UNTOUCHED = contextlib.nullcontext()  # reads, health, tokenize: the lifecycle has no say


def passage(request: web.Request, ex: Exchange) -> contextlib.AbstractAsyncContextManager[None]:
    """Around a request's forwarding: hold a data-plane one while the engine does not serve;
    check a control-plane one's token, and track the phase it enters and leaves."""
    kind = plane(request.method, request.path)
    if kind is None:
        return _UNTOUCHED
    lifecycle = request.app[LIFECYCLE]
    mark = request[PASSAGE] = Passage(kind, lifecycle.version)
    if kind == CONTROL:
        return _control(request, ex, lifecycle, mark)
    return _Data(ex, lifecycle, mark)


@contextlib.asynccontextmanager
async def _control(
    request: web.Request, ex: Exchange, lifecycle: Lifecycle, mark: Passage
) -> AsyncIterator[None]:
    try:
        lifecycle.authorize(request.headers.get("Authorization"))
    except Unauthorized:
        mark.unauthorized = True
        raise
    async with lifecycle.control_call(normalized(request.path), ex, request.query_string):
        yield


class _Data:
    """A data-plane request: held while the engine does not serve, then counted as running.
    A class, not a generator: it is on every completion's path."""

    __slots__ = ("ex", "lifecycle", "mark")

    def __init__(self, ex: Exchange, lifecycle: Lifecycle, mark: Passage) -> None:
        self.ex, self.lifecycle, self.mark = ex, lifecycle, mark

    async def __aenter__(self) -> None:
        try:
            await self.lifecycle.admit(self.ex)
        except SidecarFailure as failure:
            self.mark.retry_after = failure.extra.get("retry_after")
            raise
        self.mark.version = self.lifecycle.version
        self.lifecycle.running += 1

    async def __aexit__(self, *exc_info: object) -> None:
        self.lifecycle.running -= 1
        self.lifecycle.stalls.discard(self.mark)


def upstream_started(request: web.Request, resp: aiohttp.ClientResponse) -> None:
    """vLLM answered: a data-plane stream is watched for a phase stalling it (see stalls.py)."""
    mark = request.get(PASSAGE)
    if (
        mark is not None
        and mark.plane == DATA
        and is_event_stream(resp.headers.get("Content-Type"))
    ):
        request.app[LIFECYCLE].stalls.add(mark, route_label(request.path), resp)


async def stamp(request: web.Request, response: web.StreamResponse) -> None:
    """on_response_prepare: the headers a phase or the weight version adds to an answer."""
    mark = request.get(PASSAGE)
    if mark is None:
        return
    headers = response.headers
    if mark.retry_after is not None:
        headers["Retry-After"] = str(mark.retry_after)  # RFC 9110 section 10.2.3
    if mark.unauthorized:
        headers["WWW-Authenticate"] = 'Bearer realm="vllm-sidecar control plane"'
    if mark.plane != DATA or mark.version is None:
        return
    lifecycle = request.app[LIFECYCLE]
    headers[WEIGHT_VERSION] = mark.version
    if lifecycle.version not in (None, mark.version):
        headers[WEIGHT_VERSION_END] = str(lifecycle.version)
    body = response.body if isinstance(response, web.Response) else None
    # Only outside serving: no body is searched in steady state.
    if lifecycle.phase != SERVING and isinstance(body, bytes) and _ABORT in body:
        lifecycle.count_abort(route_label(request.path))


def stream_ended(request: web.Request, *, aborted: bool) -> bytes:
    """What to append to a data-plane SSE stream that ended as vLLM sent it.

    Counts an abort (vLLM's `finish_reason: "abort"`, seen by the SSE watcher) and, when the
    weight version changed while it ran (a `keep` pause around a weight update), appends a named
    event after vLLM's `[DONE]`: SSE clients that listen for `weight_version` read it; the
    openai SDK stops at `[DONE]` and never sees it.
    """
    mark = request.get(PASSAGE)
    if mark is None or mark.plane != DATA:
        return b""
    lifecycle = request.app[LIFECYCLE]
    if lifecycle.phase != SERVING and aborted:
        lifecycle.count_abort(route_label(request.path))
    if mark.version is None or lifecycle.version in (None, mark.version):
        return b""
    change = {"weight_version": lifecycle.version, "previous": mark.version}
    return b"event: weight_version\ndata: " + orjson.dumps(change) + b"\n\n"
