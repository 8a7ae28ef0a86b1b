"""Each failure skyrl 0.4.0's stock client reports opaquely, through the sidecar: clear words."""

from __future__ import annotations

from typing import Any

import aiohttp
import pytest
from aiohttp import web

from proxy.skyrl import RetryPolicy, SidecarError
from tests.fake_vllm import FakeVLLM, respond
from tests.sidecar import Sidecar
from tests.skyrl04.clients import companion, stock, url


async def chunked_world_size(request: web.Request) -> web.StreamResponse:
    """A control-plane answer framed by chunks, without Content-Length (a router's way)."""
    resp = web.StreamResponse(headers={"Content-Type": "application/json"})
    resp.enable_chunked_encoding()
    await resp.prepare(request)
    await resp.write(b'{"world_size": ')
    await resp.write(b"1}")
    await resp.write_eof()
    return resp


GENERATE = (
    "POST /inference/v1/generate",
    lambda c: c.generate({"prompt_token_ids": [[1, 2]], "sampling_params": {}}),
)
COMPLETION = ("POST /v1/completions", lambda c: c.completion({"json": {"prompt": "the"}}))

# case -> (route, call, the upstream's answer, words of it the client must be told)
CASES: dict[str, tuple[str, Any, Any, str]] = {
    "object_error_body": (
        *COMPLETION,
        respond(
            400,
            '{"object": "error", "message": "max_tokens must be at least 1",'
            ' "type": "BadRequestError", "code": 400}',
        ),
        "max_tokens must be at least 1",
    ),
    "fastapi_detail_body": (
        *GENERATE,
        respond(
            403, '{"detail": "Scale-out endpoints are disabled. Start with --enable-scale-out"}'
        ),
        "Scale-out endpoints are disabled",
    ),
    "bare_json_string": (
        *COMPLETION,
        respond(500, '"EngineCore died: CUDA error"'),
        "EngineCore died",
    ),
    "html_502": (
        *GENERATE,
        respond(502, "<html><body><h1>502 Bad Gateway</h1>nginx</body></html>", "text/html"),
        "502 Bad Gateway",
    ),
    "empty_body_500": (*COMPLETION, respond(500, b"", "text/plain"), "empty body"),
    "empty_choices": (
        *GENERATE,
        respond(200, '{"choices": []}'),
        "empty `choices` list",
    ),
}


@pytest.mark.parametrize("case", list(CASES))
async def test_the_companion_raises_sidecar_error_with_the_upstreams_words(
    case: str, fake: FakeVLLM, sidecar: Sidecar
) -> None:
    route, call, answer, words = CASES[case]
    fake.scripts[route] = [answer] * 2  # a 5xx is retryable: the second try gets the same
    client = companion(url(sidecar), retry=RetryPolicy(attempts=2, base_s=0.01))
    with pytest.raises(SidecarError) as caught:
        await call(client)
    assert words in str(caught.value)
    await client.teardown()


@pytest.mark.parametrize(("route", "call"), [GENERATE, COMPLETION], ids=["generate", "completion"])
async def test_the_companion_refuses_a_generation_answered_200_without_a_body(
    route: str, call: Any, fake: FakeVLLM, sidecar: Sidecar
) -> None:
    # Only a control-plane success may be empty; the client indexes a generation's choices.
    fake.scripts[route] = [respond(200, b"")]
    client = companion(url(sidecar))
    with pytest.raises(SidecarError) as caught:
        await call(client)
    assert "expected a JSON object" in str(caught.value)
    await client.teardown()


@pytest.mark.parametrize("case", list(CASES))
async def test_the_stock_client_through_the_sidecar_gets_the_upstreams_words(
    case: str, fake: FakeVLLM, sidecar: Sidecar
) -> None:
    route, call, answer, words = CASES[case]
    fake.scripts[route] = [answer]
    client = stock(url(sidecar))
    # One answer each: an HTML 502 would otherwise be retried 30 times, a second apart.
    with pytest.raises(aiohttp.ClientResponseError) as caught:
        await call(client)
    assert words in caught.value.message
    assert len([r for r in fake.requests if r.raw_path == route.split(" ")[1]]) == 1
    await client.teardown()


@pytest.mark.parametrize("kind", ["stock", "companion"])
async def test_a_chunked_control_plane_answer_reaches_get_world_size(
    kind: str, fake: FakeVLLM, sidecar: Sidecar
) -> None:
    fake.script("GET /get_world_size", chunked_world_size)
    client = (stock if kind == "stock" else companion)(url(sidecar))
    assert await client.get_world_size() == (1, 1)
    await client.teardown()
