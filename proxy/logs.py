"""Logging setup: plain text, or one JSON object per line."""

from __future__ import annotations

import contextlib
import logging
import sys
import time
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
        if callable(fields):
            fields = fields()
        if isinstance(fields, dict):
            out.update(fields)
        if record.exc_info:
            out["exc_info"] = self.formatException(record.exc_info)
        return orjson.dumps(out, default=str).decode()


class BufferedStreamHandler(logging.StreamHandler):  # type: ignore[type-arg]
    """A stream handler that does not flush after every record.

    StreamHandler flushes, one write system call, per line: on a busy proxy with one access
    line per request that was a large share of the CPU. Lines collect in a block buffer
    instead; WARNING and above flush at once, `flush_now()` runs on a short timer (see
    `server`), and `close()` (run by logging at exit) flushes what is left.
    """

    def flush(self) -> None:
        pass

    def flush_now(self) -> None:
        with self.lock if self.lock else contextlib.nullcontext():
            self.stream.flush()

    def emit(self, record: logging.LogRecord) -> None:
        super().emit(record)
        if record.levelno >= logging.WARNING:
            self.flush_now()

    def close(self) -> None:
        self.flush_now()
        super().close()


def flush() -> None:
    """Write out what the buffered handlers hold."""
    for handler in logging.getLogger().handlers:
        if isinstance(handler, BufferedStreamHandler):
            handler.flush_now()


def _stderr_handler() -> logging.Handler:
    try:
        fd = sys.stderr.fileno()
    except (AttributeError, OSError, ValueError):  # stderr replaced by something without a fd
        return logging.StreamHandler(sys.stderr)
    stream = open(fd, "w", buffering=1 << 16, closefd=False, errors="backslashreplace")
    return BufferedStreamHandler(stream)


def setup(level: str, fmt: str, *, access_log: bool = True) -> None:
    handler = _stderr_handler()
    if fmt == "json":
        formatter: logging.Formatter = JSONFormatter()
        formatter.converter = time.gmtime
    else:
        formatter = logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s")
    handler.setFormatter(formatter)
    root = logging.getLogger()
    for old in root.handlers:
        if isinstance(old, BufferedStreamHandler):
            old.close()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    # Each record would otherwise look up its thread and process names: the sidecar is one
    # event-loop thread in one process, and the access line is written once per request.
    logging.logThreads = logging.logProcesses = logging.logMultiprocessing = False
    # The per-request line costs tens of microseconds; at tens of thousands of requests a
    # second the metrics may be all an operator wants.
    logging.getLogger("proxy.access").setLevel(logging.NOTSET if access_log else logging.WARNING)
