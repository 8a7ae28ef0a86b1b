"""Finding and replacing the top-level `model` without touching other bytes."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from proxy.core.body import (
    MAX_MODEL_CHARS,
    MAX_SLICES,
    ModelField,
    TooComplex,
    find_model,
    replace_model,
    run_to_end,
    scan_model,
    scan_model_in_head,
    step,
)
from proxy.core.errors import InvalidJSON, InvalidModel, InvalidRequest
from proxy.core.jsonskip import WINDOW
from tests import strategies


def find_model_in_head(head: bytes) -> ModelField | None:
    return run_to_end(scan_model_in_head(head))


def test_model_first_with_token_ids() -> None:
    body = b'{"model": "Qwen/Qwen2.5-0.5B", "prompt": [[1, 2, 3], [4]], "max_tokens": 8}'
    field = find_model(body)
    assert field is not None
    assert field.value == "Qwen/Qwen2.5-0.5B"
    out = replace_model(body, field, "Qwen2.5-0.5B")
    assert out == b'{"model": "Qwen2.5-0.5B", "prompt": [[1, 2, 3], [4]], "max_tokens": 8}'


def test_model_after_nested_values_and_odd_whitespace() -> None:
    body = (
        b'\n {\t"messages" : [{"role": "user", "content": "say \\"model\\": {[x]}"}],'
        b' "n":1.5e3 , "stop":null,"model"\r\n:\n"a/b" }\n'
    )
    field = find_model(body)
    assert field is not None
    assert field.value == "a/b"
    out = replace_model(body, field, "b")
    assert out == body.replace(b'"a/b"', b'"b"')


def test_escaped_key_and_value() -> None:
    body = b'{"mod\\u0065l": "caf\\u00e9/x", "p": 1}'
    field = find_model(body)
    assert field is not None
    assert field.value == "café/x"
    assert json.loads(replace_model(body, field, "x")) == {"model": "x", "p": 1}


@pytest.mark.parametrize(
    "body",
    [b'{"prompt": "x"}', b"{}", b"[1, 2]", b'"model"', b"  ", b'{"nested": {"model": "a"}}'],
)
def test_no_top_level_model(body: bytes) -> None:
    assert find_model(body) is None


@pytest.mark.parametrize("value", [b"1", b"null", b'["a"]', b'{"a": 1}', b"true"])
def test_non_string_model_is_reported_without_value(value: bytes) -> None:
    body = b'{"model": ' + value + b', "x": 1}'
    field = find_model(body)
    assert field is not None
    assert field.value is None
    assert body[field.start : field.end] == value


@pytest.mark.parametrize(
    "body",
    [b'{"model" "a"}', b'{"prompt": [1, 2}, "model": "a"}', b"{'model': 'a'}", b'{"model": tru}'],
)
def test_malformed_json_up_to_the_model_names_the_error(body: bytes) -> None:
    with pytest.raises(InvalidJSON, match="not valid JSON: ") as raised:
        find_model(body)
    assert "(char 0)" not in raised.value.message  # orjson was given the body, and says where


@pytest.mark.parametrize("body", [b'{"model":', b'{"model": ', b'{"a": 1, "model":\n'])
def test_a_body_that_ends_before_the_value_is_invalid_json(body: bytes) -> None:
    with pytest.raises(InvalidJSON, match="not valid JSON"):
        find_model(body)


@pytest.mark.parametrize("body", [b"{}\n", b"{ } ", b" {}"])
def test_an_empty_object_with_whitespace_has_no_model(body: bytes) -> None:
    assert find_model(body) is None


@pytest.mark.parametrize("body", [b'{"model": "a",', b'{"model": "a"]', b'{"model": "a", "p": [}'])
def test_bytes_after_the_model_are_left_for_vllm_to_judge(body: bytes) -> None:
    # Megabytes of token ids may follow the model; they are forwarded unread and vLLM
    # answers a syntax error there with its own 400, which reaches the client enveloped.
    field = find_model(body)
    assert field is not None
    assert field.value == "a"


def test_duplicate_model_keys_are_refused() -> None:
    with pytest.raises(InvalidRequest, match="2 top-level `model` keys") as raised:
        find_model(b'{"model": "a", "prompt": [1], "model": "b"}')
    assert raised.value.param == "model"


# Past 4096 strings after the model, the look-ahead for a second key switches to a plain search.
MANY_STRINGS = b", ".join(b'"s%d"' % i for i in range(5000))


def test_a_second_model_after_many_strings_is_still_found() -> None:
    with pytest.raises(InvalidRequest, match="2 top-level `model` keys"):
        find_model(b'{"model": "a", "p": [' + MANY_STRINGS + b'], "model": "b"}')


def test_many_strings_after_the_only_model() -> None:
    field = find_model(b'{"model": "a", "p": [' + MANY_STRINGS + b"]}")
    assert field is not None
    assert field.value == "a"


def test_model_string_inside_values_is_not_a_duplicate() -> None:
    body = b'{"model": "a", "messages": [{"role": "model", "model": "c"}], "x": "model"}'
    field = find_model(body)
    assert field is not None
    assert field.value == "a"


def test_non_utf8_model_value() -> None:
    with pytest.raises(InvalidJSON, match="model") as raised:
        find_model(b'{"model": "\xff\xfe", "p": 1}')
    assert raised.value.param == "model"


# -- the head of a body streamed in: answer only when the head alone can tell ---------------
def test_head_with_the_whole_model_value() -> None:
    head = b'{"stream": true, "model": "org/m", "prompt": [1, 2, 3'
    field = find_model_in_head(head)
    assert field is not None
    assert (field.value, head[field.start : field.end]) == ("org/m", b'"org/m"')


@pytest.mark.parametrize(
    "head", [b'{"model": "a", "model": "b"}', b'{"model": "a", "x": 1, "model": "b']
)
def test_head_answers_with_the_first_model_whatever_follows(head: bytes) -> None:
    field = find_model_in_head(head)
    assert field is not None
    assert field.value == "a"


@pytest.mark.parametrize(
    "head",
    [
        b'{"prompt": [1, 2',  # no model key yet
        b'{"model": "org/',  # the value is cut
        b'{"model"',  # the key without its value
        b"",
    ],
)
def test_head_that_cannot_tell(head: bytes) -> None:
    assert find_model_in_head(head) is None


@pytest.mark.parametrize("head", [b'{"prompt": "x"}', b"[1, 2]"])
def test_head_that_is_the_whole_body_without_a_model(head: bytes) -> None:
    assert find_model_in_head(head) is None


def test_head_with_a_non_string_model_and_a_bad_string() -> None:
    field = find_model_in_head(b'{"model": 7, "p"')
    assert field is not None
    assert field.value is None
    with pytest.raises(InvalidJSON) as raised:
        find_model_in_head(b'{"model": "\xff", "p"')
    assert raised.value.param == "model"


json_values = strategies.json_values(size=4, leaves=20)


@given(
    before=st.dictionaries(st.text().filter(lambda k: k != "model"), json_values, max_size=4),
    after=st.dictionaries(st.text().filter(lambda k: k != "model"), json_values, max_size=4),
    model=st.text(),
    new=st.text(),
    indent=st.sampled_from([None, 1]),
    ascii_only=st.booleans(),
)
def test_rewrite_changes_only_the_model(
    before: dict[str, object],
    after: dict[str, object],
    model: str,
    new: str,
    indent: int | None,
    ascii_only: bool,
) -> None:
    doc = {**before, "model": model, **{k: v for k, v in after.items() if k not in before}}
    body = json.dumps(doc, indent=indent, ensure_ascii=ascii_only).encode()
    field = find_model(body)
    assert field is not None
    assert field.value == model
    out = replace_model(body, field, new)
    assert json.loads(out) == {**doc, "model": new}
    assert out[: field.start] == body[: field.start]
    assert out[len(out) - (len(body) - field.end) :] == body[field.end :]


# -- hostile bodies: bounded work, nothing stepped around ------------------------------------


def test_second_model_key_spelt_with_escapes_is_refused() -> None:
    # `"mod\u0065l"` is `model` to every JSON reader: which one vLLM honours is undefined.
    for key in (b'"mod\\u0065l"', b'"\\u006D\\u006F\\u0064\\u0065\\u006C"'):
        with pytest.raises(InvalidRequest, match="2 top-level `model` keys"):
            find_model(b'{"model": "a", "prompt": [1, 2], ' + key + b': "b"}')


@pytest.mark.parametrize("shift", range(-4, 5))
def test_window_edges_cut_nothing(shift: int) -> None:
    """Strings, escapes, whitespace and a second key straddling WINDOW are read whole."""
    # The string's body starts at byte 11, so its window ends at WINDOW + 11: shift 0 puts
    # the backslash of `\"` on the window's last byte.
    escape_at_edge = b'{"prompt":"' + b"a" * (WINDOW - 1 + shift) + b'\\"b\\\\","model":"m"}'
    assert (field := find_model(escape_at_edge)) is not None
    assert field.value == "m"
    spaces = b'{"prompt":1' + b" " * (WINDOW + shift) + b',"model":"m"}'
    assert (field := find_model(spaces)) is not None
    assert field.value == "m"
    # The search for a second key starts at byte 12 (after `"m"`); these keys cross WINDOW + 12.
    ids = b'{"model":"m","prompt":[' + b"1," * (WINDOW // 2 - 9 + shift) + b'1],"model":"n"}'
    with pytest.raises(InvalidRequest):
        find_model(ids)
    escaped_key = b'{"model":"m","p":"' + b"a" * (WINDOW - 13 + shift) + b'","mod\\u0065l":"n"}'
    with pytest.raises(InvalidRequest):
        find_model(escaped_key)


def test_model_name_longer_than_any_served_one_is_refused() -> None:
    assert (field := find_model(b'{"model": "' + b"a" * MAX_MODEL_CHARS + b'"}')) is not None
    assert field.value == "a" * MAX_MODEL_CHARS
    for value in (b"a" * (MAX_MODEL_CHARS + 1), b"\\u0061" * (MAX_MODEL_CHARS + 1), b"a" * 10**7):
        with pytest.raises(InvalidModel, match=r"(characters|bytes) long"):
            find_model(b'{"model": "' + value + b'"}')


def test_model_length_is_counted_in_characters_however_they_are_escaped() -> None:
    # 600 emoji are 600 characters: as UTF-8 (2,400 bytes) and as json.dumps escapes them
    # (surrogate pairs, 7,200 bytes) alike; the cap is on characters, not bytes.
    emoji = "\U0001f600" * 600
    for raw in (json.dumps({"model": emoji}), json.dumps({"model": emoji}, ensure_ascii=False)):
        assert (field := find_model(raw.encode())) is not None
        assert field.value == emoji
    longest = "\U0001f600" * MAX_MODEL_CHARS
    assert (field := find_model(json.dumps({"model": longest}).encode())) is not None
    assert field.value == longest
    with pytest.raises(InvalidModel, match=r"(characters|bytes) long"):
        find_model(json.dumps({"model": longest + "a"}).encode())


def test_a_scan_past_its_slices_stops_and_keeps_a_model_it_found() -> None:
    hostile = b'{"p":' + b"[" * 5000 + b"]" * 5000 + b',"model":"m"}'
    scan = scan_model(hostile)
    assert step(scan, 0) == (False, None)
    with pytest.raises(TooComplex):
        step(scan, MAX_SLICES)
    # Found first, then the search for a second one runs out: vLLM's to judge, as streamed.
    scan = scan_model(b'{"model":"m","p":' + b"[" * 5000 + b"]" * 5000 + b',"model":"n"}')
    assert step(scan, 0) == (False, None)
    done, field = step(scan, MAX_SLICES)
    assert done
    assert field is not None
    assert field.value == "m"


@pytest.mark.parametrize("key", [b'"model"', b'"mod\\u0065l"'])
def test_second_key_after_thousands_of_strings_is_found(key: bytes) -> None:
    # Past a few thousand quotes the search for a second key changes strategy; it still finds it.
    strings = b",".join(b'"s%d"' % i for i in range(10_000))
    with pytest.raises(InvalidRequest):
        find_model(b'{"model":"m","p":[' + strings + b"]," + key + b':"n"}')
