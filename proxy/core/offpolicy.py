"""Off-policy accounting: a choice's tokens by how many weight updates behind they were.

A lag is counted against the pod's own version history (`position`: each version's place in the
ordered updates the pod saw, oldest first) and its newest version when the answer ended. The
tokens' versions come from vLLM's per-token spans (`weight_versions`, vLLM 0.33's
`return_weight_versions`, or the sidecar's continuation) where an answer has them; otherwise only
the versions at the answer's two ends are known, and tokens made across a change are
`straddled`: which of them came before the update is not known, and is not guessed.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TypeGuard

# The label values of `lag`, a bounded set. `unknown` is kept apart from `3+`: `3+` is a measured
# lag, `unknown` is no measurement at all (a version the pod's bounded history no longer holds, or
# never saw, or an answer that named no version, as every answer of a vLLM outside dev mode).
# Folding it into `3+` would show a serving pod without versions as entirely off-policy.
LAGS = ("0", "1", "2", "3+", "straddled", "unknown")
STRADDLED = "straddled"
UNKNOWN = "unknown"
_BUCKETS = ("0", "1", "2")  # lags counted one by one; more is "3+"


@dataclass(frozen=True, slots=True)
class Span:
    """Tokens `[start, end)` of one choice's output, made by weights `version`."""

    version: str
    start: int
    end: int


def _offset(value: object) -> TypeGuard[int]:
    # bool is an int in Python; a JSON `true` is no token offset.
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def spans_of(raw: object) -> list[Span] | None:
    """One choice's `weight_versions` as Spans; None for anything malformed (never raises).

    vLLM writes the spans in token order, each starting where the last ended or later; spans out
    of order or overlapping would count tokens twice, so they make the whole value malformed.
    """
    if not isinstance(raw, list):
        return None
    spans: list[Span] = []
    for item in raw:
        if not isinstance(item, dict):
            return None
        version, start, end = item.get("version"), item.get("start"), item.get("end")
        if not isinstance(version, str) or not _offset(start) or not _offset(end):
            return None
        if end < start or (spans and start < spans[-1].end):
            return None
        spans.append(Span(version, start, end))
    return spans


def positions(history: Iterable[str]) -> dict[str, int]:
    """Each version's place in a pod's history, oldest first. A name the history holds twice
    (a trainer that names two updates alike) takes its latest place: its tokens cannot be told
    apart, and the latest gives the smaller lag rather than an invented larger one."""
    return {version: index for index, version in enumerate(history)}


def behind(version: str | None, position: Mapping[str, int], newest: str | None) -> int | None:
    """Updates between `version` and `newest` in the pod's history; None where either is not in
    it, or `version` comes after `newest` (a history that moved on cannot be measured against)."""
    if version is None or newest is None:
        return None
    at, last = position.get(version), position.get(newest)
    if at is None or last is None or at > last:
        return None
    return last - at


def _label(lag: int | None) -> str:
    if lag is None:
        return UNKNOWN
    return _BUCKETS[lag] if lag < len(_BUCKETS) else "3+"


def ends_label(
    start: str | None, end: str | None, position: Mapping[str, int], newest: str | None
) -> str:
    """The label of tokens no span covers, by the versions at the answer's ends."""
    if start is not None and end is not None and start != end:
        return STRADDLED
    return _label(behind(start if start is not None else end, position, newest))


def by_lag(
    *,
    tokens: int,
    spans: Sequence[Span] | None,
    start: str | None,
    end: str | None,
    position: Mapping[str, int],
    newest: str | None,
) -> dict[str, int]:
    """The `tokens` of one choice by lag label (labels from LAGS; zero counts left out).

    Spans count the tokens they cover (clipped to `tokens`, each token once); the tokens no span
    covers go by `start` and `end`, the versions at the answer's ends: one version (or only one
    known) is that version's lag, two different ones are `straddled`. Exactly `tokens` in all.
    """
    counts: dict[str, int] = {}
    covered = 0
    cursor = 0  # tokens before it are counted: overlapping spans count a token once
    for span in sorted(spans or (), key=lambda s: s.start):
        low, high = max(span.start, cursor), min(span.end, tokens)
        if high > low:
            label = _label(behind(span.version, position, newest))
            counts[label] = counts.get(label, 0) + high - low
            covered += high - low
            cursor = high
    rest = max(tokens, 0) - covered
    if rest > 0:
        label = ends_label(start, end, position, newest)
        counts[label] = counts.get(label, 0) + rest
    return counts


def straddles(spans: Sequence[Span] | None, start: str | None, end: str | None) -> bool:
    """Whether the choice ran under more than one version. Spans say it where they cover tokens
    (an answer queued across an update but made whole by the new weights did not straddle);
    without them, only differing versions at the answer's ends can."""
    versions = {span.version for span in spans or () if span.end > span.start}
    if versions:
        return len(versions) > 1
    return start is not None and end is not None and start != end


def lag_of(
    *,
    spans: Sequence[Span] | None,
    start: str | None,
    end: str | None,
    position: Mapping[str, int],
    newest: str | None,
) -> int | None:
    """How many updates behind a choice's oldest tokens were; None when unknown.

    Its first span that covers tokens names the oldest weights; without spans, the version at
    its start (or, if none, at its end) does: an upper bound where start and end differ, since
    its first tokens may have come after the update.
    """
    first = next((s for s in sorted(spans or (), key=lambda s: s.start) if s.end > s.start), None)
    if first is not None:
        return behind(first.version, position, newest)
    return behind(start if start is not None else end, position, newest)
