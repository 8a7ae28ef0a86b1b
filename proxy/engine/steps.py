"""The steps of a phase-changing control call, taken where the pod's engine state is kept.

A call is entered when it is sent, then answered, failed (reverted) or left (its caller hung
up). One process and the supervisor of `--workers N` take each step on their own state
(`LocalSteps`); a worker relays it to the supervisor (`pod.podlifecycle.Relay`). Both are
`Steps`: the lifecycle awaits each step without knowing where it is taken.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

from proxy.core.routes import WAKE_UP, rule

from .state import Call, EngineState


class Flags(Protocol):
    """What an answered call reads of vLLM afterwards (upstream/engine_probe.py's `Lenient`,
    handed in by the wiring). `sleeping`: None when vLLM has no such route, False when it could
    not be asked (taken as awake); `weight_version`: None wherever vLLM cannot say."""

    async def sleeping(self) -> bool | None: ...

    async def weight_version(self) -> str | None: ...


class Steps(Protocol):
    async def enter(self, path: str) -> Call: ...

    def leave(self, call: Call) -> None: ...

    async def failed(self, call: Call, path: str) -> None: ...

    async def answered(self, call: Call, path: str, query: str) -> None: ...


class LocalSteps:
    """Each step taken on `state` at once; an answer also reads what vLLM now reports, through
    the probe that reconciling keeps (`probe()`, None while there is none)."""

    def __init__(self, state: EngineState, probe: Callable[[], Flags | None]) -> None:
        self.state, self._probe = state, probe

    async def enter(self, path: str) -> Call:
        return self.state.enter(path)

    def leave(self, call: Call) -> None:
        self.state.leave(call)

    async def failed(self, call: Call, path: str) -> None:
        self.state.failed(call, path)

    async def answered(self, call: Call, path: str, query: str) -> None:
        awake, version, probe, route = True, None, self._probe(), rule(path)
        if route.step == WAKE_UP and "tags=" in query and probe is not None:
            # Waking only some tags (weights, then kv_cache) leaves the engine asleep.
            awake = await probe.sleeping() is False
        if route.versions and probe is not None:
            version = await probe.weight_version()
        self.state.answered(call, path, awake=awake, version=version)
