"""One engine phase for the pod: the steps workers relay to the supervisor, and their relay.

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
from typing import TypeVar

from proxy.core import phase
from proxy.engine.state import Call, EngineState
from proxy.engine.steps import LocalSteps

from .channel import Channel
from .messages import Answered, Enter, Entered, Failed, Leave, Step, StepTaken

log = logging.getLogger(__name__)

# A step may wait for the supervisor's probe of vLLM (at most 5 s each) after the answer.
STEP_TIMEOUT = 15.0
UNKNOWN: Call = 0  # a call the supervisor did not number (it did not answer in time)
Taken = TypeVar("Taken", Entered, StepTaken)


class PodCalls:
    """The supervisor's side: the steps workers relay, taken on the pod's state (`steps`), and
    which worker opened which call."""

    def __init__(self, steps: LocalSteps) -> None:
        self.steps = steps
        self.by_worker: dict[int, set[Call]] = {}

    async def relayed(self, worker: int, step: Step) -> Entered | StepTaken:
        """One step of a control call a worker relays; its answer once every worker was told."""
        if isinstance(step, Enter):
            call = await self.steps.enter(step.path)
            self.by_worker.setdefault(worker, set()).add(call)
            return Entered(call)
        self.by_worker.get(worker, set()).discard(step.call)
        match step:
            case Failed(call=call, path=path):
                await self.steps.failed(call, path)
            case Answered(call=call, path=path, query=query):
                await self.steps.answered(call, path, query)
            case Leave(call=call):
                self.steps.leave(call)
        return StepTaken()

    def worker_gone(self, worker: int) -> None:
        """A worker died with calls open: their phases stand, as when a caller hangs up."""
        for call in self.by_worker.pop(worker, ()):
            self.steps.leave(call)


class RemoteSteps:
    """A worker's steps: each sent to the supervisor, which takes it on the pod's state and
    publishes the result back (`EngineState.follow`); `state` is this worker's mirror."""

    def __init__(self, state: EngineState, channel: Channel) -> None:
        self.state, self._channel = state, channel

    async def _step(self, step: Enter | Answered | Failed, answer: type[Taken]) -> Taken | None:
        reply = await self._channel.ask(step, answer, within=STEP_TIMEOUT)
        if reply is None:
            log.error("the supervisor did not take the step %s of %s", step.type, step.path)
        return reply

    async def enter(self, path: str) -> Call:
        asking = asyncio.ensure_future(self._step(Enter(path), Entered))
        try:
            reply = await asyncio.shield(asking)
        except asyncio.CancelledError:
            # The caller left before the call was forwarded: once the pod entered the phase,
            # take it back, as for a call vLLM never got.
            asking.add_done_callback(lambda _: self._unsent(asking, path))
            raise
        if reply is None:  # the safe side: this worker at least enters the phase
            self.state.set(phase.on_send(self.state.engine, path), f"{path} sent")
            return UNKNOWN
        return reply.call

    def _unsent(self, asking: asyncio.Future[Entered | None], path: str) -> None:
        reply = None if asking.cancelled() or asking.exception() else asking.result()
        if reply is not None:
            self._channel.send(Failed(reply.call, path))

    def leave(self, call: Call) -> None:
        self._channel.send(Leave(call))

    async def failed(self, call: Call, path: str) -> None:
        await self._step(Failed(call, path), StepTaken)

    async def answered(self, call: Call, path: str, query: str) -> None:
        await self._step(Answered(call, path, query), StepTaken)
