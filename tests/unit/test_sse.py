"""The in-stream error watcher, across arbitrary chunk boundaries."""

from __future__ import annotations

import itertools

from hypothesis import given
from hypothesis import strategies as st

from proxy.sse import ErrorWatcher, is_event_stream

STREAM = (
    b'data: {"id":"cmpl-1","choices":[{"index":0,"text":"error"}]}\n\n'
    b'data: {"error": {"message": "Token id 5000 is out of vocabulary", "type": '
    b'"BadRequestError", "param": null, "code": 400}}\n\n'
    b"data: [DONE]\n\n"
)


@given(st.lists(st.integers(min_value=1, max_value=len(STREAM) - 1), max_size=6))
def test_error_event_found_however_the_stream_is_cut(cuts: list[int]) -> None:
    watcher = ErrorWatcher()
    points = [0, *sorted(set(cuts)), len(STREAM)]
    for a, b in itertools.pairwise(points):
        watcher.feed(STREAM[a:b])
    assert len(watcher.errors) == 1
    assert watcher.errors[0]["error"]["code"] == 400


def test_text_mentioning_error_is_not_an_error_event() -> None:
    watcher = ErrorWatcher()
    watcher.feed(b'data: {"choices":[{"text":"\\"error\\": no"}]}\n\ndata: [DONE]\n\n')
    assert watcher.errors == []


def test_event_stream_content_type() -> None:
    assert is_event_stream("text/event-stream; charset=utf-8")
    assert not is_event_stream("application/json")
    assert not is_event_stream(None)
