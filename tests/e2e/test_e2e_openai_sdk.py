"""The official `openai` SDK pointed at the sidecar, in front of a real vLLM, asking by HF path."""

from __future__ import annotations

from collections.abc import Iterator

import openai
import pytest

from tests.sidecar import SidecarProcess
from tests.vllm_servers import TinyModel

pytestmark = pytest.mark.vllm


@pytest.fixture
def client(sidecar: SidecarProcess) -> Iterator[openai.OpenAI]:
    # No retries: every error must surface from the one request the test made.
    with openai.OpenAI(base_url=f"{sidecar.url}/v1", api_key="unused", max_retries=0) as client:
        yield client


def test_completion(client: openai.OpenAI, tiny_model: TinyModel) -> None:
    out = client.completions.create(
        model=tiny_model.hf_path, prompt=[[1, 2, 3], [4, 5]], max_tokens=3
    )
    assert out.model == tiny_model.name
    assert [c.index for c in out.choices] == [0, 1]
    assert out.usage is not None
    assert out.usage.completion_tokens > 0


def test_chat(client: openai.OpenAI, tiny_model: TinyModel) -> None:
    out = client.chat.completions.create(
        model=tiny_model.hf_path,
        messages=[{"role": "user", "content": "hello"}],
        max_tokens=3,
    )
    assert out.model == tiny_model.name
    assert out.choices[0].message.role == "assistant"
    assert out.choices[0].finish_reason in ("length", "stop")


def test_streaming_iteration(client: openai.OpenAI, tiny_model: TinyModel) -> None:
    stream = client.chat.completions.create(
        model=tiny_model.hf_path,
        messages=[{"role": "user", "content": "hello"}],
        max_tokens=5,
        stream=True,
        extra_body={"ignore_eos": True},
    )
    with stream:
        chunks = list(stream)
    assert {c.model for c in chunks} == {tiny_model.name}
    assert chunks[-1].choices[0].finish_reason == "length"
    text = "".join(c.choices[0].delta.content or "" for c in chunks)
    assert text


def test_bad_model_raises_not_found_with_the_envelope(
    client: openai.OpenAI, tiny_model: TinyModel
) -> None:
    with pytest.raises(openai.NotFoundError) as caught:
        client.completions.create(model="sidecar-test/no-such-model", prompt=[1], max_tokens=1)
    exc = caught.value
    assert exc.status_code == 404
    # The SDK keeps the envelope's `error` object as `.body`.
    assert isinstance(exc.body, dict)
    assert exc.body["reason"] == "upstream_status"
    assert exc.body["source"] == "upstream"
    assert exc.body["request_id"] == exc.request_id
    assert exc.body["model"]["served"] == [tiny_model.name]
    upstream = exc.body["upstream"]
    assert upstream["status"] == 404
    assert upstream["body"]["error"]["type"] == "NotFoundError"
    assert "sidecar-test/no-such-model" in upstream["body"]["error"]["message"]
    assert exc.response.json() == {"error": exc.body}


def test_in_stream_error_raises(client: openai.OpenAI, tiny_model: TinyModel) -> None:
    # An out-of-vocabulary token id: vLLM answers 200 and sends the error as an SSE event.
    stream = client.completions.create(
        model=tiny_model.hf_path, prompt=[1, 50_000], max_tokens=2, stream=True
    )
    with stream, pytest.raises(openai.APIError, match="out of vocabulary"):
        list(stream)
