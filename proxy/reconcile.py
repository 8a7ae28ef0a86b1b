"""Keeping the sidecar's phase true to vLLM's: calls made around it, restarts, the version."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator

import aiohttp
from yarl import URL

from .engine_probe import Probe, ProbeFailed
from .lifecycle import Lifecycle
from .phase import reconciled

log = logging.getLogger(__name__)


async def reconcile_once(lifecycle: Lifecycle, probe: Probe, *, restarted: bool) -> bool:
    """Ask vLLM once; False when it could not be asked. A relayed control call in flight, or one
    answered while the probe was out, wins over what the probe read."""
    epoch = lifecycle.epoch
    try:
        busy, version = await asyncio.gather(probe.busy(), probe.weight_version())
    except ProbeFailed as exc:
        log.debug("engine state unknown: %s", exc)
        return False
    if busy is not None and lifecycle.calls == 0 and lifecycle.epoch == epoch:
        now = reconciled(lifecycle.engine, busy=busy, restarted=restarted)
        if now.phase != lifecycle.phase:
            log.warning(
                "engine is %s by vLLM's own flags, not %s: a call made around the sidecar?",
                now.phase,
                lifecycle.phase,
            )
        lifecycle.set(now, "reconciled with vLLM")
    if lifecycle.calls == 0 and lifecycle.epoch == epoch:
        lifecycle.set_version(version)
    return True


async def _loop(lifecycle: Lifecycle, probe: Probe, interval: float) -> None:
    reached = True
    while True:
        # After an unreachable spell vLLM may have restarted: no sync survives that.
        reached = await reconcile_once(lifecycle, probe, restarted=not reached)
        await asyncio.sleep(interval)


@contextlib.asynccontextmanager
async def reconciling(
    lifecycle: Lifecycle, session: aiohttp.ClientSession, base: URL, *, interval: float
) -> AsyncIterator[None]:
    """Probe vLLM every `interval` seconds for as long as the context is open."""
    lifecycle.probe = Probe(session, base, timeout=max(min(interval, 5.0), 1.0))
    task = asyncio.create_task(_loop(lifecycle, lifecycle.probe, interval))
    try:
        yield
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        lifecycle.probe = None
        lifecycle.stalls.stop()
