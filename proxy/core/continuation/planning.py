"""A continuation's plan: what a cut generation asked for, and what to send again.

A pause or sleep in abort mode ends every running request as a 200 with `finish_reason:
"abort"` and its partial output. With continuation on, the sidecar sends each such choice
again from exactly the tokens it has (the prompt's token ids plus the output's, the rest of
`max_tokens` and `min_tokens`, the same sampling parameters) and joins the parts into one
choice. This module reads the plan from the request and makes each part's body; joining.py
joins the parts (and finds a stop string that straddles a cut: vLLM checks stop strings
against a request's own output text only). client/continuing/ does the sending.
"""

from __future__ import annotations

from dataclasses import dataclass
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
