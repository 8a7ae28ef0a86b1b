"""Requests held against the engine: admitted once it serves, counted running while they go
upstream, held again when vLLM rejects one as paused (engine/lifecycle.py wakes them)."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Iterator
from typing import Protocol

from proxy.core import phase
from proxy.core.errors import InvalidRequest, PhaseRefusal
from proxy.core.phase import SERVING
from proxy.observe.engine_metrics import EngineMetrics
from proxy.observe.record import RequestRecord

from .stalls import Stalls
from .state import EngineState

# A client's own deadline for waiting out a phase, in seconds (0: refuse at once).
HOLD_TIMEOUT = "X-Sidecar-Hold-Timeout"


def asked_deadline(value: str | None) -> float | None:
    """The client's own hold deadline (monotonic) from its HOLD_TIMEOUT header, if it set one."""
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
    return time.monotonic() + seconds


class Holds:
    """The data plane's side of the lifecycle: `held` and `running` are written here only."""

    def __init__(
        self, state: EngineState, metrics: EngineMetrics, queue: int, stalls: Stalls
    ) -> None:
        self.state, self.metrics, self.queue, self.stalls = state, metrics, queue, stalls
        self.held = 0
        self._running = 0  # data requests gone upstream: `serving`, `not_running`
        self._wakeup = asyncio.Event()  # replaced on each change: held requests look again

    def wake(self) -> None:
        """The engine's state changed: every held request looks again."""
        self._wakeup.set()
        self._wakeup = asyncio.Event()

    async def until_serving(self, rec: RequestRecord, deadline: float | None = None) -> None:
        """Return once the engine serves. Refuse when vLLM is down, the hold queue is full, or
        a deadline asked for passes: `deadline` (the request's own) or --phase-hold-timeout."""
        state = self.state
        if state.phase == SERVING:
            return
        state.check_up(rec.route)
        limit, flag = state.deadline(deadline)
        if limit == 0:
            raise state.refusal(rec.route, f"{flag} is 0: no request is held")
        if self.queue and self.held >= self.queue:
            why = f"{self.held} requests are held already (--phase-hold-queue)"
            raise state.refusal(rec.route, why)
        self.metrics.requests.labels(state.phase, rec.route, "held").inc()
        since = time.monotonic()
        try:
            with self._holding():
                async with asyncio.timeout(limit):
                    while state.phase != SERVING:
                        state.check_up(rec.route)
                        await self._wakeup.wait()
        except TimeoutError:
            raise state.refusal(rec.route, f"held {limit:.3g}s ({flag})") from None
        finally:
            rec.held += time.monotonic() - since  # the record's (a trace's), never on serving

    def serving(self, held: Held) -> _Serving:
        """Around a data request's upstream call: held until the engine serves (`admit`), then
        counted running until the block ends; `held` learns the version it runs under, or the
        Retry-After of its refusal."""
        return _Serving(self, held)

    @contextlib.contextmanager
    def not_running(self) -> Iterator[None]:
        """A running request held again (vLLM rejected it as paused; a continuation waits for
        its next part): not running meanwhile, so that an update may start."""
        self._running -= 1
        try:
            yield
        finally:
            self._running += 1

    @property
    def running(self) -> int:
        return self._running

    @contextlib.contextmanager
    def _holding(self) -> Iterator[None]:
        """One request held: in `held` and the held gauge for as long as the block runs."""
        self.held += 1
        self.metrics.held.inc()
        try:
            yield
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
            raise self.state.refusal(rec.route, why)
        changed = self._wakeup
        with self._holding(), contextlib.suppress(TimeoutError):
            async with asyncio.timeout(min(0.25 * 2**attempt, 5.0, left or 5.0)):
                await changed.wait()
        await self.until_serving(rec, left)


class Held(Protocol):
    """A data request as the lifecycle holds it (engine/gate.py's `Data`)."""

    rec: RequestRecord
    until: float | None  # the client's own hold deadline (monotonic), if it asked for one
    version: str | None
    retry_after: int | None


class _Serving:
    """`Holds.serving`: a class, not a generator: it is on every completion's path."""

    __slots__ = ("held", "holds")

    def __init__(self, holds: Holds, held: Held) -> None:
        self.holds, self.held = holds, held

    async def __aenter__(self) -> None:
        holds, held = self.holds, self.held
        until = held.until
        try:
            left = None if until is None else max(until - time.monotonic(), 0.0)
            await holds.until_serving(held.rec, left)
        except PhaseRefusal as refusal:
            held.retry_after = refusal.retry_after
            raise
        held.version = holds.state.version
        holds._running += 1

    async def __aexit__(self, *exc_info: object) -> None:
        self.holds._running -= 1
        self.holds.stalls.discard(self.held)
