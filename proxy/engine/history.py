"""The weight versions the pod's engine went through: bounded, in order, each with when it took
effect and who named it; what a lag (how many updates behind) is counted against."""

from __future__ import annotations

import itertools
import time
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass

LIMIT = 64  # updates kept: a lag past them is `unknown`, never a guess

# Who named a version: the trainer (its finish named one), the sidecar (the trainer named none:
# core/phase.py's next_version), vLLM (read from it with no update seen through the sidecar: the
# first read, an update made around the sidecar), or a restart (vLLM came back after it was
# seen down: what came before is gone, and so is its history).
TRAINER, SIDECAR, VLLM, RESTART = "trainer", "sidecar", "vllm", "restart"


@dataclass(frozen=True, slots=True)
class Update:
    """One version taking effect: its place in the history (from 0, never reused), the wall
    time, who named it."""

    index: int
    version: str
    at: float
    by: str


class History:
    """The last LIMIT versions, oldest first. Indexes keep counting across a restart, so a lag
    is only ever taken between versions of one history."""

    def __init__(self, updates: Iterable[Update] = ()) -> None:
        self.updates: deque[Update] = deque(updates, maxlen=LIMIT)
        last = self.updates[-1].index + 1 if self.updates else 0
        self._indexes = itertools.count(last)
        self._position: dict[str, int] | None = None

    def add(self, version: str, by: str, at: float | None = None) -> None:
        if by == RESTART:
            self.updates.clear()
        self.updates.append(
            Update(next(self._indexes), version, time.time() if at is None else at, by)
        )
        self._position = None

    @property
    def newest(self) -> str | None:
        return self.updates[-1].version if self.updates else None

    def position(self) -> dict[str, int]:
        """Each version's index (a version named twice: its latest), built once a change."""
        if self._position is None:
            self._position = {u.version: u.index for u in self.updates}
        return self._position

    def describe(self) -> list[dict[str, object]]:
        """As `GET :8081/engine` shows it."""
        return [
            {"index": u.index, "version": u.version, "at": round(u.at, 3), "by": u.by}
            for u in self.updates
        ]
