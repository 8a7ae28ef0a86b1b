"""The pod's discovery: read once by the supervisor and published, mirrored by each worker.

With `--workers N` the health check and `/v1/models` reads run once per pod, in the supervisor,
so that N workers neither multiply the upstream's probe traffic nor disagree about the served
names (a worker that had refreshed after a LoRA load would resolve differently from one that
had not). Each change goes to every worker as a `DiscoveryChanged` over its channel; a worker
that meets an unknown name asks the supervisor to re-read (`RefreshModels`), and gets the answer
on the same channel.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import AsyncIterator, Callable
from typing import Any

import aiohttp
from yarl import URL

from proxy.config.settings import Settings
from proxy.observe.metrics import Metrics
from proxy.upstream.checks import UpstreamChecks
from proxy.upstream.discovery import Discovery, read_bound

from .channel import Channel
from .messages import DiscoveryChanged, DiscoveryState, RefreshModels

log = logging.getLogger(__name__)


def state_of(discovery: Discovery) -> DiscoveryState:
    """What a worker needs to resolve names and report readiness exactly as the supervisor."""
    return DiscoveryState(
        discovery.table.served, discovery.models_known, discovery.healthy, discovery.last_error
    )


class PodDiscovery(Discovery):
    """The supervisor's: the upstream checks of `Discovery`, each change published through
    `publish`; ready only while a worker serves."""

    def __init__(
        self,
        settings: Settings,
        metrics: Metrics,
        base: URL,
        *,
        publish: Callable[[DiscoveryState], None],
        live_workers: Callable[[], int],
    ) -> None:
        super().__init__(settings, metrics, base, source=UpstreamChecks, on_change=self._changed)
        self._publish, self._live_workers = publish, live_workers
        self.state = state_of(self)

    def _changed(self) -> None:
        # Where health changes, also when a check itself failed (discovery's guarded loop).
        state = state_of(self)
        if state != self.state:
            self.state = state
            self._publish(state)

    def readiness(self, *, draining: bool = False) -> tuple[bool, dict[str, Any]]:
        ready, detail = super().readiness(draining=draining)
        live = self._live_workers()
        detail["workers"] = live
        if ready and live == 0:
            ready = detail["ready"] = False
            detail["reason"] = "no worker process is serving the proxy port"
        return ready, detail


def follow(discovery: Discovery, state: DiscoveryState) -> None:
    """A worker's discovery takes the supervisor's state as it arrives."""
    discovery.mirror(
        state.served, known=state.models_known, healthy=state.healthy, error=state.last_error
    )


class AskSupervisor:
    """A worker's discovery `Source`: the supervisor reads for the pod; a worker runs no checks
    and, meeting an unknown name, asks the supervisor to re-read (rate-limited pod-wide)."""

    def __init__(self, discovery: Discovery, channel: Channel) -> None:
        self._discovery, self._channel = discovery, channel

    async def read_models(self) -> bool:
        """Ask, and wait: the answer carries the state, applied by `worker.follow` before this
        returns. `refresh` and `refresh_on_miss` stay Discovery's, single-flight as alone."""
        within = read_bound(self._discovery.settings)
        if await self._channel.ask(RefreshModels(), DiscoveryChanged, within=within) is None:
            log.warning("the supervisor did not answer a refresh request in time")
        return self._discovery.models_known

    @contextlib.asynccontextmanager
    async def running(self, session: aiohttp.ClientSession) -> AsyncIterator[None]:
        yield  # the supervisor runs the checks; the worker applies them (`worker.follow`)
