"""Running the sidecar: both listeners, the event loop, signals and the graceful drain."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import signal
import socket
from collections.abc import Coroutine
from typing import Any

from aiohttp import web

from proxy.client import connections
from proxy.client.admin import create_admin_app
from proxy.client.budget import map_large_buffers
from proxy.client.connections import CONNECTIONS
from proxy.client.drain import IN_FLIGHT
from proxy.client.guard import Limits
from proxy.config.settings import Settings
from proxy.observe import logs

from . import dispatch
from .app import create_app

log = logging.getLogger(__name__)


async def serve(
    settings: Settings,
    *,
    stop: asyncio.Event | None = None,
    proxy: web.Application | None = None,
    listen: socket.socket | None = None,
) -> None:
    """Serve until SIGTERM/SIGINT (or `stop`), then drain within the grace period.

    `listen`: a worker's (one of `--workers N`) proxy socket, already listening beside its
    siblings'; the admin port is then the supervisor's."""
    stop = _stopped_by_signals(stop or asyncio.Event())
    proxy = proxy if proxy is not None else create_app(settings)
    conns = proxy[CONNECTIONS]
    conns.limits = _capped(conns.limits)
    runner = _proxy_runner(proxy, settings)
    admin = web.AppRunner(create_admin_app(proxy), access_log=None, handle_signals=False)
    await runner.setup()
    dispatch.install(runner, proxy)
    await admin.setup()
    listener, sweep = None, None
    try:
        listener, sweep = await connections.serve_guarded(
            conns, runner.server, settings.host, settings.port, sock=listen
        )
        if listen is None:
            await web.TCPSite(admin, _admin_host(settings), settings.admin_port).start()
        _announce(settings)
        await flushing_logs_until(stop)
        log.info("stopping: draining in-flight requests for up to %gs", settings.shutdown_grace)
        listener.close()  # refuse new connections; readiness reports draining
        conns.start_draining()
        await proxy[IN_FLIGHT].drain(settings.shutdown_grace)
    finally:
        if sweep is not None:
            sweep.cancel()
        if listener is not None:
            listener.close()
        await runner.cleanup()  # idle connections, then the upstream session
        await admin.cleanup()
    log.info("stopped")
    logs.flush()


def _stopped_by_signals(stop: asyncio.Event) -> asyncio.Event:
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        with contextlib.suppress(NotImplementedError, RuntimeError):
            loop.add_signal_handler(sig, stop.set)
    return stop


def _proxy_runner(proxy: web.Application, settings: Settings) -> web.AppRunner:
    # aiohttp's default leaves a handler running after its client hangs up, and with it the
    # generation on the GPU; cancelling it closes the upstream request, and vLLM aborts.
    return web.AppRunner(
        proxy,
        handler_cancellation=True,
        shutdown_timeout=1.0,
        # aiohttp's own idle limit is an hour; the guard's sweep closes idle connections and
        # counts them, this is only its backstop.
        keepalive_timeout=2 * settings.client_idle_timeout + 1,
        access_log=None,
        handle_signals=False,
    )


def _admin_host(settings: Settings) -> str:
    return settings.admin_host or settings.host


def _announce(settings: Settings) -> None:
    log.info(
        "vllm-sidecar on %s:%d (admin %s:%d) -> %s",
        settings.host,
        settings.port,
        _admin_host(settings),
        settings.admin_port,
        settings.upstream_url,
    )


def _capped(limits: Limits) -> Limits:
    """The connection limit within what the process's descriptors allow, raised first."""
    fds = connections.raise_fd_limit()
    cap = connections.connection_cap(limits.max_connections, fds)
    if cap < limits.max_connections:
        log.warning(
            "open-files limit %d allows %d client connections, not %d",
            fds,
            cap,
            limits.max_connections,
        )
    return dataclasses.replace(limits, max_connections=cap)


async def flushing_logs_until(stop: asyncio.Event, interval: float = 0.5) -> None:
    """Wait for `stop`, writing buffered log lines out every `interval` seconds meanwhile."""
    while not stop.is_set():
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), interval)
        logs.flush()


def run(settings: Settings) -> None:
    run_loop(serve(settings))


def run_loop(main: Coroutine[Any, Any, None]) -> None:
    """Run `main` to completion on uvloop, where it builds."""
    map_large_buffers()
    try:
        import uvloop
    except ImportError:  # pragma: no cover - uvloop is a dependency where it builds
        asyncio.run(main)
    else:
        uvloop.run(main)
