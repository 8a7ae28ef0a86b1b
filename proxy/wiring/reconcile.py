"""Keeping the sidecar's phase true to vLLM's (calls made around it, restarts, the version):
the engine's state, read from vLLM by the upstream's probe, joined here."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator

import aiohttp
from yarl import URL

from proxy.core.phase import reconciled
from proxy.engine.lifecycle import Lifecycle
from proxy.engine.state import EngineState
from proxy.upstream.engine_probe import Lenient, Probe, ProbeFailed
from proxy.upstream.options import UpstreamOptions

log = logging.getLogger(__name__)


# What one probe of vLLM found: its flags, no dev-mode routes, too slow to answer, or down.
READ, NO_DEV, SLOW, DOWN = "read", "no_dev", "slow", "down"
# Each probed route, the feature the sidecar loses where vLLM lacks it (0.20 lacks all three;
# 0.32 has them in dev mode only), and what that costs.
FEATURES = {
    "/is_paused": ("pause_state", "pauses made around the sidecar"),
    "/is_sleeping": ("sleep_state", "sleeps made around the sidecar"),
    "/weight_info": ("weight_versions", "weight versions (every lag counts `unknown`)"),
}


def lacking(missing: set[str]) -> str | None:
    """The one line that says what vLLM cannot support, from the routes it answered with 404."""
    if not missing:
        return None
    routes = [r for r in FEATURES if r in missing]
    costs = "; ".join(FEATURES[r][1] for r in routes)
    return (
        f"vLLM answers 404 for {', '.join(routes)} (an older vLLM, or no VLLM_SERVER_DEV_MODE=1):"
        f" the sidecar cannot see {costs}"
    )


async def reconcile_once(state: EngineState, probe: Probe, *, restarted: bool) -> str:
    """Ask vLLM once. A relayed control call in flight, or one answered while the probe was
    out, wins over what the probe read. A refused or reset connection marks vLLM down (held
    requests end at once); a timeout changes nothing: vLLM is slow during weight updates."""
    epoch = state.epoch
    try:
        busy, version = await asyncio.gather(probe.busy(), probe.weight_version())
    except ProbeFailed as exc:
        log.debug("engine state unknown: %s", exc)
        if exc.timed_out:
            return SLOW
        state.engine_down(str(exc))
        return DOWN
    state.engine_down(None)
    if busy is not None and state.calls == 0 and state.epoch == epoch:
        now = reconciled(state.engine, busy=busy, restarted=restarted)
        if now.phase != state.phase:
            log.warning(
                "engine is %s by vLLM's own flags, not %s: a call made around the sidecar?",
                now.phase,
                state.phase,
            )
        state.set(now, "reconciled with vLLM")
    if state.calls == 0 and state.epoch == epoch:
        state.set_version(version)
    return NO_DEV if busy is None and version is None else READ


def _report(lifecycle: Lifecycle, missing: set[str], told: set[str] | None) -> set[str]:
    """Say what vLLM lacks once, at start-up and again only when that changes (a restart)."""
    if missing != told:
        line = lacking(missing)
        if line is not None:
            log.warning("%s", line)
        elif told:
            log.info("vLLM now answers %s", ", ".join(sorted(told)))
        for route, (feature, _) in FEATURES.items():
            lifecycle.metrics.upstream_lacks.labels(feature).set(float(route in missing))
    return set(missing)


async def _loop(lifecycle: Lifecycle, probe: Probe, interval: float, idle: float) -> None:
    down, told = False, None
    while True:
        # After a spell of refused connections vLLM may have restarted: no sync survives
        # that. A timeout is not such a spell: vLLM is slow while it loads weights.
        found = await reconcile_once(lifecycle.state, probe, restarted=down)
        if found != SLOW:
            down = found == DOWN
        if found in (READ, NO_DEV):
            told = _report(lifecycle, probe.missing, told)
        # Without dev mode every probe is a 404 in vLLM's log: ask again only now and then.
        await asyncio.sleep(idle if found == NO_DEV else interval)


@contextlib.asynccontextmanager
async def reconciling(
    lifecycle: Lifecycle, session: aiohttp.ClientSession, base: URL, settings: UpstreamOptions
) -> AsyncIterator[None]:
    """Probe vLLM every --health-interval (every --discovery-interval while it has no dev-mode
    routes) for as long as the context is open."""
    interval = settings.health_interval
    idle = max(settings.discovery_interval, interval)
    probe = Probe(session, base, timeout=max(min(interval, 5.0), 1.0))
    lifecycle.probe = Lenient(probe)
    task = asyncio.create_task(_loop(lifecycle, probe, interval, idle))
    try:
        yield
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        lifecycle.probe = None
        lifecycle.stalls.stop()
