"""Where a request meets the engine lifecycle: one handle a request carries from its head to its
last byte (its plane, its hold, what it did to the engine, its weight-version stamp)."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Awaitable, Callable, Iterable
from contextlib import AbstractAsyncContextManager
from typing import Any

import orjson
from aiohttp import web

from proxy.core.control import plane
from proxy.core.errors import PhaseRefusal, Unauthorized
from proxy.core.phase import SERVING, next_version
from proxy.core.routes import CONTROL, SYNC_END, normalized, rule
from proxy.core.sse import is_event_stream
from proxy.observe.record import RequestRecord

from .holds import HOLD_TIMEOUT, asked_deadline
from .lifecycle import Lifecycle
from .tally import Counts, Tally, answered, joined, of_body

WEIGHT_VERSION = "X-Weight-Version"
# The version at the end, when it differs from the one the answer started with.
WEIGHT_VERSION_END = "X-Weight-Version-End"
_ABORT = b'"finish_reason":"abort"'  # vLLM's compact JSON, in bodies and SSE events alike

_UNTOUCHED = contextlib.nullcontext()
_CHAT = "/v1/chat/completions"


class EngineHandle:
    """A request the lifecycle has no say in (reads, health, tokenize): every step a no-op.
    `Control` and `Data` are the two kinds it has a say in; callers never ask which."""

    __slots__ = ()

    # Plain attributes, read on every request's path (a property is a call each time).
    version: str | None = None  # the weight version it started with (data)
    # What holds the request again after vLLM (0.33) rejected it as paused, before it is sent
    # again; None: such a request is not sent again (only a data request is).
    rehold: Callable[[int], Awaitable[None]] | None = None
    token_used = False  # its Authorization was the sidecar's control token, not vLLM's key

    def hold(self) -> AbstractAsyncContextManager[None]:
        """Around the upstream call: a data request's hold, the phase a control call enters."""
        return _UNTOUCHED

    def would_hold(self) -> bool:
        """Whether `hold()` entered now would hold the request (the engine does not serve)."""
        return False

    def left(self) -> float | None:
        """Seconds left of a hold deadline the client asked for; None: it asked for none."""
        return None

    # -- the hooks (client/hooks.py), in the order they fire --------------------------------

    def body(self, body: bytes) -> bytes | None:
        """The body to send instead, when the sidecar names what the caller left unnamed."""
        return None

    def answered(self, resp: Any) -> None:
        """vLLM answered (headers in)."""

    def prepared(self, response: web.StreamResponse) -> None:
        """At the response's prepare: the headers a phase or the weight version adds."""

    def streaming(self) -> Tally | None:
        """What counts a relayed stream's generated tokens as it passes (None: not counted)."""
        return None

    def ended(self, aborted: bool, counts: Counts | None) -> bytes:
        """A relayed SSE stream ended, however it did: `aborted` (vLLM's `finish_reason:
        "abort"`), its generated tokens counted by lag; what to append to it, when it ended
        as vLLM sent it."""
        return b""

    def continued(self, choices: Iterable[tuple[int, list[Any], int]], usage: object) -> None:
        """A continued answer's tokens, each choice joined from its parts (client/continuing/)."""


NOTHING = EngineHandle()


def admit(lifecycle: Lifecycle, request: web.Request, rec: RequestRecord) -> EngineHandle:
    """The request's handle, judged at its head: a control-plane call's token is checked next
    (addon.py; its phase is entered only once its body is complete and it goes upstream); a
    data-plane request is held, later, while the engine does not serve (a bad body gets its
    400 first)."""
    kind = plane(request.method, request.path)
    if kind is None:
        return NOTHING
    if kind == CONTROL:
        return Control(lifecycle, rec, request)
    return Data(lifecycle, rec, asked_deadline(request.headers.get(HOLD_TIMEOUT)))


def admissible(lifecycle: Lifecycle, request: web.Request) -> bool:
    """Whether the lifecycle would take the request at its head: a control call needs the
    token (asked before its body is invited)."""
    if plane(request.method, request.path) != CONTROL:
        return True
    try:
        lifecycle.authorize(request.headers.get("Authorization"))
    except Unauthorized:
        return False
    return True


class Control(EngineHandle):
    """A control-plane call: the token, the phase it enters, the version it names."""

    __slots__ = ("lifecycle", "name", "rec", "request", "token_used", "unauthorized")

    def __init__(self, lifecycle: Lifecycle, rec: RequestRecord, request: web.Request) -> None:
        self.lifecycle, self.rec, self.request = lifecycle, rec, request
        self.unauthorized = False
        self.token_used = lifecycle.token is not None
        self.name: str | None = None  # the version the sidecar gave an update that named none

    def authorize(self, header: str | None) -> None:
        try:
            self.lifecycle.authorize(header)
        except Unauthorized:
            self.unauthorized = True
            raise

    def hold(self) -> AbstractAsyncContextManager[None]:
        request = self.request
        return self.lifecycle.control_call(normalized(request.path), self.rec, request.query_string)

    def body(self, body: bytes) -> bytes | None:
        """A /finish_weight_update that names no `weight_version` (SkyRL 0.4 names none): the
        body that names the next one (`default` -> `default+1` -> `default+2`), so that vLLM's
        own version, its per-token spans and every answer's X-Weight-Version tell the updates
        apart. None when the body is left as it is: it names one, or is not a JSON object."""
        current = self.lifecycle.version
        if rule(self.request.path).step != SYNC_END or current is None:
            return None
        try:
            payload = orjson.loads(body) if body.strip() else {}
        except orjson.JSONDecodeError:
            return None
        if not isinstance(payload, dict) or payload.get("weight_version"):
            return None
        self.name = payload["weight_version"] = next_version(current)
        return orjson.dumps(payload)

    def prepared(self, response: web.StreamResponse) -> None:
        if self.unauthorized:
            response.headers["WWW-Authenticate"] = 'Bearer realm="vllm-sidecar control plane"'
        if self.name is not None and response.status < 300:  # an update finished with it
            response.headers[WEIGHT_VERSION] = self.name


class Data(EngineHandle):
    """A data-plane request: held while the engine does not serve, counted running while it
    goes upstream, stamped with the weight versions it ran under."""

    __slots__ = ("counted", "lifecycle", "rec", "rehold", "retry_after", "until", "version")

    def __init__(self, lifecycle: Lifecycle, rec: RequestRecord, until: float | None) -> None:
        self.lifecycle, self.rec, self.until = lifecycle, rec, until
        self.version: str | None = lifecycle.version
        self.retry_after: int | None = None
        self.rehold = self._rehold
        self.counted = False  # its generated tokens are (once: a continuation counts its own)

    def left(self) -> float | None:
        return None if self.until is None else max(self.until - time.monotonic(), 0.0)

    def hold(self) -> AbstractAsyncContextManager[None]:
        return self.lifecycle.holds.serving(self)

    def would_hold(self) -> bool:
        return self.lifecycle.phase != SERVING

    async def _rehold(self, attempt: int) -> None:
        """vLLM rejected the request as paused: wait for the pause to end (the sidecar's phase,
        or vLLM's flags, or a short backoff when it was made around the sidecar), then pass the
        hold again. A deadline the client asked for counts from its first hold."""
        lifecycle, holds = self.lifecycle, self.lifecycle.holds
        try:
            with holds.not_running():
                await holds.after_rejection(self.rec, attempt, self.left())
        except PhaseRefusal as refusal:
            self.retry_after = refusal.retry_after
            raise
        self.version = lifecycle.version

    def answered(self, resp: Any) -> None:
        """With a pod-wide hold deadline, a stream is watched for a phase stalling it (see
        stalls.py); without one, a frozen stream stays open as with vLLM alone."""
        lifecycle = self.lifecycle
        if lifecycle.hold_timeout is not None and is_event_stream(resp.headers.get("Content-Type")):
            lifecycle.stalls.add(self, self.rec.route, resp)

    def prepared(self, response: web.StreamResponse) -> None:
        headers, lifecycle = response.headers, self.lifecycle
        if self.retry_after is not None:
            headers["Retry-After"] = str(self.retry_after)  # RFC 9110 section 10.2.3
        if self.version is not None:
            headers[WEIGHT_VERSION] = self.version
            if lifecycle.version not in (None, self.version):
                headers[WEIGHT_VERSION_END] = str(lifecycle.version)
        body = response.body if isinstance(response, web.Response) else None
        if not isinstance(body, bytes):
            return
        if response.status == 200 and not self.counted and self.rec.row.choices:
            self.generated(of_body(body))
        # Only outside serving: no body is searched in steady state.
        if lifecycle.phase != SERVING and _ABORT in body:
            lifecycle.count_abort(self.rec.route)

    def streaming(self) -> Tally | None:
        route = self.rec.route
        return Tally(chat=route == _CHAT) if self.rec.row.choices else None

    def generated(self, counts: Counts | None) -> None:
        if counts is not None and not self.counted:
            self.counted = True
            answered(self.lifecycle, self.rec.route, counts, self.version)

    def ended(self, aborted: bool, counts: Counts | None) -> bytes:
        """An abort is counted outside serving, however the stream ended, also when the client
        left right after vLLM's `[DONE]`."""
        if aborted and self.lifecycle.phase != SERVING:
            self.lifecycle.count_abort(self.rec.route)
        self.generated(counts)
        return self._tail()

    def continued(self, choices: Iterable[tuple[int, list[Any], int]], usage: object) -> None:
        self.generated(joined(choices, usage))

    def _tail(self) -> bytes:
        """When the weight version changed while the stream ran (a `keep` pause around a weight
        update), a named event after vLLM's `[DONE]`. SSE clients that listen for
        `weight_version` read it; the openai SDK stops at `[DONE]` and never sees it."""
        now = self.lifecycle.version
        if self.version is None or now in (None, self.version):
            return b""
        change = {"weight_version": now, "previous": self.version}
        return b"event: weight_version\ndata: " + orjson.dumps(change) + b"\n\n"
