"""The spans of a JSON object's top-level `model` values, found key by key in slices."""

from __future__ import annotations

import json
from collections.abc import Generator

import pytest

from proxy.core.jsonskip import HOPS_PER_SLICE, Malformed
from proxy.core.modelkeys import TooComplex, leading_model, model_spans, sole_model
from tests.support import exhaust

Spans = list[tuple[int, int]] | None


def run(gen: Generator[None, None, Spans]) -> Spans:
    """The generator's answer, its slices run back to back."""
    return exhaust(gen)[0]


run_counting = exhaust  # (the answer, how many times it yielded on the way)


def values(body: bytes, *, first_only: bool = False) -> list[bytes] | None:
    """The bytes of each top-level `model` value, in order."""
    spans = run(model_spans(body, first_only=first_only))
    return None if spans is None else [body[start:end] for start, end in spans]


def malformed_at(body: bytes, *, first_only: bool = False) -> int:
    with pytest.raises(Malformed) as raised:
        run(model_spans(body, first_only=first_only))
    return raised.value.pos


def test_the_span_is_the_values_bytes() -> None:
    body = b'{"model": "Qwen/Qwen2.5-0.5B", "max_tokens": 8}'
    assert run(model_spans(body, first_only=True)) == [(10, 29)]
    assert body[10:29] == b'"Qwen/Qwen2.5-0.5B"'


@pytest.mark.parametrize(
    ("body", "found"),
    [
        (b'{"model":"a"}', [b'"a"']),
        (b'{"prompt": [1, 2], "model": "a"}', [b'"a"']),
        (b'\n {\t"model" \r\n:\n "a b" }\n', [b'"a b"']),
        (b'{"p": {"model": "inner"}, "model": "outer"}', [b'"outer"']),
        (b'{"p": ["model", {"model": 1}], "model": "x"}', [b'"x"']),
        (b'{"s": "\\"model\\": \\"no\\"", "model": "yes"}', [b'"yes"']),
        (b'{"model": "caf\\u00e9"}', [b'"caf\\u00e9"']),
    ],
)
def test_only_top_level_model_keys_are_found(body: bytes, found: list[bytes]) -> None:
    assert values(body) == found


@pytest.mark.parametrize(
    "value",
    [b"1", b"-2.5e3", b"null", b"true", b"false", b'["a", ["b"]]', b'{"a": {"b": "}"}}'],
)
def test_a_non_string_value_is_spanned_whole(value: bytes) -> None:
    body = b'{"model": ' + value + b', "n": 1}'
    assert values(body) == [value]


@pytest.mark.parametrize(
    "key",
    [
        b'"mod\\u0065l"',
        b'"\\u006dodel"',
        b'"\\u006D\\u006F\\u0064\\u0065\\u006C"',  # every letter escaped: the longest spelling
        b'"m\\u006fd\\u0065l"',
    ],
)
def test_a_key_spelt_with_escapes_is_a_model_key(key: bytes) -> None:
    assert json.loads(key) == "model"
    body = b'{"a": 1, ' + key + b': "x"}'
    assert values(body) == [b'"x"']


@pytest.mark.parametrize(
    "key",
    [b'"Model"', b'"MODEL"', b'"mode"', b'"models"', b'" model"', b'"mod\\u0065L"', b'"m\\/odel"'],
)
def test_other_keys_are_not_model_keys(key: bytes) -> None:
    assert values(b"{" + key + b': "x"}') == []


@pytest.mark.parametrize("body", [b"{}", b"{ }", b" {\n} ", b'{"prompt": "model"}'])
def test_an_object_without_a_model_gives_no_spans(body: bytes) -> None:
    assert values(body) == []


@pytest.mark.parametrize("body", [b"", b"   ", b"[1, 2]", b'"model"', b"1", b"null", b"x{}"])
def test_a_body_that_is_not_an_object_gives_none(body: bytes) -> None:
    assert run(model_spans(body, first_only=False)) is None
    assert run(model_spans(body, first_only=True)) is None


def test_duplicate_keys_are_all_found_unless_first_only() -> None:
    body = b'{"model": "a", "prompt": [1], "mod\\u0065l": "b", "model": "c"}'
    assert values(body) == [b'"a"', b'"b"', b'"c"']
    assert values(body, first_only=True) == [b'"a"']


def test_first_only_stops_before_what_follows_the_model() -> None:
    # With the model found, the rest is not read: vLLM judges its syntax.
    assert values(b'{"model": "a", "p": [}', first_only=True) == [b'"a"']
    assert values(b'{"model": "a"', first_only=True) == [b'"a"']


def test_without_a_later_model_key_the_rest_is_not_read() -> None:
    # No `"model"` (or an escaped spelling) after the value: nothing to find, so no walk.
    assert values(b'{"model": "a", "p": [}, "q"') == [b'"a"']
    assert values(b'{"model": "a", "p": [1, 2, 3') == [b'"a"']


def test_a_later_model_string_keeps_the_walk_going() -> None:
    # `"model"` as a value means the walk goes on, and then meets the broken bytes.
    assert values(b'{"model": "a", "p": "model"}') == [b'"a"']
    body = b'{"model": "a", "p": "model" ]'
    assert malformed_at(body) == body.index(b"]")
    # An escaped spelling counts as a possible key too.
    body = b'{"model": "a", "p": "mod\\u0065l" ]'
    assert malformed_at(body) == body.index(b"]")


@pytest.mark.parametrize(
    ("body", "at"),
    [
        (b"{", b""),
        (b'{"model" "a"}', b'"a"'),
        (b'{model: "a"}', b"model"),
        (b"{'model': 'a'}", b"'model'"),
        (b'{"a": 1 "model": "b"}', b'"model"'),
        (b'{"a": }', b"}"),
        (b'{"a": tru, "model": "b"}', b"tru"),
        (b'{"a": [1, 2}, "model": "b"}', b"}"),
        (b'{"a": 1,}', b"}"),
        (b'{"a": 1', b""),
    ],
)
def test_malformed_json_before_the_model_says_where(body: bytes, at: bytes) -> None:
    pos = malformed_at(body)
    assert pos == (body.index(at) if at else len(body))
    assert malformed_at(body, first_only=True) == pos


def test_an_unterminated_key_is_malformed_at_the_end() -> None:
    body = b'{"a": 1, "mod'
    assert malformed_at(body) == len(body)


def many_keys(n: int) -> bytes:
    return b", ".join(b'"k%d": %d' % (i, i) for i in range(n))


def test_many_keys_are_walked_in_slices() -> None:
    n = 3 * HOPS_PER_SLICE
    body = b"{" + many_keys(n) + b', "model": "m"}'
    spans, yields = run_counting(model_spans(body, first_only=True))
    assert spans is not None
    assert [body[s:e] for s, e in spans] == [b'"m"']
    assert yields == (n + 1) // (HOPS_PER_SLICE // 4)  # a yield every 256 keys


def test_a_small_body_takes_no_yield() -> None:
    assert run_counting(model_spans(b'{"a": [1], "model": "m"}', first_only=False)) == (
        [(20, 23)],
        0,
    )


def test_too_complex_after_a_model_answers_with_that_model() -> None:
    # A second `model` key far behind many others: told to stop, the scan keeps the first.
    body = b'{"model": "a", ' + many_keys(HOPS_PER_SLICE) + b', "model": "b"}'
    scan = model_spans(body, first_only=False)
    next(scan)  # the first slice ends in the keys after the first model
    with pytest.raises(StopIteration) as done:
        scan.throw(TooComplex())
    assert done.value.value == [(10, 13)]
    # Left to run, it finds both.
    assert values(body) == [b'"a"', b'"b"']


def test_too_complex_before_any_model_is_raised() -> None:
    body = b"{" + many_keys(HOPS_PER_SLICE) + b', "model": "b"}'
    scan = model_spans(body, first_only=False)
    next(scan)
    with pytest.raises(TooComplex):
        scan.throw(TooComplex())


def test_a_second_model_after_many_strings_is_found_by_the_plain_search() -> None:
    # Past 4096 quote-to-quote hops the look-ahead switches to a regex search.
    strings = b", ".join(b'"s%d"' % i for i in range(5000))
    body = b'{"model": "a", "p": [' + strings + b'], "model": "b"}'
    assert values(body) == [b'"a"', b'"b"']
    body = b'{"model": "a", "p": [' + strings + b'], "q": "end"'  # no second key, left unread
    assert values(body) == [b'"a"']


def test_a_second_model_past_a_long_stretch_without_quotes() -> None:
    # More than the look-ahead's 4 MiB find window of token ids with no quote in them.
    ids = b",".join([b"1234567"] * (5 << 17))  # about 5 MiB
    assert len(ids) > 4 << 20
    body = b'{"model": "a", "prompt": [' + ids + b'], "model": "b"}'
    spans, yields = run_counting(model_spans(body, first_only=False))
    assert spans is not None
    assert [body[s:e] for s, e in spans] == [b'"a"', b'"b"']
    assert yields >= 1
    # No second key: the look-ahead yields after its first find window, then answers.
    body = b'{"model": "a", "prompt": [' + ids + b"]}"
    spans, yields = run_counting(model_spans(body, first_only=False))
    assert spans == [(10, 13)]
    assert yields == 1


@pytest.mark.parametrize(
    "body",
    [
        json.dumps({"model": "Qwen/Qwen2.5-0.5B", "prompt": [1, 2], "max_tokens": 16}).encode(),
        b'{"model":"Qwen/Qwen2.5-0.5B","prompt":[1,2]}',
        b'{ "model" :\n\t"Qwen/Qwen2.5-0.5B" , "prompt": "x"}',
    ],
)
def test_a_leading_model_is_found_without_the_walk_spaced_or_compact(body: bytes) -> None:
    # `json.dumps`' default spacing (`{"model": "`) is what most Python clients send.
    span = leading_model(body)
    assert span is not None
    assert [body[slice(*span)]] == values(body) == [b'"Qwen/Qwen2.5-0.5B"']


@pytest.mark.parametrize(
    "body",
    [
        b'{"model": "a", "x": {"model": "b"}}',  # a later `"model"`: the walk tells which
        b'{"model": "a\\u0062"}',  # an escape in the name
        b'{"prompt": "x", "model": "a"}',  # not first
    ],
)
def test_the_walk_reads_what_the_leading_shape_cannot_tell(body: bytes) -> None:
    assert leading_model(body) is None


@pytest.mark.parametrize(
    "body",
    [
        # SkyRL 0.4's generate: `sampling_params` first, then the model, then the token ids.
        json.dumps(
            {"sampling_params": {"max_tokens": 16, "stop": None}, "model": "Q", "token_ids": [1]}
        ).encode(),
        b'{"prompt":"x","mod\\u0065l" : "Q"}',  # the key spelt with an escape
        b'{"a":[{"b":1}],"model":"Q","c":"d"}',
    ],
)
def test_the_sole_model_key_is_found_by_one_parse(body: bytes) -> None:
    spans = sole_model(body)
    assert spans == run(model_spans(body, first_only=False))
    assert spans is not None
    assert [body[slice(*s)] for s in spans] == [b'"Q"']


def test_a_body_without_a_top_level_model_has_none() -> None:
    assert sole_model(b'{"prompt": "x", "n": {"modal": 1}}') == []


@pytest.mark.parametrize(
    "body",
    [
        b'{"model":"a","model":"b"}',  # a duplicate: the walk counts them
        b'{"x":{"model":"b"},"model":"a"}',  # a nested key as well
        b'{"prompt":"model","model":"a"}',  # a value spelt like the key
        b'{"x":1,"model":null}',  # not a string
        b'{"x":1,"model":"a\\"b"}',  # an escape in the name
        b'{"x":1,"model":"a"',  # not JSON: the walk says where
        b"[1]",
        b'{"x":"' + b"1" * (16 << 10) + b'","model":"a"}',  # long: the walk is cheaper
    ],
)
def test_what_one_parse_cannot_tell_is_left_to_the_walk(body: bytes) -> None:
    assert sole_model(body) is None
