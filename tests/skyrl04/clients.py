"""SkyRL 0.4's clients as the tests make them, and the seed's deployment they talk to."""

from __future__ import annotations

from typing import Any

from skyrl.backends.skyrl_train.inference_servers.remote_inference_client import (
    RemoteInferenceClient,
)

from proxy.skyrl import SidecarInferenceClient
from tests.sidecar import Sidecar
from tests.skyrl_deployment import HF_PATH, SERVED

__all__ = ["HF_PATH", "LORA", "SERVED", "companion", "stock", "url"]

LORA = "skyrl-lora"


def url(sidecar: Sidecar) -> str:
    return str(sidecar.client.make_url("")).rstrip("/")


def stock(base: str, model: str = HF_PATH) -> RemoteInferenceClient:
    return RemoteInferenceClient(
        proxy_url=base, server_urls=[base], data_parallel_size=1, model_name=model
    )


def companion(base: str, model: str = HF_PATH, **options: Any) -> SidecarInferenceClient:
    return SidecarInferenceClient(
        proxy_url=base, server_urls=[base], data_parallel_size=1, model_name=model, **options
    )
