"""The engine's phase as pure data: what each control call does to it, and how long phases last."""

from __future__ import annotations

import math
import statistics
from collections import deque
from dataclasses import dataclass, field, replace
from urllib.parse import parse_qs

from .routes import PAUSE, RESUME, SLEEP, SYNC_END, SYNC_START, WAKE_UP, rule

SERVING, PAUSED, SLEEPING, WEIGHT_SYNC = "serving", "paused", "sleeping", "weight_sync"
PHASES = (SERVING, PAUSED, SLEEPING, WEIGHT_SYNC)


@dataclass(frozen=True, slots=True)
class Engine:
    """What the engine is doing: serving, paused or asleep, and whether weights are being synced.

    A weight sync normally runs inside a pause (SkyRL: pause, start, update, finish, resume), so
    the two are kept apart: when the sync finishes the engine is still paused.
    """

    base: str = SERVING
    syncing: bool = False

    @property
    def phase(self) -> str:
        return WEIGHT_SYNC if self.syncing else self.base


def on_send(engine: Engine, path: str) -> Engine:
    """The phase a control call enters as soon as it is sent (its step: routes.py's row).

    vLLM aborts running requests before it answers /pause or /sleep, so the aborted streams end
    while the call is still open: they must already count as the pause's.
    """
    step = rule(path).step
    if step == PAUSE and engine.base != SLEEPING:
        return replace(engine, base=PAUSED)
    if step == SLEEP:
        return replace(engine, base=SLEEPING)
    if step == SYNC_START:
        return replace(engine, syncing=True)
    return engine


def on_answer(engine: Engine, path: str, *, fully_awake: bool = True) -> Engine:
    """The phase a control call leaves for once vLLM answered it with success.

    Leaving a phase waits for the answer: a held request released on /resume's send could reach
    vLLM before it resumed. `fully_awake` is false after a /wake_up that woke only some tags.
    """
    step = rule(path).step
    if step == RESUME and engine.base == PAUSED:
        return replace(engine, base=SERVING)
    if step == WAKE_UP and fully_awake:
        return replace(engine, base=SERVING)
    if step == SYNC_END:
        return replace(engine, syncing=False)
    return engine


def cuts_running(path: str, query: str) -> bool:
    """A pause or sleep in abort mode (vLLM's default for both): vLLM ends every running
    request with `finish_reason: "abort"` before it answers; `keep` and `wait` end none."""
    if rule(path).step not in (PAUSE, SLEEP):
        return False
    modes = parse_qs(query).get("mode") or ["abort"]
    return modes[-1] == "abort"


def next_version(current: str) -> str:
    """The version of a finished update whose caller named none: `default` -> `default+1` ->
    `default+2`; any other name gets `+1`. Every sidecar of a fleet that saw the same updates
    names them alike."""
    base, plus, count = current.rpartition("+")
    if plus and count.isdigit():
        return f"{base}+{int(count) + 1}"
    return f"{current}+1"


def reconciled(engine: Engine, *, busy: bool, restarted: bool) -> Engine:
    """The phase once vLLM's own flags are known (`busy`: /is_paused or /is_sleeping is true).

    The flags cannot tell a pause from a sleep (both are true in either), so a pause made around
    the sidecar is taken for a pause. vLLM has no flag for a weight sync: one is only cleared by
    its finish, or by a restart (an engine that comes back is not syncing).
    """
    syncing = engine.syncing and not restarted
    if busy and engine.base == SERVING:
        return Engine(PAUSED, syncing)
    if not busy and engine.base != SERVING:
        return Engine(SERVING, syncing)
    return Engine(engine.base, syncing)


@dataclass(slots=True)
class Durations:
    """How long each phase lasted the last few times: the basis of Retry-After."""

    keep: int = 16
    recent: dict[str, deque[float]] = field(default_factory=dict)

    def record(self, phase: str, seconds: float) -> None:
        self.recent.setdefault(phase, deque(maxlen=self.keep)).append(seconds)

    def retry_after(self, phase: str, elapsed: float, *, cap: float = 3600.0) -> int:
        """Whole seconds until `phase`, `elapsed` seconds old, typically ends; at least 1.

        The median of recent durations: one sync that took ten minutes should not make every
        client wait ten minutes next time.
        """
        past = self.recent.get(phase)
        if not past:
            return 1
        left = statistics.median(past) - elapsed
        return int(min(max(math.ceil(left), 1), cap))
