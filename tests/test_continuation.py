"""Continuation against a fake vLLM that generates (tests/fake_generator.py): a generation an
abort-mode pause or sleep cut short is finished from its exact tokens, and joined into one answer
that equals the uninterrupted one, with spans that say which weights made which tokens."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import aiohttp
import pytest
from aiohttp.test_utils import TestServer

from proxy.engine.lifecycle import LIFECYCLE
from tests.fake_generator import Generator, generate, logprob_of, text_of
from tests.fake_vllm import FakeVLLM, respond, sse_then_drop
from tests.sidecar import MakeSidecar, Sidecar, control, failures
from tests.sse import read_events
from tests.support import eventually

PROMPT = [3, 1, 4, 1, 5]
FAMILY = "vllm_sidecar_continuations_total"


@pytest.fixture
def generator(fake: FakeVLLM) -> Generator:
    gen = Generator(fake)
    gen.install()
    return gen


@pytest.fixture
async def sidecar(upstream: TestServer, make_sidecar: MakeSidecar, generator: Generator) -> Sidecar:
    sidecar = await make_sidecar(str(upstream.make_url("")), continue_aborted=True)
    await eventually(lambda: sidecar.app[LIFECYCLE].version == "default")
    return sidecar


def text(tokens: list[int]) -> str:
    return "".join(text_of(t) for t in tokens)


async def cut(
    sidecar: Sidecar, generator: Generator, version: str | None, *, mode: str = "pause"
) -> None:
    """Once the generation stalled where `generator.stall_at` says: an abort-mode pause (or
    sleep), a weight update naming `version` (if any), and the resume (or wake-up)."""
    await asyncio.wait_for(generator.stalled.wait(), 10)
    generator.stalled.clear()
    stop, go = ("/pause?mode=abort", "/resume") if mode == "pause" else ("/sleep", "/wake_up")
    assert (await control(sidecar, stop)).status == 200
    if version is not None:
        await control(sidecar, "/start_weight_update", json={})
        await control(sidecar, "/finish_weight_update", json={"weight_version": version})
    assert (await control(sidecar, go)).status == 200


async def completion(sidecar: Sidecar, **body: Any) -> aiohttp.ClientResponse:
    return await sidecar.client.post("/v1/completions", json={"model": "tiny-model", **body})


async def test_a_cut_completion_is_finished_from_its_exact_tokens(
    sidecar: Sidecar, generator: Generator
) -> None:
    generator.stall_at = 12
    asked = asyncio.create_task(completion(sidecar, prompt=PROMPT, max_tokens=40))
    await cut(sidecar, generator, "v2")
    resp = await asked
    assert resp.status == 200, await resp.text()
    answer = await resp.json()
    [choice] = answer["choices"]
    expected = generate(PROMPT, 40)
    assert choice["text"] == text(expected)
    assert (choice["finish_reason"], choice["stop_reason"]) == ("length", None)
    # The client asked for no token ids: the sidecar's own are not shown.
    assert "token_ids" not in choice
    assert "prompt_token_ids" not in choice
    assert answer["usage"] == {"prompt_tokens": 5, "completion_tokens": 40, "total_tokens": 45}
    # The continuation was sent from the prompt plus the tokens already made, for the rest.
    first, second = generator.bodies
    made = 12
    assert second["prompt"] == PROMPT + expected[:made]
    assert second["max_tokens"] == 40 - made
    assert first["return_token_ids"] is True
    spans = json.loads(resp.headers["X-Weight-Versions"])
    assert spans == [
        [
            {"version": "default", "start": 0, "end": made},
            {"version": "v2", "start": made, "end": 40},
        ]
    ]
    assert resp.headers["X-Sidecar-Continued"] == "1"
    assert sidecar.metric(FAMILY, route="/v1/completions", outcome="continued") == 1


async def test_two_cuts_in_one_answer(sidecar: Sidecar, generator: Generator) -> None:
    generator.stall_at = 10
    asked = asyncio.create_task(
        completion(sidecar, prompt=PROMPT, max_tokens=60, return_token_ids=True)
    )
    await cut(sidecar, generator, "v2")
    generator.stall_at = 15  # the continuation, 15 tokens in
    await cut(sidecar, generator, "v3")
    answer = await (await asked).json()
    [choice] = answer["choices"]
    expected = generate(PROMPT, 60)
    assert choice["token_ids"] == expected  # asked for: shown, joined
    assert choice["prompt_token_ids"] == PROMPT
    assert choice["text"] == text(expected)
    assert choice["finish_reason"] == "length"
    assert [b["max_tokens"] for b in generator.bodies] == [60, 50, 35]
    assert answer["usage"]["completion_tokens"] == 60


async def test_logprobs_are_joined_with_their_offsets(
    sidecar: Sidecar, generator: Generator
) -> None:
    generator.stall_at = 7
    asked = asyncio.create_task(completion(sidecar, prompt=PROMPT, max_tokens=30, logprobs=0))
    await cut(sidecar, generator, None)
    [choice] = (await (await asked).json())["choices"]
    expected = generate(PROMPT, 30)
    assert choice["logprobs"]["token_logprobs"] == [logprob_of(t) for t in expected]
    assert choice["logprobs"]["tokens"] == [text_of(t) for t in expected]
    assert choice["logprobs"]["text_offset"] == list(range(30))


async def test_n_2_continues_each_choice(sidecar: Sidecar, generator: Generator) -> None:
    generator.stall_at = 9
    asked = asyncio.create_task(completion(sidecar, prompt=PROMPT, max_tokens=30, n=2))
    await cut(sidecar, generator, "v2")
    answer = await (await asked).json()
    expected = text(generate(PROMPT, 30))  # greedy: both choices alike
    assert [(c["index"], c["text"], c["finish_reason"]) for c in answer["choices"]] == [
        (0, expected, "length"),
        (1, expected, "length"),
    ]
    parts = generator.bodies[1:]
    assert len(parts) == 2
    assert all(p["n"] == 1 for p in parts)
    assert answer["usage"]["completion_tokens"] == 60


def stop_across(made: int) -> str:
    """The 3 characters around a cut after `made` tokens: one before it, two after."""
    return text(generate(PROMPT, made + 2)[made - 1 :])


@pytest.mark.parametrize("include", [False, True])
@pytest.mark.parametrize("stream", [False, True])
async def test_a_stop_string_across_the_cut_is_honoured(
    sidecar: Sidecar, generator: Generator, include: bool, stream: bool
) -> None:
    """vLLM checks a part's own text only: the sidecar finds a stop string that began before
    the cut, ends the choice there as vLLM would have, and sends no more."""
    stop = stop_across(20)
    full = text(generate(PROMPT, 200))
    assert full.find(stop) == 19  # nowhere earlier: the cut is what it straddles
    body = {"prompt": PROMPT, "max_tokens": 200, "stop": [stop], "stream": stream}
    generator.stall_at = 20
    asked = asyncio.create_task(completion(sidecar, include_stop_str_in_output=include, **body))
    await cut(sidecar, generator, None)
    resp = await asked
    if stream:
        events = [json.loads(e[6:]) for e in await read_events(resp) if e != "data: [DONE]"]
        got = "".join(c.get("text", "") for e in events for c in e["choices"])
        [end] = [c for e in events for c in e["choices"] if c.get("finish_reason") is not None]
    else:
        [end] = (await resp.json())["choices"]
        got = end["text"]
    assert got == full[: 19 + (3 if include else 0)]
    assert (end["finish_reason"], end["stop_reason"]) == ("stop", stop)
    # A token at a time across the cut: two, each checked, then the stop ended it.
    assert [b["max_tokens"] for b in generator.bodies[1:]] == [1, 1]


async def test_a_cut_stream_just_goes_on(sidecar: Sidecar, generator: Generator) -> None:
    generator.stall_at = 11
    body = {"prompt": PROMPT, "max_tokens": 30, "stream": True}
    asked = asyncio.create_task(completion(sidecar, stream_options={"include_usage": True}, **body))
    await cut(sidecar, generator, "v2")
    resp = await asked
    events = await read_events(resp)
    assert events[-1] == "data: [DONE]"
    assert events.count("data: [DONE]") == 1
    chunks = [json.loads(e[6:]) for e in events[:-1]]
    choices = [c for e in chunks for c in e["choices"]]
    assert "".join(c.get("text", "") for c in choices) == text(generate(PROMPT, 30))
    assert [c["finish_reason"] for c in choices if c.get("finish_reason")] == ["length"]
    assert {e["id"] for e in chunks} == {chunks[0]["id"]}  # one answer, whatever its parts
    assert all("token_ids" not in c and "prompt_token_ids" not in c for c in choices)
    assert chunks[-1]["choices"] == []
    assert chunks[-1]["usage"] == {"prompt_tokens": 5, "completion_tokens": 30, "total_tokens": 35}
    assert len(generator.bodies) == 2


async def test_generate_is_continued_with_vllms_spans_joined(
    sidecar: Sidecar, generator: Generator
) -> None:
    """SkyRL 0.4's route: token ids in and out; vLLM's own spans, shifted and joined."""
    generator.stall_at = 8
    body = {
        "model": "tiny-model",
        "token_ids": PROMPT,
        "sampling_params": {"max_tokens": 25, "logprobs": 0},
    }
    asked = asyncio.create_task(sidecar.client.post("/inference/v1/generate", json=body))
    await cut(sidecar, generator, "v2", mode="sleep")
    answer = await (await asked).json()
    [choice] = answer["choices"]
    expected = generate(PROMPT, 25)
    assert choice["token_ids"] == expected
    assert [c["logprob"] for c in choice["logprobs"]["content"]] == [
        logprob_of(t) for t in expected
    ]
    assert choice["finish_reason"] == "length"
    assert choice["weight_versions"] == [
        {"version": "default", "start": 0, "end": 8},
        {"version": "v2", "start": 8, "end": 25},
    ]
    assert generator.bodies[1]["token_ids"] == PROMPT + expected[:8]
    assert generator.bodies[1]["sampling_params"]["max_tokens"] == 17


async def test_a_generate_stream_goes_on_and_ends_with_the_joined_spans(
    sidecar: Sidecar, generator: Generator
) -> None:
    generator.stall_at = 6
    body = {
        "model": "tiny-model",
        "token_ids": PROMPT,
        "stream": True,
        "sampling_params": {"max_tokens": 20},
    }
    asked = asyncio.create_task(sidecar.client.post("/inference/v1/generate", json=body))
    await cut(sidecar, generator, "v2")
    events = await read_events(await asked)
    chunks = [json.loads(e[6:]) for e in events[:-1]]
    choices = [c for e in chunks for c in e["choices"]]
    assert [t for c in choices for t in c["token_ids"]] == generate(PROMPT, 20)
    [end] = [c for c in choices if c["finish_reason"] is not None]
    assert end["finish_reason"] == "length"
    assert end["weight_versions"] == [
        {"version": "default", "start": 0, "end": 6},
        {"version": "v2", "start": 6, "end": 20},
    ]


async def test_off_by_default_and_on_per_request(
    upstream: TestServer, make_sidecar: MakeSidecar, generator: Generator
) -> None:
    sidecar = await make_sidecar(str(upstream.make_url("")))
    await eventually(lambda: sidecar.app[LIFECYCLE].version == "default")
    generator.stall_at = 5
    asked = asyncio.create_task(completion(sidecar, prompt=PROMPT, max_tokens=20))
    await cut(sidecar, generator, None)
    [choice] = (await (await asked).json())["choices"]
    assert (choice["finish_reason"], choice["text"]) == ("abort", text(generate(PROMPT, 5)))
    assert "return_token_ids" not in generator.bodies[0]  # the request went as it came

    generator.stall_at = 5
    on = {"X-Sidecar-Continue": "on"}
    asked = asyncio.create_task(
        sidecar.client.post(
            "/v1/completions",
            json={"model": "tiny-model", "prompt": PROMPT, "max_tokens": 20},
            headers=on,
        )
    )
    await cut(sidecar, generator, None)
    [choice] = (await (await asked).json())["choices"]
    assert (choice["finish_reason"], choice["text"]) == ("length", text(generate(PROMPT, 20)))


async def test_an_abort_someone_asked_for_is_relayed(
    sidecar: Sidecar, generator: Generator
) -> None:
    """/abort_requests while the engine serves: nobody asked the sidecar to undo it."""
    generator.stall_at = 5
    asked = asyncio.create_task(completion(sidecar, prompt=PROMPT, max_tokens=20))
    await asyncio.wait_for(generator.stalled.wait(), 10)
    for run in generator.engine._runs.values():  # what vLLM's /abort_requests does
        run.aborted = True
    [choice] = (await (await asked).json())["choices"]
    assert choice["finish_reason"] == "abort"
    assert len(generator.bodies) == 1


async def test_a_client_that_leaves_while_held_ends_it(
    sidecar: Sidecar, generator: Generator, fake: FakeVLLM
) -> None:
    generator.stall_at = 5
    asked = asyncio.create_task(completion(sidecar, prompt=PROMPT, max_tokens=20))
    await asyncio.wait_for(generator.stalled.wait(), 10)
    assert (await control(sidecar, "/pause?mode=abort")).status == 200
    await eventually(lambda: sidecar.app[LIFECYCLE].held == 1, "the cut choice is held")
    asked.cancel()
    await eventually(lambda: sidecar.app[LIFECYCLE].held == 0, "the hold ended with the client")
    assert (await control(sidecar, "/resume")).status == 200
    await asyncio.sleep(0.1)  # nothing more is sent: there is no condition to wait for
    assert len(generator.bodies) == 1


async def test_continuations_are_bounded(
    upstream: TestServer, make_sidecar: MakeSidecar, generator: Generator
) -> None:
    sidecar = await make_sidecar(str(upstream.make_url("")), continue_aborted=True, continue_max=1)
    await eventually(lambda: sidecar.app[LIFECYCLE].version == "default")
    generator.stall_at = 4
    asked = asyncio.create_task(completion(sidecar, prompt=PROMPT, max_tokens=30))
    await cut(sidecar, generator, None)
    generator.stall_at = 4
    await cut(sidecar, generator, None)
    [choice] = (await (await asked).json())["choices"]
    assert (choice["finish_reason"], choice["text"]) == ("abort", text(generate(PROMPT, 8)))
    assert sidecar.metric(FAMILY, route="/v1/completions", outcome="exhausted") == 1


async def test_a_part_vllm_refuses_leaves_the_cut_answer(
    sidecar: Sidecar, generator: Generator, fake: FakeVLLM
) -> None:
    """Never worse than vLLM alone: what it answered is what the client gets."""
    generator.stall_at = 5
    asked = asyncio.create_task(completion(sidecar, prompt=PROMPT, max_tokens=20))
    await asyncio.wait_for(generator.stalled.wait(), 10)
    refusal = b'{"error": {"message": "no", "type": "BadRequestError", "param": null, "code": 400}}'
    fake.scripts["POST /v1/completions"].insert(0, respond(400, refusal))
    generator.stalled.clear()
    assert (await control(sidecar, "/pause?mode=abort")).status == 200
    assert (await control(sidecar, "/resume")).status == 200
    resp = await asked
    assert resp.status == 200
    [choice] = (await resp.json())["choices"]
    assert (choice["finish_reason"], choice["text"]) == ("abort", text(generate(PROMPT, 5)))
    assert sidecar.metric(FAMILY, route="/v1/completions", outcome="failed") == 1


async def test_a_continued_stream_that_breaks_off_ends_with_the_error_event(
    sidecar: Sidecar, generator: Generator, fake: FakeVLLM
) -> None:
    generator.stall_at = 5
    body = {"prompt": PROMPT, "max_tokens": 20, "stream": True}
    asked = asyncio.create_task(completion(sidecar, **body))
    await asyncio.wait_for(generator.stalled.wait(), 10)
    fake.scripts["POST /v1/completions"].insert(0, sse_then_drop(2))
    generator.stalled.clear()
    assert (await control(sidecar, "/pause?mode=abort")).status == 200
    assert (await control(sidecar, "/resume")).status == 200
    events = await read_events(await asked)
    assert events[-1] == "data: [DONE]"
    error = json.loads(events[-2][6:])["error"]
    assert error["reason"] == "upstream_disconnected"
    assert failures(sidecar, "upstream_disconnected", "502") == 1


CHAT = [{"role": "user", "content": "hi"}]


def chat_prompt() -> list[int]:
    """The fake's template of CHAT: the letters' tokens, then 0."""
    return [ord(c) % 26 for c in "hi"] + [0]


async def test_a_cut_chat_answer_is_finished_from_its_token_ids(
    sidecar: Sidecar, generator: Generator
) -> None:
    """The continuation goes to /v1/completions from the rendered prompt's token ids and the
    output's: no template applied again, the message's content joined from its text."""
    generator.stall_at = 9
    body = {"model": "tiny-model", "messages": CHAT, "max_completion_tokens": 30}
    asked = asyncio.create_task(sidecar.client.post("/v1/chat/completions", json=body))
    await cut(sidecar, generator, "v2")
    answer = await (await asked).json()
    [choice] = answer["choices"]
    expected = generate(chat_prompt(), 30)
    assert choice["message"] == {"role": "assistant", "content": text(expected)}
    assert choice["finish_reason"] == "length"
    assert "prompt_token_ids" not in answer  # asked for by the sidecar, not the client
    assert "token_ids" not in choice
    first, second = generator.bodies
    assert first["return_token_ids"] is True
    assert second["prompt"] == chat_prompt() + expected[:9]
    assert (second["max_tokens"], "messages" in second, second["model"]) == (
        21,
        False,
        "tiny-model",
    )
    assert answer["usage"]["completion_tokens"] == 30


async def test_a_cut_chat_stream_goes_on_as_chat_deltas(
    sidecar: Sidecar, generator: Generator
) -> None:
    generator.stall_at = 7
    body = {"model": "tiny-model", "messages": CHAT, "max_tokens": 25, "stream": True}
    asked = asyncio.create_task(sidecar.client.post("/v1/chat/completions", json=body))
    await cut(sidecar, generator, None)
    events = await read_events(await asked)
    chunks = [json.loads(e[6:]) for e in events[:-1]]
    deltas = [c["delta"] for e in chunks for c in e["choices"]]
    # One role event, the first part's, as the frontend framed it (Rust: no content key).
    assert [d for d in deltas if "role" in d] == [deltas[0]]
    assert deltas[0]["role"] == "assistant"
    assert "".join(d.get("content") or "" for d in deltas) == text(generate(chat_prompt(), 25))
    assert all("prompt_token_ids" not in e for e in chunks)
    assert {e["id"] for e in chunks} == {chunks[0]["id"]}


@pytest.mark.parametrize(
    "extra",
    [
        {"tools": [{"type": "function", "function": {"name": "f", "parameters": {}}}]},
        {},  # no max_tokens: vLLM's own budget, which the sidecar cannot know
    ],
)
async def test_a_chat_that_cannot_be_continued_exactly_is_relayed_cut(
    sidecar: Sidecar, generator: Generator, extra: dict[str, Any]
) -> None:
    generator.stall_at = 5
    body = {"model": "tiny-model", "messages": CHAT, **extra}
    if extra:
        body["max_tokens"] = 20
    asked = asyncio.create_task(sidecar.client.post("/v1/chat/completions", json=body))
    await cut(sidecar, generator, None)
    [choice] = (await (await asked).json())["choices"]
    assert choice["finish_reason"] == "abort"
    assert len(generator.bodies) == 1
    assert "return_token_ids" not in generator.bodies[0]


async def test_an_answer_past_the_memory_budget_is_relayed_as_it_comes(
    upstream: TestServer, make_sidecar: MakeSidecar, generator: Generator
) -> None:
    """Joining reads answers whole: only within --buffer-budget-bytes."""
    sidecar = await make_sidecar(
        str(upstream.make_url("")), continue_aborted=True, buffer_budget_bytes=150
    )
    await eventually(lambda: sidecar.app[LIFECYCLE].version == "default")
    generator.stall_at = 5
    asked = asyncio.create_task(completion(sidecar, prompt=PROMPT, max_tokens=20))
    await cut(sidecar, generator, None)
    resp = await asked
    [choice] = (await resp.json())["choices"]
    assert choice["finish_reason"] == "abort"
    assert "X-Weight-Versions" not in resp.headers
    assert len(generator.bodies) == 1
