"""vLLM 0.33's paused rejection told from any other answer, on the bytes alone."""

from __future__ import annotations

import json

import orjson
import pytest

from proxy.core.rejection import first_event_end, rejected_body, rejected_stream

PAUSED = {
    "error": {
        "message": "Generation is paused. Please retry after it resumes.",
        "type": "ServiceUnavailableError",
        "param": None,
        "code": 503,
    }
}


def test_the_non_stream_rejection_is_a_503_with_vllms_words() -> None:
    body = orjson.dumps(PAUSED)
    assert rejected_body(503, body)
    assert not rejected_body(500, body)
    other = {"error": {**PAUSED["error"], "message": "The server is overloaded."}}
    assert not rejected_body(503, orjson.dumps(other))
    assert not rejected_body(503, b"<html>busy</html>")
    assert not rejected_body(503, b"[]")


@pytest.mark.parametrize(
    "event",
    [
        b"data: " + json.dumps(PAUSED).encode() + b"\n\n",  # completions: spaced JSON
        b"data: " + orjson.dumps(PAUSED) + b"\n\n",  # chat: compact
        b": keep-alive\n\n: keep-alive\n\ndata: " + orjson.dumps(PAUSED) + b"\n\n",
    ],
)
def test_the_stream_rejection_is_its_first_event(event: bytes) -> None:
    assert rejected_stream(event + b"data: [DONE]\n\n")
    assert first_event_end(event) == len(event)


def test_a_stream_that_starts_with_tokens_or_another_error_is_no_rejection() -> None:
    token = b'data: {"choices":[{"text":"a"}]}\n\n'
    assert not rejected_stream(token + b"data: " + orjson.dumps(PAUSED) + b"\n\n")
    oov = {"error": {"message": "Token id 5000 is out of vocabulary", "code": 400}}
    assert not rejected_stream(b"data: " + orjson.dumps(oov) + b"\n\n")
    assert not rejected_stream(b"data: " + orjson.dumps(PAUSED))  # not ended yet
    assert first_event_end(b": keep-alive\n\ndata: {") == -1
