"""Log output: the buffered handler and the JSON format."""

from __future__ import annotations

import io
import json
import logging
import os
import subprocess
import sys
import time

import pytest

from proxy.observe.logs import (
    FIELD_CHARS,
    BufferedStreamHandler,
    JSONFormatter,
    TextFormatter,
    text_field,
)


class CountingStream(io.StringIO):
    def __init__(self) -> None:
        super().__init__()
        self.flushes = 0

    def flush(self) -> None:
        self.flushes += 1
        super().flush()


def record(level: int, msg: str) -> logging.LogRecord:
    return logging.LogRecord("proxy.access", level, __file__, 1, msg, None, None)


def test_info_lines_wait_for_a_flush_warnings_do_not() -> None:
    stream = CountingStream()
    handler = BufferedStreamHandler(stream)
    handler.handle(record(logging.INFO, "one"))
    handler.handle(record(logging.INFO, "two"))
    assert stream.flushes == 0
    handler.handle(record(logging.WARNING, "three"))
    assert stream.flushes == 1
    handler.flush_now()
    handler.close()
    assert stream.getvalue().splitlines() == ["one", "two", "three"]
    assert stream.flushes == 3


def test_json_lines_carry_the_request_fields() -> None:
    fields = {"status": 200, "request_id": "r1", "model_requested": "a/b"}
    rec = record(logging.INFO, "POST /v1/completions 200")
    rec.fields = lambda: fields  # the access line hands over a callable, called only here
    out = json.loads(JSONFormatter().format(rec))
    assert out["message"] == "POST /v1/completions 200"
    assert (out["status"], out["request_id"], out["model_requested"]) == (200, "r1", "a/b")
    assert out["level"] == "info"
    assert out["ts"].endswith("Z")


WRITER = """
import logging, sys
from proxy.observe.logs import BufferedStreamHandler, WholeLines
handler = BufferedStreamHandler(WholeLines(1))
for i in range(20000):
    line = sys.argv[1] * 200 + str(i)
    handler.handle(logging.LogRecord("x", logging.INFO, "", 1, line, (), None))
    if i % 3000 == 0:
        handler.flush_now()
handler.close()
"""


def test_workers_sharing_one_pipe_never_cut_each_others_lines() -> None:
    # Two processes write their buffered log lines into one pipe, as N workers do into a
    # container's stdout: every line that comes out must be one process's, whole.
    read, write = os.pipe()
    writers = [subprocess.Popen([sys.executable, "-c", WRITER, tag], stdout=write) for tag in "abc"]
    os.close(write)
    with os.fdopen(read, "rb") as pipe:
        lines = pipe.read().decode().splitlines()
    assert [proc.wait(30) for proc in writers] == [0, 0, 0]
    assert len(lines) == 60000
    for line in lines:
        tag = line[0]
        assert line[:200] == tag * 200, line[:80] + "..." + line[-20:]
        assert line[200:].isdigit(), line[:80] + "..." + line[-20:]


def test_text_and_json_timestamps_match_loggings_own_at_every_second() -> None:
    # The formatters format the date once per second; each line must read as logging's would.
    plain = logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s")
    iso = logging.Formatter()
    iso.converter = time.gmtime
    text, js = TextFormatter(), JSONFormatter()
    for created in (1795982287.0, 1795982287.999, 1795982288.004, 1795982288.5, 1795982400.25):
        rec = record(logging.INFO, "line")
        rec.created, rec.msecs = created, (created - int(created)) * 1000
        assert text.format(rec) == plain.format(rec)
        expected = iso.formatTime(rec, "%Y-%m-%dT%H:%M:%S") + f".{int(rec.msecs):03d}Z"
        assert json.loads(js.format(rec))["ts"] == expected


@pytest.mark.parametrize(
    ("value", "logged"),
    [
        ("Qwen/Qwen2.5-0.5B", "Qwen/Qwen2.5-0.5B"),
        ("a b", '"a b"'),
        ("a\nb", '"a\\nb"'),
        ("a\r\tb", '"a\\r\\tb"'),
        ('a"b\\c', '"a\\"b\\\\c"'),
        ("a\u2028b\x85c\x00", '"a\\u2028b\\x85c\\x00"'),
        ("\udcff", '"\\udcff"'),  # a non-UTF-8 byte as aiohttp decodes it
        ("", '""'),
        ("日本語", "日本語"),
    ],
)
def test_text_fields_cannot_start_a_line_or_a_field(value: str, logged: str) -> None:
    assert text_field(value) == logged


def test_long_fields_are_capped() -> None:
    assert text_field("x" * 10_000) == "x" * FIELD_CHARS + "…"
