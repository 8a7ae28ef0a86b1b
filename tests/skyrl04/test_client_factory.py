"""The 0.4 client from SkyRL's own config, and the BasePPOExp hook that installs it."""

from __future__ import annotations

from typing import Any

import pytest
from skyrl.backends.skyrl_train.inference_servers.remote_inference_client import (
    RemoteInferenceClient,
)
from skyrl.train.config import SkyRLTrainConfig

from proxy.skyrl import (
    RetryPolicy,
    SidecarClientMixin,
    SidecarInferenceClient,
    create_sidecar_client_from_config,
)
from tests.fake_vllm import FakeVLLM
from tests.sidecar import Sidecar
from tests.skyrl04.clients import HF_PATH, SERVED, stock, url


def config(servers: list[str] | None, proxy: str | None = None, **ie: Any) -> SkyRLTrainConfig:
    cfg = SkyRLTrainConfig()
    cfg.trainer.policy.model.path = HF_PATH
    engine = cfg.generator.inference_engine
    engine.run_engines_locally = False
    engine.external_server_urls = servers
    engine.external_proxy_url = proxy
    for key, value in ie.items():
        setattr(engine, key, value)
    return cfg


async def test_one_sidecar_serves_both_planes_and_the_policy_path_resolves(
    fake: FakeVLLM, sidecar: Sidecar
) -> None:
    client = create_sidecar_client_from_config(config([url(sidecar)]))
    assert (client.proxy_url, client.server_urls) == (url(sidecar), [url(sidecar)])
    assert client.model_name == HF_PATH
    await client.completion({"json": {"prompt": "the"}})
    assert fake.last("/v1/completions").json()["model"] == SERVED
    await client.teardown()


def test_the_served_name_and_lora_settings_are_skyrls() -> None:
    cfg = config(["http://a:8080", "http://b:8080"], "http://router:8000", served_model_name="m")
    cfg.trainer.policy.model.lora.rank = 8
    client = create_sidecar_client_from_config(cfg, control_token="t", retry=RetryPolicy(2))
    assert (client.proxy_url, client.server_urls) == (
        "http://router:8000",
        ["http://a:8080", "http://b:8080"],
    )
    assert (client.model_name, client.uses_lora_weight_sync) == ("m", True)
    assert (client.control_token, client.retry.attempts) == ("t", 2)


def test_several_sidecars_without_a_proxy_ask_for_one() -> None:
    with pytest.raises(ValueError, match="external_proxy_url"):
        create_sidecar_client_from_config(config(["http://a:8080", "http://b:8080"]))


class SkyRLsHook:
    """Stands in for BasePPOExp (whose module starts Ray): its hook returns the stock client."""

    def __init__(self, client: RemoteInferenceClient) -> None:
        self.client = client

    def get_inference_client(self) -> RemoteInferenceClient:
        return self.client


class Exp(SidecarClientMixin, SkyRLsHook):
    sidecar_options = {"control_token": "t"}  # noqa: RUF012


def test_the_mixin_turns_skyrls_client_into_the_companion() -> None:
    parent = stock("http://router:8000")
    parent.server_urls = ["http://a:8080", "http://b:8080"]
    parent.increment_weight_version()
    ours = Exp(parent).get_inference_client()
    assert isinstance(ours, SidecarInferenceClient)
    assert (ours.proxy_url, ours.server_urls, ours.model_name) == (
        "http://router:8000",
        ["http://a:8080", "http://b:8080"],
        HF_PATH,
    )
    assert (ours.weight_version, ours.control_token) == (1, "t")


def test_skyrl_0_4_offers_the_client_and_not_the_engine() -> None:
    import proxy.skyrl

    assert "SidecarInferenceClient" in proxy.skyrl.__all__
    assert "SidecarInferenceEngine" not in proxy.skyrl.__all__
