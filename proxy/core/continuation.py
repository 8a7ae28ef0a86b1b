"""Continuing a generation a phase cut short: what to send again, and how the parts join.

A pause or sleep in abort mode ends every running request as a 200 with `finish_reason:
"abort"` and its partial output. With continuation on, the sidecar sends each such choice
again from exactly the tokens it has (the prompt's token ids plus the output's, the rest of
`max_tokens` and `min_tokens`, the same sampling parameters) and joins the parts into one
choice. This module is the pure part: the plan read from the request, each part's body, the
joining, and a stop string that straddles a cut (vLLM checks stop strings against a request's
own output text only, so one that began before the cut is the sidecar's to find).
client/continuation.py does the sending.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, TypeGuard

COMPLETIONS, GENERATE, CHAT = "completions", "generate", "chat"
ABORT = "abort"
# vLLM's default `max_tokens` on /v1/completions (`null` and absent alike).
COMPLETIONS_MAX_TOKENS = 16

Json = dict[str, Any]


@dataclass(frozen=True, slots=True)
class Plan:
    """What a continuable request asked for, read once from its body."""

    kind: str  # COMPLETIONS or GENERATE
    payload: Json  # the request as forwarded (its model already the served name)
    max_tokens: int
    min_tokens: int
    stops: tuple[str, ...]
    include_stop: bool  # include_stop_str_in_output
    stream: bool
    usage: bool  # stream_options.include_usage
    token_ids_asked: bool  # the client asked for token ids (else the sidecar strips them)
    versions_asked: bool  # return_weight_versions: spans on each choice

    def sampling(self) -> Json:
        """Where the sampling parameters live: the body itself, or `sampling_params`."""
        if self.kind == GENERATE:
            params: Json = self.payload.get("sampling_params") or {}
            return params
        return self.payload

    def first_body(self) -> Json:
        """The request as sent the first time: asking for the token ids a continuation needs."""
        if self.kind in (COMPLETIONS, CHAT):
            return {**self.payload, "return_token_ids": True}
        return self.payload

    def text_of(self, choice: Json) -> str:
        """A choice's text: `text` (a chat request's continuations too: /v1/completions), or a
        chat message's (or delta's) `content`."""
        message = choice.get("message") or choice.get("delta") if self.kind == CHAT else None
        if isinstance(message, dict):
            text = message.get("content")
        else:
            text = choice.get("text")
        return text if isinstance(text, str) else ""

    def reasoning_of(self, choice: Json) -> dict[str, str]:
        """A chat message's (or delta's) reasoning: a reasoning parser's, beside `content`."""
        message = choice.get("message") or choice.get("delta") if self.kind == CHAT else None
        if not isinstance(message, dict):
            return {}
        return {k: v for k in _REASONING if isinstance(v := message.get(k), str)}

    def with_text(self, choice: Json, text: str, *, stream: bool) -> Json:
        """`choice` with its text replaced: where this route writes it."""
        if self.kind == CHAT:
            key = "delta" if stream else "message"
            message = choice.get(key)
            return {
                **choice,
                key: {**(message if isinstance(message, dict) else {}), "content": text},
            }
        if self.kind == COMPLETIONS or "text" in choice:
            return {**choice, "text": text}
        return choice

    def prompt_of(self, choice: Json, answer: Json | None = None) -> list[int] | None:
        """A choice's prompt token ids: the request's, or those vLLM returned with it (chat:
        on the answer, or a stream's first event)."""
        if self.kind == GENERATE:
            ids = self.payload.get("token_ids")
        elif self.kind == CHAT:
            ids = (answer or {}).get("prompt_token_ids")
        else:
            ids = choice.get("prompt_token_ids")
            if not _token_list(ids):
                ids = self.token_prompt(choice.get("index"))
        return list(ids) if _token_list(ids) else None

    def choices(self) -> int:
        """How many choices the answer has: `n` for each prompt."""
        n = _int(self.sampling().get("n"), 1) or 1
        prompt = self.payload.get("prompt")
        many = isinstance(prompt, list) and bool(prompt) and not _token_list(prompt)
        return n * (len(prompt) if many and isinstance(prompt, list) else 1)

    def token_prompt(self, index: object) -> list[int] | None:
        """The token-id prompt of choice `index` (vLLM numbers them prompt by prompt, `n`
        each), when the client sent token ids; None for a text prompt."""
        if self.kind == GENERATE:
            ids = self.payload.get("token_ids")
            return list(ids) if _token_list(ids) else None
        prompt = self.payload.get("prompt")
        if _token_list(prompt):
            return list(prompt)
        n = _int(self.sampling().get("n"), 1) or 1
        if isinstance(prompt, list) and isinstance(index, int) and 0 <= index // n < len(prompt):
            one = prompt[index // n]
            return list(one) if _token_list(one) else None
        return None

    def part_body(self, prompt: list[int], output: list[int], *, stream: bool, most: int) -> Json:
        """A continuation: the prompt plus the output so far, for the tokens still owed (at
        most `most`), one choice, nothing echoed."""
        left = self.max_tokens - len(output)
        minimum = max(self.min_tokens - len(output), 0)
        budget = {"max_tokens": min(left, most), "min_tokens": min(minimum, left, most), "n": 1}
        if self.kind == GENERATE:
            body = {k: v for k, v in self.payload.items() if k not in _GENERATE_DROPS}
            body["token_ids"] = prompt + output
            body["sampling_params"] = {**self.sampling(), **budget}
        elif self.kind == CHAT:
            # On /v1/completions (PART_PATH): the rendered prompt's ids and the output's are the
            # prompt, no template applied again; the sampling parameters carry over as they are.
            body = {k: v for k, v in self.payload.items() if k in _CHAT_SAMPLING}
            body.update(budget, prompt=prompt + output, return_token_ids=True)
        else:
            body = {k: v for k, v in self.payload.items() if k not in _COMPLETIONS_DROPS}
            body.update(budget, prompt=prompt + output, return_token_ids=True)
        body["stream"] = stream
        return body


# Not carried into a continuation: the prompt's echo and logprobs (the prompt is now the prompt
# plus the output), best_of, the stream's options (its usage is counted by the sidecar), and a
# request id (vLLM refuses a duplicate one while the parts of n > 1 run at once).
_COMPLETIONS_DROPS = frozenset(
    ("echo", "prompt_logprobs", "best_of", "stream_options", "suffix", "request_id")
)
_GENERATE_DROPS = frozenset(("stream_options", "request_id", "prompt_logprobs"))
_REASONING = ("reasoning_content", "reasoning")
# What a chat request's continuation keeps on /v1/completions: the model and every sampling
# parameter the two routes share (vLLM's SamplingParams either way).
_CHAT_SAMPLING = frozenset(
    (
        "model", "temperature", "top_p", "top_k", "min_p", "seed", "stop", "stop_token_ids",
        "include_stop_str_in_output", "ignore_eos", "presence_penalty", "frequency_penalty",
        "repetition_penalty", "skip_special_tokens", "spaces_between_special_tokens",
        "bad_words", "allowed_token_ids", "logit_bias", "priority", "cache_salt",
    )
)  # fmt: skip
# Where a chat request's continuations go: from token ids, chat has no exact way (its
# decode-side hook, kv_transfer_params.prompt_token_ids, gives the right tokens in vLLM 0.32
# but a text that begins with the prompt's; continue_final_message tokenizes the text again).
PART_PATH = {CHAT: "/v1/completions"}


def _token_list(value: object) -> TypeGuard[list[int]]:
    return isinstance(value, list) and all(isinstance(t, int) for t in value)


def _int(value: object, default: int) -> int | None:
    if value is None:
        return default
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def plan(kind: str, payload: object) -> Plan | None:
    """The plan for a request body, or None when it cannot be continued exactly: not an
    object, an echo, no `max_tokens` on /inference/v1/generate (vLLM's own default then)."""
    if not isinstance(payload, dict):
        return None
    if kind == GENERATE:
        params = payload.get("sampling_params")
        if not isinstance(params, dict) or not _token_list(payload.get("token_ids")):
            return None
        sampling: Json = params
        most = _int(params.get("max_tokens"), -1)
    elif kind == CHAT:
        if not _plain_chat(payload):
            return None
        sampling = payload
        limit = payload.get("max_completion_tokens", payload.get("max_tokens"))
        most = _int(limit, -1)  # none: vLLM's default budget, which the sidecar cannot know
    else:
        if payload.get("echo") or "prompt" not in payload:
            return None
        sampling = payload
        most = _int(payload.get("max_tokens"), COMPLETIONS_MAX_TOKENS)
    least = _int(sampling.get("min_tokens"), 0)
    if most is None or most < 1 or least is None:
        return None
    stop = sampling.get("stop")
    stops = (stop,) if isinstance(stop, str) else tuple(s for s in stop or () if isinstance(s, str))
    options = payload.get("stream_options")
    return Plan(
        kind=kind,
        payload=payload,
        max_tokens=most,
        min_tokens=least,
        stops=tuple(s for s in stops if s),
        include_stop=bool(sampling.get("include_stop_str_in_output")),
        stream=payload.get("stream") is True,
        usage=isinstance(options, dict) and options.get("include_usage") is True,
        token_ids_asked=bool(payload.get("return_token_ids")),
        versions_asked=bool(payload.get("return_weight_versions")),
    )


_UNJOINABLE_CHAT = frozenset(
    ("echo", "tools", "logprobs", "top_logprobs", "response_format", "structured_outputs")
) | {"kv_transfer_params"}


def _plain_chat(payload: Json) -> bool:
    """A chat request continued exactly from token ids on /v1/completions: text messages
    (content is the output's text), no tools (a tool call needs the chat route's parser), no
    logprobs (their shape differs), no echo, no response format or grammar (it would begin
    again), no kv_transfer_params of the client's own (disaggregated serving)."""
    messages = payload.get("messages")
    if not isinstance(messages, list) or not messages:
        return False
    if any(payload.get(k) for k in _UNJOINABLE_CHAT):
        return False
    return all(isinstance(m, dict) and isinstance(m.get("content"), str | None) for m in messages)


def aborted(choice: object) -> bool:
    return isinstance(choice, dict) and choice.get("finish_reason") == ABORT


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
