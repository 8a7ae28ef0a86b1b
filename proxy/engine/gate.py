"""Where a request meets the engine lifecycle: its plane, its hold, its weight-version stamp."""

from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass

import aiohttp
import orjson
from aiohttp import web

from proxy.core.control import plane
from proxy.core.errors import InvalidRequest, PhaseRefusal, Unauthorized
from proxy.core.phase import SERVING, next_version
from proxy.core.routes import CONTROL, DATA, SYNC_END, normalized, rule
from proxy.core.sse import is_event_stream
from proxy.observe.record import RequestRecord

from .lifecycle import LIFECYCLE, Lifecycle

WEIGHT_VERSION = "X-Weight-Version"
# The version at the end, when it differs from the one the answer started with.
WEIGHT_VERSION_END = "X-Weight-Version-End"
_ABORT = b'"finish_reason":"abort"'  # vLLM's compact JSON, in bodies and SSE events alike
# A client's own deadline for waiting out a phase, in seconds (0: refuse at once).
HOLD_TIMEOUT = "X-Sidecar-Hold-Timeout"


@dataclass(slots=True, eq=False)
class Admission:
    """One request's dealings with the lifecycle, read again when its answer goes out."""

    plane: str
    route: str  # the record's route label, for the counts made when the answer goes out
    version: str | None = None
    retry_after: int | None = None
    unauthorized: bool = False
    named: str | None = None  # the version the sidecar gave a finished update that named none
    until: float | None = None  # the client's own hold deadline (monotonic), if it set one

    def left(self) -> float | None:
        """Seconds left of the client's hold deadline; None when it set none."""
        return None if self.until is None else max(self.until - time.monotonic(), 0.0)


ADMISSION = web.RequestKey("admission", Admission)


_UNTOUCHED = contextlib.nullcontext()  # reads, health, tokenize: the lifecycle has no say


def admission(
    request: web.Request, rec: RequestRecord
) -> contextlib.AbstractAsyncContextManager[None]:
    """What the lifecycle does around a request's upstream call, judged before its body is
    read: a control-plane call's token is checked now, and the phase it enters is entered only
    once its body is complete and it goes upstream; a data-plane request is held while the
    engine does not serve (after its body was read: a bad body gets its 400 at once)."""
    kind = plane(request.method, request.path)
    if kind is None:
        return _UNTOUCHED
    lifecycle = request.app[LIFECYCLE]
    admission = request[ADMISSION] = Admission(kind, rec.route, lifecycle.version)
    if kind == CONTROL:
        try:
            lifecycle.authorize(request.headers.get("Authorization"))
        except Unauthorized:
            admission.unauthorized = True
            raise
        return lifecycle.control_call(normalized(request.path), rec, request.query_string)
    if (seconds := _asked_deadline(request)) is not None:
        admission.until = time.monotonic() + seconds
    return _DataHold(rec, lifecycle, admission)


def admissible(request: web.Request) -> bool:
    """Whether the lifecycle would take the request at its head: a control call needs the
    token (asked before its body is invited)."""
    if plane(request.method, request.path) != CONTROL:
        return True
    try:
        request.app[LIFECYCLE].authorize(request.headers.get("Authorization"))
    except Unauthorized:
        return False
    return True


def _asked_deadline(request: web.Request) -> float | None:
    value = request.headers.get(HOLD_TIMEOUT)
    if value is None:
        return None
    try:
        seconds = float(value)
    except ValueError:
        seconds = -1.0
    if not 0 <= seconds < float("inf"):
        raise InvalidRequest(
            f"{HOLD_TIMEOUT} must be a number of seconds, 0 or more; got `{value[:50]}`."
        )
    return seconds


def named_version(request: web.Request, body: bytes) -> bytes | None:
    """A /finish_weight_update that names no `weight_version` (SkyRL 0.4 names none): the
    body that names the next one (`default` -> `default+1` -> `default+2`), so that vLLM's own
    version, its per-token spans and every answer's X-Weight-Version tell the updates apart.
    None when the body is left as it is: it names one, or is not a JSON object."""
    admission = request.get(ADMISSION)
    if admission is None or rule(request.path).step != SYNC_END:
        return None
    current = request.app[LIFECYCLE].version
    try:
        payload = orjson.loads(body) if body.strip() else {}
    except orjson.JSONDecodeError:
        return None
    if current is None or not isinstance(payload, dict) or payload.get("weight_version"):
        return None
    admission.named = payload["weight_version"] = next_version(current)
    return orjson.dumps(payload)


class _DataHold:
    """A data-plane request: held while the engine does not serve, then counted as running.
    A class, not a generator: it is on every completion's path."""

    __slots__ = ("admission", "lifecycle", "rec")

    def __init__(self, rec: RequestRecord, lifecycle: Lifecycle, admission: Admission) -> None:
        self.rec, self.lifecycle, self.admission = rec, lifecycle, admission

    async def __aenter__(self) -> None:
        try:
            await self.lifecycle.admit(self.rec, self.admission.left())
        except PhaseRefusal as refusal:
            self.admission.retry_after = refusal.retry_after
            raise
        self.admission.version = self.lifecycle.version
        self.lifecycle.running += 1

    async def __aexit__(self, *exc_info: object) -> None:
        self.lifecycle.running -= 1
        self.lifecycle.stalls.discard(self.admission)


def control_token_used(request: web.Request) -> bool:
    """A control-plane call that passed the sidecar's token check: its Authorization was the
    sidecar's token, not the client's word to vLLM."""
    admission = request.get(ADMISSION)
    return (
        admission is not None
        and admission.plane == CONTROL
        and request.app[LIFECYCLE].token is not None
    )


def resendable(request: web.Request) -> bool:
    """A data-plane request: one vLLM rejects as paused (0.33) is sent again."""
    admission = request.get(ADMISSION)
    return admission is not None and admission.plane == DATA


async def held_again(request: web.Request, rec: RequestRecord, attempt: int) -> None:
    """vLLM rejected the request as paused: wait for the pause to end (the sidecar's phase,
    or vLLM's flags, or a short backoff when it was made around the sidecar), then pass the
    hold again. A deadline the client asked for counts from its first hold."""
    admission = request[ADMISSION]
    lifecycle = request.app[LIFECYCLE]
    lifecycle.running -= 1  # held again, not running: an update may start meanwhile
    try:
        await lifecycle.after_rejection(rec, attempt, admission.left())
    except PhaseRefusal as refusal:
        admission.retry_after = refusal.retry_after
        raise
    finally:
        lifecycle.running += 1
    admission.version = lifecycle.version


def upstream_started(request: web.Request, resp: aiohttp.ClientResponse) -> None:
    """vLLM answered: with a pod-wide hold deadline, a data-plane stream is watched for a phase
    stalling it (see stalls.py); without one, a frozen stream stays open as with vLLM alone."""
    admission = request.get(ADMISSION)
    if admission is None or admission.plane != DATA:
        return
    lifecycle = request.app[LIFECYCLE]
    if lifecycle.hold_timeout is not None and is_event_stream(resp.headers.get("Content-Type")):
        lifecycle.stalls.add(admission, admission.route, resp)


def stamp(request: web.Request, response: web.StreamResponse) -> None:
    """At a response's prepare: the headers a phase or the weight version adds to an answer."""
    admission = request.get(ADMISSION)
    if admission is None:
        return
    headers = response.headers
    if admission.retry_after is not None:
        headers["Retry-After"] = str(admission.retry_after)  # RFC 9110 section 10.2.3
    if admission.unauthorized:
        headers["WWW-Authenticate"] = 'Bearer realm="vllm-sidecar control plane"'
    if admission.named is not None and response.status < 300:  # an update finished with it
        headers[WEIGHT_VERSION] = admission.named
    if admission.plane != DATA or admission.version is None:
        return
    lifecycle = request.app[LIFECYCLE]
    headers[WEIGHT_VERSION] = admission.version
    if lifecycle.version not in (None, admission.version):
        headers[WEIGHT_VERSION_END] = str(lifecycle.version)
    body = response.body if isinstance(response, web.Response) else None
    # Only outside serving: no body is searched in steady state.
    if lifecycle.phase != SERVING and isinstance(body, bytes) and _ABORT in body:
        lifecycle.count_abort(admission.route)


def stream_aborted(request: web.Request) -> None:
    """Count a data-plane stream vLLM aborted (`finish_reason: "abort"`, seen by the SSE
    watcher) outside serving; called however the stream ended, also when the client left
    right after vLLM's `[DONE]`."""
    admission = request.get(ADMISSION)
    lifecycle = request.app[LIFECYCLE]
    if admission is not None and admission.plane == DATA and lifecycle.phase != SERVING:
        lifecycle.count_abort(admission.route)


def version_change(request: web.Request) -> bytes:
    """What to append to a data-plane SSE stream that ended as vLLM sent it: when the weight
    version changed while it ran (a `keep` pause around a weight update), a named event after
    vLLM's `[DONE]`. SSE clients that listen for `weight_version` read it; the openai SDK stops
    at `[DONE]` and never sees it."""
    admission = request.get(ADMISSION)
    if admission is None or admission.plane != DATA:
        return b""
    lifecycle = request.app[LIFECYCLE]
    if admission.version is None or lifecycle.version in (None, admission.version):
        return b""
    change = {"weight_version": lifecycle.version, "previous": admission.version}
    return b"event: weight_version\ndata: " + orjson.dumps(change) + b"\n\n"
