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
import logging
from collections.abc import AsyncIterator, Callable

from aiohttp import web

from proxy.core import control, phase
from proxy.core.errors import Interrupted, Unauthorized
from proxy.core.phase import SERVING
from proxy.core.routes import SYNC_START, rule
from proxy.observe.engine_metrics import EngineMetrics
from proxy.observe.record import RequestRecord

from .holds import Holds
from .stalls import MIN_QUIET, Stalls
from .state import ALONE, Change, EngineState, Role
from .steps import Flags, LocalSteps, Steps

log = logging.getLogger(__name__)


class Lifecycle:
    """The gate data-plane requests pass: held while the engine's state (`state`) does not
    serve, released on its changes; control calls move that state through `steps`.

    `role` says what this copy does besides (`state.Role`); `relay`, a worker's of `--workers
    N`, takes the steps elsewhere (the supervisor) instead of here."""

    def __init__(
        self,
        metrics: EngineMetrics,
        *,
        hold_timeout: float | None,
        hold_queue: int,
        token: bytes | None,
        long_after: float = 600.0,
        role: Role = ALONE,
        relay: Callable[[EngineState], Steps] | None = None,
    ) -> None:
        self.metrics = metrics
        self.hold_queue, self.token, self.long_after = hold_queue, token, long_after
        self.state = EngineState(metrics, hold_timeout=hold_timeout, role=role)
        self.state.listeners.append(self._changed)
        self.probe: Flags | None = None  # reconciling's, while it runs (the lead's only)
        self.steps: Steps = (
            LocalSteps(self.state, lambda: self.probe) if relay is None else relay(self.state)
        )
        self.cuts = 0  # abort-mode pauses and sleeps sent: what a continuation asks (client/)
        self._long_timer: asyncio.TimerHandle | None = None
        self.stalls = Stalls()
        self.holds = Holds(self.state, metrics, hold_queue, self.stalls)

    @property
    def role(self) -> Role:
        return self.state.role

    @property
    def phase(self) -> str:
        return self.state.phase

    @property
    def version(self) -> str | None:
        return self.state.version

    @property
    def hold_timeout(self) -> float | None:
        return self.state.hold_timeout

    def _changed(self, change: Change) -> None:
        """The state changed: time a new phase, release held requests to look again, and
        watch or stop watching the streams a phase may stall."""
        if change.kind == "version":
            return
        now = self.state.phase
        if now != change.before:
            self._watch_length(now)
        self.holds.wake()
        if change.kind != "engine":
            return
        if now == SERVING:
            self.stalls.stop()
        elif change.before == SERVING and self.hold_timeout is not None:
            # Only a deadline someone asked for ends a frozen stream; vLLM alone keeps it open.
            self.stalls.start(asyncio.get_running_loop().create_task(self._sweep()))

    def _watch_length(self, now: str) -> None:
        """A phase that lasts past --phase-long-after is logged, shown and alerted on; it fails
        no request by itself (a weight sync of a large model takes minutes)."""
        if self._long_timer is not None:
            self._long_timer.cancel()
            self._long_timer = None
        if now != SERVING and self.role.leads:
            loop = asyncio.get_running_loop()
            self._long_timer = loop.call_later(self.long_after, self._lasted_long, now)

    def _lasted_long(self, now: str) -> None:
        self._long_timer = None
        if self.state.mark_long(now):
            log.warning(
                "engine %s for %.0fs (--phase-long-after %g): a trainer that died between its"
                " calls, or a sync that hangs? Held requests: %d",
                now,
                self.state.elapsed(),
                self.long_after,
                self.held,
            )

    # -- the data plane: holds.py ----------------------------------------------------------
    @property
    def held(self) -> int:
        return self.holds.held

    @property
    def running(self) -> int:
        return self.holds.running

    async def _sweep(self) -> None:
        """While the engine does not serve, end the streams that stay silent for the deadline."""
        quiet = max(self.hold_timeout or 0.0, MIN_QUIET)
        while True:
            before = self.stalls.received()
            await asyncio.sleep(quiet)
            for route, resp in self.stalls.stalled(before):
                why = f"it received nothing for {quiet:g}s (--phase-hold-timeout)"
                self.stalls.cut(resp, Interrupted(self.state.refusal(route, why, outcome="cut")))

    def count_abort(self, route: str) -> None:
        self.metrics.requests.labels(self.state.phase, route, "aborted").inc()

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
        route = rule(path)
        if route.step is None and not route.versions:
            yield
            return
        self._warn_unpaused(path)
        if phase.cuts_running(path, query):
            self.cuts += 1  # before vLLM aborts anything: the aborts are this call's
        steps = self.steps
        call = await steps.enter(path)
        try:
            yield
        except asyncio.CancelledError:
            # The caller hung up: vLLM may have acted on the call anyway. The entered phase
            # stands (the safe side) until vLLM's own flags settle it.
            log.warning("%s: the caller left before vLLM answered; phase %s kept", path, self.phase)
            steps.leave(call)
            raise
        except Exception:
            await steps.failed(call, path)  # vLLM was not reached, or broke off
            raise
        if not 200 <= rec.status < 300:
            await steps.failed(call, path)
            return
        await steps.answered(call, path, query)

    def _warn_unpaused(self, path: str) -> None:
        """Requests running into an update outside any pause or sleep: that crashed vLLM."""
        unpaused = self.state.engine.base == SERVING and self.running
        if rule(path).step == SYNC_START and unpaused:
            self.metrics.unpaused_sync.inc(self.running)
            log.warning(
                "%s with %d requests running: pause the engine before updating weights "
                "(an update under traffic crashed vLLM)",
                path,
                self.running,
            )

    def describe(self) -> dict[str, object]:
        state, serves = self.state, self.role.serves
        return {
            "phase": state.phase,
            "paused_or_asleep": state.engine.base,
            "weight_sync": state.engine.syncing,
            "since": state.since_wall,
            "seconds": round(state.elapsed(), 3),
            "weight_version": state.version,
            "weight_updates": state.updates,
            "weight_versions": state.history.describe(),
            # A pod lead's requests are its workers': summed in vllm_sidecar_held_requests.
            "held_requests": self.held if serves else None,
            "running_requests": self.running if serves else None,
            "long": state.long,
            "engine_down": state.down,
            "phase_hold_timeout": self.hold_timeout,
            "phase_long_after": self.long_after,
            "control_token": self.token is not None,
        }


# Its slot on an app (aiohttp's typed key, declared beside what it holds).
LIFECYCLE = web.AppKey("lifecycle", Lifecycle)
