"""engine/tally.py: what an answer's bytes tell of its tokens, in vLLM 0.32's compact JSON
(../shared/vllm-samples/d3_chat_stream_usage.txt, d4_completions_stream.txt)."""

from __future__ import annotations

import orjson
from prometheus_client import CollectorRegistry

from proxy.core.offpolicy import Span
from proxy.core.sse import ErrorWatcher
from proxy.engine.history import SIDECAR, VLLM, History
from proxy.engine.tally import PARSE_LIMIT, Counts, Tally, count, joined, of_body
from proxy.observe.engine_metrics import EngineMetrics

ESTIMATED = "vllm_sidecar_estimated_generated_tokens_total"


def event(choices: list[dict[str, object]], **extra: object) -> bytes:
    return b"data: " + orjson.dumps({"id": "cmpl-1", "choices": choices, **extra}) + b"\n\n"


def delta(text: str, finish: str | None = None, **extra: object) -> dict[str, object]:
    return {"index": 0, "text": text, "finish_reason": finish, "stop_reason": None, **extra}


def test_a_body_without_spans_is_told_by_its_usage_alone() -> None:
    body = orjson.dumps(
        {"choices": [delta("ab", "length")], "usage": {"prompt_tokens": 3, "completion_tokens": 12}}
    )
    assert of_body(body) == Counts([], total=12)
    assert of_body(b'{"object":"list","data":[]}') is None


def test_a_body_past_the_parse_limit_is_told_by_its_usage() -> None:
    spans = [{"version": "a", "start": 0, "end": 2}]
    choice = {"index": 0, "text": "x" * PARSE_LIMIT, "weight_versions": spans}
    body = orjson.dumps({"choices": [choice], "usage": {"completion_tokens": 2}})
    assert of_body(body) == Counts([], total=2)


def test_a_body_with_spans_is_told_choice_by_choice() -> None:
    spans = [{"version": "a", "start": 0, "end": 2}, {"version": "b", "start": 2, "end": 5}]
    body = orjson.dumps(
        {
            "choices": [
                {"index": 0, "token_ids": [1, 2, 3, 4, 5], "weight_versions": spans},
                {"index": 1, "token_ids": None, "weight_versions": spans[:1]},
            ]
        }
    )
    counts = of_body(body)
    assert counts is not None
    assert counts.choices == [
        (5, [Span("a", 0, 2), Span("b", 2, 5)]),
        (2, [Span("a", 0, 2)]),  # no token ids: as far as its spans reach
    ]
    assert counts.total is None


class Relayed:
    """A stream as the relay passes it: the watcher sees each chunk, the tally its ends."""

    def __init__(self, chat: bool) -> None:
        self.watcher, self.tally = ErrorWatcher(), Tally(chat)

    def feed(self, chunk: bytes) -> None:
        if not self.watcher.passes(chunk):
            self.watcher.feed(chunk)
        if self.watcher.ends:
            self.tally.ended(chunk)

    def counts(self) -> Counts:
        return self.tally.counts(self.watcher)


def test_a_stream_counts_one_token_per_choice_event() -> None:
    stream = Relayed(chat=False)
    for text in ("a", "b"):
        stream.feed(event([delta(text)]))
    stream.feed(event([delta("c", "length")]) + b"data: [DONE]\n\n")
    assert stream.counts() == Counts([], total=3, estimated=True)


def test_an_event_split_across_chunks_is_counted_once() -> None:
    stream = Relayed(chat=False)
    whole = event([delta("a")]) + event([delta("b", "length")])
    for start, end in ((0, 10), (10, 95), (95, 150), (150, len(whole))):
        stream.feed(whole[start:end])
    assert stream.counts() == Counts([], total=2, estimated=True)


def test_a_chat_streams_role_events_and_an_abort_carry_no_token() -> None:
    stream = Relayed(chat=True)
    role = {"index": 0, "delta": {"role": "assistant", "content": ""}, "finish_reason": None}
    stream.feed(event([role]))
    stream.feed(event([{"index": 0, "delta": {"content": "x"}, "finish_reason": None}]))
    stream.feed(event([{"index": 0, "delta": {"content": ""}, "finish_reason": "abort"}]))
    assert stream.counts() == Counts([], total=1, estimated=True)


def test_a_streams_usage_is_the_count_where_it_was_asked_for() -> None:
    stream = Relayed(chat=False)
    stream.feed(event([delta("a")]))
    stream.feed(event([delta("b", "stop")]))
    stream.feed(event([], usage={"prompt_tokens": 3, "completion_tokens": 9}) + b"data: [DONE]\n\n")
    assert stream.counts().total == 9  # not the two events: usage is vLLM's own count


def test_a_streams_spans_are_read_from_the_events_that_end_a_choice() -> None:
    spans = [{"version": "a", "start": 0, "end": 1}, {"version": "b", "start": 1, "end": 3}]
    stream = Relayed(chat=False)
    stream.feed(event([delta("a")]))
    # A span key in text is text, its quotes escaped: never read as a key.
    stream.feed(event([delta('"weight_versions":[')]))
    stream.feed(event([delta("c", "length", weight_versions=spans)]))
    assert stream.counts().choices == [(3, [Span("a", 0, 1), Span("b", 1, 3)])]


def test_an_uncut_continued_choice_goes_by_the_ends() -> None:
    spans = [{"version": "a", "start": 0, "end": 4}]
    counts = joined([(4, spans, 1), (6, spans, 0), (0, [], 0)], {"completion_tokens": 10})
    assert counts.choices == [(4, [Span("a", 0, 4)]), (6, None), (None, None)]
    assert counts.total == 10


def test_count_labels_the_tokens_and_the_straddling_answer() -> None:
    registry = CollectorRegistry()
    metrics, history = EngineMetrics(registry), History()
    for version, by in (("a", VLLM), ("b", SIDECAR), ("c", SIDECAR)):
        history.add(version, by)
    spans = [Span("a", 0, 2), Span("c", 2, 5)]
    count(metrics, "/g", Counts([(5, spans)], total=8), start="a", end="c", history=history)

    def sample(lag: str) -> float | None:
        labels = {"route": "/g", "lag": lag}
        return registry.get_sample_value("vllm_sidecar_generated_tokens_total", labels)

    # 2 tokens of `a`, two updates behind `c`; 3 of `c`; 3 more the answer told only in its
    # usage, across a change of version: straddled.
    assert (sample("2"), sample("0"), sample("straddled")) == (2, 3, 3)
    assert registry.get_sample_value("vllm_sidecar_straddling_answers_total", {"route": "/g"}) == 1
    assert registry.get_sample_value(ESTIMATED, {"route": "/g"}) is None  # vLLM's own count


def test_an_estimate_is_counted_as_one() -> None:
    registry = CollectorRegistry()
    metrics = EngineMetrics(registry)
    counts = Counts([], total=7, estimated=True)
    count(metrics, "/g", counts, start="a", end="a", history=History())
    assert registry.get_sample_value(ESTIMATED, {"route": "/g"}) == 7
