"""What the upstream serves and whether it is up, as this process knows it (a source reads)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import AbstractAsyncContextManager
from typing import Any, Protocol

import aiohttp
from aiohttp import web
from yarl import URL

from proxy.core.envelope import SERVED_SHOWN
from proxy.core.resolution import ModelTable, ServedModel
from proxy.observe.logs import text_field
from proxy.observe.metrics import Metrics

from .options import UpstreamOptions

log = logging.getLogger(__name__)


# Served names logged at most: a server with thousands of adapters would log a line of megabytes.
LOGGED_NAMES = 20


def _listed(names: list[str]) -> str:
    """Served names for the log: each escaped as a client-sent value is (a LoRA adapter's name
    is the upstream's to choose, newline included), and no more than LOGGED_NAMES of them."""
    shown = ", ".join(text_field(n) for n in names[:LOGGED_NAMES]) or "nothing"
    more = len(names) - LOGGED_NAMES
    return f"{shown} and {more} more" if more > 0 else shown


def read_bound(settings: UpstreamOptions) -> float:
    """The bound on each /health or /v1/models read, or on a worker's ask for one."""
    return max(settings.connect_timeout, 5.0)


class Source(Protocol):
    """Where discovery's reads go: to the upstream (`checks.UpstreamChecks`), or, from a worker
    of `--workers N`, to the supervisor that reads for the pod. The one who makes a `Discovery`
    picks it: discovery knows none of them."""

    async def read_models(self) -> bool:
        """Read the served names once; whether they are known now."""
        ...

    def running(self, session: aiohttp.ClientSession) -> AbstractAsyncContextManager[None]:
        """The background checks, for as long as the context is open."""
        ...


class Discovery:
    """Holds the current model table and upstream health, and refreshes the table single-flight;
    the reads themselves are the `source`'s, and each change is told to `on_change`."""

    def __init__(
        self,
        settings: UpstreamOptions,
        metrics: Metrics,
        base: URL,
        *,
        source: Callable[[Discovery], Source],
        on_change: Callable[[], None] = lambda: None,
    ) -> None:
        self.settings, self.metrics, self.base = settings, metrics, base
        self.fixed = settings.served_model_names is not None
        self.table = self.make_table([ServedModel(n) for n in settings.served_model_names or ()])
        self.models_known = self.fixed
        self.healthy = False
        self.last_error: str | None = "no health check yet"
        self._refreshing: asyncio.Task[bool] | None = None
        self._last_refresh = -float("inf")
        self._on_change = on_change
        # True while a slow /health is expected (a pause, sleep or weight sync, or a control call
        # in flight): the app's lifecycle says. A timeout then is no outage: vLLM's API server
        # answers slowly while it takes in weights, and readiness must not drop for it.
        self.patient: Callable[[], bool] = lambda: False
        metrics.upstream_up.set(0)
        self.source = source(self)

    def make_table(self, served: Sequence[ServedModel]) -> ModelTable:
        s = self.settings
        return ModelTable(served, s.aliases, case_insensitive=s.case_insensitive)

    async def refresh(self) -> bool:
        """Read /v1/models; single-flight: whoever asks while a read is in flight shares it."""
        if self.fixed:
            return self.models_known
        if self._refreshing is None or self._refreshing.done():
            self._last_refresh = time.monotonic()
            self._refreshing = asyncio.create_task(self.source.read_models())
        try:
            return await asyncio.shield(self._refreshing)
        finally:
            self._on_change()

    async def refresh_on_miss(self) -> None:
        """A name did not resolve: join the read in flight, or start one at most once per
        `--miss-refresh-interval`."""
        if self.fixed:
            return
        in_flight = self._refreshing is not None and not self._refreshing.done()
        if (
            in_flight
            or time.monotonic() - self._last_refresh >= self.settings.miss_refresh_interval
        ):
            await self.refresh()

    def set_table(self, table: ModelTable) -> None:
        """What the upstream serves now; the same table where nothing changed."""
        if table is not self.table and table.names != self.table.names:
            log.info("upstream serves %s", _listed(list(table.names)))
        self.table, self.models_known = table, True

    def set_health(self, ok: bool, error: str) -> None:
        if ok != self.healthy:
            log.log(
                logging.INFO if ok else logging.WARNING,
                "upstream %s: %s",
                "up" if ok else "down",
                "healthy" if ok else error,
            )
        self.healthy, self.last_error = ok, (None if ok else error)
        self.metrics.upstream_up.set(1 if ok else 0)
        self._on_change()

    def mirror(
        self, served: Sequence[ServedModel], *, known: bool, healthy: bool, error: str | None
    ) -> None:
        """Take another process's view as it is (a worker's, the supervisor's): no log, no
        change told, since the one that read it did both. A health flip sends the same names
        again: they keep their table (50,001 adapters took a second to index)."""
        if tuple(served) != self.table.served:
            self.table = self.make_table(served)
        self.models_known = known
        self.healthy, self.last_error = healthy, error
        self.metrics.upstream_up.set(1 if healthy else 0)

    def readiness(self, *, draining: bool = False) -> tuple[bool, dict[str, Any]]:
        ready = self.healthy and self.models_known and not draining
        names = self.table.names
        detail: dict[str, Any] = {
            "ready": ready,
            "reason": self._unready_reason(draining),
            "upstream": str(self.base),
            "upstream_healthy": self.healthy,
            "served": list(names[:SERVED_SHOWN]),  # probed every few seconds: GET /models has all
        }
        if len(names) > SERVED_SHOWN:
            detail["served_total"] = len(names)
        return ready, detail

    def _unready_reason(self, draining: bool) -> str | None:
        """Why the sidecar is not ready: draining first, then the upstream's health, then names."""
        if draining:
            return "draining"
        if not self.healthy:
            return self.last_error
        if not self.models_known:
            return "served model names not known yet"
        return None

    @contextlib.asynccontextmanager
    async def running(self, session: aiohttp.ClientSession) -> AsyncIterator[None]:
        """The source's background checks for as long as the context is open."""
        try:
            async with self.source.running(session):
                yield
        finally:
            if self._refreshing is not None:
                self._refreshing.cancel()
                await asyncio.gather(self._refreshing, return_exceptions=True)


# Its slot on an app (aiohttp's typed key, declared beside what it holds).
DISCOVERY = web.AppKey("discovery", Discovery)
