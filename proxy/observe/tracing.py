"""Tracing's switch on the request path: one flag on the app, and the slot where the server span
finds the request's record. Nothing here imports OpenTelemetry: proxy/observe/otel/ does, and
only once wiring/tracing.py has turned tracing on (--otlp-traces-endpoint)."""

from __future__ import annotations

from aiohttp import web

from .record import RequestRecord

TRACED = web.AppKey("traced", bool)
RECORD = web.RequestKey("record", RequestRecord)
