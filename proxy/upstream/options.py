"""What the upstream side reads of the command line: the wiring hands it the `Settings`."""

from __future__ import annotations

from typing import Literal, Protocol


class UpstreamOptions(Protocol):
    """The flags the upstream session, discovery and its checks read (config/settings.py)."""

    upstream_api_key: str | None
    served_model_names: list[str] | None
    aliases: dict[str, str]
    case_insensitive: bool
    upstream_client: Literal["lean", "aiohttp"]
    max_connections: int
    pool_timeout: float
    connect_timeout: float
    read_timeout: float | None
    health_interval: float
    discovery_interval: float
    miss_refresh_interval: float
