"""Answers that are 200 but unusable, and connections that break: SidecarError, never IndexError."""

from __future__ import annotations

import json
from typing import Any

import aiohttp
import pytest
from aiohttp.test_utils import TestServer
from skyrl.backends.skyrl_train.inference_engines.remote_inference_engine import (
    RemoteInferenceEngine,
)

from proxy.skyrl import SidecarError, SidecarInferenceEngine
from tests.fake_vllm import FakeVLLM, hang, raw, respond
from tests.sidecar import Sidecar
from tests.skyrl.seed import SEED_PROMPTS, generate_via_skyrl
from tests.skyrl_deployment import HF_PATH, SERVED, hostport

pytestmark = pytest.mark.skyrl


def engine(url: str, tokenizer: Any) -> SidecarInferenceEngine:
    return SidecarInferenceEngine(
        url=url, model_name=HF_PATH, engine_backend="vllm", tokenizer=tokenizer
    )


def one_choice_for_two_prompts() -> Any:
    body = {
        "id": "cmpl-1",
        "object": "text_completion",
        "model": SERVED,
        "choices": [{"index": 0, "text": " fox", "finish_reason": "length"}],
    }
    return respond(200, json.dumps(body))


async def test_too_few_choices_is_malformed_response(
    fake: FakeVLLM, sidecar: Sidecar, tokenizer: Any
) -> None:
    fake.script("POST /v1/completions", one_choice_for_two_prompts())
    with pytest.raises(SidecarError) as caught:
        await generate_via_skyrl(
            hostport(sidecar.client), HF_PATH, tokenizer, engine_cls=SidecarInferenceEngine
        )
    err = caught.value
    assert (err.status, err.reason) == (200, "malformed_response")
    assert f"1 choices came back for {len(SEED_PROMPTS)} prompts" in str(err)


async def test_too_few_choices_is_the_stock_engines_index_error(
    fake: FakeVLLM, sidecar: Sidecar, tokenizer: Any
) -> None:
    # The same answer, the stock classes: what the check above prevents.
    fake.script("POST /v1/completions", one_choice_for_two_prompts())
    with pytest.raises(IndexError):
        await generate_via_skyrl(
            hostport(sidecar.client), HF_PATH, tokenizer, engine_cls=RemoteInferenceEngine
        )


@pytest.mark.parametrize(
    ("route", "answer", "expected"),
    [
        ("POST /sleep", respond(200, "OK", "text/plain"), "got non-JSON text/plain: OK"),
        ("POST /reset_prefix_cache", respond(200, "[true]"), "got JSON list"),
        ("POST /v1/completions", respond(200, '{"id": "x"}'), "no 'choices' list"),
        ("POST /v1/chat/completions", respond(200, '{"choices": null}'), "no 'choices' list"),
    ],
)
async def test_unusable_200_answers_are_malformed_response(
    route: str, answer: Any, expected: str, fake: FakeVLLM, sidecar: Sidecar, tokenizer: Any
) -> None:
    fake.script(route, answer)
    calls = {
        "POST /sleep": lambda e: e.sleep(),
        "POST /reset_prefix_cache": lambda e: e.reset_prefix_cache(),
        "POST /v1/completions": lambda e: e.generate(
            {"prompts": None, "prompt_token_ids": SEED_PROMPTS, "sampling_params": None}
        ),
        "POST /v1/chat/completions": lambda e: e.chat_completion(
            {"json": {"model": HF_PATH, "messages": [{"role": "user", "content": "hi"}]}}
        ),
    }
    with pytest.raises(SidecarError) as caught:
        await calls[route](engine(hostport(sidecar.client), tokenizer))
    assert caught.value.reason == "malformed_response"
    assert expected in str(caught.value)


async def test_a_stream_is_not_what_completion_returns(sidecar: Sidecar, tokenizer: Any) -> None:
    # SkyRL's completion() returns one JSON object; a streamed answer cannot be that.
    with pytest.raises(SidecarError) as caught:
        await engine(hostport(sidecar.client), tokenizer).completion(
            {"json": {"model": HF_PATH, "prompt": "hi", "stream": True}}
        )
    assert caught.value.reason == "malformed_response"
    assert "non-JSON text/event-stream" in str(caught.value)


async def test_upstream_dropping_mid_body_is_the_sidecars_502(
    fake: FakeVLLM, sidecar: Sidecar, tokenizer: Any
) -> None:
    cut = b'HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 99\r\n\r\n{"ch'
    fake.script("POST /v1/completions", raw(cut))
    with pytest.raises(SidecarError) as caught:
        await engine(hostport(sidecar.client), tokenizer).completion({"json": {"prompt": "hi"}})
    assert (caught.value.status, caught.value.reason) == (502, "upstream_disconnected")


async def test_a_connection_dropped_by_the_peer_is_sidecar_disconnected(
    fake: FakeVLLM, upstream: TestServer, tokenizer: Any
) -> None:
    # Here the engine talks to the fake directly: it is the peer that hangs up.
    fake.script("POST /wake_up", raw(b""))
    with pytest.raises(SidecarError) as caught:
        await engine(hostport(upstream), tokenizer).wake_up()
    assert (caught.value.status, caught.value.reason) == (None, "sidecar_disconnected")
    assert "connection lost" in str(caught.value)


async def test_a_configured_timeout_is_sidecar_timeout(
    fake: FakeVLLM, upstream: TestServer, tokenizer: Any
) -> None:
    fake.script("POST /pause", hang())
    slow = engine(hostport(upstream), tokenizer)
    slow.timeout = aiohttp.ClientTimeout(total=0.2)
    with pytest.raises(SidecarError) as caught:
        await slow.pause_generation()
    assert (caught.value.status, caught.value.reason) == (None, "sidecar_timeout")
    assert caught.value.url.endswith("/pause")
