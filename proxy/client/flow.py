"""One request's flow: the exchange itself, carried as one object from the head to the last byte."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import aiohttp
from aiohttp import StreamReader, web
from yarl import URL

from proxy.observe.metrics import METRICS, Metrics
from proxy.observe.record import RequestRecord
from proxy.upstream.discovery import DISCOVERY, Discovery
from proxy.upstream.hop import HOP, Hop
from proxy.upstream.session import UPSTREAM

from .budget import BUDGET, Budget
from .drain import IN_FLIGHT, InFlight
from .hooks import ENGINE, NO_HOOKS, Engine, FlowHooks
from .options import OPTIONS, ClientOptions

STREAM_FROM = 1 << 20  # bodies larger than this are streamed through once their head is read


@dataclass(slots=True)
class StreamedBody:
    """A large body on its way: its (rewritten) head now, the rest as the client sends it."""

    head: bytes
    rest: StreamReader | None
    length: int

    async def chunks(self) -> AsyncIterator[bytes]:
        # In slices, so that the socket's backpressure applies to a large held body too: given
        # whole, its unsent rest would be copied into the transport's buffer at once.
        view = memoryview(self.head)
        for start in range(0, len(view), STREAM_FROM):
            yield view[start : start + STREAM_FROM]  # type: ignore[misc]
        if self.rest is not None:
            async for chunk in self.rest.iter_any():
                yield chunk


Body = bytes | StreamedBody


class Flow:
    """One exchange: the client's request, its record (what the access log and the metrics say
    of it, its model's resolution included), the body to forward, and the engine's handle on it
    (hooks.py), from the head to the last byte relayed. Every step of client/ takes the
    flow and nothing beside it (mitmproxy's `Flow` is the model). The services the steps use
    (the metrics, the model table, the options, the drain, the memory budget, the upstream hop
    and its URL, the engine addon) are read of the app once, here, and the app is not kept."""

    __slots__ = (
        "addon",
        "body",
        "budget",
        "discovery",
        "engine",
        "hop",
        "in_flight",
        "metrics",
        "options",
        "rec",
        "request",
        "upstream",
    )

    def __init__(
        self, request: web.Request, rec: RequestRecord, app: web.Application | None = None
    ) -> None:
        self.request, self.rec = request, rec
        app = request.app if app is None else app
        self.metrics: Metrics = app[METRICS]
        self.discovery: Discovery = app[DISCOVERY]
        self.options: ClientOptions = app[OPTIONS]
        self.in_flight: InFlight = app[IN_FLIGHT]  # the handlers running, and the drain
        self.budget: Budget = app[BUDGET]  # the memory the bodies held take (budget.py)
        self.hop: Hop = app[HOP]  # the upstream client: the lean hop, or aiohttp's
        self.upstream: URL = app[UPSTREAM]  # vLLM's base URL
        self.addon: Engine = app[ENGINE]  # the engine addon, which hands out `engine` (hooks.py)
        self.engine: FlowHooks = NO_HOOKS  # the engine's hooks, from the head on (hooks.py)
        self.body: Body = b""  # what goes upstream, once read (client/inbound.py)

    @property
    def client_gone(self) -> bool:
        transport = self.request.transport
        return transport is None or transport.is_closing()


# What to do with vLLM's answer to one upstream call (the relay, a continuation's own).
Relay = Callable[[Flow, aiohttp.ClientResponse, bytes], Awaitable[Any]]
