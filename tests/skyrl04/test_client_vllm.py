"""skyrl 0.4's clients through the sidecar against a real vLLM on CPU (dev mode, scale-out)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest

from proxy.skyrl import SidecarError, SidecarInferenceClient
from tests.sidecar import MakeSidecar, Sidecar
from tests.skyrl04.clients import companion, stock, url
from tests.vllm_servers import DevVllm

pytestmark = pytest.mark.vllm


@pytest.fixture(scope="module")
def vllm(dev_engine: DevVllm) -> DevVllm:
    return dev_engine


@pytest.fixture
async def front(vllm: DevVllm, make_sidecar: MakeSidecar) -> Sidecar:
    return await make_sidecar(vllm.url)


@pytest.fixture
async def client(vllm: DevVllm, front: Sidecar) -> AsyncIterator[SidecarInferenceClient]:
    c = companion(url(front), model=vllm.hf_path)
    yield c
    await c.teardown()


async def test_every_data_plane_route_works_with_the_hf_path(
    client: SidecarInferenceClient,
) -> None:
    out = await client.generate(
        {"prompt_token_ids": [[1, 2, 3]], "sampling_params": {"max_tokens": 2}}
    )
    assert len(out["response_ids"][0]) == 2
    tokens = await client.tokenize(["hello world"])
    assert tokens[0]
    assert isinstance((await client.detokenize(tokens))[0], str)
    done = await client.completion({"json": {"prompt": "hello", "max_tokens": 2}})
    assert len(done["choices"]) == 1


async def test_an_unknown_model_names_the_served_one(vllm: DevVllm, front: Sidecar) -> None:
    c = companion(url(front), model="Qwen/Qwen3-8B")
    with pytest.raises(SidecarError) as caught:
        await c.completion({"json": {"prompt": "hello", "max_tokens": 2}})
    assert vllm.served_model_name in str(caught.value)
    await c.teardown()


async def test_control_plane_round_trip(client: SidecarInferenceClient) -> None:
    assert await client.get_world_size() == (1, 1)
    await client.pause(mode="keep")
    await client.resume()
    await client.sleep(level=1)
    assert await client.is_sleeping() is True
    await client.wake_up()
    assert await client.is_sleeping() is False


async def test_the_stock_client_works_through_the_sidecar(vllm: DevVllm, front: Sidecar) -> None:
    c = stock(url(front), model=vllm.hf_path)
    out = await c.generate({"prompt_token_ids": [[1, 2, 3]], "sampling_params": {"max_tokens": 2}})
    assert len(out["response_ids"][0]) == 2
    assert await c.get_world_size() == (1, 1)
    await c.teardown()


async def test_sleep_level_reaches_vllm_as_a_query_parameter(
    client: SidecarInferenceClient,
) -> None:
    answers: dict[str, Any] = await client.sleep(level=2)
    assert [a["body"] for a in answers.values()] == [{"status": "sleeping", "level": 2}]
    await client.wake_up()
