"""The sidecar in front of a real vLLM: names resolve, answers match vLLM's, errors are enveloped.

vLLM serves the tiny model under its basename only (`tiny-llama`), as in the seed report;
clients ask for it by its HF path (`sidecar-test/tiny-llama`). Every answer through the sidecar
is compared with what vLLM itself says to the same request sent with the served name.
"""

from __future__ import annotations

from typing import Any

import aiohttp
import pytest

from tests.metrics import metric
from tests.sidecar import SidecarProcess
from tests.sse import DONE, parse_sse
from tests.vllm_servers import TinyModel, VllmServer

pytestmark = pytest.mark.vllm

Json = dict[str, Any]


async def post(http: aiohttp.ClientSession, url: str, payload: Json) -> tuple[int, Json]:
    async with http.post(url, json=payload) as resp:
        return resp.status, await resp.json()


async def post_stream(http: aiohttp.ClientSession, url: str, payload: Json) -> list[Any]:
    async with http.post(url, json=payload) as resp:
        assert resp.status == 200, await resp.text()
        assert resp.content_type == "text/event-stream"
        # Read to the end of the body, not just to [DONE]: the response is over only then.
        return parse_sse(await resp.text())


def shape(value: Any) -> Any:
    """The keys and value types of a JSON document, without its values."""
    if isinstance(value, dict):
        return {k: shape(v) for k, v in value.items()}
    if isinstance(value, list):
        return [shape(v) for v in value]
    return type(value).__name__


def failures(sidecar: SidecarProcess, http: aiohttp.ClientSession, **labels: str) -> Any:
    return metric(http, f"{sidecar.admin_url}/metrics", "vllm_sidecar_failures_total", **labels)


# Greedy decoding, so that the sidecar's answer and vLLM's own can be compared token for token.
COMPLETION: Json = {"prompt": [[1, 2, 3], [40, 50, 60, 70]], "max_tokens": 6, "temperature": 0}
CHAT: Json = {"messages": [{"role": "user", "content": "hello"}], "max_tokens": 6, "temperature": 0}
ROUTES = [("/v1/completions", COMPLETION), ("/v1/chat/completions", CHAT)]


@pytest.mark.parametrize(("route", "payload"), ROUTES)
async def test_hf_path_answers_like_vllm_itself(
    http: aiohttp.ClientSession,
    sidecar: SidecarProcess,
    vllm_server: VllmServer,
    tiny_model: TinyModel,
    route: str,
    payload: Json,
) -> None:
    status, via = await post(http, sidecar.url + route, {**payload, "model": tiny_model.hf_path})
    _, direct = await post(http, vllm_server.url + route, {**payload, "model": tiny_model.name})
    assert status == 200, via
    assert via["model"] == tiny_model.name
    assert shape(via) == shape(direct)
    assert via["choices"] == direct["choices"]
    assert via["usage"] == direct["usage"]


async def test_token_id_batch_gets_one_choice_per_prompt(
    http: aiohttp.ClientSession, sidecar: SidecarProcess, tiny_model: TinyModel
) -> None:
    prompts = [[5, 6, 7], [8, 9], [10, 11, 12, 13]]
    status, body = await post(
        http,
        f"{sidecar.url}/v1/completions",
        {"model": tiny_model.hf_path, "prompt": prompts, "max_tokens": 3},
    )
    assert status == 200, body
    assert [c["index"] for c in body["choices"]] == [0, 1, 2]
    assert body["usage"]["prompt_tokens"] == sum(map(len, prompts))


@pytest.mark.parametrize(("route", "payload"), ROUTES)
async def test_hf_path_streams_like_vllm_itself(
    http: aiohttp.ClientSession,
    sidecar: SidecarProcess,
    vllm_server: VllmServer,
    tiny_model: TinyModel,
    route: str,
    payload: Json,
) -> None:
    streamed = {**payload, "stream": True}
    via = await post_stream(http, sidecar.url + route, {**streamed, "model": tiny_model.hf_path})
    direct = await post_stream(
        http, vllm_server.url + route, {**streamed, "model": tiny_model.name}
    )
    assert via[-1] == direct[-1] == DONE
    assert {e["model"] for e in via[:-1]} == {tiny_model.name}
    assert shape(via[0]) == shape(direct[0])
    # vLLM may merge tokens into fewer events when its reader lags, so compare what they add up to.
    assert streamed_text(via) == streamed_text(direct)


def streamed_text(events: list[Any]) -> dict[int, tuple[str, str | None]]:
    """Each choice's text joined across a stream's events, and its finish reason."""
    text: dict[int, str] = {}
    finish: dict[int, str | None] = {}
    for event in events[:-1]:
        for choice in event["choices"]:
            i = choice["index"]
            piece = choice["text"] if "text" in choice else choice["delta"].get("content") or ""
            text[i] = text.get(i, "") + piece
            # The Rust frontend's token events have no finish_reason key, only its last.
            finish[i] = choice.get("finish_reason") or finish.get(i)
    return {i: (text[i], finish[i]) for i in text}


async def test_tokenize_by_hf_path(
    http: aiohttp.ClientSession,
    sidecar: SidecarProcess,
    vllm_server: VllmServer,
    tiny_model: TinyModel,
) -> None:
    payload = {"prompt": "hello world, the sidecar"}
    status, via = await post(
        http, f"{sidecar.url}/tokenize", {**payload, "model": tiny_model.hf_path}
    )
    _, direct = await post(
        http, f"{vllm_server.url}/tokenize", {**payload, "model": tiny_model.name}
    )
    assert status == 200, via
    assert via == direct
    assert via["count"] == len(via["tokens"]) > 0


@pytest.mark.parametrize(
    "form", ["root", "upper-case HF path", "upper-case basename", "served name"]
)
async def test_every_form_of_the_name_resolves(
    http: aiohttp.ClientSession, sidecar: SidecarProcess, tiny_model: TinyModel, form: str
) -> None:
    name = {
        "root": str(tiny_model.path),
        "upper-case HF path": tiny_model.hf_path.upper(),
        "upper-case basename": "Tiny-LLaMA",
        "served name": tiny_model.name,
    }[form]
    status, body = await post(
        http, f"{sidecar.url}/v1/completions", {"model": name, "prompt": [1, 2], "max_tokens": 1}
    )
    assert status == 200, body
    assert body["model"] == tiny_model.name


async def test_admin_models_shows_the_table(
    http: aiohttp.ClientSession, sidecar: SidecarProcess, tiny_model: TinyModel
) -> None:
    async with http.get(f"{sidecar.admin_url}/models") as resp:
        table = await resp.json()
    assert resp.status == 200
    assert table["models_known"] is True
    [served] = table["served"]
    assert served["id"] == tiny_model.name
    assert served["root"] == str(tiny_model.path)
    rules = {a["alias"]: a["rule"] for a in served["aliases"]}
    assert rules[str(tiny_model.path)] == "root"
    assert rules[f"*/{tiny_model.name}"] == "basename"


async def test_unknown_name_gets_vllms_404_in_the_envelope(
    http: aiohttp.ClientSession,
    sidecar: SidecarProcess,
    vllm_server: VllmServer,
    tiny_model: TinyModel,
) -> None:
    payload = {"model": "sidecar-test/tiny-lama", "prompt": [1, 2], "max_tokens": 1}
    labels = {"route": "/v1/completions", "reason": "upstream_status", "status": "404"}
    before = await failures(sidecar, http, **labels)
    async with http.post(f"{sidecar.url}/v1/completions", json=payload) as resp:
        status, body, headers = resp.status, await resp.json(), resp.headers
    _, vllm_body = await post(http, f"{vllm_server.url}/v1/completions", payload)

    assert status == 404
    assert headers["X-Sidecar-Error"] == "upstream_status"
    err = body["error"]
    assert (err["code"], err["source"], err["reason"]) == (404, "upstream", "upstream_status")
    # vLLM's own type: "NotFoundError" (Python server), "invalid_request_error" (Rust).
    assert err["type"] == vllm_body["error"]["type"]
    assert err["request_id"] == headers["X-Request-Id"]
    assert err["upstream"]["status"] == 404
    assert err["upstream"]["body"] == vllm_body
    assert err["model"]["requested"] == "sidecar-test/tiny-lama"
    assert err["model"]["resolved"] is None
    assert err["model"]["served"] == [tiny_model.name]
    assert tiny_model.name in err["model"]["suggestions"]
    assert tiny_model.name in err["message"]
    assert await failures(sidecar, http, **labels) == before + 1


@pytest.mark.parametrize(
    ("case", "extra"),
    [
        ("prompt longer than max-model-len", {"prompt": "max_model_len + 1", "max_tokens": 1}),
        ("max_tokens -1", {"prompt": [1, 2, 3], "max_tokens": -1}),
    ],
)
async def test_vllms_400s_come_back_enveloped_with_their_body(
    http: aiohttp.ClientSession,
    sidecar: SidecarProcess,
    vllm_server: VllmServer,
    tiny_model: TinyModel,
    case: str,
    extra: Json,
) -> None:
    if extra["prompt"] == "max_model_len + 1":
        extra = {**extra, "prompt": [1] * (vllm_server.max_model_len + 1)}
    labels = {"route": "/v1/completions", "reason": "upstream_status", "status": "400"}
    before = await failures(sidecar, http, **labels)
    status, body = await post(
        http, f"{sidecar.url}/v1/completions", {"model": tiny_model.hf_path, **extra}
    )
    _, vllm_body = await post(
        http, f"{vllm_server.url}/v1/completions", {"model": tiny_model.name, **extra}
    )
    assert status == 400, case
    err = body["error"]
    assert (err["code"], err["source"], err["reason"]) == (400, "upstream", "upstream_status")
    assert err["type"] == vllm_body["error"]["type"]  # "BadRequestError" on the Python server
    assert err["param"] == vllm_body["error"]["param"]
    assert err["upstream"]["body"] == vllm_body
    assert vllm_body["error"]["message"] in err["message"]
    assert err["model"]["resolved"] == tiny_model.name
    assert await failures(sidecar, http, **labels) == before + 1


async def test_out_of_vocabulary_stream_error_is_delivered_and_counted(
    http: aiohttp.ClientSession, sidecar: SidecarProcess, tiny_model: TinyModel
) -> None:
    # vLLM answers 200 and reports this error inside the stream (sample f9).
    labels = {"route": "/v1/completions", "reason": "upstream_stream_error"}
    before = await failures(sidecar, http, **labels)
    payload = {"model": tiny_model.hf_path, "prompt": [1, 50_000], "max_tokens": 2, "stream": True}
    events = await post_stream(http, f"{sidecar.url}/v1/completions", payload)
    assert events[-1] == DONE
    [error_event] = [e for e in events if isinstance(e, dict) and "error" in e]
    assert "out of vocabulary" in error_event["error"]["message"]
    assert await failures(sidecar, http, **labels) == before + 1
