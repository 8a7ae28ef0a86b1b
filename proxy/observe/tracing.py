"""Where the server span finds the request's record (the handler puts it there only while
`Metrics.traced`). Nothing here imports OpenTelemetry: proxy/observe/otel/ does, and only once
wiring/tracing.py has turned tracing on (--otlp-traces-endpoint)."""

from __future__ import annotations

from aiohttp import web

from .record import RequestRecord

RECORD = web.RequestKey("record", RequestRecord)
