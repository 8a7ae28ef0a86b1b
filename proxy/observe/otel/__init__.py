"""OpenTelemetry for the sidecar (the `otel` extra): its tracer provider, sampled parent-based
at a ratio, exporting over OTLP/HTTP through a bounded queue. Imported only when tracing is on."""

from __future__ import annotations

import importlib
import logging
import os

from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SpanExporter
from opentelemetry.sdk.trace.sampling import ParentBased, TraceIdRatioBased
from opentelemetry.trace import Tracer

from .export import BoundedExport, Dropped, quiet

log = logging.getLogger(__name__)

__all__ = ["Tracing", "traces_url"]

SCOPE = "vllm-sidecar"
TRACES_PATH = "/v1/traces"


def traces_url(endpoint: str) -> str:
    """The URL spans are posted to: a collector's bare address (`http://jaeger:4318`) gets the
    OTLP/HTTP traces path, as OTEL_EXPORTER_OTLP_ENDPOINT would; a URL with a path is kept."""
    scheme, sep, rest = endpoint.partition("://")
    if sep and "/" not in rest.rstrip("/"):
        return f"{scheme}://{rest.rstrip('/')}{TRACES_PATH}"
    return endpoint


class Tracing:
    """One process's provider and tracer; `close` flushes what it can and stops the thread."""

    def __init__(
        self,
        endpoint: str,
        ratio: float,
        dropped: Dropped,
        *,
        exporter: SpanExporter | None = None,
    ) -> None:
        resource = Resource.create({"service.name": os.environ.get("OTEL_SERVICE_NAME", SCOPE)})
        self.provider = TracerProvider(
            resource=resource, sampler=ParentBased(TraceIdRatioBased(ratio))
        )
        self.processor = BoundedExport(
            exporter if exporter is not None else _exporter(endpoint),
            dropped,
            # The SDK's own names for its batch processor's bounds.
            max_queue=_int("OTEL_BSP_MAX_QUEUE_SIZE", 2048),
            batch=_int("OTEL_BSP_MAX_EXPORT_BATCH_SIZE", 512),
        )
        self.provider.add_span_processor(self.processor)
        self.tracer: Tracer = self.provider.get_tracer(SCOPE)
        quiet()
        log.info("traces: exporting to %s, sampling %g of new traces", endpoint, ratio)

    def flush(self, timeout: float = 30.0) -> bool:
        return self.processor.force_flush(int(timeout * 1000))

    def close(self) -> None:
        self.provider.shutdown()


def _int(name: str, default: int) -> int:
    value = os.environ.get(name, "")
    return int(value) if value.strip().isdigit() and int(value) > 0 else default


def _exporter(endpoint: str) -> SpanExporter:
    # The OTLP exporters honour the other OTEL_EXPORTER_OTLP_* variables themselves (headers,
    # timeout, compression, certificates). The extra ships OTLP/HTTP; gRPC (vLLM's default)
    # works where its exporter is installed beside it.
    protocol = os.environ.get(
        "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", os.environ.get("OTEL_EXPORTER_OTLP_PROTOCOL", "")
    )
    if protocol == "grpc":
        try:  # not a dependency: imported by name (and not type-checked)
            grpc = importlib.import_module("opentelemetry.exporter.otlp.proto.grpc.trace_exporter")
        except ImportError:
            raise ValueError(
                "OTEL_EXPORTER_OTLP_PROTOCOL=grpc needs opentelemetry-exporter-otlp-proto-grpc "
                "(the otel extra ships http/protobuf: port 4318 on most collectors)"
            ) from None
        exporter: SpanExporter = grpc.OTLPSpanExporter(endpoint=endpoint)
        return exporter
    if protocol not in ("", "http/protobuf"):
        raise ValueError(f"OTEL_EXPORTER_OTLP_PROTOCOL={protocol!r}: grpc or http/protobuf")
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

    return OTLPSpanExporter(endpoint=traces_url(endpoint))
