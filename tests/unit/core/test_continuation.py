"""Continuation's pure part: the plan read from a body, each part's body, and the joining."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from proxy.core.continuation import joining
from proxy.core.continuation import planning as cont
from proxy.core.continuation.joining import Joined, joined_choice
from proxy.core.continuation.planning import CHAT, COMPLETIONS, GENERATE, Plan, plan

Json = dict[str, Any]


def completions(**fields: Any) -> Plan:
    found = cont.plan(COMPLETIONS, {"model": "m", "prompt": [1, 2], **fields})
    assert found is not None
    return found


def generate(sampling: Json | None = None, **fields: Any) -> Plan:
    params = {"max_tokens": 8, **(sampling or {})}
    found = cont.plan(GENERATE, {"token_ids": [1, 2], "sampling_params": params, **fields})
    assert found is not None
    return found


# plan()


def test_a_completions_plan_reads_the_body() -> None:
    body = {
        "model": "m",
        "prompt": [5, 6, 7],
        "max_tokens": 10,
        "min_tokens": 3,
        "stop": ["</s>", "END"],
        "include_stop_str_in_output": True,
        "stream": True,
        "stream_options": {"include_usage": True},
        "return_token_ids": True,
        "return_weight_versions": True,
    }
    p = cont.plan(COMPLETIONS, body)
    assert p == Plan(
        kind=COMPLETIONS,
        payload=body,
        max_tokens=10,
        min_tokens=3,
        stops=("</s>", "END"),
        include_stop=True,
        stream=True,
        usage=True,
        token_ids_asked=True,
        versions_asked=True,
    )
    assert p.payload is body
    assert p.sampling() is body


def test_a_generate_plan_reads_its_sampling_params() -> None:
    params = {
        "max_tokens": 20,
        "min_tokens": 2,
        "stop": "\n\n",
        "include_stop_str_in_output": True,
    }
    body = {"token_ids": [1, 2, 3], "sampling_params": params, "stream": True}
    p = cont.plan(GENERATE, body)
    assert p is not None
    assert (p.kind, p.max_tokens, p.min_tokens, p.stops) == (GENERATE, 20, 2, ("\n\n",))
    assert (p.include_stop, p.stream) == (True, True)
    assert (p.usage, p.token_ids_asked, p.versions_asked) == (False, False, False)
    assert p.sampling() is params


def test_the_plan_defaults() -> None:
    p = completions()
    assert (p.max_tokens, p.min_tokens, p.stops) == (cont.COMPLETIONS_MAX_TOKENS, 0, ())
    assert cont.COMPLETIONS_MAX_TOKENS == 16
    flags = (p.include_stop, p.stream, p.usage, p.token_ids_asked, p.versions_asked)
    assert flags == (False, False, False, False, False)
    assert completions(max_tokens=None, min_tokens=None).max_tokens == 16
    assert completions(max_tokens=None, min_tokens=None).min_tokens == 0
    assert generate().min_tokens == 0


@pytest.mark.parametrize("max_tokens", [None, "absent"])
def test_generate_without_max_tokens_is_not_continued(max_tokens: object) -> None:
    params: Json = {"temperature": 0.0}
    if max_tokens != "absent":
        params["max_tokens"] = max_tokens
    assert cont.plan(GENERATE, {"token_ids": [1, 2], "sampling_params": params}) is None


@pytest.mark.parametrize(
    ("kind", "payload"),
    [
        (COMPLETIONS, None),
        (COMPLETIONS, [1, 2]),
        (COMPLETIONS, "prompt"),
        (GENERATE, [{"token_ids": [1]}]),
        (COMPLETIONS, {"prompt": [1], "echo": True}),
        (COMPLETIONS, {"prompt": "hi", "echo": 1}),
        (COMPLETIONS, {"model": "m", "max_tokens": 4}),  # no prompt
        (COMPLETIONS, {"prompt": [1], "max_tokens": "5"}),
        (COMPLETIONS, {"prompt": [1], "max_tokens": True}),
        (COMPLETIONS, {"prompt": [1], "max_tokens": 2.0}),
        (COMPLETIONS, {"prompt": [1], "max_tokens": 0}),
        (COMPLETIONS, {"prompt": [1], "max_tokens": -3}),
        (COMPLETIONS, {"prompt": [1], "min_tokens": "1"}),
        (COMPLETIONS, {"prompt": [1], "min_tokens": False}),
        (GENERATE, {"token_ids": [1], "sampling_params": None}),
        (GENERATE, {"token_ids": [1], "sampling_params": [("max_tokens", 4)]}),
        (GENERATE, {"sampling_params": {"max_tokens": 4}}),  # no token ids
        (GENERATE, {"token_ids": "1 2", "sampling_params": {"max_tokens": 4}}),
        (GENERATE, {"token_ids": [1, "2"], "sampling_params": {"max_tokens": 4}}),
        (GENERATE, {"token_ids": [1], "sampling_params": {"max_tokens": 0}}),
        (GENERATE, {"token_ids": [1], "sampling_params": {"max_tokens": "4"}}),
        (GENERATE, {"token_ids": [1], "sampling_params": {"max_tokens": 4, "min_tokens": 1.5}}),
    ],
)
def test_a_body_that_cannot_be_continued_has_no_plan(kind: str, payload: object) -> None:
    assert cont.plan(kind, payload) is None


def test_echo_false_is_continued() -> None:
    assert completions(echo=False).max_tokens == 16


def test_max_tokens_on_generate_lives_in_sampling_params() -> None:
    body = {"token_ids": [1], "max_tokens": 5, "sampling_params": {"temperature": 1.0}}
    assert cont.plan(GENERATE, body) is None


@pytest.mark.parametrize(
    ("stop", "stops"),
    [
        ("END", ("END",)),
        ("", ()),
        (None, ()),
        ([], ()),
        (["a", "", "bc"], ("a", "bc")),
        (["", ""], ()),
        (["x", 3, None, "y"], ("x", "y")),
    ],
)
def test_the_stop_strings(stop: object, stops: tuple[str, ...]) -> None:
    assert completions(stop=stop).stops == stops
    assert generate({"stop": stop}).stops == stops


def test_flags_are_read_strictly_where_vllm_is_strict() -> None:
    assert completions(stream=True).stream
    assert not completions(stream="true").stream
    assert not completions(stream=1).stream
    assert not completions(stream=False).stream
    assert completions(stream_options={"include_usage": True}).usage
    assert not completions(stream_options={"include_usage": 1}).usage
    assert not completions(stream_options={"include_usage": False}).usage
    assert not completions(stream_options=[("include_usage", True)]).usage
    assert generate(stream_options={"include_usage": True}).usage
    assert completions(return_token_ids=True).token_ids_asked
    assert not completions(return_token_ids=False).token_ids_asked
    assert completions(return_weight_versions=True).versions_asked
    assert generate(return_weight_versions=True).versions_asked
    assert completions(include_stop_str_in_output=True).include_stop
    # On generate, sampling parameters are read from sampling_params only.
    assert not generate(include_stop_str_in_output=True).include_stop
    assert generate({"include_stop_str_in_output": True}).include_stop
    assert generate(stop="X").stops == ()


# Plan's bodies


def test_the_first_completions_body_asks_for_token_ids() -> None:
    p = completions(max_tokens=4)
    first = p.first_body()
    assert first == {"model": "m", "prompt": [1, 2], "max_tokens": 4, "return_token_ids": True}
    assert "return_token_ids" not in p.payload  # the client's body stays as it was
    assert completions(return_token_ids=False).first_body()["return_token_ids"] is True


def test_the_first_generate_body_is_the_request() -> None:
    p = generate()
    assert p.first_body() is p.payload


def test_a_completions_part_body() -> None:
    body = {
        "model": "m",
        "prompt": [[1, 2], [3]],
        "n": 3,
        "max_tokens": 10,
        "min_tokens": 4,
        "temperature": 0.7,
        "seed": 11,
        "logprobs": 2,
        "stop": ["END"],
        "echo": False,
        "prompt_logprobs": 1,
        "best_of": 3,
        "stream": True,
        "stream_options": {"include_usage": True},
        "suffix": "!",
    }
    before = copy.deepcopy(body)
    p = cont.plan(COMPLETIONS, body)
    assert p is not None
    part = p.part_body([1, 2], [7, 8, 9], stream=False, most=100)
    assert part == {
        "model": "m",
        "prompt": [1, 2, 7, 8, 9],
        "n": 1,
        "max_tokens": 7,
        "min_tokens": 1,
        "temperature": 0.7,
        "seed": 11,
        "logprobs": 2,
        "stop": ["END"],
        "stream": False,
        "return_token_ids": True,
    }
    assert body == before
    assert p.part_body([1, 2], [7], stream=True, most=100)["stream"] is True


def test_a_part_body_is_capped_by_most() -> None:
    p = completions(max_tokens=10, min_tokens=8)
    part = p.part_body([1, 2], [3, 4, 5], stream=False, most=2)
    assert (part["max_tokens"], part["min_tokens"]) == (2, 2)
    part = p.part_body([1, 2], [3, 4, 5], stream=False, most=6)
    assert (part["max_tokens"], part["min_tokens"]) == (6, 5)
    part = p.part_body([1, 2], [3, 4, 5], stream=False, most=1)
    assert (part["max_tokens"], part["min_tokens"]) == (1, 1)


def test_min_tokens_already_made_is_zero() -> None:
    p = completions(max_tokens=10, min_tokens=2)
    part = p.part_body([1], [3, 4, 5, 6], stream=False, most=100)
    assert (part["max_tokens"], part["min_tokens"]) == (6, 0)
    part = completions(max_tokens=10).part_body([1], [], stream=False, most=100)
    assert (part["max_tokens"], part["min_tokens"], part["prompt"]) == (10, 0, [1])


def test_a_generate_part_body() -> None:
    params = {"max_tokens": 12, "min_tokens": 5, "temperature": 0.0, "n": 2, "stop": ["."]}
    body = {
        "model": "m",
        "token_ids": [1, 2],
        "sampling_params": params,
        "stream": False,
        "stream_options": {"include_usage": True},
        "request_id": "abc",
        "prompt_logprobs": 1,
        "cache_salt": "s",
    }
    before = copy.deepcopy(body)
    p = cont.plan(GENERATE, body)
    assert p is not None
    part = p.part_body([1, 2], [3, 4], stream=True, most=100)
    assert part == {
        "model": "m",
        "token_ids": [1, 2, 3, 4],
        "sampling_params": {
            "max_tokens": 10,
            "min_tokens": 3,
            "temperature": 0.0,
            "n": 1,
            "stop": ["."],
        },
        "stream": True,
        "cache_salt": "s",
    }
    assert body == before
    capped = p.part_body([1, 2], [3, 4], stream=False, most=2)["sampling_params"]
    assert (capped["max_tokens"], capped["min_tokens"], capped["n"]) == (2, 2, 1)


def test_each_kind_drops_only_its_own_keys() -> None:
    # generate keeps what only completions drops; neither keeps a request id.
    c = completions(suffix="x", best_of=2, request_id="r").part_body([1], [2], stream=False, most=9)
    assert ("suffix" in c, "best_of" in c, "request_id" in c) == (False, False, False)
    g = generate(best_of=2, echo=True).part_body([1], [2], stream=False, most=9)
    assert (g["best_of"], g["echo"]) == (2, True)


def test_the_prompt_of_a_choice() -> None:
    text = completions(prompt="hello")
    assert text.prompt_of({"index": 0, "prompt_token_ids": [4, 5]}) == [4, 5]
    assert text.prompt_of({"index": 0}) is None
    assert text.prompt_of({"index": 0, "prompt_token_ids": None}) is None
    assert text.prompt_of({"index": 0, "prompt_token_ids": ["a"]}) is None
    ids = completions(prompt=[9, 8])
    assert ids.prompt_of({"index": 0, "prompt_token_ids": [4, 5]}) == [4, 5]
    assert ids.prompt_of({"index": 0}) == [9, 8]
    assert ids.prompt_of({"index": 0, "prompt_token_ids": "x"}) == [9, 8]
    batch = completions(prompt=[[1], [2, 3]], n=2)
    assert batch.prompt_of({"index": 3}) == [2, 3]
    gen = generate()
    assert gen.prompt_of({"index": 0, "prompt_token_ids": [7]}) == [1, 2]
    choice = {"prompt_token_ids": [4, 5]}
    got = text.prompt_of(choice)
    assert got == [4, 5]
    assert got is not choice["prompt_token_ids"]


@pytest.mark.parametrize(
    ("fields", "count"),
    [
        ({"prompt": "hi"}, 1),
        ({"prompt": "hi", "n": 3}, 3),
        ({"prompt": [1, 2, 3], "n": 2}, 2),
        ({"prompt": ["a", "b", "c"]}, 3),
        ({"prompt": ["a", "b"], "n": 2}, 4),
        ({"prompt": [[1], [2], [3]], "n": 2}, 6),
        ({"prompt": "hi", "n": None}, 1),
        ({"prompt": ["a", "b"], "n": "2"}, 2),
        ({"prompt": ["a", "b"], "n": 0}, 2),
    ],
)
def test_how_many_choices(fields: Json, count: int) -> None:
    assert completions(**fields).choices() == count


def test_how_many_choices_on_generate() -> None:
    assert generate().choices() == 1
    assert generate({"n": 4}).choices() == 4
    assert generate({"n": 4}, n=7).choices() == 4  # n lives in sampling_params


def test_the_token_prompt_of_a_single_token_prompt() -> None:
    p = completions(prompt=[5, 6], n=3)
    for index in (0, 2, 99, None):
        assert p.token_prompt(index) == [5, 6]
    got = p.token_prompt(0)
    assert got == [5, 6]
    assert got is not p.payload["prompt"]


def test_the_token_prompt_of_a_batch_with_n() -> None:
    p = completions(prompt=[[1, 2], [3, 4], [5]], n=2)
    assert [p.token_prompt(i) for i in range(6)] == [
        [1, 2],
        [1, 2],
        [3, 4],
        [3, 4],
        [5],
        [5],
    ]
    assert p.token_prompt(6) is None
    assert p.token_prompt(-1) is None
    assert p.token_prompt(None) is None
    assert p.token_prompt("0") is None
    one = completions(prompt=[[1, 2], [3, 4]])
    assert [one.token_prompt(i) for i in range(3)] == [[1, 2], [3, 4], None]


def test_a_text_prompt_has_no_token_prompt() -> None:
    assert completions(prompt="hi").token_prompt(0) is None
    assert completions(prompt=["a", "b"]).token_prompt(1) is None
    mixed = completions(prompt=["a", [7, 8]])
    assert (mixed.token_prompt(0), mixed.token_prompt(1)) == (None, [7, 8])


def test_the_token_prompt_on_generate_is_its_token_ids() -> None:
    assert generate().token_prompt(5) == [1, 2]


# Joined


def completions_part(text: str, tokens: list[int], offsets: list[int], finish: str) -> Json:
    return {
        "index": 0,
        "text": text,
        "token_ids": tokens,
        "logprobs": {
            "tokens": [f"t{t}" for t in tokens],
            "token_logprobs": [-t / 10 for t in tokens],
            "top_logprobs": [{f"t{t}": -t / 10} for t in tokens],
            "text_offset": offsets,
        },
        "finish_reason": finish,
        "stop_reason": None if finish != "stop" else "END",
    }


def test_two_completions_parts_join() -> None:
    j = Joined(index=2, prompt=[1])
    j.add(completions_part("Hel", [10, 11], [0, 2], cont.ABORT), "v1")
    assert (j.finish_reason, j.cuts, j.text, j.tokens) == (cont.ABORT, 1, "Hel", [10, 11])
    j.add(completions_part("lo!", [12, 13], [0, 2], "stop"), "v1")
    assert j.tokens == [10, 11, 12, 13]
    assert j.text == "Hello!"
    assert j.logprobs == {
        "tokens": ["t10", "t11", "t12", "t13"],
        "token_logprobs": [-1.0, -1.1, -1.2, -1.3],
        "top_logprobs": [{"t10": -1.0}, {"t11": -1.1}, {"t12": -1.2}, {"t13": -1.3}],
        "text_offset": [0, 2, 3, 5],
    }
    assert (j.finish_reason, j.stop_reason, j.cuts) == ("stop", "END", 1)
    assert j.spans == [{"version": "v1", "start": 0, "end": 4}]


def test_three_parts_shift_text_offsets_past_all_the_text_before() -> None:
    j = Joined(index=0, prompt=[1])
    j.add(completions_part("ab", [1], [0], cont.ABORT), "v1")
    j.add(completions_part("cde", [2, 3], [0, 1], cont.ABORT), "v2")
    j.add(completions_part("f", [4], [0], "length"), "v2")
    assert j.logprobs is not None
    assert j.logprobs["text_offset"] == [0, 2, 3, 5]
    assert (j.cuts, j.finish_reason, j.stop_reason) == (2, "length", None)
    assert j.spans == [
        {"version": "v1", "start": 0, "end": 1},
        {"version": "v2", "start": 1, "end": 4},
    ]


def test_generate_parts_join_their_content_logprobs() -> None:
    j = Joined(index=0, prompt=[1])
    first = {"token_ids": [5, 6], "logprobs": {"content": [{"a": 1}, {"b": 2}]}}
    j.add({**first, "finish_reason": cont.ABORT}, "v1")
    j.add({"token_ids": [7], "logprobs": {"content": [{"c": 3}]}, "finish_reason": "length"}, "v2")
    assert j.logprobs == {"content": [{"a": 1}, {"b": 2}, {"c": 3}]}
    assert j.tokens == [5, 6, 7]
    assert j.text == ""
    assert first["logprobs"] == {"content": [{"a": 1}, {"b": 2}]}  # the part is not changed


def test_logprobs_keep_the_first_non_list_fields_and_none_logprobs_are_skipped() -> None:
    j = Joined(index=0, prompt=[1])
    j.add_tokens([1], "a", {"content": [1], "note": "first"})
    j.add_tokens([2], "b", None)
    j.add_tokens([3], "c", {"content": [3], "note": "second"})
    assert j.logprobs == {"content": [1, 3], "note": "first"}
    assert (j.tokens, j.text) == ([1, 2, 3], "abc")


def test_a_choice_without_tokens_or_text() -> None:
    j = Joined(index=0, prompt=[1])
    j.add({"text": None, "token_ids": None, "finish_reason": cont.ABORT}, "v1")
    assert (j.tokens, j.text, j.logprobs, j.spans, j.cuts) == ([], "", None, [], 1)


def test_vllms_spans_are_shifted_past_the_earlier_parts() -> None:
    j = Joined(index=0, prompt=[1])
    j.add({"token_ids": [1, 2, 3], "finish_reason": cont.ABORT}, "v1")
    spans = [{"version": "v2", "start": 0, "end": 1}, {"version": "v3", "start": 1, "end": 2}]
    j.add({"token_ids": [4, 5], "weight_versions": spans, "finish_reason": "stop"}, "v9")
    assert j.spans == [
        {"version": "v1", "start": 0, "end": 3},
        {"version": "v2", "start": 3, "end": 4},
        {"version": "v3", "start": 4, "end": 5},
    ]
    assert spans[0] == {"version": "v2", "start": 0, "end": 1}  # vLLM's are not changed


def test_adjacent_spans_of_one_version_merge_others_do_not() -> None:
    j = Joined(index=0, prompt=[1])
    j.add({"token_ids": [1, 2], "weight_versions": [{"version": "v1", "start": 0, "end": 2}]}, "x")
    j.add({"token_ids": [3], "weight_versions": [{"version": "v1", "start": 0, "end": 1}]}, "x")
    assert j.spans == [{"version": "v1", "start": 0, "end": 3}]
    j.add({"token_ids": [4]}, "v2")
    j.add({"token_ids": [5]}, "v1")
    assert j.spans == [
        {"version": "v1", "start": 0, "end": 3},
        {"version": "v2", "start": 3, "end": 4},
        {"version": "v1", "start": 4, "end": 5},
    ]


def test_spans_of_one_version_with_a_gap_do_not_merge() -> None:
    j = Joined(index=0, prompt=[1])
    j.add_tokens([1, 2, 3, 4], "", None)
    gapped = [{"version": "v1", "start": 0, "end": 1}, {"version": "v1", "start": 2, "end": 4}]
    j.add_spans(gapped, 4, None)
    assert j.spans == gapped


def test_one_span_of_the_version_when_vllm_sends_none() -> None:
    j = Joined(index=0, prompt=[1])
    j.add({"token_ids": [1, 2], "weight_versions": []}, "v4")
    assert j.spans == [{"version": "v4", "start": 0, "end": 2}]
    j.add({"token_ids": [3], "weight_versions": None}, None)  # no version known: no span
    assert j.spans == [{"version": "v4", "start": 0, "end": 2}]
    j.add({"token_ids": []}, "v5")  # no tokens: no span
    assert j.spans == [{"version": "v4", "start": 0, "end": 2}]


def test_malformed_vllm_spans_are_skipped() -> None:
    j = Joined(index=0, prompt=[1])
    j.add_tokens([1, 2, 3], "", None)
    bad = ["v1", {"version": "v1", "start": "0", "end": 1}, {"version": "v2", "start": 1, "end": 3}]
    j.add_spans(bad, 3, "v9")
    assert j.spans == [{"version": "v2", "start": 1, "end": 3}]


def stream_part(j: Joined, tokens: list[int], version: str) -> None:
    """A stream's events, a token at a time, each counted under the version sent with."""
    for t in tokens:
        j.add_tokens([t], "", None)
        j.add_spans(None, 1, version)


def test_a_stream_parts_spans_replace_those_counted_per_event() -> None:
    j = Joined(index=0, prompt=[1])
    stream_part(j, [1, 2, 3], "v1")
    j.finish({"finish_reason": cont.ABORT})
    start = len(j.tokens)
    stream_part(j, [4, 5], "v2")
    assert j.spans == [
        {"version": "v1", "start": 0, "end": 3},
        {"version": "v2", "start": 3, "end": 5},
    ]
    spans = [{"version": "v2", "start": 0, "end": 1}, {"version": "v3", "start": 1, "end": 2}]
    j.part_spans(start, spans)
    assert j.spans == [
        {"version": "v1", "start": 0, "end": 3},
        {"version": "v2", "start": 3, "end": 4},
        {"version": "v3", "start": 4, "end": 5},
    ]


def test_a_span_straddling_the_parts_start_is_cut_there() -> None:
    j = Joined(index=0, prompt=[1])
    stream_part(j, [1, 2, 3], "v1")
    start = len(j.tokens)
    stream_part(j, [4, 5], "v1")  # counted under v1: merged into one span over both parts
    assert j.spans == [{"version": "v1", "start": 0, "end": 5}]
    j.part_spans(start, [{"version": "v2", "start": 0, "end": 2}])
    assert j.spans == [
        {"version": "v1", "start": 0, "end": 3},
        {"version": "v2", "start": 3, "end": 5},
    ]


def test_a_stream_parts_spans_of_the_same_version_merge_back() -> None:
    j = Joined(index=0, prompt=[1])
    stream_part(j, [1, 2, 3], "v1")
    start = len(j.tokens)
    stream_part(j, [4, 5], "v7")
    j.part_spans(start, [{"version": "v1", "start": 0, "end": 2}])
    assert j.spans == [{"version": "v1", "start": 0, "end": 5}]


@pytest.mark.parametrize("spans", [None, [], "v2", {"version": "v2", "start": 0, "end": 2}])
def test_part_spans_without_a_list_change_nothing(spans: object) -> None:
    j = Joined(index=0, prompt=[1])
    stream_part(j, [1, 2, 3], "v1")
    stream_part(j, [4, 5], "v2")
    j.part_spans(3, spans)
    assert j.spans == [
        {"version": "v1", "start": 0, "end": 3},
        {"version": "v2", "start": 3, "end": 5},
    ]


def test_part_spans_from_the_first_token_replace_all() -> None:
    j = Joined(index=0, prompt=[1])
    stream_part(j, [1, 2], "v1")
    j.part_spans(0, [{"version": "v0", "start": 0, "end": 2}])
    assert j.spans == [{"version": "v0", "start": 0, "end": 2}]


def test_finish_takes_the_reasons_and_counts_cuts() -> None:
    j = Joined(index=0, prompt=[1])
    assert (j.finish_reason, j.stop_reason, j.cuts) == (None, None, 0)
    j.finish({"finish_reason": cont.ABORT, "stop_reason": None})
    j.finish({"finish_reason": cont.ABORT})
    assert j.cuts == 2
    j.finish({"finish_reason": "stop", "stop_reason": 7})
    assert (j.finish_reason, j.stop_reason, j.cuts) == ("stop", 7, 2)
    j.finish({})
    assert (j.finish_reason, j.stop_reason, j.cuts) == (None, None, 2)


@pytest.mark.parametrize(("include", "text"), [(False, "abc"), (True, "abcSTOP")])
def test_stop_at_ends_the_text_as_vllm_would(include: bool, text: str) -> None:
    j = Joined(index=0, prompt=[1], tokens=[1, 2, 3], text="abcSTOPdef")
    j.finish({"finish_reason": "length", "stop_reason": None})
    j.stop_at(3, "STOP", include)
    assert (j.text, j.finish_reason, j.stop_reason) == (text, "stop", "STOP")
    assert j.tokens == [1, 2, 3]  # as vLLM's, the tokens that made the stop are kept


def test_aborted() -> None:
    assert cont.aborted({"finish_reason": "abort"})
    assert not cont.aborted({"finish_reason": "stop"})
    assert not cont.aborted({})
    assert not cont.aborted("abort")
    assert not cont.aborted(None)


# Stop strings across a cut


def test_a_stop_straddling_the_cut_is_found() -> None:
    assert joining.straddling_stop("abcSTOPdef", 5, ("STOP",)) == (3, "STOP")
    assert joining.straddling_stop("abcSTOPdef", 4, ("STOP",)) == (3, "STOP")
    assert joining.straddling_stop("abcSTOPdef", 6, ("STOP",)) == (3, "STOP")
    assert joining.straddling_stop("aaa", 2, ("aa",)) == (1, "aa")


@pytest.mark.parametrize(
    ("text", "since"),
    [
        ("STOPxx", 5),  # wholly before
        ("aSTOP", 5),  # ends exactly at the cut: vLLM saw it
        ("abcdeSTOP", 5),  # begins at the cut: vLLM sees it
        ("abcdefSTOP", 5),  # wholly after
        ("abcdefg", 3),  # not there at all
        ("abcST", 5),  # not yet whole
    ],
)
def test_a_stop_that_does_not_straddle_is_not_returned(text: str, since: int) -> None:
    assert joining.straddling_stop(text, since, ("STOP",)) is None


def test_the_earliest_straddling_stop() -> None:
    assert joining.straddling_stop("xxABCDEyy", 4, ("BCD", "ABC", "CDE")) == (2, "ABC")
    assert joining.straddling_stop("xxABCDEyy", 4, ("CDE", "BCD")) == (3, "BCD")
    assert joining.straddling_stop("xxABCDEyy", 4, ("xx", "Eyy")) is None
    assert joining.straddling_stop("xxABCDEyy", 4, ()) is None
    # A stop wholly before the cut does not hide a later one that straddles it.
    assert joining.straddling_stop("ABxxAByy", 5, ("AB",)) == (4, "AB")
    assert joining.straddling_stop("ABxxAByy", 5, ("AB", "xAB")) == (3, "xAB")


def test_the_text_ends_in_a_stop_prefix() -> None:
    assert joining.ends_in_stop_prefix("abcS", ("STOP",))
    assert joining.ends_in_stop_prefix("abcSTO", ("STOP",))
    assert joining.ends_in_stop_prefix("S", ("STOP",))
    assert joining.ends_in_stop_prefix("xyz\n", ("END", "\n\n"))
    assert not joining.ends_in_stop_prefix("abcSTOP", ("STOP",))  # all of it: vLLM's to see
    assert not joining.ends_in_stop_prefix("abcT", ("STOP",))
    assert not joining.ends_in_stop_prefix("abc", ("STOP",))
    assert not joining.ends_in_stop_prefix("", ("STOP",))
    assert not joining.ends_in_stop_prefix("abcS", ())
    assert not joining.ends_in_stop_prefix("abcX", ("X",))  # one character cannot straddle


# The answer


def test_usage_counts_every_joined_token_once() -> None:
    first = {"prompt_tokens": 5, "completion_tokens": 2, "total_tokens": 7, "extra": 1}
    a = Joined(index=0, prompt=[1], tokens=[1, 2, 3])
    b = Joined(index=1, prompt=[1], tokens=[4, 5, 6, 7])
    usage = joining.usage_of(first, [a, b])
    assert usage == {"prompt_tokens": 5, "completion_tokens": 7, "total_tokens": 12, "extra": 1}
    assert first["completion_tokens"] == 2
    assert joining.usage_of({"prompt_tokens": 3}, []) == {
        "prompt_tokens": 3,
        "completion_tokens": 0,
        "total_tokens": 3,
    }
    assert joining.usage_of({"completion_tokens": 1}, [a]) == {"completion_tokens": 3}
    assert joining.usage_of(None, [a]) is None
    assert joining.usage_of([1], [a]) is None


def cut_base() -> Json:
    return {
        "index": 1,
        "text": "Hel",
        "token_ids": [10, 11],
        "prompt_token_ids": [1, 2],
        "logprobs": None,
        "finish_reason": cont.ABORT,
        "stop_reason": None,
    }


def joined_two() -> Joined:
    j = Joined(index=1, prompt=[1, 2], tokens=[10, 11, 12], text="Hello")
    j.spans = [{"version": "v1", "start": 0, "end": 3}]
    j.finish({"finish_reason": "stop", "stop_reason": "END"})
    return j


def test_the_joined_completions_choice_without_token_ids() -> None:
    base = cut_base()
    choice = joining.joined_choice(completions(), base, joined_two())
    assert choice == {
        "index": 1,
        "text": "Hello",
        "logprobs": None,
        "finish_reason": "stop",
        "stop_reason": "END",
    }
    assert base == cut_base()


def test_the_joined_completions_choice_with_token_ids_and_versions() -> None:
    j = joined_two()
    j.logprobs = {"tokens": ["a"]}
    p = completions(return_token_ids=True, return_weight_versions=True)
    choice = joining.joined_choice(p, cut_base(), j)
    assert choice == {
        "index": 1,
        "text": "Hello",
        "token_ids": [10, 11, 12],
        "prompt_token_ids": [1, 2],
        "logprobs": {"tokens": ["a"]},
        "finish_reason": "stop",
        "stop_reason": "END",
        "weight_versions": [{"version": "v1", "start": 0, "end": 3}],
    }
    versions_only = joining.joined_choice(completions(return_weight_versions=True), cut_base(), j)
    assert ("token_ids" in versions_only, "prompt_token_ids" in versions_only) == (False, False)
    assert versions_only["weight_versions"] == [{"version": "v1", "start": 0, "end": 3}]


def test_the_joined_completions_choice_has_text_even_where_the_base_had_none() -> None:
    choice = joining.joined_choice(completions(), {"index": 0}, joined_two())
    assert choice["text"] == "Hello"


def test_the_joined_generate_choice() -> None:
    base = {"index": 0, "token_ids": [10, 11], "finish_reason": cont.ABORT, "logprobs": None}
    choice = joining.joined_choice(generate(), base, joined_two())
    assert choice == {
        "index": 0,
        "token_ids": [10, 11, 12],
        "logprobs": None,
        "finish_reason": "stop",
        "stop_reason": "END",
        "weight_versions": [{"version": "v1", "start": 0, "end": 3}],
    }
    with_text = joining.joined_choice(generate(), {**base, "text": "He"}, joined_two())
    assert with_text["text"] == "Hello"


def test_stripped_drops_only_the_token_ids_the_sidecar_asked_for() -> None:
    choice = cut_base()
    out = joining.stripped(completions(), choice)
    assert out is choice
    assert ("token_ids" in out, "prompt_token_ids" in out) == (False, False)
    assert out["text"] == "Hel"
    assert joining.stripped(completions(return_token_ids=True), cut_base()) == cut_base()
    assert joining.stripped(generate(), cut_base()) == cut_base()
    assert joining.stripped(completions(), {"index": 0}) == {"index": 0}


# -- chat ----------------------------------------------------------------------------------


def chat(**extra: Any) -> Plan:
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], **extra}
    found = plan(CHAT, body)
    assert found is not None
    return found


@pytest.mark.parametrize(
    "body",
    [
        {"messages": [{"role": "user", "content": "hi"}]},  # no limit: vLLM's own budget
        {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 5, "echo": True},
        {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 5, "tools": [{}]},
        {"messages": [{"role": "user", "content": [{"type": "image_url"}]}], "max_tokens": 5},
        {"messages": [], "max_tokens": 5},
        {
            "messages": [{"role": "user", "content": "hi"}],
            "max_tokens": 5,
            "kv_transfer_params": {"do_remote_decode": True},
        },
        {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 5, "logprobs": True},
        {
            "messages": [{"role": "user", "content": "hi"}],
            "max_tokens": 5,
            "response_format": {"type": "json_object"},
        },
    ],
)
def test_a_chat_that_cannot_be_continued_exactly_has_no_plan(body: dict[str, Any]) -> None:
    assert plan(CHAT, body) is None


def test_a_chat_part_goes_to_completions_from_the_token_ids() -> None:
    p = chat(
        max_completion_tokens=10,
        min_tokens=4,
        n=2,
        temperature=0.5,
        stop=["x"],
        stream_options={"include_usage": True},
        user="u",
    )
    assert p.first_body()["return_token_ids"] is True
    body = p.part_body([1, 2], [3, 4, 5], stream=True, most=99)
    assert body == {
        "model": "m",
        "prompt": [1, 2, 3, 4, 5],
        "max_tokens": 7,
        "min_tokens": 1,
        "n": 1,
        "temperature": 0.5,
        "stop": ["x"],
        "return_token_ids": True,
        "stream": True,
    }
    assert cont.PART_PATH[CHAT] == "/v1/completions"
    assert chat(max_tokens=10).part_body([1], [2], stream=False, most=99)["max_tokens"] == 9
    assert p.text_of({"index": 0, "text": "from a part"}) == "from a part"


def test_a_chat_choice_joins_content_and_reasoning() -> None:
    p = chat(max_tokens=10)
    first = {
        "index": 0,
        "message": {"role": "assistant", "content": "ab", "reasoning_content": "x"},
    }
    second = {
        "index": 0,
        "message": {"role": "assistant", "content": "cd", "reasoning_content": "y"},
    }
    assert p.text_of(first) == "ab"
    assert p.text_of({"delta": {"content": "z"}}) == "z"
    assert p.prompt_of(first, {"prompt_token_ids": [1, 2]}) == [1, 2]
    j = Joined(0, [1, 2])
    for part in (first, second):
        j.add(
            {**part, "token_ids": [5], "finish_reason": "length"},
            "v",
            p.text_of(part),
            p.reasoning_of(part),
        )
    out = joined_choice(p, first, j)
    assert out["message"] == {"role": "assistant", "content": "abcd", "reasoning_content": "xy"}
    assert "token_ids" not in out
    assert p.with_text({"index": 0}, "q", stream=True) == {"index": 0, "delta": {"content": "q"}}
