"""skyrl 0.4's client through the sidecar: every data-plane route with the HF path, and errors."""

from __future__ import annotations

import pickle
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
from skyrl.backends.skyrl_train.inference_servers.remote_inference_client import (
    RemoteInferenceClient,
)

from proxy.skyrl import SidecarError, SidecarInferenceClient
from tests.fake_vllm import FakeVLLM
from tests.sidecar import Sidecar
from tests.skyrl04.clients import HF_PATH, LORA, SERVED, companion, stock, url

Call = Callable[[RemoteInferenceClient], Awaitable[Any]]
MESSAGES = [{"role": "user", "content": "hi"}]

# name -> (the upstream route that carries `model`, the call)
DATA_PLANE: dict[str, tuple[str, Call]] = {
    "generate": (
        "/inference/v1/generate",
        lambda c: c.generate({"prompt_token_ids": [[1, 2, 3]], "sampling_params": {}}),
    ),
    "sample": (
        "/inference/v1/generate",
        lambda c: c.sample(
            {"json": {"prompt": {"chunks": [{"tokens": [1, 2]}]}, "num_samples": 2}}
        ),
    ),
    "completion": ("/v1/completions", lambda c: c.completion({"json": {"prompt": "the"}})),
    "chat_completion": (
        "/v1/chat/completions",
        lambda c: c.chat_completion({"json": {"messages": MESSAGES}}),
    ),
    "render_chat_completion": (
        "/v1/chat/completions/render",
        lambda c: c.render_chat_completion({"json": {"messages": MESSAGES}}),
    ),
    "tokenize": ("/tokenize", lambda c: c.tokenize(["the fox"])),
    "detokenize": ("/detokenize", lambda c: c.detokenize([[7, 8]])),
}


@pytest.mark.parametrize("name", list(DATA_PLANE))
@pytest.mark.parametrize("kind", ["stock", "companion"])
async def test_the_hf_path_reaches_vllm_as_its_served_name(
    name: str, kind: str, fake: FakeVLLM, sidecar: Sidecar
) -> None:
    route, call = DATA_PLANE[name]
    client = (stock if kind == "stock" else companion)(url(sidecar))
    result = await call(client)
    assert result
    assert fake.last(route).json()["model"] == SERVED
    await client.teardown()


@pytest.mark.parametrize("kind", ["stock", "companion"])
async def test_the_packed_route_reaches_vllm_as_its_served_name(
    kind: str, fake: FakeVLLM, sidecar: Sidecar
) -> None:
    make = stock if kind == "stock" else companion
    client = make(url(sidecar))
    client.enable_return_routed_experts = True
    out = await client.generate({"prompt_token_ids": [[1, 2]], "sampling_params": {}})
    assert out["rollout_expert_indices"][0].shape == (2, 1, 2)
    assert fake.last("/skyrl/v1/generate").json()["model"] == SERVED
    await client.teardown()


async def test_the_packed_route_raises_on_an_unknown_model(
    fake: FakeVLLM, sidecar: Sidecar
) -> None:
    fake.scripts.pop("POST /skyrl/v1/generate")  # vLLM's own 404 for a name it does not serve
    client = companion(url(sidecar), model="Qwen/Qwen3-8B", enable_return_routed_experts=True)
    with pytest.raises(SidecarError) as caught:
        await client.generate({"prompt_token_ids": [[1, 2]], "sampling_params": {}})
    assert caught.value.status == 404
    assert SERVED in str(caught.value)
    await client.teardown()


@pytest.mark.parametrize("name", list(DATA_PLANE))
async def test_an_unknown_model_raises_naming_the_served_names(
    name: str, fake: FakeVLLM, sidecar: Sidecar
) -> None:
    route, call = DATA_PLANE[name]
    if name in ("generate", "sample", "detokenize", "render_chat_completion"):
        fake.scripts.pop(f"POST {route}")  # the fake's own handler checks the model
    client = companion(url(sidecar), model="Qwen/Qwen3-8B")
    with pytest.raises(SidecarError) as caught:
        await call(client)
    assert caught.value.status == 404
    assert SERVED in str(caught.value)
    assert caught.value.served == [SERVED, LORA]
    await client.teardown()


async def test_a_lora_adapter_name_vllm_serves_is_sent_exactly(
    fake: FakeVLLM, sidecar: Sidecar
) -> None:
    client = companion(url(sidecar))
    await client.completion({"json": {"prompt": "the", "model": LORA}})
    assert fake.last("/v1/completions").json()["model"] == LORA
    await client.teardown()


async def test_an_unknown_adapter_name_passes_through_unchanged(
    fake: FakeVLLM, sidecar: Sidecar
) -> None:
    client = companion(url(sidecar))
    with pytest.raises(SidecarError):
        await client.completion({"json": {"prompt": "the", "model": "skyrl-lora-7"}})
    assert fake.last("/v1/completions").json()["model"] == "skyrl-lora-7"
    await client.teardown()


async def test_control_plane_calls_reach_vllm_as_the_parent_sends_them(
    fake: FakeVLLM, sidecar: Sidecar
) -> None:
    client = companion(url(sidecar))
    await client.pause(mode="keep")
    await client.resume()
    await client.sleep(level=2)
    await client.wake_up(tags=["weights", "kv_cache"])
    await client.reset_prefix_cache()
    sent = [r.raw_path for r in fake.requests if r.method == "POST"]
    assert sent == [
        "/pause?mode=keep&clear_cache=false",
        "/resume",
        "/sleep?level=2",
        "/wake_up?tags=weights&tags=kv_cache",
        "/reset_prefix_cache",
    ]
    await client.teardown()


async def test_a_count_of_choices_that_does_not_match_raises(
    fake: FakeVLLM, sidecar: Sidecar
) -> None:
    async def two(request: Any) -> Any:
        from tests.fake_vllm import json_response

        choice = {"token_ids": [1], "finish_reason": "length"}
        return json_response({"choices": [{"index": 0, **choice}, {"index": 1, **choice}]})

    fake.scripts["POST /inference/v1/generate"] = [two]
    client = companion(url(sidecar))
    with pytest.raises(SidecarError, match="2 choices came back for 1 requested"):
        await client.generate({"prompt_token_ids": [[1]], "sampling_params": {}})
    await client.teardown()


async def test_the_client_pickles_and_is_what_skyrl_checks_for(sidecar: Sidecar) -> None:
    client = companion(url(sidecar), control_token="s3cret")
    await client.tokenize(["warm the session"])
    copy = pickle.loads(pickle.dumps(client))
    assert isinstance(copy, RemoteInferenceClient)
    assert isinstance(copy, SidecarInferenceClient)
    assert (copy.control_token, copy.model_name) == ("s3cret", HF_PATH)
    assert await copy.tokenize(["the"]) == [[ord("t"), ord("h"), ord("e")]]
    await client.teardown()
    await copy.teardown()


def test_the_control_token_defaults_to_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("VLLM_SIDECAR_CONTROL_TOKEN", "from-env")
    assert companion("http://127.0.0.1:9").control_token == "from-env"
    assert companion("http://127.0.0.1:9", control_token="given").control_token == "given"


def test_a_sidecar_error_survives_pickling_as_ray_ships_it() -> None:
    envelope = {"error": {"message": "m", "retryable": True}}
    err = SidecarError("m", reason="engine_paused", method="POST", url="u", envelope=envelope)
    copy = pickle.loads(pickle.dumps(err))
    assert (copy.reason, copy.retryable, str(copy)) == ("engine_paused", True, str(err))
