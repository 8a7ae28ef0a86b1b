"""Skipping JSON values a window at a time: where each skip ends, and that it yields."""

from __future__ import annotations

import json
import re
from collections.abc import Generator

import pytest

from proxy.core.jsonskip import (
    HOPS_PER_SLICE,
    WINDOW,
    Malformed,
    search,
    skip_container,
    skip_string,
    skip_value,
    skip_ws,
)
from tests.support import exhaust


def run(gen: Generator[None, None, int]) -> int:
    """The generator's answer, its slices run back to back."""
    return exhaust(gen)[0]


run_counting = exhaust  # (the answer, how many times it yielded on the way)


def malformed_at(gen: Generator[None, None, int]) -> int:
    with pytest.raises(Malformed) as raised:
        run(gen)
    assert raised.value.args == (raised.value.pos,)
    return raised.value.pos


# -- whitespace


@pytest.mark.parametrize(
    ("body", "pos", "end"),
    [
        (b"", 0, 0),
        (b"x", 0, 0),
        (b"  \t\r\n x", 0, 6),
        (b"ab   ", 2, 5),
        (b"a \x0b b", 1, 2),  # vertical tab is not JSON whitespace
        (b"a \xa0b", 1, 2),  # nor is a non-breaking space
    ],
)
def test_skip_ws_ends_at_the_first_non_space(body: bytes, pos: int, end: int) -> None:
    assert run(skip_ws(body, pos)) == end


def test_skip_ws_over_more_than_a_window_yields_per_window() -> None:
    body = b" " * (2 * WINDOW + 5) + b"x"
    end, yields = run_counting(skip_ws(body, 0))
    assert end == 2 * WINDOW + 5
    assert yields == 2


def test_whitespace_ending_exactly_at_a_window_edge() -> None:
    body = b" " * WINDOW + b"x"
    assert run(skip_ws(body, 0)) == WINDOW
    body = b" " * (WINDOW - 1) + b"x" + b" " * 10
    assert run_counting(skip_ws(body, 0)) == (WINDOW - 1, 0)


def test_skip_ws_stops_at_a_backslash_just_before_the_window_edge() -> None:
    # The backslash rule at a window edge is for strings; whitespace still ends there.
    body = b" " * (WINDOW - 1) + b"\\" + b" " * 4
    assert run(skip_ws(body, 0)) == WINDOW - 1


# -- strings


@pytest.mark.parametrize(
    "string",
    [
        b'""',
        b'"abc"',
        b'"say \\"hi\\""',
        b'"back\\\\"',
        b'"\\\\\\""',
        b'"caf\\u00e9 \\n\\t\\/"',
        b'"[{]}"',
        '"naïve ✓"'.encode(),
        b'"raw\nnewline"',  # a control byte: left for the JSON reader to refuse
    ],
)
def test_skip_string_ends_after_the_closing_quote(string: bytes) -> None:
    body = string + b', "next"'
    assert run(skip_string(body, 0)) == len(string)


def test_skip_string_from_inside_a_body() -> None:
    body = b'{"key": "va\\"lue", "x": 1}'
    start = body.index(b'"va')
    assert run(skip_string(body, start)) == body.index(b", ")


@pytest.mark.parametrize(
    ("body", "pos"),
    [
        (b'"', 1),
        (b'"abc', 4),
        (b'"abc\\"', 6),  # the last quote is escaped
        (b'"abc\\', 4),  # ends on a lone backslash: the position is the backslash
        (b'x "ab', 5),
    ],
)
def test_an_unterminated_string_is_malformed_where_it_ends(body: bytes, pos: int) -> None:
    start = body.index(b'"')
    assert malformed_at(skip_string(body, start)) == pos


@pytest.mark.parametrize("shift", [-3, -2, -1, 0, 1, 2])
@pytest.mark.parametrize("escape", [b'\\"', b"\\\\", b"\\n"])
def test_an_escape_around_the_window_edge(shift: int, escape: bytes) -> None:
    # The string's body is searched from byte 1, so its first window's last byte is WINDOW:
    # an escape whose backslash falls there is cut from its escaped byte by the edge.
    lead = WINDOW - 1 + shift
    string = b'"' + b"a" * lead + escape + b'b"'
    assert string.index(b"\\") == WINDOW + shift
    body = string + b' "not the end"'
    end = run(skip_string(body, 0))
    assert end == len(string)
    assert json.loads(body[:end]) == "a" * lead + json.loads(b'"' + escape + b'"') + "b"


def test_an_escaped_quote_cut_at_the_edge_is_not_the_end() -> None:
    # `\` is the first window's last byte and `"` the next window's first: were the edge to
    # forget the backslash, the string would seem to end at that quote.
    string = b'"' + b"a" * (WINDOW - 1) + b'\\"tail"'
    assert string[WINDOW : WINDOW + 2] == b'\\"'
    end, yields = run_counting(skip_string(string, 0))
    assert end == len(string)
    assert yields >= 1


def test_an_escaped_backslash_cut_at_the_edge_does_not_escape_the_quote() -> None:
    # `\\` across the edge, then `"`: the quote closes the string.
    string = b'"' + b"a" * (WINDOW - 1) + b'\\\\"'
    body = string + b'junk"'
    assert run(skip_string(body, 0)) == len(string)


def test_a_string_of_escapes_longer_than_a_window() -> None:
    string = b'"' + b'\\"' * WINDOW + b'"'
    end, yields = run_counting(skip_string(string + b"]", 0))
    assert end == len(string)
    assert yields >= 1


def test_an_unterminated_string_longer_than_a_window_is_malformed_at_the_end() -> None:
    body = b'"' + b"a" * (2 * WINDOW)
    assert malformed_at(skip_string(body, 0)) == len(body)


def test_a_short_string_takes_no_yield() -> None:
    assert run_counting(skip_string(b'"short" ', 0)) == (7, 0)


# -- containers


@pytest.mark.parametrize(
    "value",
    [
        b"[]",
        b"{}",
        b"[1, 2, 3]",
        b'{"a": [1, {"b": null}], "c": {}}',
        b"[[[[[]]]]]",
        b'["]", "[", "}", "{"]',
        b'{"k": "a \\"]\\" b"}',
        b'["\\\\", "]"]',
        b'[{"x": "}"}, ["]"]]',
    ],
)
def test_skip_container_ends_after_its_closer(value: bytes) -> None:
    body = value + b', "after": [1]}'
    assert run(skip_value(body, 0)) == len(value)
    assert run(skip_container(body, 0)) == len(value)
    json.loads(value)  # the cases are real JSON


def test_skip_container_from_inside_a_body() -> None:
    body = b'{"a": 1, "b": [2, {"c": "]"}], "d": 3}'
    start = body.index(b"[")
    assert run(skip_container(body, start)) == body.index(b', "d"')


def test_a_container_is_skipped_by_its_brackets_alone() -> None:
    # Only the structure is followed; what lies between the brackets is vLLM's to judge.
    assert run(skip_container(b"[1 2 x] ", 0)) == 7


@pytest.mark.parametrize(
    ("body", "pos"),
    [
        (b"[}", 1),
        (b"{]", 1),
        (b"[1, {2]", 6),
        (b'{"a": [1}', 8),
    ],
)
def test_a_mismatched_closer_is_malformed_where_it_is(body: bytes, pos: int) -> None:
    assert malformed_at(skip_container(body, 0)) == pos


@pytest.mark.parametrize("body", [b"[", b"[1, 2", b'{"a": [1, 2]', b"[[]", b'["]"'])
def test_an_unclosed_container_is_malformed_at_the_end(body: bytes) -> None:
    assert malformed_at(skip_container(body, 0)) == len(body)


def test_an_unterminated_string_in_a_container_is_malformed_at_the_end() -> None:
    assert malformed_at(skip_container(b'["abc', 0)) == 5


def test_deep_nesting_yields_every_slice_of_hops() -> None:
    depth = 3 * HOPS_PER_SLICE
    body = b"[" * depth + b"]" * depth
    end, yields = run_counting(skip_container(body, 0))
    assert end == len(body)
    # One hop per bracket after the first, a yield every HOPS_PER_SLICE hops.
    assert yields == (2 * depth - 1) // HOPS_PER_SLICE


def test_many_strings_in_a_container_yield_too() -> None:
    body = b"[" + b",".join(b'"s"' for _ in range(2 * HOPS_PER_SLICE)) + b"]"
    end, yields = run_counting(skip_container(body, 0))
    assert end == len(body)
    assert yields >= 1


def test_a_container_with_no_bracket_for_more_than_a_window() -> None:
    # No structural byte in the first window: the windowed search takes over.
    inner = b"1," * WINDOW + b"2"
    body = b"[" + inner + b"] tail"
    end, yields = run_counting(skip_container(body, 0))
    assert end == len(body) - len(b" tail")
    assert yields >= 1


def test_a_long_string_with_an_edge_escape_inside_a_container() -> None:
    string = b'"' + b"a" * (WINDOW - 1) + b'\\"]"'  # the `]` is inside the string
    body = b"[" + string + b", 1] ]"
    assert body[1 + WINDOW : 1 + WINDOW + 2] == b'\\"'
    assert run(skip_container(body, 0)) == len(body) - 2


# -- scalars and skip_value


@pytest.mark.parametrize(
    ("body", "end"),
    [
        (b"0,", 1),
        (b"-0}", 2),
        (b"123 ", 3),
        (b"-1.5e+3]", 7),
        (b"2E-8", 4),
        (b"1.25e10,", 7),
        (b"true,", 4),
        (b"false}", 5),
        (b"null", 4),
        (b"01", 1),  # a leading zero ends the number; the `1` is the caller's to refuse
        (b"1.", 1),  # a bare point is no fraction
        (b"1e", 1),  # nor is a bare exponent
        (b'"s" ', 3),
        (b"[1] ", 3),
        (b'{"a": 1} ', 8),
    ],
)
def test_skip_value_ends_after_the_value(body: bytes, end: int) -> None:
    assert run(skip_value(body, 0)) == end


@pytest.mark.parametrize(
    ("body", "pos"),
    [
        (b"", 0),
        (b"tru", 0),
        (b"nul", 0),
        (b"-", 0),
        (b"+1", 0),
        (b".5", 0),
        (b"True", 0),
        (b"}", 0),
        (b"'a'", 0),
        (b"NaN", 0),
        (b"[1]", 3),  # past the end of the body
    ],
)
def test_skip_value_refuses_what_no_json_value_starts_with(body: bytes, pos: int) -> None:
    assert malformed_at(skip_value(body, pos)) == pos


def test_a_scalar_is_read_no_further_than_4096_bytes() -> None:
    digits = b"1" * 5000
    assert run(skip_value(digits, 0)) == 4096


def test_skip_value_at_an_offset() -> None:
    body = b'{"n": -12.5, "s": "x"}'
    assert run(skip_value(body, body.index(b"-"))) == body.index(b", ")


# -- search


QUOTE_OR_BRACKET = re.compile(rb'["\[]')
KEY = re.compile(rb'"model"')


def test_search_finds_the_first_match_at_or_after_pos() -> None:
    body = b'ab"cd[ef"'
    assert run(search(QUOTE_OR_BRACKET, body, 0)) == 2
    assert run(search(QUOTE_OR_BRACKET, body, 2)) == 2
    assert run(search(QUOTE_OR_BRACKET, body, 3)) == 5
    assert run(search(QUOTE_OR_BRACKET, body, 9)) == -1
    assert run(search(QUOTE_OR_BRACKET, b"", 0)) == -1
    assert run(search(QUOTE_OR_BRACKET, b"abc", 0)) == -1


def test_search_yields_once_per_window_searched_in_vain() -> None:
    body = b"x" * (3 * WINDOW) + b'"'
    found, yields = run_counting(search(QUOTE_OR_BRACKET, body, 0))
    assert found == 3 * WINDOW
    assert yields == 3
    missing, yields = run_counting(search(QUOTE_OR_BRACKET, b"x" * (2 * WINDOW + 1), 0))
    assert missing == -1
    assert yields == 3


def test_search_finds_a_match_just_past_the_first_window() -> None:
    body = b"x" * WINDOW + b'"'
    assert run(search(QUOTE_OR_BRACKET, body, 0)) == WINDOW


@pytest.mark.parametrize("cut", [1, 3, 6])
def test_a_match_across_a_window_edge_needs_the_overlap(cut: int) -> None:
    # `"model"` starts `cut` bytes before the first window's edge.
    at = WINDOW - cut
    body = b"x" * at + b'"model"' + b"x" * 10
    assert run(search(KEY, body, 0, overlap=len(b'"model"') - 1)) == at
    # Without the overlap, the cut match is in neither window.
    assert run(search(KEY, body, 0)) == -1


def test_with_overlap_a_later_match_is_still_found() -> None:
    body = b"x" * (WINDOW - 3) + b'"model"' + b"x" * WINDOW + b'"model"'
    assert run(search(KEY, body, 0, overlap=6)) == WINDOW - 3
    second = body.rindex(b'"model"')
    assert run(search(KEY, body, WINDOW - 2, overlap=6)) == second
