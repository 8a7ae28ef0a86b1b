"""The engine as the client side's addon: what client/hooks.py's `Engine` names, over one
lifecycle. The wiring registers it (wiring/app.py); each flow's own hooks are its handle
(gate.py)."""

from __future__ import annotations

from typing import Any

from aiohttp import web

from proxy.core.phase import SERVING

from .gate import Control, admissible, admit
from .holds import Holds
from .lifecycle import Lifecycle


class EngineAddon:
    """One app's engine: takes each flow's head (`head`: its handle, judged now), and answers
    what a continuation and the admin port ask of the lifecycle."""

    __slots__ = ("lifecycle",)

    def __init__(self, lifecycle: Lifecycle) -> None:
        self.lifecycle = lifecycle

    def head(self, flow: Any) -> None:
        """The flow's handle (`flow.engine`), judged at its head: a control call's token is
        checked now, its refusal stamped (the handle is the flow's before it raises)."""
        request = flow.request
        flow.engine = handle = admit(self.lifecycle, request, flow.rec)
        if type(handle) is Control:
            handle.authorize(request.headers.get("Authorization"))

    def admissible(self, request: web.Request) -> bool:
        return admissible(self.lifecycle, request)

    def serving(self) -> bool:
        return self.lifecycle.phase == SERVING

    def describe(self) -> dict[str, object]:
        return self.lifecycle.describe()

    @property
    def token(self) -> bytes | None:
        return self.lifecycle.token

    @property
    def version(self) -> str | None:
        return self.lifecycle.version

    @property
    def cuts(self) -> int:
        return self.lifecycle.cuts

    @property
    def holds(self) -> Holds:
        return self.lifecycle.holds
