"""Joining the parts of a continued generation into one choice (planning.py plans them):
tokens, text, logprobs and weight-version spans joined; a stop string that straddles a cut; the
answer's usage and its choice as the client gets it."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from .planning import ABORT, GENERATE, Plan

Json = dict[str, Any]


@dataclass(slots=True)
class Joined:
    """One choice, joined from its parts."""

    index: int
    prompt: list[int]
    tokens: list[int] = field(default_factory=list)
    text: str = ""
    logprobs: Json | None = None
    spans: list[Json] = field(default_factory=list)
    finish_reason: str | None = None
    stop_reason: object = None
    cuts: int = 0  # parts a phase cut short
    reasoning: dict[str, str] = field(default_factory=dict)  # a chat message's, joined

    def add(
        self,
        choice: Json,
        version: str | None,
        text: str | None = None,
        reasoning: dict[str, str] | None = None,
    ) -> None:
        """A part's choice (non-stream), made under `version` where vLLM names none; `text`:
        its text where it is not `text` (a chat message's content), `reasoning` its own."""
        for key, value in (reasoning or {}).items():
            self.reasoning[key] = self.reasoning.get(key, "") + value
        tokens = choice.get("token_ids") or []
        text = choice.get("text") or "" if text is None else text
        self.add_tokens(tokens, text, choice.get("logprobs"))
        self.add_spans(choice.get("weight_versions"), len(tokens), version)
        self.finish(choice)

    def add_tokens(self, tokens: list[int], text: str, logprobs: object) -> None:
        if isinstance(logprobs, dict):
            self.logprobs = _joined_logprobs(self.logprobs, logprobs, len(self.text))
        self.tokens.extend(tokens)
        self.text += text

    def add_spans(self, spans: object, count: int, version: str | None) -> None:
        """vLLM's spans over this part's tokens (shifted past the earlier parts), or one span
        of `version` over them all."""
        start = len(self.tokens) - count  # called once the part's tokens were added
        if isinstance(spans, list) and spans:
            for span in spans:
                if isinstance(span, dict):
                    s, e = span.get("start"), span.get("end")
                    if isinstance(s, int) and isinstance(e, int):
                        self._span(span.get("version"), start + s, start + e)
        elif count and version is not None:
            self._span(version, start, start + count)

    def part_spans(self, start: int, spans: object) -> None:
        """vLLM's spans over a whole part that began at token `start` (a stream's last event
        has them): they replace what was counted for the part event by event."""
        if not isinstance(spans, list) or not spans:
            return
        kept = []
        for span in self.spans:
            if span["start"] < start:
                kept.append({**span, "end": min(span["end"], start)})
        self.spans = kept
        self.add_spans(spans, len(self.tokens) - start, None)

    def _span(self, version: object, start: int, end: int) -> None:
        last = self.spans[-1] if self.spans else None
        if last is not None and last["version"] == version and last["end"] == start:
            last["end"] = end
        else:
            self.spans.append({"version": version, "start": start, "end": end})

    def finish(self, choice: Json) -> None:
        self.finish_reason = choice.get("finish_reason")
        self.stop_reason = choice.get("stop_reason")
        if self.finish_reason == ABORT:
            self.cuts += 1

    def stop_at(self, at: int, stop: str, include: bool) -> None:
        """A stop string straddling a cut begins at `at` in the text: end there, as vLLM would
        have (the text up to it, or through it with include_stop_str_in_output)."""
        self.text = self.text[: at + len(stop)] if include else self.text[:at]
        self.finish_reason, self.stop_reason = "stop", stop


def _joined_logprobs(before: Json | None, part: Json, text_before: int) -> Json:
    """Logprobs of two parts as one: each list extended (`content` on /inference/v1/generate;
    `tokens`, `token_logprobs`, `top_logprobs`, `text_offset` on /v1/completions, the offsets
    moved past the text before)."""
    if before is None:
        before = {k: [] for k, v in part.items() if isinstance(v, list)}
    out = dict(before)
    for key, value in part.items():
        if not isinstance(value, list):
            out.setdefault(key, value)
            continue
        if key == "text_offset":
            value = [o + text_before if isinstance(o, int) else o for o in value]
        out[key] = [*(out.get(key) or []), *value]
    return out


def straddling_stop(text: str, since: int, stops: tuple[str, ...]) -> tuple[int, str] | None:
    """The first stop string in `text` that begins before `since` (the cut) and ends after it,
    with where it begins: vLLM never sees it, since each part's check covers its own text."""
    best: tuple[int, str] | None = None
    for stop in stops:
        low = max(since - len(stop) + 1, 0)
        at = text.find(stop, low)
        while 0 <= at < since:
            if at + len(stop) > since:
                if best is None or at < best[0]:
                    best = (at, stop)
                break
            at = text.find(stop, at + 1)
    return best


def ends_in_stop_prefix(text: str, stops: tuple[str, ...]) -> bool:
    """Whether `text` ends in the beginning of a stop string (not all of it): the next tokens
    may complete it across the cut."""
    return any(
        text.endswith(stop[:k]) for stop in stops for k in range(1, len(stop)) if len(text) >= k
    )


def usage_of(first: object, joined: list[Joined]) -> Json | None:
    """The answer's usage: the first part's prompt, every joined token once."""
    if not isinstance(first, dict):
        return None
    prompt = first.get("prompt_tokens")
    completion = sum(len(j.tokens) for j in joined)
    usage = {**first, "completion_tokens": completion}
    if isinstance(prompt, int):
        usage["total_tokens"] = prompt + completion
    return usage


def joined_choice(plan: Plan, base: Json, joined: Joined) -> Json:
    """The client's choice: the first part's fields, the joined text, tokens and reasons."""
    choice = {**base, "finish_reason": joined.finish_reason, "stop_reason": joined.stop_reason}
    choice = plan.with_text(choice, joined.text, stream=False)
    if joined.reasoning and isinstance(choice.get("message"), dict):
        choice["message"] = {**choice["message"], **joined.reasoning}
    if joined.logprobs is not None:
        choice["logprobs"] = joined.logprobs
    if plan.kind == GENERATE or plan.token_ids_asked:
        choice["token_ids"] = joined.tokens
    else:
        choice.pop("token_ids", None)
        choice.pop("prompt_token_ids", None)
    if plan.versions_asked or plan.kind == GENERATE:
        choice["weight_versions"] = joined.spans
    return choice


def stripped(plan: Plan, choice: Json) -> Json:
    """A choice relayed as vLLM wrote it, less the token ids the sidecar asked for itself."""
    if plan.kind != GENERATE and not plan.token_ids_asked:
        choice.pop("token_ids", None)
        choice.pop("prompt_token_ids", None)
    return choice
