"""create_sidecar_engines_from_config: SkyRL's config in, one checked engine per remote URL out."""

from __future__ import annotations

from typing import Any

import pytest
from skyrl.train.config import SkyRLTrainConfig

from proxy.skyrl import SidecarError, SidecarInferenceEngine, create_sidecar_engines_from_config
from tests.fake_vllm import FakeVLLM
from tests.sidecar import Sidecar
from tests.skyrl.seed import make_client
from tests.skyrl_deployment import HF_PATH, SERVED, hostport

pytestmark = pytest.mark.skyrl


def config(urls: list[str], served_model_name: str | None = None) -> Any:
    cfg = SkyRLTrainConfig()
    cfg.trainer.policy.model.path = HF_PATH
    ie = cfg.generator.inference_engine
    ie.run_engines_locally = False
    ie.remote_urls = urls
    ie.served_model_name = served_model_name
    ie.tensor_parallel_size, ie.pipeline_parallel_size = 2, 1
    ie.data_parallel_size, ie.expert_parallel_size = 1, 1
    return cfg


def test_one_engine_per_remote_url_with_the_configs_sizes(tokenizer: Any) -> None:
    engines = create_sidecar_engines_from_config(config(["a:8080", "b:8080"]), tokenizer)
    assert [type(e) for e in engines] == [SidecarInferenceEngine] * 2
    assert [e.url for e in engines] == ["http://a:8080", "http://b:8080"]
    assert all(e.tokenizer is tokenizer and e.engine_backend == "vllm" for e in engines)
    assert [(e.tp_size(), e.pp_size(), e.dp_size(), e.ep_size()) for e in engines] == [
        (2, 1, 1, 1)
    ] * 2


@pytest.mark.parametrize(
    ("served_model_name", "expected"), [(None, HF_PATH), (SERVED, SERVED), ("alias-x", "alias-x")]
)
def test_model_name_is_served_model_name_when_set_else_the_policy_path(
    served_model_name: str | None, expected: str, tokenizer: Any
) -> None:
    cfg = config(["a:8080"], served_model_name)
    assert [e.model_name for e in create_sidecar_engines_from_config(cfg, tokenizer)] == [expected]


@pytest.mark.parametrize("served_model_name", [None, SERVED])
async def test_factory_engines_generate_through_the_sidecar(
    served_model_name: str | None, fake: FakeVLLM, sidecar: Sidecar, tokenizer: Any
) -> None:
    cfg = config([hostport(sidecar.client)], served_model_name)
    engines = create_sidecar_engines_from_config(cfg, tokenizer)
    client = make_client(engines, tokenizer, HF_PATH, served_model_name=served_model_name)
    output = await client.generate(
        {"prompts": None, "prompt_token_ids": [[7, 8]], "sampling_params": {"max_tokens": 3}}
    )
    assert output["responses"] == [" fox"]
    assert fake.last("/v1/completions").json()["model"] == SERVED


async def test_factory_engine_with_a_wrong_served_model_name_raises(
    sidecar: Sidecar, tokenizer: Any
) -> None:
    cfg = config([hostport(sidecar.client)], "Qwen2.5-7B-Instruct")
    [engine] = create_sidecar_engines_from_config(cfg, tokenizer)
    with pytest.raises(SidecarError) as caught:
        await engine.generate({"prompts": None, "prompt_token_ids": [[1]], "sampling_params": None})
    assert caught.value.status == 404
    assert "Qwen2.5-7B-Instruct" in str(caught.value)
    assert caught.value.served == [SERVED]
