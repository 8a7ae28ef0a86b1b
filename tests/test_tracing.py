"""Traces (docs/tracing.md): one request is one trace in a real receiver (Arize Phoenix), the
client's span its parent and the upstream call's span its child; a collector that is down or
slow costs requests nothing but counted drops; tracing off imports nothing of OpenTelemetry."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.trace import SpanKind, Tracer
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from proxy.client.traced import TRACER
from proxy.observe.otel import traces_url
from proxy.observe.tracing import TRACED
from tests.fake_vllm import FakeVLLM, hang, respond
from tests.phoenix import Phoenix, Span, attribute
from tests.processes import ROOT
from tests.sidecar import COMPLETION, MakeSidecar
from tests.support import eventually, free_port

DROPPED = "vllm_sidecar_trace_spans_dropped_total"


@pytest.fixture
def client_tracer(phoenix: Phoenix) -> Iterator[Tracer]:
    """The client's own tracing (an agent's, a gateway's), exporting to the same Phoenix."""
    provider = TracerProvider(resource=Resource.create({"service.name": "test-client"}))
    provider.add_span_processor(SimpleSpanProcessor(OTLPSpanExporter(phoenix.traces_url)))
    yield provider.get_tracer("tests")
    provider.shutdown()


def _traceparent(tracer: Tracer) -> tuple[Any, dict[str, str]]:
    span = tracer.start_span("client call", kind=SpanKind.CLIENT)
    carrier: dict[str, str] = {}
    from opentelemetry.trace import set_span_in_context

    TraceContextTextMapPropagator().inject(carrier, context=set_span_in_context(span))
    return span, carrier


async def _trace(phoenix: Phoenix, trace_id: str, count: int) -> list[Span]:
    found: list[Span] = []

    def complete() -> bool:
        found[:] = phoenix.spans(trace_id)
        return len(found) >= count

    await eventually(complete, f"{count} spans of trace {trace_id} in Phoenix", within=30)
    return found


def _sampled(traceparent: str) -> bool:
    return bool(int(traceparent.rsplit("-", 1)[1], 16) & 1)  # W3C trace flags: bit 0


def _named(spans: list[Span], name: str) -> list[Span]:
    # Phoenix's `span_kind` is OpenInference's (LLM, CHAIN, ...), not OpenTelemetry's.
    return [s for s in spans if s["name"] == name]


async def test_one_request_is_one_trace_client_to_sidecar_to_upstream(
    phoenix: Phoenix,
    client_tracer: Tracer,
    fake: FakeVLLM,
    upstream: TestServer,
    make_sidecar: MakeSidecar,
) -> None:
    sidecar = await make_sidecar(
        str(upstream.make_url("")), otlp_traces_endpoint=phoenix.traces_url
    )
    client_span, headers = _traceparent(client_tracer)
    resp = await sidecar.client.post(
        "/v1/completions", json={**COMPLETION, "model": "Tiny-Model"}, headers=headers
    )
    assert resp.status == 200
    await resp.read()
    client_span.end()
    trace_id = format(client_span.get_span_context().trace_id, "032x")

    spans = await _trace(phoenix, trace_id, 3)
    (server,) = [
        s for s in spans if s["parent_id"] == format(client_span.get_span_context().span_id, "016x")
    ]
    assert server["name"] == "POST /v1/completions"
    (upstream_call,) = [s for s in spans if s["parent_id"] == server["context"]["span_id"]]
    assert attribute(server, "gen_ai.request.model") == "Tiny-Model"
    assert attribute(server, "gen_ai.response.model") == "tiny-model"
    assert attribute(server, "vllm_sidecar.model.rule") == "case"
    assert attribute(server, "http.route") == "/v1/completions"
    assert attribute(server, "http.response.status_code") == 200
    assert attribute(server, "vllm_sidecar.upstream.attempts") == 1
    assert attribute(server, "vllm_sidecar.continued_parts") == 0
    rid = resp.headers["X-Request-Id"]
    assert attribute(server, "vllm_sidecar.request_id") == rid
    assert attribute(upstream_call, "vllm_sidecar.upstream.request_id") == rid
    assert attribute(upstream_call, "http.response.status_code") == 200
    # vLLM is handed the upstream call's span as its parent.
    sent = fake.last("/v1/completions").headers["traceparent"]
    assert sent.startswith(f"00-{trace_id}-{upstream_call['context']['span_id']}-")
    assert _sampled(sent)


async def test_an_upstream_error_is_on_the_server_span(
    phoenix: Phoenix, fake: FakeVLLM, upstream: TestServer, make_sidecar: MakeSidecar
) -> None:
    fake.script("POST /v1/completions", respond(503, b'{"error": "overloaded"}'))
    sidecar = await make_sidecar(
        str(upstream.make_url("")), otlp_traces_endpoint=phoenix.traces_url
    )
    resp = await sidecar.client.post("/v1/completions", json=COMPLETION)
    assert resp.status == 503
    await resp.read()
    trace_id = fake.last("/v1/completions").headers["traceparent"].split("-")[1]

    spans = await _trace(phoenix, trace_id, 2)
    (server,) = _named(spans, "POST /v1/completions")
    assert attribute(server, "error.type") == "upstream_status"
    assert attribute(server, "vllm_sidecar.error.source") == "upstream"
    assert server["status_code"] == "ERROR"


async def test_the_standard_variable_turns_it_on_and_a_ratio_of_zero_follows_the_client(
    phoenix: Phoenix,
    client_tracer: Tracer,
    fake: FakeVLLM,
    upstream: TestServer,
    make_sidecar: MakeSidecar,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", phoenix.url)  # no path: added
    sidecar = await make_sidecar(str(upstream.make_url("")), otlp_traces_sample_ratio=0.0)
    assert sidecar.app[TRACED]
    # A new trace is not sampled at ratio 0: vLLM is told so (flags 00).
    await (await sidecar.client.post("/v1/completions", json=COMPLETION)).read()
    assert not _sampled(fake.last("/v1/completions").headers["traceparent"])
    # A client's sampled trace is followed (parent-based), and reaches Phoenix.
    client_span, headers = _traceparent(client_tracer)
    await (await sidecar.client.post("/v1/completions", json=COMPLETION, headers=headers)).read()
    client_span.end()
    assert _sampled(fake.last("/v1/completions").headers["traceparent"])
    await _trace(phoenix, format(client_span.get_span_context().trace_id, "032x"), 3)


@pytest.mark.parametrize("collector", ["down", "slow"])
async def test_a_collector_down_or_slow_costs_requests_nothing_but_counted_drops(
    collector: str,
    aiohttp_server: Any,
    fake: FakeVLLM,
    upstream: TestServer,
    make_sidecar: MakeSidecar,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("OTEL_BSP_MAX_QUEUE_SIZE", "4")
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_TRACES_TIMEOUT", "2")
    if collector == "down":
        endpoint = f"http://127.0.0.1:{free_port()}/v1/traces"
    else:
        slow = web.Application()  # a collector that takes the connection and never answers
        slow.router.add_post("/v1/traces", hang())
        endpoint = str((await aiohttp_server(slow)).make_url("/v1/traces"))
    sidecar = await make_sidecar(str(upstream.make_url("")), otlp_traces_endpoint=endpoint)
    requests = 40
    for _ in range(requests):  # one after the other: each waits for nothing of the collector
        resp = await asyncio.wait_for(
            sidecar.client.post("/v1/completions", json=COMPLETION), timeout=5
        )
        assert resp.status == 200
        await resp.read()
    assert (
        sidecar.metric(
            "vllm_sidecar_requests_total", route="/v1/completions", method="POST", status="200"
        )
        == requests
    )

    def dropped() -> float:
        return sidecar.metric(DROPPED, reason="queue_full") + sidecar.metric(
            DROPPED, reason="export_failed"
        )

    # 80 spans, at most 4 queued and 2 x 512 in flight: most are dropped, every one counted.
    await eventually(lambda: dropped() >= 2 * requests - 4 - 1024 and dropped() > 0, "drops")
    assert sidecar.metric(DROPPED, reason="queue_full") > 0


def test_tracing_off_imports_no_opentelemetry() -> None:
    script = (
        "import sys\n"
        "from proxy.config.settings import Settings\n"
        "from proxy.wiring.app import create_app\n"
        "from proxy.observe.tracing import TRACED\n"
        "import proxy.__main__\n"
        "app = create_app(Settings())\n"
        "assert app[TRACED] is False\n"
        "print(sorted(m for m in sys.modules if m.startswith('opentelemetry')))\n"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    env["PYTHONPATH"] = str(ROOT)
    out = subprocess.run(
        [sys.executable, "-c", script], env=env, cwd=ROOT, capture_output=True, text=True
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


def test_a_bare_collector_address_gets_the_traces_path() -> None:
    assert traces_url("http://jaeger:4318") == "http://jaeger:4318/v1/traces"
    assert traces_url("http://jaeger:4318/") == "http://jaeger:4318/v1/traces"
    assert traces_url("https://otel.example/custom/path") == "https://otel.example/custom/path"


async def test_the_tracer_is_the_apps_own(upstream: TestServer, make_sidecar: MakeSidecar) -> None:
    endpoint = f"http://127.0.0.1:{free_port()}/v1/traces"
    one = await make_sidecar(str(upstream.make_url("")), otlp_traces_endpoint=endpoint)
    two = await make_sidecar(str(upstream.make_url("")), otlp_traces_endpoint=endpoint)
    assert one.app[TRACER] is not two.app[TRACER]
