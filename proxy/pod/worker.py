"""One of `--workers N`: `python -m proxy.pod.worker FD`, started by the supervisor (`supervisor`).

Settings and the pod's discovery and engine state arrive on the socket FD; the worker serves the
proxy port beside its siblings (SO_REUSEPORT), with its own event loop and upstream pool, and
stops (draining like a single sidecar) on SIGTERM or when the supervisor goes away.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import sys
from typing import Any

from aiohttp import web
from prometheus_client import CollectorRegistry
from yarl import URL

from proxy.client.connections import CONNECTIONS
from proxy.client.drain import IN_FLIGHT
from proxy.config.settings import SETTINGS, Settings
from proxy.engine.lifecycle import Lifecycle
from proxy.engine.state import FOLLOWER, EngineState
from proxy.observe import logs
from proxy.observe.engine_metrics import EngineMetrics
from proxy.observe.metrics import Metrics
from proxy.upstream.discovery import Discovery
from proxy.wiring import server
from proxy.wiring.app import create_app

from .channel import Channel
from .messages import (
    DiscoveryChanged,
    Drain,
    Drained,
    EngineChanged,
    Entered,
    Frame,
    Hello,
    Listening,
    StepTaken,
)
from .poddiscovery import AskSupervisor
from .poddiscovery import follow as follow_discovery
from .podlifecycle import RemoteSteps
from .port import shared_socket

log = logging.getLogger(__name__)


class Mirror:
    """A worker's copy of the pod's state: the discovery and engine state `create_app` makes
    through its factories, kept in step with the supervisor's messages."""

    discovery: Discovery
    engine: EngineState

    def __init__(self, channel: Channel) -> None:
        self._channel = channel

    def make_discovery(self, settings: Settings, metrics: Metrics, base: URL) -> Discovery:
        self.discovery = Discovery(settings, metrics, base, source=self._ask)
        return self.discovery

    def _ask(self, discovery: Discovery) -> AskSupervisor:
        return AskSupervisor(discovery, self._channel)

    def make_lifecycle(self, metrics: EngineMetrics, **kwargs: Any) -> Lifecycle:
        lifecycle = Lifecycle(metrics, role=FOLLOWER, relay=self._relay, **kwargs)
        self.engine = lifecycle.state
        return lifecycle

    def _relay(self, state: EngineState) -> RemoteSteps:
        return RemoteSteps(state, self._channel)

    def start(self, hello: Hello) -> None:
        """The pod's state as this worker starts."""
        follow_discovery(self.discovery, hello.discovery)
        self.engine.follow(hello.engine)


async def main(sock: socket.socket) -> None:
    channel = await Channel.open(sock)
    first = await channel.receive()
    if first is None:  # the supervisor died before it said anything
        return
    if not isinstance(hello := first.message, Hello):
        log.error("the supervisor's first message was %s, not its Hello", type(hello).__name__)
        return
    settings = hello.settings
    logs.setup(settings.log_level, settings.log_format, access_log=settings.access_log, shared=True)
    mirror = Mirror(channel)
    # The samples land in this process's files in the pod's multiprocess directory, which the
    # supervisor's /metrics merges; this registry itself is never exported.
    app = create_app(
        settings,
        registry=CollectorRegistry(),
        discovery=mirror.make_discovery,
        lifecycle=mirror.make_lifecycle,
    )
    stop = asyncio.Event()
    mirror.start(hello)
    following = asyncio.create_task(follow(mirror, app, channel))
    following.add_done_callback(lambda _: stop.set())
    listening = shared_socket(settings.host, settings.port, listen=True)
    channel.send(Listening(os.getpid()))
    try:
        await server.serve(settings, stop=stop, proxy=app, listen=listening)
    finally:
        following.cancel()
        channel.close()


async def follow(mirror: Mirror, app: web.Application, channel: Channel) -> None:
    """Apply every state the supervisor sends, and drain when it asks, until it goes away."""
    draining: set[asyncio.Task[None]] = set()
    while (frame := await channel.receive()) is not None:
        match frame.message:
            case DiscoveryChanged(state=state):
                follow_discovery(mirror.discovery, state)
            case EngineChanged(state=snapshot):
                mirror.engine.follow(snapshot)
            case Drain():
                task = asyncio.create_task(_drain(app, channel, frame))
                draining.add(task)
                task.add_done_callback(draining.discard)
            case Entered() | StepTaken():
                pass  # answers, taken by the step that asked (`Channel.ask`)
            case other:
                log.error(
                    "the supervisor sent %s, not a message for a worker", type(other).__name__
                )
    log.warning("the supervisor is gone: this worker stops")


async def _drain(app: web.Application, channel: Channel, asked: Frame) -> None:
    """The admin port's `POST /drain`, for this worker: no new requests, those in flight end."""
    app[CONNECTIONS].start_draining()
    left = await app[IN_FLIGHT].settle(app[SETTINGS].shutdown_grace)
    channel.answer(asked, Drained(left))


def run() -> None:
    sock = socket.socket(fileno=int(sys.argv[1]))
    os.set_inheritable(sock.fileno(), False)
    server.run_loop(main(sock))


if __name__ == "__main__":
    run()
