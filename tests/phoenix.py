"""Arize Phoenix, an OTLP receiver users run (scripts/test-env.d/35-phoenix.sh builds its venv),
started on free ports; what it received is read back through its own REST API."""

from __future__ import annotations

import json
import os
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.trace import Span as ClientSpan
from opentelemetry.trace import SpanKind, Tracer, set_span_in_context
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from tests.processes import ROOT, ManagedProcess
from tests.support import eventually, free_port

PHOENIX_VENV = Path(os.environ.get("PHOENIX_VENV", ROOT / ".venv-phoenix"))

Span = dict[str, Any]


class Phoenix(ManagedProcess):
    """`phoenix serve`: OTLP/HTTP on `traces_url`, spans back from /v1/projects/default/spans."""

    def __init__(self, workdir: Path) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.traces_url = f"{self.url}/v1/traces"
        env = {
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
            "PHOENIX_HOST": "127.0.0.1",
            "PHOENIX_PORT": str(self.port),
            "PHOENIX_GRPC_PORT": str(free_port()),
            "PHOENIX_WORKING_DIR": str(workdir),
            "PHOENIX_TELEMETRY_ENABLED": "false",
        }
        argv = [str(PHOENIX_VENV / "bin/python"), "-m", "phoenix.server.main", "serve"]
        super().__init__("phoenix", argv, env, workdir / "phoenix.log")

    def start(self) -> None:
        self.spawn()
        self.wait_until(f"{self.url}/healthz", deadline_s=120.0)

    def spans(self, trace_id: str) -> list[Span]:
        """Every span of one trace (32 hex digits) that Phoenix has stored."""
        found: list[Span] = []
        cursor = ""
        while True:
            query = f"?limit=1000{cursor}"
            url = f"{self.url}/v1/projects/default/spans{query}"
            with urllib.request.urlopen(url, timeout=10) as resp:
                page = json.load(resp)
            found += [s for s in page["data"] if s["context"]["trace_id"] == trace_id]
            if not page.get("next_cursor"):
                return found
            cursor = f"&cursor={page['next_cursor']}"


def running_phoenix(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Phoenix]:
    """The session's Phoenix (tests/conftest.py's `phoenix` fixture)."""
    if not (PHOENIX_VENV / "bin/python").exists():
        pytest.fail(f"{PHOENIX_VENV} is missing: make test-env builds it (35-phoenix.sh)")
    server = Phoenix(tmp_path_factory.mktemp("phoenix"))
    server.start()
    yield server
    server.stop()


def attribute(span: Span, name: str) -> Any:
    """A span's attribute by its dotted name; Phoenix nests them by their dots."""
    value: Any = span["attributes"]
    if name in value:
        return value[name]
    for part in name.split("."):
        if not isinstance(value, dict) or part not in value:
            return None
        value = value[part]
    return value


def client_tracing(phoenix: Phoenix) -> Iterator[Tracer]:
    """The client's own tracing (an agent's, a gateway's), exporting to the same Phoenix."""
    provider = TracerProvider(resource=Resource.create({"service.name": "test-client"}))
    provider.add_span_processor(SimpleSpanProcessor(OTLPSpanExporter(phoenix.traces_url)))
    yield provider.get_tracer("tests")
    provider.shutdown()


def client_call(tracer: Tracer) -> tuple[ClientSpan, dict[str, str], str]:
    """A client span, the `traceparent` header that names it, and its trace id (hex)."""
    span = tracer.start_span("client call", kind=SpanKind.CLIENT)
    carrier: dict[str, str] = {}
    TraceContextTextMapPropagator().inject(carrier, context=set_span_in_context(span))
    return span, carrier, format(span.get_span_context().trace_id, "032x")


def span_id(span: ClientSpan) -> str:
    return format(span.get_span_context().span_id, "016x")


async def stored_trace(
    phoenix: Phoenix, trace_id: str, count: int, within: float = 30
) -> list[Span]:
    """The trace's spans once Phoenix holds at least `count` of them."""
    found: list[Span] = []

    def complete() -> bool:
        found[:] = phoenix.spans(trace_id)
        return len(found) >= count

    await eventually(complete, f"{count} spans of trace {trace_id} in Phoenix", within=within)
    return found


def child_of(spans: list[Span], parent: str) -> Span:
    """The one span whose parent is `parent` (a span id, hex)."""
    (child,) = [s for s in spans if s["parent_id"] == parent]
    return child
