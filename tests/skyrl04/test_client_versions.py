"""The companion's generate says which weights made each response: vLLM's spans, per prompt."""

from __future__ import annotations

import json

from aiohttp import web

from tests.fake_vllm import FakeVLLM, json_response
from tests.sidecar import Sidecar
from tests.skyrl04.clients import companion, stock, url


async def versioned(request: web.Request) -> web.Response:
    """vLLM's /inference/v1/generate with its per-token spans; the version follows the prompt,
    so that a result filed under the wrong prompt shows."""
    payload = json.loads(await request.read())
    first = payload["token_ids"][0]
    spans = [
        {"version": f"v{first}", "start": 0, "end": 1},
        {"version": f"v{first}+1", "start": 1, "end": 2},
    ]
    choice = {"index": 0, "token_ids": [7, 8], "finish_reason": "length", "weight_versions": spans}
    return json_response({"choices": [choice], "model": payload["model"]})


async def test_each_response_carries_the_spans_of_its_own_prompt(
    fake: FakeVLLM, sidecar: Sidecar
) -> None:
    fake.scripts["POST /inference/v1/generate"] = [versioned] * 20
    client = companion(url(sidecar))
    batch = {"prompt_token_ids": [[3, 1], [5, 1], [4, 1], [9, 1]], "sampling_params": {}}
    out = await client.generate(batch)
    assert [spans[0]["version"] for spans in out["weight_versions"]] == ["v3", "v5", "v4", "v9"]
    assert out["weight_versions"][1] == [
        {"version": "v5", "start": 0, "end": 1},
        {"version": "v5+1", "start": 1, "end": 2},
    ]
    # The stock client drops them.
    plain = stock(url(sidecar))
    assert "weight_versions" not in await plain.generate(batch)
    await plain.teardown()
    await client.teardown()


async def test_one_prompt_object_twice_gets_no_spans_rather_than_anothers(
    fake: FakeVLLM, sidecar: Sidecar
) -> None:
    fake.scripts["POST /inference/v1/generate"] = [versioned] * 20
    client = companion(url(sidecar))
    same = [6, 1]
    out = await client.generate({"prompt_token_ids": [same, [2, 1], same], "sampling_params": {}})
    assert out["weight_versions"][0] is None
    assert out["weight_versions"][2] is None
    assert out["weight_versions"][1][0]["version"] == "v2"
    await client.teardown()
