"""Logging setup: plain text, or one JSON object per line."""

from __future__ import annotations

import logging
import sys
from typing import Any

import orjson


class JSONFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, Any] = {
            "ts": self.formatTime(record, "%Y-%m-%dT%H:%M:%S") + f".{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
        }
        fields = getattr(record, "fields", None)
        if isinstance(fields, dict):
            out.update(fields)
        if record.exc_info:
            out["exc_info"] = self.formatException(record.exc_info)
        return orjson.dumps(out, default=str).decode()


def setup(level: str, fmt: str, *, access_log: bool = True) -> None:
    handler = logging.StreamHandler(sys.stderr)
    if fmt == "json":
        formatter: logging.Formatter = JSONFormatter()
        formatter.converter = __import__("time").gmtime
    else:
        formatter = logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s")
    handler.setFormatter(formatter)
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    # The per-request line costs tens of microseconds; at tens of thousands of requests a
    # second the metrics may be all an operator wants.
    logging.getLogger("proxy.access").setLevel(logging.NOTSET if access_log else logging.WARNING)
