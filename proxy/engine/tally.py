"""Each generation answer's tokens counted by lag (core/offpolicy.py) into the pod's metrics.

What an answer says of its tokens, read as cheaply as it can be read: a body's `usage` by one
search where nothing more is needed, the whole body parsed only where it carries per-token spans
(`weight_versions`); a stream's chunks searched for three keys, and only the events that carry
spans or usage parsed. JSON escapes every quote inside a string, so a `"key":` found in vLLM's
compact JSON is a key, never generated text.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import orjson

from proxy.core.offpolicy import Span, by_lag, ends_label, spans_of, straddles
from proxy.core.sse import ErrorWatcher
from proxy.observe.engine_metrics import EngineMetrics

from .history import History

if TYPE_CHECKING:
    from .lifecycle import Lifecycle

_SPANS = b'"weight_versions":['
PARSE_LIMIT = 1024 * 1024  # orjson reads ~1 GB/s: at most about a millisecond of the loop
_USAGE_KEY = b'"completion_tokens":'
_DIGITS = re.compile(rb"\d{1,18}")
_ENDED = b'"finish_reason":"'  # a choice's last event: its reason is a string, not null


@dataclass(slots=True)
class Counts:
    """An answer's tokens as it tells them: per choice its tokens (None: not told) and spans
    (None: none), and the answer's total (`usage.completion_tokens`; None: not told)."""

    choices: list[tuple[int | None, Sequence[Span] | None]]
    total: int | None = None
    estimated: bool = False  # `total` is a stream's events counted, not vLLM's count


def _usage(data: bytes) -> int | None:
    """The last `completion_tokens` (a stream's usage is cumulative)."""
    at = data.rfind(_USAGE_KEY)
    digits = _DIGITS.match(data, at + len(_USAGE_KEY)) if at >= 0 else None
    return int(digits.group()) if digits is not None else None


def of_body(body: bytes) -> Counts | None:
    """A whole answer's counts; None where it tells nothing (not a generation's JSON). It runs
    on the event loop, so a body past PARSE_LIMIT is not parsed: its usage alone tells it,
    by the answer's ends."""
    if _SPANS not in body or len(body) > PARSE_LIMIT:
        total = _usage(body)
        return None if total is None else Counts([], total=total)
    try:
        answer = orjson.loads(body)
    except orjson.JSONDecodeError:
        return None
    if not isinstance(answer, dict) or not isinstance(answer.get("choices"), list):
        return None
    usage = answer.get("usage")
    given = usage.get("completion_tokens") if isinstance(usage, dict) else None
    counts = Counts([], total=given if type(given) is int else None)
    for choice in answer["choices"]:
        if isinstance(choice, dict):
            counts.choices.append(
                choice_counts(choice.get("token_ids"), choice.get("weight_versions"))
            )
    return counts


def choice_counts(token_ids: object, raw_spans: object) -> tuple[int | None, list[Span] | None]:
    """One choice's tokens (its token ids, else as far as its spans reach) and spans."""
    spans = spans_of(raw_spans)
    if isinstance(token_ids, list):
        return len(token_ids), spans
    return (max(s.end for s in spans) if spans else None), spans


def joined(choices: Iterable[tuple[int, list[dict[str, Any]], int]], usage: object) -> Counts:
    """A continued answer's: each choice's joined tokens (the sidecar asks vLLM for their ids),
    with its spans where a phase cut it (its parts' versions are then known, one each); an uncut
    choice goes by the answer's ends, as a relayed one (its one part's span names the version it
    began under, also where a `keep` pause let an update through in the middle)."""
    given = usage.get("completion_tokens") if isinstance(usage, dict) else None
    counts = Counts([], total=given if type(given) is int else None)
    for tokens, spans, cuts in choices:
        counts.choices.append(
            (tokens, spans_of(spans) if cuts else None) if tokens else (None, None)
        )
    return counts


class Tally:
    """A relayed stream's counts. Its choice events are counted as they pass by the SSE watcher
    (core/sse.py), in the search it makes of each chunk anyway; only once a choice has ended
    is a chunk searched for what ends bring (`ended`): vLLM 0.33 puts spans on a choice's last
    event only (v1/engine/output_processor.py), and usage comes after the last. Usage, where
    the client asked for it (`stream_options.include_usage`), is vLLM's own count: exact.
    Without it the tokens are an estimate, the events that carry one (`untold`)."""

    __slots__ = ("chat", "spans", "total")

    def __init__(self, chat: bool) -> None:
        self.chat = chat
        self.total: int | None = None
        self.spans: dict[int, dict[int, Span]] = {}  # choice index -> span start -> span

    def ended(self, chunk: bytes) -> None:
        """A chunk at or after a choice's end. What an end brings follows its `finish_reason`
        (vLLM's field order: spans after it, usage in an event after the last), so the search
        starts at the chunk's last end, found from the chunk's end: a chunk of many events
        (a whole stream read at once) is not searched twice over."""
        at = max(chunk.rfind(_ENDED), 0)
        if chunk.find(_USAGE_KEY, at) >= 0:
            self.total = _usage(chunk)
        if chunk.find(_SPANS, at) >= 0:
            self._spans(chunk)

    def _spans(self, chunk: bytes) -> None:
        """The spans of each event that has them; an event cut across two chunks is not read,
        its tokens go by the answer's ends."""
        for event in chunk.split(b"\n\n"):
            if _SPANS not in event or not event.startswith(b"data: "):
                continue
            try:
                data = orjson.loads(event[6:])
            except orjson.JSONDecodeError:
                continue
            choices = data.get("choices") if isinstance(data, dict) else None
            for choice in choices if isinstance(choices, list) else ():
                if isinstance(choice, dict) and type(index := choice.get("index")) is int:
                    for span in spans_of(choice.get("weight_versions")) or ():
                        self.spans.setdefault(index, {})[span.start] = span

    def counts(self, watcher: ErrorWatcher) -> Counts:
        counts = Counts([], total=self.total)
        for index in sorted(self.spans):
            spans = sorted(self.spans[index].values(), key=lambda s: s.start)
            counts.choices.append((max(s.end for s in spans), spans))
        if counts.total is None:
            counts.total, counts.estimated = untold(watcher, self.chat), True
        return counts


def untold(watcher: ErrorWatcher, chat: bool) -> int:
    """A stream's tokens where it tells no usage: its choice events less those that carry no
    token. Each chat choice has one role event first, as it has one end. The Python server's
    last event of a choice carries a token with the finish reason (an abort's carries none);
    the Rust frontend's is one more event, tokenless, and its token events have no
    `finish_reason` key, which tells the two apart. One event a token at `--stream-interval` 1,
    with two exceptions: an interval above 1 puts several tokens in one event, and the Rust
    frontend sends no chat event for a token without text of its own (a part of a UTF-8
    character) unless logprobs were asked for. Both count short: docs/offpolicy.md."""
    python = watcher.keyed == watcher.events  # every choice event has the key
    tokenless = (watcher.aborts if python else watcher.ends) + (watcher.ends if chat else 0)
    return max(watcher.events - tokenless, 0)


def answered(lifecycle: Lifecycle, route: str, counts: Counts, start: str | None) -> None:
    """A data request's answer ended: count it against the pod's state now."""
    state = lifecycle.state
    count(lifecycle.metrics, route, counts, start=start, end=state.version, history=state.history)


def count(
    metrics: EngineMetrics,
    route: str,
    counts: Counts,
    *,
    start: str | None,
    end: str | None,
    history: History,
) -> None:
    """Count one answer's tokens by lag, against the pod's newest version as it ends (`start`,
    `end`: the versions at its two ends), and the answer once if it straddled an update."""
    if counts.estimated and counts.total:
        metrics.estimated_tokens.labels(route).inc(counts.total)
    if not counts.choices:  # the common answer, told by its ends alone: one label
        if counts.total:
            label = ends_label(start, end, history.position(), history.newest)
            metrics.generated_tokens.labels(route, label).inc(counts.total)
        if start != end and start is not None and end is not None:
            metrics.straddling_answers.labels(route).inc()
        return
    position, newest = history.position(), history.newest
    labels: dict[str, int] = {}
    known, straddling = 0, False
    for tokens, spans in counts.choices:
        straddling = straddling or straddles(spans, start, end)
        if tokens is not None:
            _add(
                labels,
                by_lag(
                    tokens=tokens,
                    spans=spans,
                    start=start,
                    end=end,
                    position=position,
                    newest=newest,
                ),
            )
            known += tokens
    rest = (counts.total or 0) - known  # choices that told no count of their own
    if rest > 0:
        _add(
            labels,
            by_lag(tokens=rest, spans=None, start=start, end=end, position=position, newest=newest),
        )
    for label, tokens in labels.items():
        metrics.generated_tokens.labels(route, label).inc(tokens)
    if straddling:
        metrics.straddling_answers.labels(route).inc()


def _add(into: dict[str, int], counted: dict[str, int]) -> None:
    for label, tokens in counted.items():
        into[label] = into.get(label, 0) + tokens
