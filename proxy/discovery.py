"""What the upstream serves and whether it is up: /v1/models and /health, read in the background."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import orjson
from yarl import URL

from .metrics import Metrics
from .resolution import ModelTable, from_names, parse_models_list
from .settings import Settings
from .upstream import UPSTREAM_ERRORS, target

log = logging.getLogger(__name__)


class Discovery:
    """Holds the current model table and upstream health; refreshes both on a schedule."""

    def __init__(self, settings: Settings, metrics: Metrics, base: URL) -> None:
        self._settings = settings
        self._metrics = metrics
        self._base = base
        self.fixed = settings.served_model_names is not None
        self.table = self._table(from_names(settings.served_model_names or ()))
        self.models_known = self.fixed
        self.healthy = False
        self.last_error: str | None = "no health check yet"
        self._session: aiohttp.ClientSession | None = None
        self._refreshing: asyncio.Task[bool] | None = None
        self._last_refresh = -float("inf")
        metrics.upstream_up.set(0)

    def _table(self, served: Any) -> ModelTable:
        s = self._settings
        return ModelTable(served, s.aliases, case_insensitive=s.case_insensitive)

    def _timeout(self) -> aiohttp.ClientTimeout:
        return aiohttp.ClientTimeout(total=max(self._settings.connect_timeout, 5.0))

    async def refresh(self) -> bool:
        """Read /v1/models once; the table is replaced only by a good answer."""
        if self.fixed or self._session is None:
            return self.models_known
        self._last_refresh = time.monotonic()
        url = target(self._base, "/v1/models")
        key = self._settings.upstream_api_key
        headers = {"Authorization": f"Bearer {key}"} if key else None
        try:
            async with self._session.get(url, timeout=self._timeout(), headers=headers) as resp:
                raw = await resp.read()
                if resp.status != 200:
                    raise ValueError(f"status {resp.status}: {raw[:200]!r}")
                served = parse_models_list(orjson.loads(raw))
        except (*UPSTREAM_ERRORS, ValueError) as exc:
            self._metrics.discoveries.labels("error").inc()
            log.warning("model discovery from %s failed: %s", url, exc or type(exc).__name__)
            return False
        if [m.id for m in served] != list(self.table.names):
            log.info("upstream serves %s", ", ".join(m.id for m in served) or "nothing")
        self.table = self._table(served)
        self.models_known = True
        self._metrics.discoveries.labels("ok").inc()
        return True

    async def refresh_on_miss(self) -> None:
        """A name did not resolve: re-read the list at most once per interval, single-flight."""
        if self.fixed or self._session is None:
            return
        if self._refreshing is None or self._refreshing.done():
            if time.monotonic() - self._last_refresh < self._settings.miss_refresh_interval:
                return
            self._refreshing = asyncio.create_task(self.refresh())
        await asyncio.shield(self._refreshing)

    async def check_health(self) -> bool:
        if self._session is None:
            return False
        url = target(self._base, "/health")
        try:
            async with self._session.get(url, timeout=self._timeout()) as resp:
                await resp.read()
                ok, error = resp.status == 200, f"/health answered {resp.status}"
        except UPSTREAM_ERRORS as exc:
            ok, error = False, f"/health failed: {exc or type(exc).__name__}"
        if ok != self.healthy:
            log.log(
                logging.INFO if ok else logging.WARNING,
                "upstream %s: %s",
                "up" if ok else "down",
                "healthy" if ok else error,
            )
        self.healthy, self.last_error = ok, (None if ok else error)
        self._metrics.upstream_up.set(1 if ok else 0)
        return ok

    def readiness(self, *, draining: bool = False) -> tuple[bool, dict[str, Any]]:
        ready = self.healthy and self.models_known and not draining
        reason = (
            "draining"
            if draining
            else self.last_error
            if not self.healthy
            else "served model names not known yet"
            if not self.models_known
            else None
        )
        return ready, {
            "ready": ready,
            "reason": reason,
            "upstream": str(self._base),
            "upstream_healthy": self.healthy,
            "served": list(self.table.names),
        }

    async def _health_loop(self) -> None:
        while True:
            was_healthy = self.healthy
            if await self.check_health() and (not was_healthy or not self.models_known):
                await self.refresh()  # an upstream that came back may serve other names
            await asyncio.sleep(self._settings.health_interval)

    async def _discovery_loop(self) -> None:
        while True:
            await asyncio.sleep(self._settings.discovery_interval)
            await self.refresh()

    @contextlib.asynccontextmanager
    async def running(self, session: aiohttp.ClientSession) -> AsyncIterator[None]:
        """Run the background checks for as long as the context is open."""
        self._session = session
        tasks = [asyncio.create_task(self._health_loop())]
        if not self.fixed:
            tasks.append(asyncio.create_task(self._discovery_loop()))
        try:
            yield
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            self._session = None
