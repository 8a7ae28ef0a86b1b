"""Which weights made each generation: vLLM's per-token spans, carried to the client's result.

vLLM's `/inference/v1/generate` answers each choice with `weight_versions`, spans
`{"version", "start", "end"}` over its output tokens (vLLM 0.33's `return_weight_versions` has
the same shape). The parent client drops them; an RL loss must know which tokens came from
stale weights. A generate call's own task collects its answer's spans (`collecting`), and the
batch maps each back to its prompt by identity: a prompt list given twice (the same object at
two indexes) cannot be told apart, and gets None rather than perhaps another's spans.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from contextvars import ContextVar
from typing import Any

Spans = list[dict[str, Any]] | None

_ANSWER: ContextVar[list[Spans] | None] = ContextVar("weight_version_answer", default=None)
_BATCH: ContextVar[dict[int, list[Spans]] | None] = ContextVar("weight_version_batch", default=None)


def seen(body: Any) -> None:
    """A generate answer came back: keep its first choice's spans for the call waiting on it."""
    box = _ANSWER.get()
    if box is None or not isinstance(body, dict):
        return
    choices = body.get("choices")
    first = choices[0] if isinstance(choices, list) and choices else None
    spans = first.get("weight_versions") if isinstance(first, dict) else None
    box.append(spans if isinstance(spans, list) else None)


@contextlib.contextmanager
def collecting(prompt: object) -> Iterator[None]:
    """Around one prompt's generate call: its spans are filed under the prompt."""
    box: list[Spans] = []
    token = _ANSWER.set(box)
    try:
        yield
    finally:
        _ANSWER.reset(token)
        batch = _BATCH.get()
        if batch is not None:
            batch.setdefault(id(prompt), []).append(box[-1] if box else None)


@contextlib.contextmanager
def batch_spans(prompts: Sequence[object], out: dict[str, Any]) -> Iterator[None]:
    """Around a batch: `out["weight_versions"]`, one entry of spans per prompt, in order."""
    batch: dict[int, list[Spans]] = {}
    token = _BATCH.set(batch)
    try:
        yield
    finally:
        _BATCH.reset(token)
    keys = [id(p) for p in prompts]
    out["weight_versions"] = [
        found[0] if keys.count(key) == 1 and len(found := batch.get(key, [None])) == 1 else None
        for key in keys
    ]
