"""Tracing's wiring: off unless --otlp-traces-endpoint (or OTEL_EXPORTER_OTLP_TRACES_ENDPOINT)
names a collector. Off, nothing of OpenTelemetry is imported and the request path reads one
attribute (`Metrics.traced`); on, the traced handler and hop (client/traced.py) take the plain
ones' places."""

from __future__ import annotations

import os
from collections.abc import AsyncIterator

from aiohttp import web
from aiohttp.typedefs import Handler

from proxy.client.forward import handle
from proxy.config.settings import Settings
from proxy.observe.metrics import Metrics
from proxy.upstream.hop import HOP

ENV = "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"


def endpoint(settings: Settings) -> str | None:
    """Where spans go; None: tracing is off. The flag wins over the standard variable."""
    return settings.otlp_traces_endpoint or os.environ.get(ENV) or None


def install(app: web.Application, settings: Settings, metrics: Metrics) -> Handler:
    """The proxy's handler: the plain one, or, with tracing on, the traced one (the tracer and
    the traced hop are set up when the app starts, and closed when it stops)."""
    url = endpoint(settings)
    if url is None:
        return handle
    try:
        from proxy.client.traced import TRACER, TracedHop, handle_traced
        from proxy.observe.otel import Tracing
    except ImportError as exc:
        raise RuntimeError(
            f"--otlp-traces-endpoint / {ENV} is set but OpenTelemetry is not installed "
            f"({exc.name}): pip install 'vllm-sidecar[otel]'"
        ) from None
    ratio = settings.otlp_traces_sample_ratio
    metrics.traced = True

    def dropped(reason: str, spans: int) -> None:
        metrics.trace_drops.labels(reason).inc(spans)

    async def tracing_ctx(app: web.Application) -> AsyncIterator[None]:
        tracing = Tracing(url, ratio, dropped)
        app[TRACER] = tracing.tracer
        app[HOP] = TracedHop(app[HOP], tracing.tracer)
        try:
            yield
        finally:
            tracing.close()

    app.cleanup_ctx.append(tracing_ctx)
    return handle_traced
