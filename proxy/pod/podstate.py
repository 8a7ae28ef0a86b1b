"""One pod, one view of the upstream: the supervisor's discovery, published to every worker.

With `--workers N` the health check and `/v1/models` reads run once per pod, in the supervisor,
so that N workers neither multiply the upstream's probe traffic nor disagree about the served
names (a worker that had refreshed after a LoRA load would resolve differently from one that
had not). Each change goes to every worker as one JSON line over a socket pair; a worker that
meets an unknown name asks the supervisor to re-read, and gets the answer on the same line.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import socket
from collections.abc import AsyncIterator, Callable
from typing import Any

import aiohttp
import orjson
from yarl import URL

from proxy.config.settings import Settings
from proxy.core.resolution import ServedModel
from proxy.observe.metrics import Metrics
from proxy.upstream.checks import UpstreamChecks
from proxy.upstream.discovery import Discovery, read_bound

log = logging.getLogger("proxy.podstate")  # its name before the layers: kept for filters

Message = dict[str, Any]
LINE_LIMIT = 16 << 20  # the served list and aliases of one upstream; far below this


class Channel:
    """JSON lines both ways over one connected socket; EOF means the other process is gone.

    A message with `ask` wants an answer: the other side sends one with `reply` set to it."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._reader, self._writer = reader, writer
        self._ids = itertools.count(1)
        self._waiting: dict[int, asyncio.Future[Message]] = {}

    @classmethod
    async def open(cls, sock: socket.socket) -> Channel:
        reader, writer = await asyncio.open_unix_connection(sock=sock, limit=LINE_LIMIT)
        return cls(reader, writer)

    def send(self, message: Message) -> None:
        if not self._writer.is_closing():
            self._writer.write(orjson.dumps(message) + b"\n")

    async def receive(self) -> Message | None:
        """The next message; an answer to `ask` also goes to the one waiting for it."""
        line = await self._reader.readline()
        if not line:
            return None
        message: Message = orjson.loads(line)
        waiter = self._waiting.pop(message.get("reply", 0), None)
        if waiter is not None and not waiter.done():
            waiter.set_result(message)
        return message

    async def ask(self, message: Message, *, within: float) -> Message | None:
        """Send `message` and wait for its answer; None when none came `within` seconds."""
        ask_id = next(self._ids)
        answered = self._waiting[ask_id] = asyncio.get_running_loop().create_future()
        self.send({**message, "ask": ask_id})
        try:
            return await asyncio.wait_for(answered, within)
        except TimeoutError:
            return None
        finally:
            self._waiting.pop(ask_id, None)

    def close(self) -> None:
        self._writer.close()


def snapshot(discovery: Discovery) -> Message:
    """What a worker needs to resolve names and report readiness exactly as the supervisor."""
    return {
        "served": [[m.id, m.root] for m in discovery.table.served],
        "models_known": discovery.models_known,
        "healthy": discovery.healthy,
        "last_error": discovery.last_error,
    }


class PodDiscovery(Discovery):
    """The supervisor's: the upstream checks of `Discovery`, each change published through
    `publish`; ready only while a worker serves."""

    def __init__(
        self,
        settings: Settings,
        metrics: Metrics,
        base: URL,
        *,
        publish: Callable[[Message], None],
        live_workers: Callable[[], int],
    ) -> None:
        super().__init__(settings, metrics, base, source=UpstreamChecks, on_change=self._changed)
        self._publish, self._live_workers = publish, live_workers
        self.state = snapshot(self)

    def _changed(self) -> None:
        # Where health changes, also when a check itself failed (discovery's guarded loop).
        state = snapshot(self)
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


def follow(discovery: Discovery, state: Message) -> None:
    """A worker's discovery takes the supervisor's state as it arrives."""
    discovery.mirror(
        [ServedModel(i, r) for i, r in state["served"]],
        known=state["models_known"],
        healthy=state["healthy"],
        error=state["last_error"],
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
        if await self._channel.ask({"miss": True}, within=within) is None:
            log.warning("the supervisor did not answer a refresh request in time")
        return self._discovery.models_known

    @contextlib.asynccontextmanager
    async def running(self, session: aiohttp.ClientSession) -> AsyncIterator[None]:
        yield  # the supervisor runs the checks; the worker applies them (`worker.follow`)
