"""How many weight updates behind each response's oldest tokens were, told by one batch alone.

The pod's own version history is on the sidecar's admin port, which a trainer need not reach, so
the companion orders the versions the batch itself shows. Each answer shows some in the order
they took effect: its `X-Weight-Version` (when it was forwarded), its spans in token order, its
`X-Weight-Version-End` (when its headers went out). Answers are read in the order they arrived; a
version seen for the first time goes just before the first known version its answer showed
after it, or else after every version known. A response's lag is how many versions of that order
come after its oldest tokens' version: 0 for tokens made by the newest weights the batch saw.

What one batch cannot see it cannot count: an update that no answer of the batch shows, and
versions named unlike across pods (the sidecar's `default+N` counts each vLLM's own updates, so
a pod restarted mid-run counts from `default` again). The first order seen wins a conflict.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Seen:
    """One answer's versions: vLLM's spans (as sent) and the sidecar's two headers."""

    spans: Any
    start: str | None
    end: str | None


def _span_versions(spans: Any) -> list[str] | None:
    """The versions of spans that cover tokens, in token order; None unless every span is
    `{"version": str, "start": int, "end": int}` (a malformed one could order them wrongly)."""
    if not isinstance(spans, list):
        return None
    valid = [
        s
        for s in spans
        if isinstance(s, dict)
        and isinstance(s.get("version"), str)
        and all(type(s.get(k)) is int for k in ("start", "end"))  # a JSON `true` is no offset
    ]
    if len(valid) != len(spans):
        return None
    return [s["version"] for s in sorted(valid, key=lambda s: s["start"]) if s["end"] > s["start"]]


def _shown(seen: Seen) -> list[str]:
    """The versions one answer shows, oldest first."""
    shown = [seen.start, *(_span_versions(seen.spans) or ()), seen.end]
    return [v for v in shown if v is not None]


def order(arrivals: Sequence[Seen]) -> list[str]:
    """The batch's versions, oldest first, from its answers in arrival order."""
    known: list[str] = []
    for seen in arrivals:
        shown = _shown(seen)
        for at, version in enumerate(shown):
            if version in known:
                continue
            later = next((v for v in shown[at + 1 :] if v in known), None)
            known.insert(known.index(later) if later is not None else len(known), version)
    return known


def oldest(seen: Seen) -> str | None:
    """The version of a response's oldest tokens: its first span that covers tokens, else its
    start header (an upper bound on the lag: its first tokens may have come later), else its end."""
    versions = _span_versions(seen.spans)
    if versions:
        return versions[0]
    return seen.start if seen.start is not None else seen.end


def lags(responses: Sequence[Seen | None], arrivals: Sequence[Seen]) -> list[int | None]:
    """Per response, updates behind the newest version of the batch (None: no version known)."""
    known = order(arrivals)
    place = {version: at for at, version in enumerate(known)}
    result: list[int | None] = []
    for seen in responses:
        version = oldest(seen) if seen is not None else None
        at = place.get(version) if version is not None else None
        result.append(len(known) - 1 - at if at is not None else None)
    return result
