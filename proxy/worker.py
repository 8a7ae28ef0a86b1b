"""One of `--workers N`: `python -m proxy.worker FD`, started by the supervisor (`supervisor`).

Settings and the pod's discovery state arrive on the socket FD; the worker serves the proxy
port beside its siblings (SO_REUSEPORT), with its own event loop and upstream pool, and stops
(draining like a single sidecar) on SIGTERM or when the supervisor goes away.
"""

from __future__ import annotations

import asyncio
import os
import socket
import sys

from prometheus_client import CollectorRegistry

from . import logs, server
from .app import create_app
from .keys import DISCOVERY
from .podstate import Channel, FollowerDiscovery
from .settings import Settings
from .workers import shared_socket


async def main(sock: socket.socket) -> None:
    channel = await Channel.open(sock)
    hello = await channel.receive()
    if hello is None:  # the supervisor died before it said anything
        return
    settings = Settings.model_validate(hello["settings"])
    logs.setup(settings.log_level, settings.log_format, access_log=settings.access_log, shared=True)
    # The samples land in this process's files in the pod's multiprocess directory, which the
    # supervisor's /metrics merges; this registry itself is never exported.
    app = create_app(
        settings,
        registry=CollectorRegistry(),
        discovery=lambda s, m, b: FollowerDiscovery(s, m, b, channel),
    )
    follower = app[DISCOVERY]
    assert isinstance(follower, FollowerDiscovery)
    follower.apply(hello["state"])
    stop = asyncio.Event()
    following = asyncio.create_task(follower.follow())
    following.add_done_callback(lambda _: stop.set())
    listening = shared_socket(settings.host, settings.port, listen=True)
    channel.send({"listening": os.getpid()})
    try:
        await server.serve(settings, stop=stop, proxy=app, listen=listening)
    finally:
        following.cancel()
        channel.close()


def run() -> None:
    sock = socket.socket(fileno=int(sys.argv[1]))
    os.set_inheritable(sock.fileno(), False)
    server.run_loop(main(sock))


if __name__ == "__main__":
    run()
