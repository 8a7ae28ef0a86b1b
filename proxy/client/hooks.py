"""The engine's hooks on an exchange: a short, fixed list that client/ fires at fixed points of
a request's path, which engine/gate.py implements and wiring/app.py registers (mitmproxy's
`addons` and `_hooks.py` are the model). client/ imports nothing of engine/: it names here what
it asks, and anything with these members will do (tests/unit/client records them).

The hooks of one flow, in the order they fire, each from one place:

| hook | fired from | when |
| --- | --- | --- |
| `Engine.head(flow)` | exchange.py `head` | the head is in: sets `flow.engine` |
| `hold()` | forward.py `_respond` | the body is read: around the upstream call(s) |
| `body(body)` | exchange.py `call_upstream` | within the hold: the body to send instead |
| `answered(resp)` | exchange.py `_send` | vLLM's headers are in |
| `prepared(response)` | exchange.py `prepared` | the answer's headers go out |
| `streaming()` / `ended(...)` | relay.py `stream_reply` | an SSE answer starts / ends |
| `continued(choices, usage)` | continuing/parts.py `counted` | a continued answer's tokens |

Beside them, what the path reads of the engine's judgement: `would_hold()`, `left()`,
`rehold`, `version`, `token_used` (see engine/gate.py's `EngineHandle`).
"""

from __future__ import annotations

import contextlib
from collections.abc import Awaitable, Callable, Iterable
from contextlib import AbstractAsyncContextManager
from typing import Any, Protocol

from aiohttp import web

from proxy.core.sse import ErrorWatcher
from proxy.observe.record import RequestRecord


class Counter(Protocol):
    """What counts a relayed stream's generated tokens as it passes (engine/tally.py)."""

    def ended(self, chunk: bytes) -> None: ...

    def counts(self, watcher: ErrorWatcher) -> Any: ...


class FlowHooks(Protocol):
    """The engine's say in one flow, from its head to its last byte."""

    version: str | None  # the weight version the request started with
    rehold: Callable[[int], Awaitable[None]] | None  # hold again after a paused rejection
    token_used: bool  # its Authorization was the sidecar's control token

    def body(self, body: bytes) -> bytes | None: ...

    def hold(self) -> AbstractAsyncContextManager[None]: ...

    def would_hold(self) -> bool: ...

    def left(self) -> float | None: ...

    def answered(self, resp: Any) -> None: ...

    def prepared(self, response: web.StreamResponse) -> None: ...

    def streaming(self) -> Counter | None: ...

    def ended(self, aborted: bool, counts: Any) -> bytes: ...

    def continued(self, choices: Iterable[tuple[int, list[Any], int]], usage: object) -> None: ...


class Holds(Protocol):
    """The engine's holds, as a continuation waits in them (engine/holds.py)."""

    def not_running(self) -> Any: ...

    async def until_serving(self, rec: RequestRecord, deadline: float | None) -> None: ...


class Head(Protocol):
    """What the engine reads of a flow at its head, and sets (client/flow.py's `Flow`)."""

    engine: FlowHooks

    @property
    def request(self) -> web.Request: ...

    @property
    def rec(self) -> RequestRecord: ...


class Engine(Protocol):
    """The engine addon, one per app: it takes each flow's head and answers what the client side
    and the admin port ask of the lifecycle as a whole."""

    @property
    def token(self) -> bytes | None:
        """The control token (--control-token)."""

    @property
    def version(self) -> str | None:
        """The weight version now."""

    @property
    def cuts(self) -> int:
        """Aborts a phase has made so far (what a continuation asks)."""

    @property
    def holds(self) -> Holds: ...

    def head(self, flow: Head) -> None:
        """The head is in: the flow's hooks set on it (`flow.engine`), judged now; raises the
        refusal of a request it does not take (a control call without the token)."""

    def admissible(self, request: web.Request) -> bool: ...

    def serving(self) -> bool: ...

    def describe(self) -> dict[str, object]: ...


ENGINE = web.AppKey[Engine]("engine")
# A flow's hooks, where the response-prepare signal finds them (client/exchange.py `prepared`).
HOOKS = web.RequestKey[FlowHooks]("hooks")


class NoHooks:
    """A flow the engine has no say in (no addon registered, or before its head is judged):
    every hook a no-op."""

    __slots__ = ()

    version: str | None = None
    rehold: Callable[[int], Awaitable[None]] | None = None
    token_used = False

    def body(self, body: bytes) -> bytes | None:
        return None

    def hold(self) -> AbstractAsyncContextManager[None]:
        return _UNTOUCHED

    def would_hold(self) -> bool:
        return False

    def left(self) -> float | None:
        return None

    def answered(self, resp: Any) -> None:
        pass

    def prepared(self, response: web.StreamResponse) -> None:
        pass

    def streaming(self) -> Counter | None:
        return None

    def ended(self, aborted: bool, counts: Any) -> bytes:
        return b""

    def continued(self, choices: Iterable[tuple[int, list[Any], int]], usage: object) -> None:
        pass


_UNTOUCHED = contextlib.nullcontext()
NO_HOOKS: FlowHooks = NoHooks()
