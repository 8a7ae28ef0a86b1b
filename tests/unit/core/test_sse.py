"""The in-stream error watcher and the event framer, across arbitrary chunk boundaries."""

from __future__ import annotations

import itertools

from hypothesis import given
from hypothesis import strategies as st

from proxy.core.sse import ErrorWatcher, EventFramer, is_event_stream

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


ERROR_EVENT = b'data: {"error": {"message": "boom", "code": 400}}\n\n'


def test_feed_says_when_a_chunk_completes_an_error_event() -> None:
    watcher = ErrorWatcher()
    assert watcher.feed(b'data: {"choices": []}\n\n') is False
    assert watcher.feed(ERROR_EVENT[:-1]) is True  # the line is complete at its first newline
    assert watcher.take()[0]["error"]["message"] == "boom"
    assert watcher.take() == []  # taken once
    assert watcher.feed(b"\n") is False


def test_an_error_event_in_the_very_first_chunk() -> None:
    watcher = ErrorWatcher()
    watcher.feed(ERROR_EVENT)
    assert len(watcher.errors) == 1


def test_data_without_a_space_and_comment_lines() -> None:
    # "data:" may be followed directly by the payload; a line starting with ":" is a comment.
    watcher = ErrorWatcher()
    watcher.feed(b':    {"error": {"message": "a comment"}}\n\n')
    assert watcher.errors == []
    watcher.feed(b'data:{"error": {"message": "tight"}}\n\n')
    assert [e["error"]["message"] for e in watcher.errors] == ["tight"]


def test_a_partial_line_is_carried_up_to_one_mib() -> None:
    # A line cut across chunks is joined up to 1 MiB (an error event is never that long); past
    # that the partial line is dropped rather than buffered without bound.
    def split_event(message_len: int) -> ErrorWatcher:
        line = b'data: {"error": {"message": "' + b"m" * message_len + b'"}}'
        watcher = ErrorWatcher()
        watcher.feed(b"data: {}\n\n" * 1000 + line[:-1])  # whole events first, then the part
        watcher.feed(line[-1:] + b"\n\n")
        return watcher

    fits = (1 << 20) - len(b'data: {"error": {"message": ""}}') + 1  # carried: 1 MiB
    assert len(split_event(fits).errors) == 1
    assert split_event(fits + 1).errors == []


def test_event_stream_content_type_parameters() -> None:
    assert is_event_stream("Text/Event-Stream ;charset=utf-8; x=y")
    assert not is_event_stream("text/plain; x=text/event-stream")


@given(st.lists(st.integers(min_value=1, max_value=len(STREAM) - 1), max_size=6))
def test_framed_chunks_are_whole_events_and_lose_no_byte(cuts: list[int]) -> None:
    framer, out = EventFramer(), []
    bounds = [0, *sorted(set(cuts)), len(STREAM)]
    for a, b in itertools.pairwise(bounds):
        relayed = framer.whole(STREAM[a:b])
        assert not relayed or relayed.endswith(b"\n\n")
        out.append(relayed)
    assert b"".join(out) == STREAM
    assert framer.held == b""


def test_crlf_events_are_framed_and_an_oversized_event_passes_as_it_comes() -> None:
    framer = EventFramer()
    assert framer.whole(b"data: 1\r\n\r\ndata: 2") == b"data: 1\r\n\r\n"
    assert framer.held == b"data: 2"
    huge = b"data: " + b"x" * (64 * 1024 + 1)
    assert framer.whole(huge) == b"data: 2" + huge
    assert framer.held == b""
