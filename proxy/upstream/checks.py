"""Discovery's reads of the upstream itself: /v1/models and /health, the loops that run them."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from typing import Any

import aiohttp
import orjson
from yarl import URL

from proxy.core.resolution import ModelTable, ServedModel, parse_models_list
from proxy.observe.metrics import Metrics

from .discovery import Discovery, read_bound
from .options import UpstreamOptions
from .session import UPSTREAM_ERRORS, target

log = logging.getLogger(__name__)


# /health checks in a row that time out while the engine serves before it counts as down.
SLOW_CHECKS = 3
# A /v1/models body this large is read into a table in a thread: thousands of LoRA adapters
# make megabytes, re-read every --discovery-interval, and 50,001 of them (22 MB) took the loop
# over a second to parse and index. Every read is new bytes: vLLM stamps each with the time and
# fresh permission ids, so what is compared is the served list, not the body.
READ_OFF_LOOP = 1 << 20


def table_from(
    raw: bytes, current: ModelTable, make: Callable[[Sequence[ServedModel]], ModelTable]
) -> ModelTable:
    """The table a /v1/models body describes: `current` itself when it serves the same names
    from the same roots (its indexes and suggestion caches kept), else a new one."""
    served = tuple(parse_models_list(orjson.loads(raw)))
    return current if served == current.served else make(served)


class UpstreamChecks:
    """The `Source` of one process and of the supervisor: reads the upstream for `discovery`."""

    # The upstream session, given by `running`: the app's cleanup context opens both, and
    # requests (the only other callers) come and go inside it.
    _session: aiohttp.ClientSession

    def __init__(self, discovery: Discovery) -> None:
        self._discovery = discovery
        self._reads = self._applied = 0  # reads of /v1/models started; the one the table is from
        self._slow = 0  # /health checks in a row that timed out while serving

    def _timeout(self) -> aiohttp.ClientTimeout:
        return aiohttp.ClientTimeout(total=read_bound(self._discovery.settings))

    async def read_models(self) -> bool:
        """The table is replaced only by a good answer, and never by an answer older than the
        one it holds (each read is numbered when it starts, and checked once it is parsed)."""
        d = self._discovery
        self._reads += 1
        number = self._reads
        url = target(d.base, "/v1/models")
        key = d.settings.upstream_api_key
        headers = {"Authorization": f"Bearer {key}"} if key else None
        try:
            async with self._session.get(url, timeout=self._timeout(), headers=headers) as resp:
                raw = await resp.read()
                if resp.status != 200:
                    raise ValueError(f"status {resp.status}: {raw[:200]!r}")
            if len(raw) < READ_OFF_LOOP:
                table = table_from(raw, d.table, d.make_table)
            else:
                table = await asyncio.to_thread(table_from, raw, d.table, d.make_table)
        except Exception as exc:  # whatever it was, the read failed and the old table stays
            d.metrics.discoveries.labels("error").inc()
            expected = isinstance(exc, (*UPSTREAM_ERRORS, ValueError))
            log.warning(
                "model discovery from %s failed: %s",
                url,
                exc or type(exc).__name__,
                exc_info=None if expected else exc,
            )
            return False
        if number < self._applied:
            return d.models_known
        self._applied = number
        replaced = [d.table]
        d.set_table(table)
        d.metrics.discoveries.labels("ok").inc()
        if len(raw) >= READ_OFF_LOOP and table is not replaced[0]:
            await asyncio.to_thread(replaced.clear)  # freeing its indexes took the loop 50-100 ms
        return True

    async def check_health(self) -> bool:
        d = self._discovery
        url = target(d.base, "/health")
        try:
            async with self._session.get(url, timeout=self._timeout()) as resp:
                await resp.read()
                ok, error = resp.status == 200, f"/health answered {resp.status}"
        except UPSTREAM_ERRORS as exc:
            if isinstance(exc, asyncio.TimeoutError) and d.healthy and self._excused():
                return True
            ok, error = False, f"/health failed: {exc or type(exc).__name__}"
        self._slow = 0
        d.set_health(ok, error)
        return ok

    def _excused(self) -> bool:
        """Whether a /health check that timed out leaves a healthy upstream healthy: always in
        a planned phase, and for the first SLOW_CHECKS - 1 in a row otherwise. A busy vLLM on a
        loaded machine can take longer than a check; a refused connection or an error answer
        is an outage at once, a hung one after SLOW_CHECKS checks."""
        if self._discovery.patient():
            log.info("/health is slow while the engine is busy; still taken as healthy")
            return True
        self._slow += 1
        if self._slow >= SLOW_CHECKS:
            return False
        log.info("/health did not answer in time (%d of %d in a row)", self._slow, SLOW_CHECKS)
        return True

    async def _health_loop(self) -> None:
        while True:
            await self._guarded("health", self._health_step)
            await asyncio.sleep(self._discovery.settings.health_interval)

    async def _health_step(self) -> None:
        d = self._discovery
        was_healthy = d.healthy
        if await self.check_health() and (not was_healthy or not d.models_known):
            await d.refresh()  # an upstream that came back may serve other names

    async def _discovery_loop(self) -> None:
        while True:
            await asyncio.sleep(self._discovery.settings.discovery_interval)
            await self._guarded("discovery", self._discovery.refresh)

    async def _guarded(self, task: str, step: Callable[[], Awaitable[object]]) -> None:
        """One round of a background loop, bounded in time. A failure is logged, counted and
        survived: a loop that died would freeze readiness and `upstream_up` where they were."""
        d = self._discovery
        try:
            # Not wait_for: on 3.11 it swallows a cancellation that meets a finished step,
            # and the loop would outlive the app (seen as a hang at shutdown).
            async with asyncio.timeout(2 * read_bound(d.settings) + 1):  # a health check, a read
                await step()
        except Exception as exc:  # TimeoutError too
            d.metrics.background_errors.labels(task).inc()
            log.error("the %s check failed: %r", task, exc, exc_info=exc)
            if task == "health":
                d.set_health(False, f"the health check failed: {exc!r}")

    @contextlib.asynccontextmanager
    async def running(self, session: aiohttp.ClientSession) -> AsyncIterator[None]:
        """Run the background checks for as long as the context is open."""
        self._session = session
        tasks: list[asyncio.Task[Any]] = [asyncio.create_task(self._health_loop())]
        if not self._discovery.fixed:
            tasks.append(asyncio.create_task(self._discovery_loop()))
        try:
            yield
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)


def checked_discovery(settings: UpstreamOptions, metrics: Metrics, base: URL) -> Discovery:
    """The discovery of a process that reads the upstream itself: one sidecar's."""
    return Discovery(settings, metrics, base, source=UpstreamChecks)
