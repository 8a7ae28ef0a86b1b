"""The engine lifecycle as the sidecar lives it: phases from relayed calls, holds, the token.

Holding happens here, not in vLLM's queue: vLLM queues every request a pause or sleep finds,
with no bound and no deadline, a non-stream without a byte and a stream after its 200 headers,
so neither a deadline nor a queue size could be enforced once a request was sent. A request
held here has sent nothing yet: at its deadline it still gets a proper 503 with Retry-After.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import time
from collections.abc import AsyncIterator

from . import control, phase
from .engine_probe import Probe, ProbeFailed
from .errors import EnginePaused, EngineSleeping, PhaseRefusal, Unauthorized, WeightSync
from .metrics import EngineMetrics
from .phase import SERVING, Engine
from .record import RequestRecord
from .stalls import MIN_QUIET, Stalls
from .upstream import Interrupted

log = logging.getLogger(__name__)

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
        self, metrics: EngineMetrics, *, hold_timeout: float, hold_queue: int, token: bytes | None
    ) -> None:
        self.metrics = metrics
        self.hold_timeout, self.hold_queue, self.token = hold_timeout, hold_queue, token
        self.engine = Engine()
        self.since, self.since_wall = time.monotonic(), time.time()
        self.version: str | None = None
        self.updates = self.held = self.running = 0
        self.durations = phase.Durations()
        self.probe: Probe | None = None
        self.open: dict[Call, tuple[Engine, Engine]] = {}  # each call's phases before and sent
        self._numbers = itertools.count(1)
        self.epoch = 0  # bumped on every change of state, so a probe can tell it is stale
        self._serving = asyncio.Event()
        self._serving.set()
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
        if engine.phase == SERVING:
            self._serving.set()
            self.stalls.stop()
        elif old == SERVING:
            self._serving.clear()
            self.stalls.start(asyncio.get_running_loop().create_task(self._sweep()))

    def set_version(self, version: str | None) -> None:
        if version is None or version == self.version:
            return
        log.info("weight version %s -> %s", self.version, version)
        self.version = self.metrics.state.version = version

    # -- the data plane ---------------------------------------------------------------------
    async def admit(self, rec: RequestRecord) -> None:
        """Return once the engine serves; past the deadline or the queue size, refuse."""
        if self.engine.phase == SERVING:
            return
        held_in = self.engine.phase
        if self.hold_timeout == 0 or self.held >= self.hold_queue:
            if self.hold_timeout == 0:
                why = "--phase-hold-timeout is 0: no request is held"
            else:
                why = f"{self.held} requests are held already (--phase-hold-queue)"
            raise self.refusal(rec.route, why)
        self.metrics.requests.labels(held_in, rec.route, "held").inc()
        self.held += 1
        self.metrics.held.inc()
        try:
            async with asyncio.timeout(self.hold_timeout):
                while self.engine.phase != SERVING:
                    await self._serving.wait()
        except TimeoutError:
            why = f"held {self.hold_timeout:g}s (--phase-hold-timeout)"
            raise self.refusal(rec.route, why) from None
        finally:
            self.held -= 1
            self.metrics.held.dec()

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
        quiet = max(self.hold_timeout, MIN_QUIET)
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
            "phase_hold_timeout": self.hold_timeout,
            "control_token": self.token is not None,
        }
