"""The supervisor of `--workers N`: the pod's workers, admin port, discovery and engine phase.

It starts the workers, restarts the ones that die, serves the pod's admin port, runs discovery
and the engine phase once for all of them, and drains them all on SIGTERM."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import socket
import time
from typing import Any

from aiohttp import web
from prometheus_client import CollectorRegistry
from yarl import URL

from proxy.client.admin import create_admin_app
from proxy.client.drain import DRAIN, IN_FLIGHT
from proxy.config.settings import Settings
from proxy.engine.lifecycle import Lifecycle
from proxy.engine.state import POD_LEAD
from proxy.engine.steps import LocalSteps
from proxy.observe import logs
from proxy.observe.engine_metrics import EngineMetrics
from proxy.observe.metrics import METRICS, Metrics, WorkerMetrics
from proxy.wiring.app import create_app
from proxy.wiring.server import flushing_logs_until

from .channel import Channel
from .messages import (
    Answered,
    DiscoveryChanged,
    DiscoveryState,
    Drain,
    Drained,
    EngineChanged,
    Enter,
    Failed,
    Frame,
    Hello,
    Leave,
    Listening,
    Message,
    RefreshModels,
    encode,
)
from .multiproc import pod_registry, process_gone
from .poddiscovery import PodDiscovery
from .podlifecycle import PodCalls
from .processes import Worker, describe, quick_deaths, restart_delay, start_process

log = logging.getLogger(__name__)

# Past the grace period a worker cancels what is left and exits; this is its time to do so.
EXIT_SLACK = 10.0


class Supervisor:
    # The pod's discovery and engine state, made by `create_app` through the factories below.
    discovery: PodDiscovery
    lifecycle: Lifecycle
    calls: PodCalls  # the steps of control calls the workers relay

    def __init__(self, settings: Settings, path: str) -> None:
        self.settings, self.path = settings, path
        self.workers: dict[int, Worker] = {}
        self.quick_deaths: dict[int, int] = {}
        self.stopping = False
        self.declared = CollectorRegistry()
        self.metrics = WorkerMetrics(self.declared)
        # Never served: it holds the pod's discovery, engine phase and reconciling, for the
        # admin port and the workers.
        self.pod = create_app(
            settings,
            registry=self.declared,
            discovery=self._discovery,
            lifecycle=self._lifecycle,
        )
        self.pod[DRAIN] = self._drain_workers
        # The admin port's /metrics is the pod's: every process's files, merged, and the pod's
        # engine phase and weight version, read from the supervisor's lifecycle.
        metrics = self.pod[METRICS]
        metrics.registry = pod_registry(path, self.declared, live=metrics.engine.state)

    def _discovery(self, settings: Settings, metrics: Metrics, base: URL) -> PodDiscovery:
        self.discovery = PodDiscovery(
            settings, metrics, base, publish=self._broadcast, live_workers=self._live
        )
        return self.discovery

    def _lifecycle(self, metrics: EngineMetrics, **kwargs: Any) -> Lifecycle:
        """The pod's lead copy: each change of its state is published to every worker."""
        engine = self.lifecycle = Lifecycle(metrics, role=POD_LEAD, **kwargs)
        state = engine.state
        state.listeners.append(lambda _: self._send_all(EngineChanged(state.snapshot())))
        self.calls = PodCalls(LocalSteps(state, lambda: engine.probe))
        return engine

    def _live(self) -> int:
        return sum(w.listening and w.proc.returncode is None for w in self.workers.values())

    def _broadcast(self, state: DiscoveryState) -> None:
        self._send_all(DiscoveryChanged(state))

    def _send_all(self, message: Message) -> None:
        line = encode(Frame(message))  # once: 50,001 served names take a while to encode
        for worker in self.workers.values():
            worker.channel.write(line)

    async def run(self) -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        pod = web.AppRunner(self.pod, handle_signals=False)  # never served: its session, checks
        admin = web.AppRunner(create_admin_app(self.pod), access_log=None, handle_signals=False)
        await pod.setup()
        await admin.setup()
        try:
            await web.TCPSite(admin, self.settings.host, self.settings.admin_port).start()
            count = self.settings.workers
            for index in range(count):
                await self._start(index)
            log.info(
                "vllm-sidecar: %d workers on %s:%d (admin %d) -> %s",
                count,
                self.settings.host,
                self.settings.port,
                self.settings.admin_port,
                self.settings.upstream_url,
            )
            await flushing_logs_until(stop)
            await self._drain()
        finally:
            await admin.cleanup()
            await pod.cleanup()
        log.info("stopped")
        logs.flush()

    async def _start(self, index: int) -> None:
        ours, theirs = socket.socketpair()
        with theirs:
            proc = await start_process(theirs)
        channel = await Channel.open(ours)
        worker = self.workers[index] = Worker(index, proc, channel)
        channel.send(Hello(self.settings, self.discovery.state, self.lifecycle.state.snapshot()))
        worker.tasks = [
            asyncio.create_task(self._converse(worker)),
            asyncio.create_task(self._watch(worker)),
        ]
        log.info("worker %d started (pid %d)", index, proc.pid)

    async def _converse(self, worker: Worker) -> None:
        """A worker's messages: it listens now, it met an unknown name, or it relays a step of
        a control call. One at a time, in order: a call's steps must be taken as sent."""
        channel = worker.channel
        while (frame := await channel.receive()) is not None:
            match frame.message:
                case Listening():
                    worker.listening = True
                    self.metrics.live.set(self._live())
                case RefreshModels():
                    await self.discovery.refresh_on_miss()
                    channel.answer(frame, DiscoveryChanged(self.discovery.state))
                case Enter() | Answered() | Failed() | Leave() as step:
                    channel.answer(frame, await self.calls.relayed(worker.index, step))
                case Drained():
                    pass  # an answer, taken by the drain that asked (`Channel.ask`)
                case other:
                    log.error(
                        "worker %d sent %s, a message for workers",
                        worker.index,
                        type(other).__name__,
                    )

    async def _watch(self, worker: Worker) -> None:
        """Wait for the worker to exit; unless the pod is stopping, count it and start another."""
        code = await worker.proc.wait()
        worker.channel.close()
        process_gone(worker.proc.pid, self.path)
        self.calls.worker_gone(worker.index)
        self.metrics.live.set(self._live())
        if self.stopping:
            return
        lived = time.monotonic() - worker.started
        quick = quick_deaths(lived, self.quick_deaths.get(worker.index, 0))
        self.quick_deaths[worker.index] = quick
        delay = restart_delay(quick)
        log.error(
            "worker %d (pid %d) exited with %s after %.1fs; starting another in %.1fs",
            worker.index,
            worker.proc.pid,
            describe(code),
            lived,
            delay,
        )
        self.metrics.restarts.inc()
        await asyncio.sleep(delay)
        if not self.stopping:
            await self._start(worker.index)

    async def _drain_workers(self) -> int:
        """The admin port's `POST /drain`: every worker drains; the requests still in flight
        once all have answered, or their grace is over."""
        self.pod[IN_FLIGHT].begin_draining()  # /readyz: draining
        wait = self.settings.shutdown_grace + EXIT_SLACK
        asks = [w.channel.ask(Drain(), Drained, within=wait) for w in self.workers.values()]
        answers = await asyncio.gather(*asks)
        return sum(a.in_flight for a in answers if a is not None)

    async def _drain(self) -> None:
        """SIGTERM to every worker (each drains like one sidecar), then wait for them all."""
        self.stopping = True
        self.pod[IN_FLIGHT].begin_draining()  # /readyz: draining
        grace = self.settings.shutdown_grace
        log.info("stopping: %d workers drain for up to %gs", len(self.workers), grace)
        for worker in self.workers.values():
            with contextlib.suppress(ProcessLookupError):
                worker.proc.send_signal(signal.SIGTERM)
        watchers = [w.tasks[1] for w in self.workers.values()]
        if not watchers:
            return
        await asyncio.wait(watchers, timeout=grace + EXIT_SLACK)
        for worker in self.workers.values():
            if worker.proc.returncode is None:
                log.error("worker %d (pid %d) did not stop: killed", worker.index, worker.proc.pid)
                worker.proc.kill()
        await asyncio.wait(watchers, timeout=5)
        for worker in self.workers.values():
            for task in worker.tasks:
                task.cancel()
