"""The seed's deployment as both SkyRL tiers (tests/skyrl, tests/skyrl04) stage it, and how
SkyRL names a listener."""

from __future__ import annotations

from typing import Any

from aiohttp.test_utils import TestClient, TestServer

# vLLM started with `--served-model-name Qwen2.5-0.5B` on the HF model `Qwen/Qwen2.5-0.5B`,
# while SkyRL asks for `trainer.policy.model.path`, the HF path.
SERVED = "Qwen2.5-0.5B"
HF_PATH = "Qwen/Qwen2.5-0.5B"


def hostport(server: TestServer | TestClient[Any, Any]) -> str:
    """A listener as SkyRL's `remote_urls` name it: host:port, no scheme."""
    return f"{server.host}:{server.port}"
