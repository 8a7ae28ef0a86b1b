"""The typed slots an app carries; nothing else is stored on an app."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import aiohttp
from aiohttp import web
from yarl import URL

from .budget import Budget
from .connections import Watch
from .discovery import Discovery
from .drain import InFlight
from .lifecycle import Lifecycle
from .metrics import Metrics
from .settings import Settings

SETTINGS = web.AppKey("settings", Settings)
METRICS = web.AppKey("metrics", Metrics)
DISCOVERY = web.AppKey("discovery", Discovery)
SESSION = web.AppKey("session", aiohttp.ClientSession)
UPSTREAM = web.AppKey("upstream", URL)
IN_FLIGHT = web.AppKey("in_flight", InFlight)
CONNECTIONS = web.AppKey("connections", Watch)
BUDGET = web.AppKey("budget", Budget)
LIFECYCLE = web.AppKey("lifecycle", Lifecycle)
# With `--workers N`, the supervisor's: drain every worker, and how many requests were left.
DRAIN: web.AppKey[Callable[[], Awaitable[int]]] = web.AppKey("drain")
