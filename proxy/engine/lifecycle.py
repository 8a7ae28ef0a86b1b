"""The engine lifecycle as the sidecar lives it: phases from relayed calls, holds, the token.

Planned phases are waited out, as vLLM alone would: a data-plane request that meets a pause, a
sleep or a weight sync is held for as long as the phase lasts (SkyRL 0.4 pauses in `keep` mode
around every weight sync and fails at once on a JSON 5xx). The hold happens here, not in
vLLM's queue, so that nothing is sent into an engine that cannot serve it and so that a
deadline someone asked for can still be answered with a proper 503 and Retry-After. A hold
ends with the phase, with the engine going down (at once, with the clear error), with the
client, or with a deadline that was asked for: per request (`X-Sidecar-Hold-Timeout`) or
pod-wide (`--phase-hold-timeout`, off by default).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import time
from collections.abc import AsyncIterator

from aiohttp import web

from proxy.core import control, phase
from proxy.core.errors import (
    EnginePaused,
    EngineSleeping,
    PhaseRefusal,
    Unauthorized,
    UpstreamUnreachable,
    WeightSync,
)
from proxy.core.phase import SERVING, Engine
from proxy.observe.metrics import EngineMetrics
from proxy.observe.record import RequestRecord
from proxy.upstream.engine_probe import Probe, ProbeFailed
from proxy.upstream.session import Interrupted

from .stalls import MIN_QUIET, Stalls

log = logging.getLogger("proxy.lifecycle")  # its name before the layers: kept for filters

_REFUSALS: dict[str, type[PhaseRefusal]] = {
    phase.PAUSED: EnginePaused,
    phase.SLEEPING: EngineSleeping,
    phase.WEIGHT_SYNC: WeightSync,
}
_VERSIONING = frozenset(("/finish_weight_update", "/update_weight_version"))


Call = int  # a phase-changing control call in flight, by number


class Lifecycle:
    """The engine's phase and weight version, and the gate data-plane requests pass.

    The pod's own, as here, reconciles with vLLM and records phase durations; a worker's of
    `--workers N` (`podlifecycle.Follower`) mirrors the supervisor's and does neither."""

    LEADS = True

    def __init__(
        self,
        metrics: EngineMetrics,
        *,
        hold_timeout: float | None,
        hold_queue: int,
        token: bytes | None,
        long_after: float = 600.0,
    ) -> None:
        self.metrics = metrics
        self.hold_timeout, self.hold_queue, self.token = hold_timeout, hold_queue, token
        self.long_after = long_after
        self.long = False  # the current pause or sync has lasted past `long_after`
        self._long_timer: asyncio.TimerHandle | None = None
        self.down: str | None = None  # why vLLM is seen down (refused or reset), if it is
        self.engine = Engine()
        self.since, self.since_wall = time.monotonic(), time.time()
        self.version: str | None = None
        self.updates = self.held = self.running = 0
        self.durations = phase.Durations()
        self.probe: Probe | None = None
        self.open: dict[Call, tuple[Engine, Engine]] = {}  # each call's phases before and sent
        self._numbers = itertools.count(1)
        self.epoch = 0  # bumped on every change of state, so a probe can tell it is stale
        self._changed = asyncio.Event()  # replaced on each change: held requests look again
        self.stalls = Stalls()

    @property
    def phase(self) -> str:
        return self.engine.phase

    @property
    def calls(self) -> int:
        """Phase-changing control calls in flight."""
        return len(self.open)

    def elapsed(self) -> float:
        return time.monotonic() - self.since

    def set(self, engine: Engine, why: str) -> None:
        if engine == self.engine:
            return
        old, self.engine = self.engine.phase, engine
        self.epoch += 1
        if engine.phase != old:
            took = self.elapsed()
            self.durations.record(old, took)
            if self.LEADS:
                self.metrics.phase_duration.labels(old).observe(took)
            self.since, self.since_wall = time.monotonic(), time.time()
            self.metrics.state.phase = engine.phase
            log.info("engine %s -> %s after %.1fs (%s)", old, engine.phase, took, why)
            self._watch_length(engine.phase)
        self._wake()
        if engine.phase == SERVING:
            self.stalls.stop()
        elif old == SERVING and self.hold_timeout is not None:
            # Only a deadline someone asked for ends a frozen stream; vLLM alone keeps it open.
            self.stalls.start(asyncio.get_running_loop().create_task(self._sweep()))

    def _wake(self) -> None:
        self._changed.set()
        self._changed = asyncio.Event()

    def _watch_length(self, now: str) -> None:
        """A phase that lasts past --phase-long-after is logged, shown and alerted on; it fails
        no request by itself (a weight sync of a large model takes minutes)."""
        self.long = self.metrics.state.long = False
        if self._long_timer is not None:
            self._long_timer.cancel()
            self._long_timer = None
        if now != SERVING and self.LEADS:
            loop = asyncio.get_running_loop()
            self._long_timer = loop.call_later(self.long_after, self._lasted_long, now)

    def _lasted_long(self, now: str) -> None:
        self._long_timer = None
        if self.engine.phase == now:
            self.long = self.metrics.state.long = True
            log.warning(
                "engine %s for %.0fs (--phase-long-after %g): a trainer that died between its"
                " calls, or a sync that hangs? Held requests: %d",
                now,
                self.elapsed(),
                self.long_after,
                self.held,
            )

    def engine_down(self, why: str | None) -> None:
        """vLLM refused or reset a connection (`why`), or is back (None). Requests held for a
        phase then end at once: a dead engine's phase never ends by itself."""
        if why == self.down:
            return
        if why is not None and self.LEADS:
            log.warning("vLLM is down while the engine is %s: %s", self.phase, why)
        self.down = why
        self._wake()

    def set_version(self, version: str | None) -> None:
        if version is None or version == self.version:
            return
        log.info("weight version %s -> %s", self.version, version)
        self.version = self.metrics.state.version = version
        self.metrics.state.version_changed = time.time()

    # -- the data plane ---------------------------------------------------------------------
    async def admit(self, rec: RequestRecord, deadline: float | None = None) -> None:
        """Return once the engine serves. Refuse when vLLM is down, the hold queue is full, or
        a deadline asked for passes: `deadline` (the request's own) or --phase-hold-timeout."""
        if self.engine.phase == SERVING:
            return
        self._check_up(rec.route)
        limit, flag = self._deadline(deadline)
        if limit == 0:
            raise self.refusal(rec.route, f"{flag} is 0: no request is held")
        if self.hold_queue and self.held >= self.hold_queue:
            why = f"{self.held} requests are held already (--phase-hold-queue)"
            raise self.refusal(rec.route, why)
        self.metrics.requests.labels(self.engine.phase, rec.route, "held").inc()
        self.held += 1
        self.metrics.held.inc()
        try:
            async with asyncio.timeout(limit):
                while self.engine.phase != SERVING:
                    self._check_up(rec.route)
                    await self._changed.wait()
        except TimeoutError:
            raise self.refusal(rec.route, f"held {limit:g}s ({flag})") from None
        finally:
            self.held -= 1
            self.metrics.held.dec()

    async def after_rejection(self, rec: RequestRecord, attempt: int, left: float | None) -> None:
        """vLLM (0.33) rejected a request as paused: a pause made around the sidecar, so far
        unseen. Wait for a change of state or a backoff (0.25 s doubling to 5 s, vLLM answers
        a rejection at once), then hold as any request; `left`: the client's deadline left."""
        self.metrics.requests.labels(phase.PAUSED, rec.route, "rejected").inc()
        if left is not None and left <= 0:
            why = "vLLM rejected it as paused past X-Sidecar-Hold-Timeout"
            raise self.refusal(rec.route, why)
        changed = self._changed
        self.held += 1
        self.metrics.held.inc()
        try:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(min(0.25 * 2**attempt, 5.0, left or 5.0)):
                    await changed.wait()
        finally:
            self.held -= 1
            self.metrics.held.dec()
        await self.admit(rec, left)

    def _deadline(self, asked: float | None) -> tuple[float | None, str]:
        """The shorter of the request's own deadline and the pod's, and the name to cite."""
        pod = self.hold_timeout
        if asked is not None and (pod is None or asked <= pod):
            return asked, "X-Sidecar-Hold-Timeout"
        return pod, "--phase-hold-timeout"

    def _check_up(self, route: str) -> None:
        if self.down is None:
            return
        self.metrics.requests.labels(self.engine.phase, route, "engine_down").inc()
        raise UpstreamUnreachable(
            f"vLLM went down while the engine was {self.phase.replace('_', ' ')} ({self.down});"
            " the request was held by the sidecar and not sent to it."
        )

    def refusal(self, route: str, why: str, outcome: str = "refused") -> PhaseRefusal:
        """The failure for a request the current phase refused (or, `cut`, a stream it stalled)."""
        now = self.engine.phase
        self.metrics.requests.labels(now, route, outcome).inc()
        retry = self.durations.retry_after(now, self.elapsed())
        what = "the request was not sent to it" if outcome == "refused" else "the stream was ended"
        return _REFUSALS[now](
            f"The engine is {now.replace('_', ' ')} (for {self.elapsed():.1f}s); {what}: {why}."
            f" Retry after {retry}s.",
            retry_after=retry,
        )

    async def _sweep(self) -> None:
        """While the engine does not serve, end the streams that stay silent for the deadline."""
        quiet = max(self.hold_timeout or 0.0, MIN_QUIET)
        while True:
            before = self.stalls.quiet_since()
            await asyncio.sleep(quiet)
            for route, resp in self.stalls.stalled(before):
                why = f"it received nothing for {quiet:g}s (--phase-hold-timeout)"
                self.stalls.cut(resp, Interrupted(self.refusal(route, why, outcome="cut")))

    def count_abort(self, route: str) -> None:
        self.metrics.requests.labels(self.engine.phase, route, "aborted").inc()

    # -- the control plane ------------------------------------------------------------------
    def authorize(self, header: str | None) -> None:
        if self.token is not None and not control.authorized(header, self.token):
            raise Unauthorized(
                "This control-plane route needs the sidecar's control token: send "
                "`Authorization: Bearer <token>` (--control-token). Nothing was forwarded."
            )

    @contextlib.asynccontextmanager
    async def control_call(self, path: str, rec: RequestRecord, query: str) -> AsyncIterator[None]:
        """Enter the call's phase when it is sent; settle it on the answer, revert on failure."""
        if path not in phase.TRANSITIONS and path not in _VERSIONING:
            yield
            return
        # Requests running into an update outside any pause or sleep: that crashed vLLM.
        unpaused = self.engine.base == SERVING and self.running
        if path in ("/start_weight_update", "/start_draft_weight_update") and unpaused:
            self.metrics.unpaused_sync.inc(self.running)
            log.warning(
                "%s with %d requests running: pause the engine before updating weights "
                "(an update under traffic crashed vLLM)",
                path,
                self.running,
            )
        call = await self.enter(path)
        try:
            yield
        except asyncio.CancelledError:
            # The caller hung up: vLLM may have acted on the call anyway. The entered phase
            # stands (the safe side) until vLLM's own flags settle it.
            log.warning("%s: the caller left before vLLM answered; phase %s kept", path, self.phase)
            self.leave(call)
            raise
        except Exception:
            await self.failed(call, path)  # vLLM was not reached, or broke off
            raise
        if not 200 <= rec.status < 300:
            await self.failed(call, path)
            return
        await self.answered(call, path, query)

    # The steps of a call, each one the pod's: a worker's `Follower` has the supervisor take them.
    async def enter(self, path: str) -> Call:
        """The call is sent: enter its phase."""
        before = self.engine
        self.set(phase.on_send(before, path), f"{path} sent")
        call = next(self._numbers)
        self.open[call] = (before, self.engine)
        return call

    def leave(self, call: Call) -> None:
        """The call's caller left: its phase stands."""
        self.open.pop(call, None)

    async def failed(self, call: Call, path: str) -> None:
        """vLLM refused the call or was not reached: back to the phase before it."""
        before, sent = self.open.pop(call, (self.engine, self.engine))
        if self.engine == sent:  # unless something else changed it meanwhile
            self.set(before, f"{path} failed")

    async def answered(self, call: Call, path: str, query: str) -> None:
        """vLLM answered with success: leave the phase, and read the version it changed."""
        self.open.pop(call, None)
        awake = True
        if path == "/wake_up" and "tags=" in query and self.probe is not None:
            # Waking only some tags (weights, then kv_cache) leaves the engine asleep.
            with contextlib.suppress(ProbeFailed):
                awake = await self.probe.sleeping() is False
        # The version first: requests the phase held are released with the new one.
        if path in _VERSIONING and self.probe is not None:
            with contextlib.suppress(ProbeFailed):
                self.set_version(await self.probe.weight_version())
        self.set(phase.on_answer(self.engine, path, fully_awake=awake), f"{path} answered")
        if path == "/finish_weight_update":
            self.updates += 1
            self.metrics.weight_updates.inc()

    def describe(self) -> dict[str, object]:
        return {
            "phase": self.engine.phase,
            "paused_or_asleep": self.engine.base,
            "weight_sync": self.engine.syncing,
            "since": self.since_wall,
            "seconds": round(self.elapsed(), 3),
            "weight_version": self.version,
            "weight_updates": self.updates,
            "held_requests": self.held,
            "running_requests": self.running,
            "long": self.long,
            "engine_down": self.down,
            "phase_hold_timeout": self.hold_timeout,
            "phase_long_after": self.long_after,
            "control_token": self.token is not None,
        }


# Its slot on an app (aiohttp's typed key, declared beside what it holds).
LIFECYCLE = web.AppKey("lifecycle", Lifecycle)
