"""One engine phase for the pod: with `--workers N` the supervisor's lifecycle is the pod's.

A control call relayed by one worker must take effect on every worker at once: a worker that
had not heard of a `/start_weight_update` would forward completions into the update, which
crashed vLLM. So a worker relays each step of a phase-changing call (sent, answered, failed,
caller gone) to the supervisor and waits for it; the supervisor applies the step to the pod's
phase, sends the new phase to every worker, and only then answers. A worker therefore forwards
a `/pause` to vLLM only once every worker has been sent the pause: what remains is the time a
sibling's event loop takes to read one local socket line, while requests it forwarded before
are running ones, as with one process (vLLM aborts or freezes them itself). Reconciling with
vLLM's flags and reading the weight version run once, in the supervisor.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any

from proxy.core import phase
from proxy.core.phase import Engine
from proxy.engine.lifecycle import Call, Lifecycle
from proxy.observe.metrics import EngineMetrics

from .podstate import Channel, Message

log = logging.getLogger("proxy.podlifecycle")  # its name before the layers: kept for filters

# A step may wait for the supervisor's probe of vLLM (at most 5 s each) after the answer.
STEP_TIMEOUT = 15.0
UNKNOWN: Call = 0  # a call the supervisor did not number (it did not answer in time)


def snapshot(lifecycle: Lifecycle) -> Message:
    engine = lifecycle.engine
    return {
        "engine": [engine.base, engine.syncing],
        "version": lifecycle.version,
        "down": lifecycle.down,
    }


class PodLifecycle(Lifecycle):
    """The supervisor's: the pod's phase, each change published to every worker."""

    def __init__(
        self, metrics: EngineMetrics, *, publish: Callable[[Message], None], **kwargs: Any
    ) -> None:
        super().__init__(metrics, **kwargs)
        self._publish = publish
        self.by_worker: dict[int, set[Call]] = {}

    def set(self, engine: Engine, why: str) -> None:
        if engine != self.engine:
            super().set(engine, why)
            self._publish(snapshot(self))

    def set_version(self, version: str | None) -> None:
        if version is not None and version != self.version:
            super().set_version(version)
            self._publish(snapshot(self))

    def engine_down(self, why: str | None) -> None:
        if why != self.down:
            super().engine_down(why)
            self._publish(snapshot(self))

    async def relayed(self, worker: int, step: Message) -> Message:
        """One step of a control call a worker relays; its answer once every worker was told."""
        kind, path = step["step"], step.get("path", "")
        if kind == "enter":
            call = await self.enter(path)
            self.by_worker.setdefault(worker, set()).add(call)
            return {"call": call}
        call = step["call"]
        self.by_worker.get(worker, set()).discard(call)
        if kind == "failed":
            await self.failed(call, path)
        elif kind == "answered":
            await self.answered(call, path, step.get("query", ""))
        else:
            self.leave(call)
        return {}

    def describe(self) -> dict[str, object]:
        # Held and running requests are each worker's: summed in vllm_sidecar_held_requests.
        return {**super().describe(), "held_requests": None, "running_requests": None}

    def worker_gone(self, worker: int) -> None:
        """A worker died with calls open: their phases stand, as when a caller hangs up."""
        for call in self.by_worker.pop(worker, ()):
            self.leave(call)


class Follower(Lifecycle):
    """A worker's: the pod's phase as the supervisor sends it; each call step taken there."""

    LEADS = False

    def __init__(self, metrics: EngineMetrics, *, channel: Channel, **kwargs: Any) -> None:
        super().__init__(metrics, **kwargs)
        self._channel = channel

    def apply(self, state: Message) -> None:
        base, syncing = state["engine"]
        Lifecycle.set(self, Engine(base, syncing), "the pod's phase")
        Lifecycle.set_version(self, state["version"])
        Lifecycle.engine_down(self, state.get("down"))

    async def _step(self, step: Message) -> Message | None:
        reply = await self._channel.ask({"lifecycle": step}, within=STEP_TIMEOUT)
        if reply is None:
            log.error("the supervisor did not take the step %s of %s", step["step"], step["path"])
        return reply

    async def enter(self, path: str) -> Call:
        asking = asyncio.ensure_future(self._step({"step": "enter", "path": path}))
        try:
            reply = await asyncio.shield(asking)
        except asyncio.CancelledError:
            # The caller left before the call was forwarded: once the pod entered the phase,
            # take it back, as for a call vLLM never got.
            asking.add_done_callback(lambda _: self._unsent(asking, path))
            raise
        if reply is None:  # the safe side: this worker at least enters the phase
            Lifecycle.set(self, phase.on_send(self.engine, path), f"{path} sent")
            return UNKNOWN
        return int(reply["call"])

    def _unsent(self, asking: asyncio.Future[Message | None], path: str) -> None:
        reply = None if asking.cancelled() or asking.exception() else asking.result()
        if reply is not None:
            step = {"step": "failed", "call": int(reply["call"]), "path": path}
            self._channel.send({"lifecycle": step})

    def leave(self, call: Call) -> None:
        self._channel.send({"lifecycle": {"step": "leave", "call": call}})

    async def failed(self, call: Call, path: str) -> None:
        await self._step({"step": "failed", "call": call, "path": path})

    async def answered(self, call: Call, path: str, query: str) -> None:
        await self._step({"step": "answered", "call": call, "path": path, "query": query})
