"""The real vLLM on its own: what the sidecar tests compare against, and proof the fixtures work."""

from __future__ import annotations

import aiohttp
import pytest

from tests.vllm_servers import TinyModel, VllmServer

pytestmark = pytest.mark.vllm


async def test_models_lists_the_basename_with_its_root(
    http: aiohttp.ClientSession, vllm_server: VllmServer, tiny_model: TinyModel
) -> None:
    async with http.get(f"{vllm_server.url}/v1/models") as resp:
        body = await resp.json()
    assert resp.status == 200
    assert [(m["id"], m["root"]) for m in body["data"]] == [(tiny_model.name, str(tiny_model.path))]
    assert tiny_model.hf_path == "sidecar-test/tiny-llama"


async def test_token_id_batch_gets_one_choice_per_prompt(
    http: aiohttp.ClientSession, vllm_server: VllmServer, tiny_model: TinyModel
) -> None:
    payload = {"model": tiny_model.name, "prompt": [[1, 2, 3], [4, 5, 6, 7]], "max_tokens": 4}
    async with http.post(f"{vllm_server.url}/v1/completions", json=payload) as resp:
        body = await resp.json()
    assert resp.status == 200, body
    assert [c["index"] for c in body["choices"]] == [0, 1]
    assert body["usage"]["prompt_tokens"] == 7


async def test_chat_template_is_applied(
    http: aiohttp.ClientSession, vllm_server: VllmServer, tiny_model: TinyModel
) -> None:
    payload = {
        "model": tiny_model.name,
        "messages": [{"role": "user", "content": "hello"}],
        "max_tokens": 3,
    }
    async with http.post(f"{vllm_server.url}/v1/chat/completions", json=payload) as resp:
        body = await resp.json()
    assert resp.status == 200, body
    assert body["choices"][0]["message"]["role"] == "assistant"
    # <|im_start|>user\nhello<|im_end|>\n<|im_start|>assistant\n: more tokens than "hello".
    assert body["usage"]["prompt_tokens"] > 3


async def test_wrong_name_is_vllms_own_404(
    http: aiohttp.ClientSession, vllm_server: VllmServer, tiny_model: TinyModel
) -> None:
    payload = {"model": tiny_model.hf_path, "prompt": [1, 2], "max_tokens": 1}
    async with http.post(f"{vllm_server.url}/v1/completions", json=payload) as resp:
        body = await resp.json()
    assert resp.status == 404
    assert body["error"]["type"] == "NotFoundError"
    assert tiny_model.hf_path in body["error"]["message"]
