"""SidecarInferenceEngine's sleep and wake_up against a real vLLM: what vLLM 0.32 reads."""

from __future__ import annotations

from typing import Any

import pytest
from skyrl.backends.skyrl_train.inference_engines.remote_inference_engine import (
    RemoteInferenceEngine,
)

from proxy.skyrl import SidecarInferenceEngine
from tests.sidecar import MakeSidecar
from tests.skyrl_deployment import hostport
from tests.vllm_servers import DevVllm

pytestmark = [pytest.mark.vllm, pytest.mark.skyrl]


@pytest.fixture(scope="module")
def vllm(dev_engine: DevVllm) -> DevVllm:
    return dev_engine


def engine(url: str, cls: type[Any], tokenizer: Any) -> Any:
    return cls(url=url, model_name="any", engine_backend="vllm", tokenizer=tokenizer)


async def test_sleep_sends_the_level_vllm_reads(
    vllm: DevVllm, make_sidecar: MakeSidecar, tokenizer: Any
) -> None:
    url = hostport((await make_sidecar(vllm.url)).client)
    ours = engine(url, SidecarInferenceEngine, tokenizer)
    assert await ours.sleep(level=2) == {"status": "sleeping", "level": 2}
    awake = await ours.wake_up(tags=["weights", "kv_cache"])
    assert awake["tags"] == ["weights", "kv_cache"]
    # The parent sends the level in a body vLLM never reads: every sleep is level 1.
    stock = engine(url, RemoteInferenceEngine, tokenizer)
    assert await stock.sleep(level=2) == {"status": "sleeping", "level": 1}
    await ours.wake_up()
