"""A fake vLLM that generates: token by token, each token a function of the whole context, so that
a generation continued from its prompt plus its output makes exactly the tokens an uninterrupted
one makes. It keeps vLLM 0.32's wire behaviour where continuation depends on it (read from
vllm/entrypoints/openai/completion/serving.py, scale_out/token_in_token_out/serving.py,
v1/engine/detokenizer.py; see docs/continuation.md):

- `/v1/completions`: `return_token_ids` puts `prompt_token_ids` and `token_ids` on each choice
  (streamed: `prompt_token_ids` on a choice's first event, `token_ids` the event's delta);
  `n` choices per prompt, numbered prompt by prompt; usage counts every output token.
- `/inference/v1/generate`: token ids in and out, `weight_versions` spans over the output (on
  the last event of a stream), the abort event always sent.
- Stop strings are checked against the request's own output text only, after `min_tokens`;
  the text is cut at the stop (through it with `include_stop_str_in_output`), the completing
  token kept. A stream holds back `max(len(stop)) - 1` characters until the end, and flushes
  them in the abort event, whose `token_ids` is empty.
- A pause or sleep in abort mode (DevEngine) ends running requests with `finish_reason: "abort"`
  and the partial output; 0.32's /v1/completions stream sends no event at all for a choice
  aborted before its first token.

With `FakeVLLM(frontend="rust")` the /v1 streams are framed as vLLM's Rust frontend frames them
(tests/samples/rust/): token events carry only what they have (no `finish_reason`, `logprobs`,
`token_ids` keys unless asked), a choice ends with one more event, tokenless, that has its
`finish_reason`; chat's role event has no content; `return_token_ids` opens each choice with a
tokenless event that has its `prompt_token_ids`. /inference/v1/generate keeps one framing.
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

from tests.fake_vllm import DevEngine, FakeVLLM, dumps, json_response, rust_error, start_sse

VOCAB = 26  # each token's text is one letter: "a" + token id


def next_token(context: list[int]) -> int:
    """The model: a token from the whole context (prompt and output so far)."""
    value = 7
    for t in context[-8:]:
        value = (value * 31 + t) % 1_000_003
    return (value + len(context)) % VOCAB


def text_of(token: int) -> str:
    return chr(ord("a") + token % VOCAB)


def generate(prompt: list[int], count: int) -> list[int]:
    """What an uninterrupted greedy generation of `count` tokens makes."""
    out: list[int] = []
    for _ in range(count):
        out.append(next_token(prompt + out))
    return out


@dataclass
class Sampling:
    max_tokens: int
    min_tokens: int = 0
    stops: tuple[str, ...] = ()
    include_stop: bool = False
    n: int = 1
    logprobs: bool = False


@dataclass
class Output:
    """One choice being generated."""

    index: int
    prompt: list[int]
    tokens: list[int] = field(default_factory=list)
    text: str = ""
    versions: list[str] = field(default_factory=list)  # the weight version of each token
    finish: str | None = None
    stop: str | None = None

    def step(self, sampling: Sampling, version: str) -> None:
        token = next_token(self.prompt + self.tokens)
        self.tokens.append(token)
        self.versions.append(version)
        self.text += text_of(token)
        if len(self.tokens) > sampling.min_tokens:
            for stop in sampling.stops:
                at = self.text.find(stop)
                if at >= 0:
                    self.text = (
                        self.text[: at + len(stop)] if sampling.include_stop else self.text[:at]
                    )
                    self.finish, self.stop = "stop", stop
                    return
        if len(self.tokens) >= sampling.max_tokens:
            self.finish = "length"

    def spans(self) -> list[dict[str, Any]]:
        spans: list[dict[str, Any]] = []
        for i, version in enumerate(self.versions):
            if spans and spans[-1]["version"] == version:
                spans[-1]["end"] = i + 1
            else:
                spans.append({"version": version, "start": i, "end": i + 1})
        return spans


@dataclass
class Generator:
    """Serves /v1/completions and /inference/v1/generate on a FakeVLLM, with its DevEngine."""

    fake: FakeVLLM
    delay: float = 0.001  # between tokens
    bodies: list[dict[str, Any]] = field(default_factory=list)  # every request's body
    # The next generation stops making tokens once it made this many, until a pause aborts it
    # (`stalled` is set then): a cut at an exact place.
    stall_at: int | None = None
    stalled: asyncio.Event = field(default_factory=asyncio.Event)
    _ids: int = 0

    def install(self) -> None:
        self.fake.script("POST /v1/completions", self.completions, times=10_000)
        self.fake.script("POST /inference/v1/generate", self.generate, times=10_000)
        self.fake.script("POST /v1/chat/completions", self.chat, times=10_000)

    @property
    def engine(self) -> DevEngine:
        return self.fake.engine

    @property
    def rust(self) -> bool:
        return self.fake.frontend == "rust"

    async def completions(self, request: web.Request) -> web.StreamResponse:
        body = json.loads(await request.read())
        self.bodies.append(body)
        prompt = body["prompt"]
        prompts = prompt if prompt and isinstance(prompt[0], list) else [prompt]
        sampling = _sampling(body, body.get("max_tokens") or 16)
        outputs = [
            Output(p * sampling.n + i, list(ids))
            for p, ids in enumerate(prompts)
            for i in range(sampling.n)
        ]
        if self.rust and sampling.n > 1:
            return json_response(rust_error("Only n=1 is supported.", "n"), 400)
        return await self._serve(request, body, sampling, outputs, generate=False)

    async def chat(self, request: web.Request) -> web.StreamResponse:
        """The chat template of this model: each message's letters as tokens, then 0. A
        `kv_transfer_params.prompt_token_ids` is the prompt as it is (vLLM's decode-side hook)."""
        body = json.loads(await request.read())
        self.bodies.append(body)
        given = (body.get("kv_transfer_params") or {}).get("prompt_token_ids")
        prompt = given or [
            *(ord(c) % VOCAB for m in body["messages"] for c in m["content"] or ""),
            0,
        ]
        limit = body.get("max_completion_tokens") or body.get("max_tokens") or 16
        sampling = _sampling(body, limit)
        if self.rust and sampling.n > 1:
            return json_response(rust_error("Only n=1 is supported.", "n"), 400)
        outputs = [Output(i, list(prompt)) for i in range(sampling.n)]
        return await self._serve(request, body, sampling, outputs, generate=False, chat=True)

    async def generate(self, request: web.Request) -> web.StreamResponse:
        body = json.loads(await request.read())
        self.bodies.append(body)
        params = body["sampling_params"]
        sampling = _sampling(params, params["max_tokens"])
        outputs = [Output(i, list(body["token_ids"])) for i in range(sampling.n)]
        return await self._serve(request, body, sampling, outputs, generate=True)

    async def _serve(
        self,
        request: web.Request,
        body: dict[str, Any],
        sampling: Sampling,
        outputs: list[Output],
        *,
        generate: bool,
        chat: bool = False,
    ) -> web.StreamResponse:
        self._ids += 1
        rid = f"{'generate-tokens' if generate else 'cmpl'}-{self._ids}"
        head: dict[str, Any] = {
            "id": rid,
            "object": "text_completion",
            "created": 1795982287,
            "model": "tiny-model",
        }
        if generate:
            head = {"request_id": rid}
        if chat:
            head = {**head, "id": f"chatcmpl-{self._ids}", "object": "chat.completion.chunk"}
        stream = body.get("stream") is True
        resp = await start_sse(request) if stream else None
        hold = max((len(s) for s in sampling.stops), default=1) - 1
        hold = 0 if sampling.include_stop else hold
        sent = {o.index: (0, 0) for o in outputs}  # characters, tokens the client has
        await self.engine.admitted()  # vLLM queues new requests while paused or asleep
        if resp is not None and chat:  # the role event of every choice, the prompt on the first
            for o in outputs:
                role: dict[str, Any] = {**head, "choices": [_role(o, self.rust)]}
                if o.index == 0 and body.get("return_token_ids"):
                    role["prompt_token_ids"] = o.prompt
                await resp.write(b"data: " + dumps(role) + b"\n\n")
        stall, self.stall_at = self.stall_at, None
        with self.engine.running() as run:
            while any(o.finish is None for o in outputs):
                await asyncio.sleep(self.delay)
                if stall is not None and len(outputs[0].tokens) >= stall and not run.aborted:
                    self.stalled.set()
                    while not run.aborted:  # noqa: ASYNC110  # DevEngine sets a flag
                        await asyncio.sleep(0.005)
                if run.aborted:
                    for o in outputs:
                        if o.finish is None:
                            o.finish = "abort"
                    break
                await self.engine.admitted()  # a `keep` pause freezes it here
                for o in outputs:
                    if o.finish is None:
                        o.step(sampling, self.engine.weight_version)
                if resp is not None:
                    for o in outputs:
                        await self._event(resp, head, body, o, sent, hold, generate, chat)
            if resp is not None:
                for o in outputs:
                    if o.finish == "abort":
                        await self._event(resp, head, body, o, sent, hold, generate, chat)
        usage = {
            "prompt_tokens": len(outputs[0].prompt),
            "completion_tokens": sum(len(o.tokens) for o in outputs),
        }
        usage["total_tokens"] = usage["prompt_tokens"] + usage["completion_tokens"]
        if resp is None:
            choices = [self._choice(body, o, generate, chat) for o in outputs]
            answer = {**head, "choices": choices, "usage": usage}
            if chat:
                answer["object"] = "chat.completion"
                if body.get("return_token_ids"):
                    answer["prompt_token_ids"] = outputs[0].prompt
            return json_response(answer)
        options = body.get("stream_options") or {}
        if options.get("include_usage"):
            await resp.write(b"data: " + dumps({**head, "choices": [], "usage": usage}) + b"\n\n")
        await resp.write(b"data: [DONE]\n\n")
        await resp.write_eof()
        return resp

    def _choice(
        self, body: dict[str, Any], o: Output, generate: bool, chat: bool
    ) -> dict[str, Any]:
        choice: dict[str, Any] = {
            "index": o.index,
            "finish_reason": o.finish,
            "stop_reason": o.stop,
            "token_ids": list(o.tokens) if generate or body.get("return_token_ids") else None,
        }
        if generate:
            choice["weight_versions"] = o.spans()
            choice["logprobs"] = _generate_logprobs(o.tokens) if _logprobs(body) else None
        elif chat:
            choice["message"] = {"role": "assistant", "content": o.text}
        else:
            choice["text"] = o.text
            choice["prompt_token_ids"] = o.prompt if body.get("return_token_ids") else None
            choice["logprobs"] = _completion_logprobs(o.tokens) if _logprobs(body) else None
        return choice

    async def _event(
        self,
        resp: web.StreamResponse,
        head: dict[str, Any],
        body: dict[str, Any],
        o: Output,
        sent: dict[int, tuple[int, int]],
        hold: int,
        generate: bool,
        chat: bool,
    ) -> None:
        chars, count = sent[o.index]
        done = o.finish is not None
        upto = len(o.text) if done else max(len(o.text) - hold, chars)
        text, tokens = o.text[chars:upto], o.tokens[count:]
        if not text and not tokens and not done:
            return
        if done and o.finish == "abort" and not generate and not o.tokens:
            return  # vLLM 0.32: no event for a completions choice aborted before its first token
        if done and chars == -1:
            return
        sent[o.index] = (-1, 0) if done else (upto, len(o.tokens))
        if self.rust and not generate:
            for choice in _rust_choices(body, o, text, tokens, first=count == 0, chat=chat):
                await resp.write(b"data: " + dumps({**head, "choices": [choice]}) + b"\n\n")
            return
        choice: dict[str, Any] = {
            "index": o.index,
            "finish_reason": o.finish,
            "stop_reason": o.stop,
            "token_ids": tokens if generate or body.get("return_token_ids") else None,
        }
        if generate:
            choice["weight_versions"] = o.spans() if done else None
            choice["logprobs"] = _generate_logprobs(tokens) if _logprobs(body) else None
        elif chat:
            choice["delta"] = {"content": text}
        else:
            choice["text"] = text
            first = count == 0 and chars == 0
            returned = first and body.get("return_token_ids")
            choice["prompt_token_ids"] = o.prompt if returned else None
            choice["logprobs"] = _completion_logprobs(tokens) if _logprobs(body) else None
        event = {**head, "choices": [choice]}
        await resp.write(b"data: " + dumps(event) + b"\n\n")


def _rust_choices(
    body: dict[str, Any], o: Output, text: str, tokens: list[int], *, first: bool, chat: bool
) -> list[dict[str, Any]]:
    """One step of a choice as the Rust frontend sends it: the prompt's ids first (asked for),
    the new tokens if they have text, ids or logprobs to show, then the tokenless end."""
    ids, logprobs = bool(body.get("return_token_ids")), _logprobs(body) and not chat
    out: list[dict[str, Any]] = []
    if first and ids and not chat:
        out.append({"index": o.index, "text": "", "token_ids": [], "prompt_token_ids": o.prompt})
    if text or (tokens and (ids or logprobs)):
        choice: dict[str, Any] = {"index": o.index}
        choice.update({"delta": {"content": text}} if chat else {"text": text})
        if ids:
            choice["token_ids"] = tokens
        if logprobs:
            choice["logprobs"] = _completion_logprobs(tokens)
        out.append(choice)
    if o.finish is not None:
        end: dict[str, Any] = {"index": o.index, **({"delta": {}} if chat else {"text": ""})}
        end["finish_reason"] = o.finish
        if ids:
            end["token_ids"] = []
        out.append(end)
    return out


def _role(o: Output, rust: bool) -> dict[str, Any]:
    if rust:
        return {"index": o.index, "delta": {"role": "assistant"}}
    return {"index": o.index, "delta": {"role": "assistant", "content": ""}, "finish_reason": None}


def _sampling(params: dict[str, Any], max_tokens: int) -> Sampling:
    stop = params.get("stop") or ()
    return Sampling(
        max_tokens=max_tokens,
        min_tokens=params.get("min_tokens") or 0,
        stops=(stop,) if isinstance(stop, str) else tuple(stop),
        include_stop=bool(params.get("include_stop_str_in_output")),
        n=params.get("n") or 1,
    )


def _logprobs(body: dict[str, Any]) -> bool:
    params = body.get("sampling_params", body)
    return params.get("logprobs") is not None


def logprob_of(token: int) -> float:
    return -0.01 * (token + 1)


def _completion_logprobs(tokens: list[int]) -> dict[str, Any]:
    return {
        "text_offset": list(range(len(tokens))),
        "token_logprobs": [logprob_of(t) for t in tokens],
        "tokens": [text_of(t) for t in tokens],
        "top_logprobs": [{text_of(t): logprob_of(t)} for t in tokens],
    }


def _generate_logprobs(tokens: list[int]) -> dict[str, Any]:
    return {"content": [{"token_id": t, "logprob": logprob_of(t), "rank": 1} for t in tokens]}
