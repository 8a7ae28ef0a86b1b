"""Which weights made each generation: vLLM's per-token spans and the sidecar's version headers,
carried to the client's result with each response's lag (lags.py).

vLLM's `/inference/v1/generate` answers each choice with `weight_versions`, spans
`{"version", "start", "end"}` over its output tokens (vLLM 0.33's `return_weight_versions` has
the same shape); the sidecar adds `X-Weight-Version` (and `X-Weight-Version-End` where it
changed) to every answer. The parent client drops them; an RL loss must know which tokens came
from stale weights. A generate call's own task collects its answer's (`collecting`), and the
batch maps each back to its prompt by identity: a prompt list given twice (the same object at
two indexes) cannot be told apart, and gets None rather than perhaps another's.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any

from proxy.skyrl.lags import Seen, lags


@dataclass
class _Call:
    """What one generate call heard: the headers of its latest answer, then its body's spans."""

    start: str | None = None
    end: str | None = None
    seen: Seen | None = None


@dataclass
class _Batch:
    by_prompt: dict[int, list[Seen | None]] = field(default_factory=dict)
    arrivals: list[Seen] = field(default_factory=list)  # in the order the answers came


_CALL: ContextVar[_Call | None] = ContextVar("weight_version_call", default=None)
_BATCH: ContextVar[_Batch | None] = ContextVar("weight_version_batch", default=None)


def heard(start: str | None, end: str | None) -> None:
    """A data-plane answer's `X-Weight-Version` and `X-Weight-Version-End` (None if absent)."""
    call = _CALL.get()
    if call is not None:
        call.start, call.end = start, end


def seen(body: Any) -> None:
    """A generate answer came back: keep its first choice's spans for the call waiting on it."""
    call = _CALL.get()
    if call is None or not isinstance(body, dict):
        return
    choices = body.get("choices")
    first = choices[0] if isinstance(choices, list) and choices else None
    spans = first.get("weight_versions") if isinstance(first, dict) else None
    call.seen = Seen(spans if isinstance(spans, list) else None, call.start, call.end)


@contextlib.contextmanager
def collecting(prompt: object) -> Iterator[None]:
    """Around one prompt's generate call: what it saw is filed under the prompt."""
    call = _Call()
    token = _CALL.set(call)
    try:
        yield
    finally:
        _CALL.reset(token)
        batch = _BATCH.get()
        if batch is not None:
            batch.by_prompt.setdefault(id(prompt), []).append(call.seen)
            if call.seen is not None:
                batch.arrivals.append(call.seen)


@contextlib.contextmanager
def batch_spans(prompts: Sequence[object], out: dict[str, Any]) -> Iterator[None]:
    """Around a batch: `out["weight_versions"]` (spans) and `out["weight_lags"]`, one per prompt."""
    batch = _Batch()
    token = _BATCH.set(batch)
    try:
        yield
    finally:
        _BATCH.reset(token)
    # A prompt object given twice files two calls under one key: neither is told apart.
    found = [_only(batch.by_prompt.get(id(prompt), [])) for prompt in prompts]
    out["weight_versions"] = [seen.spans if seen is not None else None for seen in found]
    # Every answer orders the versions, also one whose prompt cannot be told apart.
    out["weight_lags"] = lags(found, batch.arrivals)


def _only(calls: list[Seen | None]) -> Seen | None:
    return calls[0] if len(calls) == 1 else None
