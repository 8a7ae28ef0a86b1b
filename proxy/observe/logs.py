"""Logging setup: plain text, or one JSON object per line; client-sent values made safe to log."""

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

# What a client sent is logged up to this many characters: a model name or path of megabytes
# would otherwise be a log line of megabytes.
FIELD_CHARS = 256
_QUOTED = ' "\\'  # printable, but a field with them is quoted (the space) or escaped


def capped(value: str, limit: int = FIELD_CHARS) -> str:
    return value if len(value) <= limit else value[:limit] + "…"


def _escape(c: str) -> str:
    # Python's own escapes (\n, \x00, \u2028, \\); a quote is escaped too, a space kept.
    return c if c == " " else '\\"' if c == '"' else c.encode("unicode_escape").decode()


def text_field(value: object) -> str:
    """A client-sent value for the text log: capped, and quoted with backslash escapes when it
    holds anything but printable non-space characters, so that it can neither start a line
    (newline, U+2028) nor pass for another `key=value` field (space)."""
    text = capped(str(value))
    # Three substring tests, not a generator over _QUOTED: this runs four times a request.
    if text and text.isprintable() and " " not in text and '"' not in text and "\\" not in text:
        return text
    inner = "".join(c if c.isprintable() and c not in _QUOTED else _escape(c) for c in text)
    return f'"{inner}"'


class _PerSecond:
    """A record's time as `strftime(fmt)`, formatted once per second, not once per line."""

    def __init__(self, fmt: str, converter: Any) -> None:
        self._fmt, self._converter = fmt, converter
        self._second, self._text = -1, ""

    def __call__(self, created: float) -> str:
        second = int(created)
        if second != self._second:
            self._second, self._text = second, time.strftime(self._fmt, self._converter(second))
        return self._text


class TextFormatter(logging.Formatter):
    def __init__(self) -> None:
        super().__init__("%(asctime)s %(levelname)s %(name)s: %(message)s")
        self._stamp = _PerSecond(self.default_time_format, self.converter)

    def formatTime(self, record: logging.LogRecord, datefmt: str | None = None) -> str:
        return f"{self._stamp(record.created)},{int(record.msecs):03d}"


class JSONFormatter(logging.Formatter):
    def __init__(self) -> None:
        super().__init__()
        self._stamp = _PerSecond("%Y-%m-%dT%H:%M:%S", time.gmtime)

    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, Any] = {
            "ts": f"{self._stamp(record.created)}.{int(record.msecs):03d}Z",
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
    formatter = JSONFormatter() if fmt == "json" else TextFormatter()
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
    # Nor walk the stack for the caller's file and line (logging's own switch, documented in
    # its source): neither format shows them.
    logging._srcfile = None
    # The per-request line costs tens of microseconds; at tens of thousands of requests a
    # second the metrics may be all an operator wants.
    logging.getLogger("proxy.access").setLevel(logging.NOTSET if access_log else logging.WARNING)
