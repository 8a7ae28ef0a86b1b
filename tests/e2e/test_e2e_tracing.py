"""One trace from the client through the sidecar into a real vLLM with its own tracing on
(`--otlp-traces-endpoint`; vLLM 0.32 ships the OpenTelemetry packages): client span -> the
sidecar's server span -> the sidecar's call to vLLM -> vLLM's `llm_request`, in Arize Phoenix."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from opentelemetry.trace import Tracer

from tests.phoenix import (
    Phoenix,
    attribute,
    child_of,
    client_call,
    client_tracing,
    span_id,
    stored_trace,
)
from tests.processes import running
from tests.sidecar import MakeSidecar
from tests.vllm_servers import TinyModel, VllmServer

pytestmark = pytest.mark.vllm


@pytest.fixture(scope="module")
def traced_vllm(
    tiny_model: TinyModel, phoenix: Phoenix, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[VllmServer]:
    server = VllmServer(
        tiny_model.path,
        tmp_path_factory.mktemp("vllm-traced"),
        served_model_name=tiny_model.name,
        extra_args=("--otlp-traces-endpoint", phoenix.traces_url),
        # vLLM exports over gRPC unless told otherwise; Phoenix takes both.
        extra_env={
            "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": "http/protobuf",
            "OTEL_SERVICE_NAME": "vllm",
            "OTEL_BSP_SCHEDULE_DELAY": "200",
        },
    )
    with running(server):
        yield server


@pytest.fixture
def client_tracer(phoenix: Phoenix) -> Iterator[Tracer]:
    yield from client_tracing(phoenix)


async def test_one_trace_from_the_client_through_the_sidecar_into_vllm(
    traced_vllm: VllmServer,
    phoenix: Phoenix,
    client_tracer: Tracer,
    make_sidecar: MakeSidecar,
    tiny_model: TinyModel,
) -> None:
    sidecar = await make_sidecar(traced_vllm.url, otlp_traces_endpoint=phoenix.traces_url)
    client_span, headers, trace_id = client_call(client_tracer)
    body = {"model": tiny_model.hf_path, "prompt": [1, 2, 3], "max_tokens": 4}
    resp = await sidecar.client.post("/v1/completions", json=body, headers=headers)
    assert resp.status == 200, await resp.text()
    await resp.read()
    client_span.end()

    spans = await stored_trace(phoenix, trace_id, 4, within=60)
    server = child_of(spans, span_id(client_span))
    call = child_of(spans, server["context"]["span_id"])
    engine = child_of(spans, call["context"]["span_id"])
    assert server["name"] == "POST /v1/completions"
    assert attribute(server, "gen_ai.request.model") == tiny_model.hf_path
    assert attribute(server, "gen_ai.response.model") == tiny_model.name
    assert attribute(server, "vllm_sidecar.model.rule") == "basename"
    assert attribute(call, "http.response.status_code") == 200
    assert engine["name"] == "llm_request"
    # vLLM's own span names the request id it was sent.
    rid = attribute(call, "vllm_sidecar.upstream.request_id")
    assert rid == resp.headers["X-Request-Id"]
    assert rid in str(attribute(engine, "gen_ai.request.id"))
