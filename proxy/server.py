"""Running the sidecar: both listeners, the event loop, signals and the graceful drain."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import socket
from collections.abc import Coroutine
from typing import Any

from aiohttp import web

from . import logs
from .admin import create_admin_app
from .app import create_app
from .keys import IN_FLIGHT
from .settings import Settings

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
    stop = stop or asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        with contextlib.suppress(NotImplementedError, RuntimeError):
            loop.add_signal_handler(sig, stop.set)
    proxy = proxy if proxy is not None else create_app(settings)
    # aiohttp's default leaves a handler running after its client hangs up, and with it the
    # generation on the GPU; cancelling it closes the upstream request, and vLLM aborts.
    runner = web.AppRunner(
        proxy,
        handler_cancellation=True,
        shutdown_timeout=1.0,
        access_log=None,
        handle_signals=False,
    )
    admin = web.AppRunner(create_admin_app(proxy), access_log=None, handle_signals=False)
    await runner.setup()
    await admin.setup()
    site: web.BaseSite = (
        web.SockSite(runner, listen, backlog=1024)
        if listen is not None
        else web.TCPSite(runner, settings.host, settings.port, backlog=1024)
    )
    try:
        await site.start()
        if listen is None:
            await web.TCPSite(admin, settings.host, settings.admin_port).start()
        log.info(
            "vllm-sidecar on %s:%d (admin %d) -> %s",
            settings.host,
            settings.port,
            settings.admin_port,
            settings.upstream_url,
        )
        await _flushing_logs_until(stop)
        log.info("stopping: draining in-flight requests for up to %gs", settings.shutdown_grace)
        await site.stop()  # refuse new connections; readiness reports draining
        await proxy[IN_FLIGHT].drain(settings.shutdown_grace)
    finally:
        await runner.cleanup()  # idle connections, then the upstream session
        await admin.cleanup()
    log.info("stopped")
    logs.flush()


async def _flushing_logs_until(stop: asyncio.Event, interval: float = 0.5) -> None:
    """Wait for `stop`, writing buffered log lines out every `interval` seconds meanwhile."""
    while not stop.is_set():
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), interval)
        logs.flush()


def run(settings: Settings) -> None:
    run_loop(serve(settings))


def run_loop(main: Coroutine[Any, Any, None]) -> None:
    """Run `main` to completion on uvloop, where it builds."""
    try:
        import uvloop
    except ImportError:  # pragma: no cover - uvloop is a dependency where it builds
        asyncio.run(main)
    else:
        uvloop.run(main)
