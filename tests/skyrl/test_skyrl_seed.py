"""The seed (SkyRL issue #1672) reproduced with SkyRL's own classes, and fixed two ways."""

from __future__ import annotations

from typing import Any

import pytest
from aiohttp.test_utils import TestServer

from proxy.skyrl import SidecarError, SidecarInferenceEngine
from tests.fake_vllm import FakeVLLM
from tests.sidecar import MakeSidecar, Sidecar
from tests.skyrl.seed import SEED_PROMPTS, check_seed, generate_via_skyrl, make_client
from tests.skyrl_deployment import HF_PATH, SERVED, hostport

pytestmark = pytest.mark.skyrl

UNSERVED = "meta-llama/Llama-3.2-1B"


async def test_seed_stock_skyrl_asking_vllm_for_the_hf_path_ends_in_index_error(
    fake: FakeVLLM, upstream: TestServer, tokenizer: Any
) -> None:
    # Documents the bug: vLLM answers 404, RemoteInferenceEngine reads no choices from it and
    # InferenceEngineClient indexes the empty list. Must keep failing so on skyrl 0.2.0.
    with pytest.raises(IndexError) as caught:
        await generate_via_skyrl(hostport(upstream), HF_PATH, tokenizer)
    last = caught.traceback[-1]
    assert last.path.name == "inference_engine_client.py"
    assert 'result["responses"][local_idx]' in str(last.statement)
    assert fake.last("/v1/completions").json()["model"] == HF_PATH


async def test_stock_skyrl_through_the_sidecar_succeeds(
    fake: FakeVLLM, sidecar: Sidecar, tokenizer: Any
) -> None:
    # Only the URL changed: the sidecar resolves the HF path to the served name.
    output = await generate_via_skyrl(hostport(sidecar.client), HF_PATH, tokenizer)
    assert output["responses"] == [" fox"] * len(SEED_PROMPTS)
    assert output["stop_reasons"] == ["length"] * len(SEED_PROMPTS)
    assert output["response_ids"] == [tokenizer.encode(" fox", add_special_tokens=False)] * 2
    sent = fake.last("/v1/completions").json()
    assert (sent["model"], sent["prompt"]) == (SERVED, SEED_PROMPTS)


async def test_sidecar_engine_through_the_sidecar_succeeds(
    fake: FakeVLLM, sidecar: Sidecar, tokenizer: Any
) -> None:
    output = await generate_via_skyrl(
        hostport(sidecar.client), HF_PATH, tokenizer, engine_cls=SidecarInferenceEngine
    )
    assert output["responses"] == [" fox"] * len(SEED_PROMPTS)
    assert fake.last("/v1/completions").json()["model"] == SERVED


def assert_unserved_error(err: SidecarError) -> None:
    assert (err.status, err.reason) == (404, "upstream_status")
    assert err.served == [SERVED]
    assert err.request_id
    text = str(err)
    assert "\n" not in text
    assert f"The model `{UNSERVED}` does not exist" in text  # the upstream's own 404 text
    assert SERVED in text
    assert "/v1/completions" in text


async def test_sidecar_engine_with_an_unserved_name_raises_sidecar_error(
    sidecar: Sidecar, tokenizer: Any
) -> None:
    engine = SidecarInferenceEngine(
        url=hostport(sidecar.client),
        model_name=UNSERVED,
        engine_backend="vllm",
        tokenizer=tokenizer,
    )
    batch = {"prompts": None, "prompt_token_ids": SEED_PROMPTS, "sampling_params": None}
    with pytest.raises(SidecarError) as caught:
        await engine.generate(batch)
    assert_unserved_error(caught.value)


async def test_unserved_name_raises_through_inference_engine_client_too(
    sidecar: Sidecar, tokenizer: Any
) -> None:
    # No IndexError and no empty output: SkyRL's client lets the engine's error through.
    with pytest.raises(SidecarError) as caught:
        await generate_via_skyrl(
            hostport(sidecar.client), UNSERVED, tokenizer, engine_cls=SidecarInferenceEngine
        )
    assert_unserved_error(caught.value)


async def test_two_engines_route_and_reassemble_through_the_client(
    fake: FakeVLLM, make_sidecar: MakeSidecar, upstream: TestServer, tokenizer: Any
) -> None:
    sidecars = [await make_sidecar(str(upstream.make_url(""))) for _ in range(2)]
    engines = [
        SidecarInferenceEngine(
            url=hostport(s.client), model_name=HF_PATH, engine_backend="vllm", tokenizer=tokenizer
        )
        for s in sidecars
    ]
    prompts = [[1], [2, 2], [3, 3, 3], [4]]
    client = make_client(engines, tokenizer, HF_PATH)
    output = await client.generate(
        {"prompts": None, "prompt_token_ids": prompts, "sampling_params": {"max_tokens": 2}}
    )
    assert output["responses"] == [" fox"] * 4
    sent = sorted(r.json()["prompt"] for r in fake.requests if r.raw_path == "/v1/completions")
    assert sent == [[[1], [2, 2]], [[3, 3, 3], [4]]]


async def test_the_reusable_seed_check_passes_on_the_fake(
    upstream: TestServer, sidecar: Sidecar, tokenizer: Any
) -> None:
    # tests/e2e runs the same check against a real vLLM.
    outcome = await check_seed(
        hostport(upstream), hostport(sidecar.client), HF_PATH, UNSERVED, tokenizer, [SERVED]
    )
    assert outcome.index_error.rstrip().endswith("IndexError: list index out of range")
    assert outcome.through_sidecar["responses"] == [" fox"] * len(SEED_PROMPTS)
    assert outcome.sidecar_error.served == [SERVED]
