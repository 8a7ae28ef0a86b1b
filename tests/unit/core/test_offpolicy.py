"""Off-policy accounting: spans parsed, tokens split by lag, straddling told, oldest lag."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from proxy.core.offpolicy import (
    LAGS,
    Span,
    behind,
    by_lag,
    lag_of,
    positions,
    spans_of,
    straddles,
)

# A pod that went through six updates; "v5" is its newest.
HISTORY = ["v0", "v1", "v2", "v3", "v4", "v5"]
POSITION = positions(HISTORY)


def count(
    tokens: int,
    spans: list[Span] | None = None,
    start: str | None = "v5",
    end: str | None = "v5",
    newest: str | None = "v5",
) -> dict[str, int]:
    return by_lag(
        tokens=tokens, spans=spans, start=start, end=end, position=POSITION, newest=newest
    )


# -- spans_of ----------------------------------------------------------------------------------
def test_spans_parse_as_vllm_writes_them() -> None:
    raw = [{"version": "v4", "start": 0, "end": 3}, {"version": "v5", "start": 3, "end": 8}]
    assert spans_of(raw) == [Span("v4", 0, 3), Span("v5", 3, 8)]
    assert spans_of([]) == []
    # A gap between spans is no fault (tokens no span covers go by the answer's ends).
    assert spans_of([{"version": "v", "start": 2, "end": 4}]) == [Span("v", 2, 4)]


@pytest.mark.parametrize(
    "raw",
    [
        None,
        "v5",
        {"version": "v5", "start": 0, "end": 1},
        ["v5"],
        [{"version": 5, "start": 0, "end": 1}],
        [{"start": 0, "end": 1}],
        [{"version": "v5", "start": "0", "end": 1}],
        [{"version": "v5", "start": 0, "end": 1.0}],
        [{"version": "v5", "start": True, "end": 2}],
        [{"version": "v5", "start": -1, "end": 2}],
        [{"version": "v5", "start": 3, "end": 2}],
        # Overlapping, or out of order: tokens would count twice.
        [{"version": "a", "start": 0, "end": 3}, {"version": "b", "start": 2, "end": 4}],
        [{"version": "a", "start": 2, "end": 4}, {"version": "b", "start": 0, "end": 2}],
    ],
)
def test_malformed_spans_are_none(raw: Any) -> None:
    assert spans_of(raw) is None


# JSON-like values, with dicts that often carry a span's keys.
span_like_values = st.recursive(
    st.none() | st.booleans() | st.integers(-3, 9) | st.text(max_size=3),
    lambda inner: (
        st.lists(inner, max_size=4)
        | st.dictionaries(st.sampled_from(["version", "start", "end", "x"]), inner)
    ),
)


@given(span_like_values)
def test_spans_of_never_raises(raw: Any) -> None:
    spans = spans_of(raw)
    assert spans is None or all(isinstance(s, Span) for s in spans)


# -- behind and positions ----------------------------------------------------------------------
def test_lag_is_updates_between_the_version_and_the_newest() -> None:
    assert behind("v5", POSITION, "v5") == 0
    assert behind("v2", POSITION, "v5") == 3
    assert behind("v2", POSITION, "v3") == 1
    assert behind("gone", POSITION, "v5") is None
    assert behind("v2", POSITION, "gone") is None
    assert behind(None, POSITION, "v5") is None
    assert behind("v2", POSITION, None) is None
    # A version after the newest cannot be measured against it.
    assert behind("v5", POSITION, "v4") is None


def test_a_version_named_twice_takes_its_latest_place() -> None:
    assert positions(["a", "b", "a"]) == {"a": 2, "b": 1}
    assert behind("a", positions(["a", "b", "a"]), "a") == 0


# -- by_lag ------------------------------------------------------------------------------------
def test_spans_split_the_tokens_by_lag() -> None:
    spans = [Span("v1", 0, 2), Span("v2", 2, 5), Span("v3", 5, 9), Span("v4", 9, 10)]
    spans += [Span("v5", 10, 16)]
    # v1 and v2 are 4 and 3 updates behind v5: both "3+".
    assert count(16, spans, start="v1") == {"3+": 5, "2": 4, "1": 1, "0": 6}


def test_spans_of_versions_the_history_lacks_are_unknown() -> None:
    assert count(5, [Span("old", 0, 2), Span("v5", 2, 5)]) == {"unknown": 2, "0": 3}
    # Without a newest version nothing is measured.
    assert count(5, [Span("v5", 0, 5)], newest=None) == {"unknown": 5}


def test_tokens_past_the_spans_go_by_the_answers_ends() -> None:
    # 3 tokens spanned, 4 more: one version at both ends is that version's lag...
    assert count(7, [Span("v4", 0, 3)], start="v4", end="v4") == {"1": 7}
    # ...and two versions are straddled, not guessed.
    assert count(7, [Span("v4", 0, 3)], start="v4", end="v5") == {"1": 3, "straddled": 4}
    # A gap between spans too.
    assert count(6, [Span("v4", 0, 2), Span("v5", 4, 6)]) == {"1": 2, "0": 4}


def test_spans_past_the_tokens_are_clipped() -> None:
    assert count(4, [Span("v4", 0, 3), Span("v5", 3, 10)]) == {"1": 3, "0": 1}
    assert count(2, [Span("v4", 5, 10)]) == {"0": 2}


def test_overlapping_spans_count_each_token_once() -> None:
    assert count(6, [Span("v3", 0, 4), Span("v4", 2, 6)]) == {"2": 4, "1": 2}


def test_without_spans_the_answers_ends_decide() -> None:
    assert count(9) == {"0": 9}
    assert count(9, start="v3", end="v3") == {"2": 9}
    assert count(9, start="v4", end="v5") == {"straddled": 9}
    # Only one end known: that one.
    assert count(9, start="v4", end=None) == {"1": 9}
    assert count(9, start=None, end="v3") == {"2": 9}
    # No version at all, or one the history lacks.
    assert count(9, start=None, end=None) == {"unknown": 9}
    assert count(9, start="gone", end="gone") == {"unknown": 9}
    # Empty spans cover nothing.
    assert count(9, [], start="v2", end="v2") == {"3+": 9}


def test_no_tokens_count_nothing() -> None:
    assert count(0) == {}
    assert count(0, [Span("v4", 0, 3)]) == {}


versions = st.sampled_from([*HISTORY, "gone"])
span_lists = st.lists(
    st.tuples(versions, st.integers(0, 40), st.integers(0, 40)).map(
        lambda t: Span(t[0], min(t[1], t[2]), max(t[1], t[2]))
    ),
    max_size=6,
)


@given(
    tokens=st.integers(0, 60),
    spans=st.none() | span_lists,
    start=st.none() | versions,
    end=st.none() | versions,
    newest=st.none() | versions,
)
def test_exactly_the_tokens_are_counted_under_known_labels(
    tokens: int,
    spans: list[Span] | None,
    start: str | None,
    end: str | None,
    newest: str | None,
) -> None:
    counts = by_lag(
        tokens=tokens, spans=spans, start=start, end=end, position=POSITION, newest=newest
    )
    assert sum(counts.values()) == tokens
    assert set(counts) <= set(LAGS)
    assert all(n > 0 for n in counts.values())


# -- straddles ---------------------------------------------------------------------------------
def test_straddling_by_spans_or_by_the_ends() -> None:
    assert straddles([Span("v4", 0, 2), Span("v5", 2, 4)], "v4", "v5")
    assert not straddles([Span("v5", 0, 4)], "v5", "v5")
    # Spans say it where they cover tokens: queued across an update, made by the new weights.
    assert not straddles([Span("v5", 0, 4)], "v4", "v5")
    # A span over no tokens ran nothing.
    assert not straddles([Span("v4", 0, 0), Span("v5", 0, 4)], "v5", "v5")
    # Without spans, the ends.
    assert straddles(None, "v4", "v5")
    assert straddles([], "v4", "v5")
    assert not straddles(None, "v5", "v5")
    assert not straddles(None, "v5", None)
    assert not straddles(None, None, None)


# -- lag_of ------------------------------------------------------------------------------------
def lag(spans: list[Span] | None, start: str | None, end: str | None) -> int | None:
    return lag_of(spans=spans, start=start, end=end, position=POSITION, newest="v5")


def test_the_oldest_tokens_lag() -> None:
    assert lag([Span("v5", 4, 6), Span("v3", 0, 4)], "v5", "v5") == 2
    # A span over no tokens is no oldest token.
    assert lag([Span("v1", 0, 0), Span("v4", 0, 4)], "v1", "v4") == 1
    assert lag([Span("gone", 0, 2), Span("v5", 2, 4)], "v5", "v5") is None
    # Without spans the start says it (an upper bound where the ends differ), else the end.
    assert lag(None, "v2", "v5") == 3
    assert lag([], "v4", None) == 1
    assert lag(None, None, "v5") == 0
    assert lag(None, None, None) is None
    assert lag_of(spans=None, start="v5", end="v5", position=POSITION, newest=None) is None
