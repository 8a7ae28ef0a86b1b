"""What the client side reads of the command line: the wiring stores the `Settings` here."""

from __future__ import annotations

from typing import Protocol

from aiohttp import web


class ClientOptions(Protocol):
    """The flags a request's path reads (config/settings.py)."""

    max_body_bytes: int
    max_connections: int  # 0: the upstream pool is unbounded
    error_body_bytes: int
    shutdown_grace: float
    continue_aborted: bool
    continue_max: int
    upstream_api_key: str | None


OPTIONS = web.AppKey[ClientOptions]("options")
