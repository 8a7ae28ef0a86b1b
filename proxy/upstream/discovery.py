"""What the upstream serves and whether it is up: /v1/models and /health, read in the background."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from typing import Any

import aiohttp
import orjson
from aiohttp import web
from yarl import URL

from proxy.config.settings import Settings
from proxy.core.resolution import ModelTable, ServedModel, parse_models_list
from proxy.observe.metrics import Metrics

from .session import UPSTREAM_ERRORS, target

log = logging.getLogger("proxy.discovery")  # its name before the layers: kept for filters


class Discovery:
    """Holds the current model table and upstream health; refreshes both on a schedule."""

    # The upstream session, given by `running`: the app's cleanup context opens both, and
    # requests (the only other callers) come and go inside it.
    _session: aiohttp.ClientSession

    def __init__(self, settings: Settings, metrics: Metrics, base: URL) -> None:
        self._settings = settings
        self._metrics = metrics
        self._base = base
        self.fixed = settings.served_model_names is not None
        self.table = self._table([ServedModel(n) for n in settings.served_model_names or ()])
        self.models_known = self.fixed
        self.healthy = False
        self.last_error: str | None = "no health check yet"
        self._refreshing: asyncio.Task[bool] | None = None
        self._last_refresh = -float("inf")
        self._reads = self._applied = 0  # reads of /v1/models started; the one the table is from
        # True while a slow /health is expected (a pause, sleep or weight sync, or a control call
        # in flight): the app's lifecycle says. A timeout then is no outage: vLLM's API server
        # answers slowly while it takes in weights, and readiness must not drop for it.
        self.patient: Callable[[], bool] = lambda: False
        metrics.upstream_up.set(0)

    def _table(self, served: Sequence[ServedModel]) -> ModelTable:
        s = self._settings
        return ModelTable(served, s.aliases, case_insensitive=s.case_insensitive)

    def _seconds(self) -> float:
        """The bound on each /health or /v1/models read."""
        return max(self._settings.connect_timeout, 5.0)

    def _timeout(self) -> aiohttp.ClientTimeout:
        return aiohttp.ClientTimeout(total=self._seconds())

    async def refresh(self) -> bool:
        """Read /v1/models; single-flight: whoever asks while a read is in flight shares it.

        The table is replaced only by a good answer, and never by an answer older than the
        one it holds (each read is numbered when it starts).
        """
        if self.fixed:
            return self.models_known
        if self._refreshing is None or self._refreshing.done():
            self._refreshing = asyncio.create_task(self._read_models())
        return await asyncio.shield(self._refreshing)

    async def refresh_on_miss(self) -> None:
        """A name did not resolve: join the read in flight, or start one at most once per
        `--miss-refresh-interval`."""
        if self.fixed:
            return
        in_flight = self._refreshing is not None and not self._refreshing.done()
        if (
            in_flight
            or time.monotonic() - self._last_refresh >= self._settings.miss_refresh_interval
        ):
            await self.refresh()

    async def _read_models(self) -> bool:
        self._last_refresh = time.monotonic()
        self._reads += 1
        number = self._reads
        url = target(self._base, "/v1/models")
        key = self._settings.upstream_api_key
        headers = {"Authorization": f"Bearer {key}"} if key else None
        try:
            async with self._session.get(url, timeout=self._timeout(), headers=headers) as resp:
                raw = await resp.read()
                if resp.status != 200:
                    raise ValueError(f"status {resp.status}: {raw[:200]!r}")
                served = parse_models_list(orjson.loads(raw))
        except Exception as exc:  # whatever it was, the read failed and the old table stays
            self._metrics.discoveries.labels("error").inc()
            expected = isinstance(exc, (*UPSTREAM_ERRORS, ValueError))
            log.warning(
                "model discovery from %s failed: %s",
                url,
                exc or type(exc).__name__,
                exc_info=None if expected else exc,
            )
            return False
        if number < self._applied:
            return self.models_known
        self._applied = number
        if [m.id for m in served] != list(self.table.names):
            log.info("upstream serves %s", ", ".join(m.id for m in served) or "nothing")
        self.table = self._table(served)
        self.models_known = True
        self._metrics.discoveries.labels("ok").inc()
        return True

    async def check_health(self) -> bool:
        url = target(self._base, "/health")
        try:
            async with self._session.get(url, timeout=self._timeout()) as resp:
                await resp.read()
                ok, error = resp.status == 200, f"/health answered {resp.status}"
        except UPSTREAM_ERRORS as exc:
            if isinstance(exc, asyncio.TimeoutError) and self.healthy and self.patient():
                log.info("/health is slow while the engine is busy; still taken as healthy")
                return True
            ok, error = False, f"/health failed: {exc or type(exc).__name__}"
        self._set_health(ok, error)
        return ok

    def _set_health(self, ok: bool, error: str) -> None:
        if ok != self.healthy:
            log.log(
                logging.INFO if ok else logging.WARNING,
                "upstream %s: %s",
                "up" if ok else "down",
                "healthy" if ok else error,
            )
        self.healthy, self.last_error = ok, (None if ok else error)
        self._metrics.upstream_up.set(1 if ok else 0)

    def readiness(self, *, draining: bool = False) -> tuple[bool, dict[str, Any]]:
        ready = self.healthy and self.models_known and not draining
        return ready, {
            "ready": ready,
            "reason": self._unready_reason(draining),
            "upstream": str(self._base),
            "upstream_healthy": self.healthy,
            "served": list(self.table.names),
        }

    def _unready_reason(self, draining: bool) -> str | None:
        """Why the sidecar is not ready: draining first, then the upstream's health, then names."""
        if draining:
            return "draining"
        if not self.healthy:
            return self.last_error
        if not self.models_known:
            return "served model names not known yet"
        return None

    async def _health_loop(self) -> None:
        while True:
            await self._guarded("health", self._health_step)
            await asyncio.sleep(self._settings.health_interval)

    async def _health_step(self) -> None:
        was_healthy = self.healthy
        if await self.check_health() and (not was_healthy or not self.models_known):
            await self.refresh()  # an upstream that came back may serve other names

    async def _discovery_loop(self) -> None:
        while True:
            await asyncio.sleep(self._settings.discovery_interval)
            await self._guarded("discovery", self.refresh)

    async def _guarded(self, task: str, step: Callable[[], Awaitable[object]]) -> None:
        """One round of a background loop, bounded in time. A failure is logged, counted and
        survived: a loop that died would freeze readiness and `upstream_up` where they were."""
        try:
            # Not wait_for: on 3.11 it swallows a cancellation that meets a finished step,
            # and the loop would outlive the app (seen as a hang at shutdown).
            async with asyncio.timeout(2 * self._seconds() + 1):  # a health check, a read
                await step()
        except Exception as exc:  # TimeoutError too
            self._metrics.background_errors.labels(task).inc()
            log.error("the %s check failed: %r", task, exc, exc_info=exc)
            if task == "health":
                self._set_health(False, f"the health check failed: {exc!r}")

    @contextlib.asynccontextmanager
    async def running(self, session: aiohttp.ClientSession) -> AsyncIterator[None]:
        """Run the background checks for as long as the context is open."""
        self._session = session
        tasks: list[asyncio.Task[Any]] = [asyncio.create_task(self._health_loop())]
        if not self.fixed:
            tasks.append(asyncio.create_task(self._discovery_loop()))
        try:
            yield
        finally:
            if self._refreshing is not None:
                tasks.append(self._refreshing)
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)


# Its slot on an app (aiohttp's typed key, declared beside what it holds).
DISCOVERY = web.AppKey("discovery", Discovery)
