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
from opentelemetry.trace import Tracer

from proxy.client.traced import TRACER
from proxy.engine.lifecycle import LIFECYCLE
from proxy.observe.metrics import METRICS
from proxy.observe.otel import Tracing, traces_url
from tests.fake_generator import Generator
from tests.fake_vllm import FakeVLLM, respond
from tests.phoenix import (
    Phoenix,
    attribute,
    child_of,
    client_call,
    client_tracing,
    span_id,
    stored_trace,
)
from tests.processes import ROOT
from tests.sidecar import COMPLETION, MakeSidecar, control
from tests.support import eventually, free_port
from tests.test_continuation import cut

DROPPED = "vllm_sidecar_trace_spans_dropped_total"


@pytest.fixture
def client_tracer(phoenix: Phoenix) -> Iterator[Tracer]:
    yield from client_tracing(phoenix)


def _sampled(traceparent: str) -> bool:
    return bool(int(traceparent.rsplit("-", 1)[1], 16) & 1)  # W3C trace flags: bit 0


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
    client_span, headers, trace_id = client_call(client_tracer)
    resp = await sidecar.client.post(
        "/v1/completions", json={**COMPLETION, "model": "Tiny-Model"}, headers=headers
    )
    assert resp.status == 200
    await resp.read()
    client_span.end()

    spans = await stored_trace(phoenix, trace_id, 3)
    server = child_of(spans, span_id(client_span))
    assert server["name"] == "POST /v1/completions"
    upstream_call = child_of(spans, server["context"]["span_id"])
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

    spans = await stored_trace(phoenix, trace_id, 2)
    (server,) = [s for s in spans if s["name"] == "POST /v1/completions"]
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
    assert sidecar.app[METRICS].traced
    # A new trace is not sampled at ratio 0: vLLM is told so (flags 00).
    await (await sidecar.client.post("/v1/completions", json=COMPLETION)).read()
    assert not _sampled(fake.last("/v1/completions").headers["traceparent"])
    # A client's sampled trace is followed (parent-based), and reaches Phoenix.
    client_span, headers, trace_id = client_call(client_tracer)
    await (await sidecar.client.post("/v1/completions", json=COMPLETION, headers=headers)).read()
    client_span.end()
    assert _sampled(fake.last("/v1/completions").headers["traceparent"])
    await stored_trace(phoenix, trace_id, 3)


async def test_a_request_a_pause_held_says_how_long_and_under_which_weights(
    phoenix: Phoenix, fake: FakeVLLM, upstream: TestServer, make_sidecar: MakeSidecar
) -> None:
    sidecar = await make_sidecar(
        str(upstream.make_url("")), otlp_traces_endpoint=phoenix.traces_url
    )
    lifecycle = sidecar.app[LIFECYCLE]
    await eventually(lambda: lifecycle.version == "default", "the weight version is known")
    await control(sidecar, "/pause")
    task = asyncio.create_task(sidecar.client.post("/v1/completions", json=COMPLETION))
    await eventually(lambda: lifecycle.held == 1, "the request is held")
    await control(sidecar, "/resume")
    resp = await task
    assert resp.status == 200
    await resp.read()
    trace_id = fake.last("/v1/completions").headers["traceparent"].split("-")[1]

    spans = await stored_trace(phoenix, trace_id, 2)
    (server,) = [s for s in spans if s["name"] == "POST /v1/completions"]
    assert attribute(server, "vllm_sidecar.phase.held_seconds") > 0
    assert attribute(server, "vllm_sidecar.weight.version") == "default"
    assert attribute(server, "vllm_sidecar.weight.straddled") is False


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
    # An export waits this long for the slow collector: far longer than all the requests take.
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_TRACES_TIMEOUT", "60")
    exports: list[web.Request] = []  # those the slow collector took, answered only at the end
    done = asyncio.Event()

    async def never_answers(request: web.Request) -> web.Response:
        exports.append(request)
        await done.wait()
        return web.Response(status=503)

    if collector == "down":
        endpoint = f"http://127.0.0.1:{free_port()}/v1/traces"
    else:
        slow = web.Application()
        slow.router.add_post("/v1/traces", never_answers)
        endpoint = str((await aiohttp_server(slow)).make_url("/v1/traces"))
    sidecar = await make_sidecar(str(upstream.make_url("")), otlp_traces_endpoint=endpoint)

    async def one() -> None:
        # The bound only turns a request stuck behind the exporter into a failure.
        resp = await asyncio.wait_for(sidecar.client.post("/v1/completions", json=COMPLETION), 30)
        assert resp.status == 200
        await resp.read()

    await one()
    if collector == "slow":  # the export of the first request's spans hangs from now on
        await eventually(lambda: exports, "the collector took an export")
    requests = 40
    for _ in range(requests - 1):
        await one()
    assert exports or collector == "down"
    counted = {"route": "/v1/completions", "method": "POST", "status": "200"}
    assert sidecar.metric("vllm_sidecar_requests_total", **counted) == requests

    def dropped(reason: str) -> float:
        return sidecar.metric(DROPPED, reason=reason)

    # 80 spans, at most 4 queued and one batch in the exporter's hands: the rest are dropped,
    # each one counted.
    await eventually(lambda: dropped("queue_full") + dropped("export_failed") >= 2 * requests - 8)
    assert dropped("queue_full") > 0
    done.set()


def test_tracing_off_imports_no_opentelemetry() -> None:
    script = (
        "import sys\n"
        "from proxy.config.settings import Settings\n"
        "from proxy.wiring.app import create_app\n"
        "from proxy.observe.metrics import METRICS\n"
        "import proxy.__main__\n"
        "app = create_app(Settings())\n"
        "assert app[METRICS].traced is False\n"
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


def test_an_unknown_otlp_protocol_fails_at_start_not_silently(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "http/json")
    with pytest.raises(ValueError, match="grpc or http/protobuf"):
        Tracing("http://127.0.0.1:4318/v1/traces", 1.0, lambda reason, spans: None)


async def test_each_continued_part_is_a_client_span_of_its_own(
    phoenix: Phoenix, fake: FakeVLLM, upstream: TestServer, make_sidecar: MakeSidecar
) -> None:
    """A generation an abort-mode pause cut short and a weight update finished: one server span,
    a client span per part, each with the request id vLLM saw, the versions both named."""
    generator = Generator(fake)
    generator.install()
    sidecar = await make_sidecar(
        str(upstream.make_url("")), otlp_traces_endpoint=phoenix.traces_url, continue_aborted=True
    )
    await eventually(lambda: sidecar.app[LIFECYCLE].version == "default")
    generator.stall_at = 5
    body = {"model": "tiny-model", "prompt": [3, 1, 4], "max_tokens": 12}
    asked = asyncio.create_task(sidecar.client.post("/v1/completions", json=body))
    await cut(sidecar, generator, "v2")
    resp = await asked
    assert resp.status == 200
    await resp.read()
    first, second = (r for r in fake.requests if r.raw_path == "/v1/completions")
    trace_id = second.headers["traceparent"].split("-")[1]
    assert first.headers["traceparent"].split("-")[1] == trace_id

    spans = await stored_trace(phoenix, trace_id, 3)
    (server,) = [s for s in spans if s["name"] == "POST /v1/completions"]
    parts = [s for s in spans if s["parent_id"] == server["context"]["span_id"]]
    assert len(parts) == 2
    seen = {attribute(p, "vllm_sidecar.upstream.request_id") for p in parts}
    assert seen == {first.headers["X-Request-Id"], second.headers["X-Request-Id"]}
    assert attribute(server, "vllm_sidecar.continued_parts") == 1
    assert attribute(server, "vllm_sidecar.weight.version") == "default"
    assert attribute(server, "vllm_sidecar.weight.version_end") == "v2"
