"""Graceful drain: the handlers in flight, awaited for the grace period, then told to stop.

aiohttp's own shutdown closes each connection right after cancelling its handler, so a stream
cut at the deadline could not say why. Cancelling the handlers here first, while their
connections are still open, lets each stream end with an SSE error event.

The wait covers every request in flight until the deadline, those that arrived after it began
too; once draining, new requests are refused (503 `shutting_down`, `Connection: close`).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable

from aiohttp import web

log = logging.getLogger(__name__)


class InFlight:
    """The handlers in flight, and the draining flag, whose one writer is `begin_draining`."""

    def __init__(self) -> None:
        self.tasks: set[asyncio.Task[object]] = set()
        self._cut: set[asyncio.Task[object]] = set()  # those `drain` cancelled at its deadline
        self._draining = False

    @property
    def draining(self) -> bool:
        """New requests are refused, readiness says so, idle connections close."""
        return self._draining

    def begin_draining(self) -> None:
        self._draining = True

    def add(self) -> asyncio.Task[object] | None:
        task = asyncio.current_task()
        if task is not None:
            self.tasks.add(task)
        return task

    def discard(self, task: asyncio.Task[object] | None) -> None:
        if task is not None:
            self.tasks.discard(task)
            self._cut.discard(task)

    def cut(self, task: asyncio.Task[object] | None) -> bool:
        """Whether `task` was cancelled by the drain's deadline, not by its client hanging up:
        the one place that tells the two apart (each is answered and counted differently)."""
        return task in self._cut

    async def settle(self, grace: float) -> int:
        """Wait up to `grace` seconds until nothing is in flight; how many still are."""
        self.begin_draining()
        loop = asyncio.get_running_loop()
        deadline = loop.time() + grace
        if self.tasks:
            log.info("waiting for %d in-flight requests", len(self.tasks))
        while self.tasks and (left := deadline - loop.time()) > 0:
            await asyncio.wait(set(self.tasks), timeout=left)
        return len(self.tasks)

    async def drain(self, grace: float) -> None:
        """Wait up to `grace` seconds for in-flight handlers, then cancel the rest."""
        if await self.settle(grace):
            log.warning("grace period over: stopping %d requests", len(self.tasks))
            for task in list(self.tasks):
                self._cut.add(task)
                task.cancel()
            await asyncio.wait(set(self.tasks), timeout=5)


# Its slot on an app (aiohttp's typed key, declared beside what it holds).
IN_FLIGHT = web.AppKey("in_flight", InFlight)
# With `--workers N`, the supervisor's: drain every worker, and how many requests were left.
DRAIN: web.AppKey[Callable[[], Awaitable[int]]] = web.AppKey("drain")
