"""Fixtures for the skyrl 0.4 tests (Python 3.12, `.venv-skyrl04`): the fake vLLM, SkyRL's clients.

`make test` runs this folder in its own venv; the 3.11 suite skips collecting it (tests/conftest).
"""

from __future__ import annotations

import json

import numpy as np
import orjson
import pytest
from aiohttp import web
from skyrl.backends.skyrl_train.inference_servers.generate_wire import pack_routed_experts

from tests.fake_vllm import FakeVLLM, json_response
from tests.skyrl04.clients import HF_PATH, LORA, SERVED


async def generate(request: web.Request) -> web.Response:
    """vLLM's /inference/v1/generate answer: one choice of token ids per `n`."""
    payload = json.loads(await request.read())
    n = payload.get("sampling_params", {}).get("n", 1)
    choice = {"token_ids": [7, 8], "finish_reason": "length", "logprobs": None}
    choices = [{"index": i, **choice} for i in range(n)]
    return json_response({"request_id": "gen-1", "choices": choices, "model": payload["model"]})


async def packed_generate(request: web.Request) -> web.Response:
    """SkyRL's own server's /skyrl/v1/generate: routed experts packed as SkyRL packs them."""
    payload = json.loads(await request.read())
    experts = pack_routed_experts(np.zeros((2, 1, 2), dtype=np.int32))
    choice = {"index": 0, "token_ids": [7, 8], "finish_reason": "length", "routed_experts": experts}
    return web.Response(
        body=orjson.dumps({"choices": [choice], "model": payload["model"]}),
        content_type="application/json",
    )


async def detokenize(request: web.Request) -> web.Response:
    return json_response({"prompt": " fox"})


async def render(request: web.Request) -> web.Response:
    return json_response({"token_ids": [1, 2, 3], "features": None})


@pytest.fixture
def fake() -> FakeVLLM:
    """The seed's deployment (served name differs from the HF path), plus a LoRA adapter."""
    fake = FakeVLLM(served=[(SERVED, HF_PATH), (LORA, "/tmp/adapters/skyrl-lora")])
    for key, handler in (
        ("POST /inference/v1/generate", generate),
        ("POST /skyrl/v1/generate", packed_generate),
        ("POST /detokenize", detokenize),
        ("POST /v1/chat/completions/render", render),
    ):
        fake.script(key, handler, times=50)
    return fake
