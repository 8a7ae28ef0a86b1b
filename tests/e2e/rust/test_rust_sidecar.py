"""tests/e2e/test_e2e_sidecar.py's tests that read vLLM's bytes, on the Rust frontend: its 404
and 400 bodies, its SSE framing. Not here: the out-of-vocabulary stream error, which the Rust
frontend answers with a 400 before any stream (its 400s are tested below)."""

from typing import Any

import aiohttp
import pytest

from tests.e2e import test_e2e_sidecar as python_tier
from tests.e2e.test_e2e_sidecar import (
    pytestmark,
    test_unknown_name_gets_vllms_404_in_the_envelope,
    test_vllms_400s_come_back_enveloped_with_their_body,
)
from tests.sidecar import SidecarProcess
from tests.vllm_servers import TinyModel, VllmServer

__all__ = [
    "pytestmark",
    "test_unknown_name_gets_vllms_404_in_the_envelope",
    "test_vllms_400s_come_back_enveloped_with_their_body",
]

# The Rust frontend takes one prompt a request: a batch of token-id prompts is a 400.
ONE_PROMPT = [
    ("/v1/completions", {**python_tier.COMPLETION, "prompt": [1, 2, 3]}),
    *python_tier.ROUTES[1:],
]


@pytest.mark.parametrize(("route", "payload"), ONE_PROMPT)
async def test_hf_path_streams_like_vllm_itself(
    http: aiohttp.ClientSession,
    sidecar: SidecarProcess,
    vllm_server: VllmServer,
    tiny_model: TinyModel,
    route: str,
    payload: dict[str, Any],
) -> None:
    await python_tier.test_hf_path_streams_like_vllm_itself(
        http, sidecar, vllm_server, tiny_model, route, payload
    )
