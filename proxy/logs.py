"""Logging setup: plain text, or one JSON object per line."""

from __future__ import annotations

import contextlib
import io
import logging
import os
import select
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


class WholeLines(io.TextIOBase):
    """A buffer for a stream several processes share (`--workers N`): it writes whole lines
    only, in blocks of at most PIPE_BUF bytes, which POSIX writes to a pipe in one piece; a
    64 KiB block could be split, and another worker's line land in the middle of one."""

    def __init__(self, fd: int, limit: int = 1 << 16) -> None:
        self._fd, self._limit = fd, limit
        self._lines: list[bytes] = []
        self._size = 0

    def write(self, text: str) -> int:
        line = text.encode("utf-8", "backslashreplace")  # StreamHandler: one record per call
        self._lines.append(line)
        self._size += len(line)
        if self._size >= self._limit:
            self.flush()
        return len(text)

    def flush(self) -> None:
        block: list[bytes] = []
        size = 0
        for line in self._lines:
            if block and size + len(line) > select.PIPE_BUF:
                self._write(b"".join(block))
                block, size = [], 0
            block.append(line)
            size += len(line)
        if block:
            self._write(b"".join(block))
        self._lines.clear()
        self._size = 0

    def _write(self, data: bytes) -> None:
        view = memoryview(data)
        while view:
            view = view[os.write(self._fd, view) :]


def _stderr_handler(shared: bool) -> logging.Handler:
    try:
        fd = sys.stderr.fileno()
    except (AttributeError, OSError, ValueError):  # stderr replaced by something without a fd
        return logging.StreamHandler(sys.stderr)
    if shared:
        return BufferedStreamHandler(WholeLines(fd))
    stream = open(fd, "w", buffering=1 << 16, closefd=False, errors="backslashreplace")
    return BufferedStreamHandler(stream)


def setup(level: str, fmt: str, *, access_log: bool = True, shared: bool = False) -> None:
    """`shared`: stderr is written by several processes (`--workers N`)."""
    handler = _stderr_handler(shared)
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
