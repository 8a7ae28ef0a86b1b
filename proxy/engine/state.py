"""The engine's state and its transitions, synchronous and without I/O: phase, version, down, calls.

The lifecycle (`lifecycle.py`) holds requests against it and times it; the steps of a control
call (`steps.py`) move it, here or in the supervisor of `--workers N`. Whoever must hear of a
change (the lifecycle's held requests, the supervisor's workers) subscribes to `listeners`.
"""

from __future__ import annotations

import itertools
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

from proxy.core import phase
from proxy.core.errors import (
    EnginePaused,
    EngineSleeping,
    PhaseRefusal,
    UpstreamUnreachable,
    WeightSync,
)
from proxy.core.phase import Engine, next_version
from proxy.core.routes import SYNC_END, rule
from proxy.observe.engine_metrics import EngineMetrics

from .history import RESTART, SIDECAR, TRAINER, VLLM, History, Update

log = logging.getLogger(__name__)

_REFUSALS: dict[str, type[PhaseRefusal]] = {
    phase.PAUSED: EnginePaused,
    phase.SLEEPING: EngineSleeping,
    phase.WEIGHT_SYNC: WeightSync,
}

Call = int  # a phase-changing control call in flight, by number


@dataclass(frozen=True, slots=True)
class Role:
    """What this copy of the state does besides holding it: with `--workers N` the supervisor's
    is the pod's lead (it records durations, times long phases, reconciles with vLLM, warns
    once), and only a worker's serves requests (its held and running counts are its own)."""

    leads: bool = True
    serves: bool = True


ALONE = Role()  # one process: leads and serves
POD_LEAD = Role(leads=True, serves=False)  # the supervisor of `--workers N`
FOLLOWER = Role(leads=False, serves=True)  # a worker: mirrors the supervisor's state


@dataclass(frozen=True, slots=True)
class Snapshot:
    """The state a follower mirrors: the lead's phase, weight version, "vLLM is down", and the
    versions the engine went through (what a worker counts a lag against)."""

    engine: Engine
    version: str | None
    down: str | None
    history: tuple[Update, ...] = ()


@dataclass(frozen=True, slots=True)
class Change:
    """One change of state: what changed, and the phase before it (the same phase unless the
    engine's phase itself moved)."""

    kind: Literal["engine", "version", "down"]
    before: str


class EngineState:
    """The engine's phase and weight version as the sidecar knows them, and the calls open."""

    def __init__(
        self, metrics: EngineMetrics, *, hold_timeout: float | None, role: Role = ALONE
    ) -> None:
        self.metrics, self.hold_timeout, self.role = metrics, hold_timeout, role
        self.engine = Engine()
        self.since, self.since_wall = time.monotonic(), time.time()
        self.version: str | None = None
        self.down: str | None = None  # why vLLM is seen down (refused or reset), if it is
        self.long = False  # the current pause or sync has lasted past --phase-long-after
        self.updates = 0
        self.history = History()
        self._restarted = False  # vLLM came back after it was seen down: its next version
        self.durations = phase.Durations()
        self.open: dict[Call, tuple[Engine, Engine]] = {}  # each call's phases before and sent
        self._numbers = itertools.count(1)
        self.epoch = 0  # bumped on every change of state, so a probe can tell it is stale
        self.listeners: list[Callable[[Change], None]] = []

    @property
    def phase(self) -> str:
        return self.engine.phase

    @property
    def calls(self) -> int:
        """Phase-changing control calls in flight."""
        return len(self.open)

    def elapsed(self) -> float:
        return time.monotonic() - self.since

    def _tell(self, kind: Literal["engine", "version", "down"], before: str) -> None:
        for listener in self.listeners:
            listener(Change(kind, before))

    # -- transitions --------------------------------------------------------------------------
    def set(self, engine: Engine, why: str) -> None:
        if engine == self.engine:
            return
        old, self.engine = self.engine.phase, engine
        self.epoch += 1
        if engine.phase != old:
            took = self.elapsed()
            self.durations.record(old, took)
            if self.role.leads:
                self.metrics.phase_duration.labels(old).observe(took)
            self.since, self.since_wall = time.monotonic(), time.time()
            self.metrics.state.phase = engine.phase
            log.info("engine %s -> %s after %.1fs (%s)", old, engine.phase, took, why)
            self.long = self.metrics.state.long = False
        self._tell("engine", old)

    def mark_long(self, now: str) -> bool:
        """The phase `now` lasted past --phase-long-after: true if it is still the phase."""
        if self.engine.phase != now:
            return False
        self.long = self.metrics.state.long = True
        return True

    def engine_down(self, why: str | None) -> None:
        """vLLM refused or reset a connection (`why`), or is back (None). Requests held for a
        phase then end at once: a dead engine's phase never ends by itself."""
        if why == self.down:
            return
        if why is not None and self.role.leads:
            log.warning("vLLM is down while the engine is %s: %s", self.phase, why)
        self._restarted = why is None and self.down is not None
        self.down = why
        self._tell("down", self.phase)

    def set_version(self, version: str | None, by: str = VLLM) -> None:
        """The engine's weight version, as vLLM reports it; `by`: who named it (history.py).
        The first after vLLM came back starts the history anew, even if it is the same."""
        if version is None:
            return
        if self._restarted:
            self._restarted = False
            self.history.add(version, RESTART)
        if version == self.version:
            return
        log.info("weight version %s -> %s", self.version, version)
        if self.history.newest != version:
            self.history.add(version, by)
        self.version = self.metrics.state.version = version
        self.metrics.state.version_changed = time.time()
        self._tell("version", self.phase)

    def snapshot(self) -> Snapshot:
        return Snapshot(self.engine, self.version, self.down, tuple(self.history.updates))

    def follow(self, snap: Snapshot) -> None:
        """Take the pod's state as the supervisor sent it (a worker's)."""
        self.set(snap.engine, "the pod's phase")
        self.set_version(snap.version)
        self.engine_down(snap.down)
        self._restarted = False  # the lead's history says what a restart did
        self.history = History(snap.history)

    # -- the steps of a control call, taken where the pod's state is kept ---------------------
    def enter(self, path: str) -> Call:
        """The call is sent: enter its phase."""
        before = self.engine
        self.set(phase.on_send(before, path), f"{path} sent")
        call = next(self._numbers)
        self.open[call] = (before, self.engine)
        return call

    def leave(self, call: Call) -> None:
        """The call's caller left: its phase stands."""
        self.open.pop(call, None)

    def failed(self, call: Call, path: str) -> None:
        """vLLM refused the call or was not reached: back to the phase before it."""
        before, sent = self.open.pop(call, (self.engine, self.engine))
        if self.engine == sent:  # unless something else changed it meanwhile
            self.set(before, f"{path} failed")

    def answered(self, call: Call, path: str, *, awake: bool, version: str | None) -> None:
        """vLLM answered with success: the version it reports first (requests the phase held
        are released with the new one), then leave the phase."""
        self.open.pop(call, None)
        before = self.version
        named = before is not None and version == next_version(before)
        self.set_version(version, SIDECAR if named else TRAINER)
        self.set(phase.on_answer(self.engine, path, fully_awake=awake), f"{path} answered")
        if rule(path).step == SYNC_END:
            self.updates += 1
            self.metrics.weight_updates.inc()

    # -- what a held request is told ----------------------------------------------------------
    def deadline(self, asked: float | None) -> tuple[float | None, str]:
        """The shorter of the request's own deadline and the pod's, and the name to cite."""
        pod = self.hold_timeout
        if asked is not None and (pod is None or asked <= pod):
            return asked, "X-Sidecar-Hold-Timeout"
        return pod, "--phase-hold-timeout"

    def check_up(self, route: str) -> None:
        """Refuse a held request at once while vLLM is seen down."""
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
