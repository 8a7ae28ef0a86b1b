"""engine/tally.py over the bytes of both of vLLM's HTTP frontends (tests/samples/): the Python
server's token events each carry `finish_reason`; the Rust frontend's carry none, and it ends a
choice with one more event, tokenless. A stream's count holds on both."""

from __future__ import annotations

import orjson
import pytest

from proxy.core.sse import ErrorWatcher
from proxy.engine.tally import Counts, Tally
from tests.samples import FRONTENDS, sample


def relayed(chunks: list[bytes], chat: bool) -> tuple[Counts, ErrorWatcher]:
    """The counts of a stream relayed chunk by chunk, as the relay passes them."""
    watcher, tally = ErrorWatcher(), Tally(chat)
    for chunk in chunks:
        if not watcher.passes(chunk):
            watcher.feed(chunk)
        if watcher.ends:
            tally.ended(chunk)
    return tally.counts(watcher), watcher


def without_usage(chunks: list[bytes]) -> list[bytes]:
    """The same stream as a client that did not ask for usage gets it: the usage event gone."""
    return [c for c in chunks if b'"usage":{' not in c]


def usage(body: bytes) -> int:
    events = [orjson.loads(line[6:]) for line in body.split(b"\n") if line.startswith(b"data: {")]
    return next(e["usage"]["completion_tokens"] for e in events if e.get("usage"))


@pytest.mark.parametrize("frontend", FRONTENDS)
@pytest.mark.parametrize(
    ("name", "chat"),
    [("d2_chat_stream", True), ("d4_completions_stream", False)],
)
def test_a_stream_without_usage_counts_its_tokens_as_an_estimate(
    frontend: str, name: str, chat: bool
) -> None:
    # 5 tokens (max_tokens 5, finish "length"): Rust sends 5 token events and a tokenless end.
    got = sample(frontend, name)
    assert relayed(got.chunks, chat)[0] == Counts([], total=5, estimated=True)
    assert relayed([got.body], chat)[0] == Counts([], total=5, estimated=True)  # one read


@pytest.mark.parametrize("frontend", FRONTENDS)
@pytest.mark.parametrize(
    ("name", "chat"),
    [("d3_chat_stream_usage", True), ("d5_completions_stream_usage", False)],
)
def test_a_streams_usage_is_exact_on_both_frontends(frontend: str, name: str, chat: bool) -> None:
    assert relayed(sample(frontend, name).chunks, chat)[0] == Counts([], total=5)


@pytest.mark.parametrize("frontend", FRONTENDS)
def test_a_long_completions_stream_is_counted_token_for_token_without_usage(frontend: str) -> None:
    # 120 tokens, some of them parts of a UTF-8 character: each has an event, with empty text.
    got = sample(frontend, "d8b_completions_stream_long_usage")
    counts, _ = relayed(without_usage(got.chunks), chat=False)
    assert counts.total == usage(got.body) == 120


@pytest.mark.parametrize("frontend", FRONTENDS)
def test_a_long_chat_stream_without_usage_on_the_rust_frontend_counts_short(
    frontend: str,
) -> None:
    """The Rust frontend sends no chat event for a token without text of its own: an estimate
    short by those tokens (the Python server sends each, its content empty)."""
    got = sample(frontend, "d8_chat_stream_long_usage")
    counts, _ = relayed(without_usage(got.chunks), chat=True)
    events = [orjson.loads(line[6:]) for line in got.body.split(b"\n") if b'"delta"' in line]
    texts = sum(1 for e in events if "content" in e["choices"][0]["delta"])
    short = texts - 1 if frontend == "python" else texts  # Python's role event has content ""
    assert counts == Counts([], total=short, estimated=True)
    assert (counts.total == usage(got.body)) is (frontend == "python")


@pytest.mark.parametrize("frontend", FRONTENDS)
@pytest.mark.parametrize("route", ["completions", "chat"])
def test_an_aborted_stream_is_seen_as_aborted_and_counted_within_a_token(
    frontend: str, route: str
) -> None:
    """An abort's last event may carry the last token or none (the Python server's did in one
    capture and not in the other), and usage may count one token fewer than the events (the
    Rust frontend's completions): without usage, an estimate within a token, save the Rust
    frontend's chat, short as its every chat stream."""
    got = sample(frontend, f"k_abort_{route}_stream")
    exact, watcher = relayed(got.chunks, chat=route == "chat")
    assert watcher.aborted
    assert exact == Counts([], total=usage(got.body))
    estimate, _ = relayed(without_usage(got.chunks), chat=route == "chat")
    assert estimate.estimated
    if frontend == "rust" and route == "chat":
        assert (estimate.total or 0) < usage(got.body)
    else:
        assert abs(usage(got.body) - (estimate.total or 0)) <= 1


def test_a_stream_interval_above_one_makes_the_estimate_short() -> None:
    """`--stream-interval 4`: about four tokens an event. Usage alone counts them exactly."""
    got = sample("rust", "d10_completions_stream_interval4_usage")
    assert relayed(got.chunks, chat=False)[0] == Counts([], total=120)
    estimate, _ = relayed(without_usage(got.chunks), chat=False)
    assert estimate == Counts([], total=31, estimated=True)  # its token events
