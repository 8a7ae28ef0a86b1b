"""One request's flow: what every step of its exchange reads, carried as one object."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import aiohttp
from aiohttp import web

from proxy.engine.gate import EngineHandle
from proxy.observe.metrics import METRICS, Metrics
from proxy.observe.record import RequestRecord
from proxy.upstream.discovery import DISCOVERY, Discovery


class Flow:
    """The client's request, its record (what the access log and the metrics say of it) and its
    handle on the engine lifecycle (engine/gate.py), from the head to the last byte relayed:
    one argument where each step took three to seven (mitmproxy's `Flow` is the model). What
    the steps read of the app is read once, here."""

    __slots__ = ("app", "discovery", "engine", "metrics", "rec", "request")

    def __init__(
        self,
        request: web.Request,
        rec: RequestRecord,
        engine: EngineHandle,
        app: web.Application | None = None,
    ) -> None:
        self.request, self.rec, self.engine = request, rec, engine
        self.app = app = request.app if app is None else app
        self.metrics: Metrics = app[METRICS]
        self.discovery: Discovery = app[DISCOVERY]

    @property
    def client_gone(self) -> bool:
        transport = self.request.transport
        return transport is None or transport.is_closing()


# What to do with vLLM's answer to one upstream call (the relay, a continuation's own).
Relay = Callable[[Flow, aiohttp.ClientResponse, bytes], Awaitable[Any]]
