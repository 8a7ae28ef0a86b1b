"""Log output: the buffered handler and the JSON format."""

from __future__ import annotations

import io
import json
import logging

import pytest

from proxy.logs import FIELD_CHARS, BufferedStreamHandler, JSONFormatter, text_field


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
