"""Where a JSON object's top-level `model` keys are: the spans of their values, found in slices.

The walk goes key to key, skipping each value with `jsonskip`, and yields between slices of
work so that its driver (`body.step`) can bound the time a hostile body takes.
"""

from __future__ import annotations

import re
from collections.abc import Generator

import orjson

from .jsonskip import HOPS_PER_SLICE, Malformed, search, skip_string, skip_value, skip_ws

# `"model"`, also spelt with escapes (`"mod\u0065l"`): only `\uXXXX` can spell a letter.
_MODEL_LIKE = re.compile(rb'"(?:[model]|\\u00[0-9a-fA-F]{2}){5}"')
_MODEL_LIKE_MAX = 32
_FIND_WINDOW = 4 << 20  # memchr runs at several GB/s: a window is well under a millisecond
_MODEL_KEY = b'"model"'
_SPACE = (b" ", b"\t", b"\n", b"\r", b"")


class TooComplex(Exception):
    """The scan used up its slices before it could answer."""


def _is_model_key(raw_key: bytes) -> bool:
    if raw_key == _MODEL_KEY:
        return True
    return len(raw_key) <= _MODEL_LIKE_MAX and b"\\" in raw_key and orjson.loads(raw_key) == "model"


# Compact (`{"model":"`) or with JSON's whitespace around the colon: Python's `json.dumps`
# writes `{"model": "` by default (the openai SDK, aiohttp's `json=`, most scripts).
_LEADING = re.compile(rb'\{[ \t\n\r]*"model"[ \t\n\r]*:[ \t\n\r]*"')
_AT_ONCE = 64 << 10  # a rest this short is searched in one regex call (C speed, microseconds)


def leading_model(body: bytes) -> tuple[int, int] | None:
    """The span of the `model` value of a body in the shape SkyRL and the openai SDK send,
    `{"model":"<name>"` first (or `{"model": "<name>"`), with no escape in the name and no
    other `model` key possible after it; None for any other body, which the walk in
    `model_spans` reads instead. The same answer as that walk, without a Python step per key:
    most requests are this shape."""
    if (lead := _LEADING.match(body)) is None:
        return None
    start = lead.end() - 1
    end = body.find(b'"', start + 1)
    if end < 0 or body.find(b"\\", start, end) >= 0 or len(body) - end > _AT_ONCE:
        return None
    if _MODEL_LIKE.search(body, end + 1) is not None:
        return None  # a `"model"` further on: the walk tells a key from a value
    return start, end + 1


_PARSE_AT_ONCE = 16 << 10  # orjson reads this in microseconds; the walk's Python steps cost more
_WS = frozenset(b" \t\n\r")


def sole_model(body: bytes) -> list[tuple[int, int]] | None:
    """`model_spans`' answer for a short body whose only `"model"`-like string is its top-level
    key with a string value, or that has no top-level `model` (`[]`), told by one orjson parse
    and one search where the walk takes a Python step per key (SkyRL 0.4's generate puts
    `sampling_params` first); None when it cannot tell, and the walk reads it."""
    if len(body) > _PARSE_AT_ONCE:
        return None
    try:
        parsed = orjson.loads(body)
    except orjson.JSONDecodeError:
        return None  # the walk says where it breaks
    if type(parsed) is not dict:
        return None
    if "model" not in parsed:
        return []  # any spelling of the key is decoded to `model`
    if type(parsed["model"]) is not str:
        return None
    found = _MODEL_LIKE.search(body)
    # Two such strings: which is the key is the walk's to tell (a duplicate, a nested key).
    if found is None or _MODEL_LIKE.search(body, found.end()) is not None:
        return None
    pos = _skip_ws(body, found.end())
    if body[pos : pos + 1] != b":":
        return None
    start = _skip_ws(body, pos + 1)
    end = body.find(b'"', start + 1)
    if body[start : start + 1] != b'"' or body.find(b"\\", start, end) >= 0:
        return None
    return [(start, end + 1)]


def _skip_ws(body: bytes, pos: int) -> int:
    while pos < len(body) and body[pos] in _WS:
        pos += 1
    return pos


def model_spans(
    body: bytes, *, first_only: bool
) -> Generator[None, None, list[tuple[int, int]] | None]:
    """Spans of every top-level `model` value; None when the body is not a JSON object.

    A TooComplex thrown in once one `model` is found ends the search for a second one: it is
    then vLLM's to judge, as it is for a streamed body.
    """
    found: list[tuple[int, int]] = []
    try:
        return (yield from _scan_keys(body, found, first_only=first_only))
    except TooComplex:
        if found:
            return found
        raise


def _ws(body: bytes, pos: int) -> Generator[None, None, int]:
    # Compact JSON has no whitespace to skip: no generator for it (a tenth of a small scan).
    if body[pos : pos + 1] not in _SPACE:
        return pos
    return (yield from skip_ws(body, pos))


def _scan_keys(
    body: bytes, found: list[tuple[int, int]], *, first_only: bool
) -> Generator[None, None, list[tuple[int, int]] | None]:
    pos = yield from _ws(body, 0)
    if pos >= len(body) or body[pos] != 0x7B:  # '{'
        return None
    pos = yield from _ws(body, pos + 1)
    if body[pos : pos + 1] == b"}":
        return found
    keys = 0
    while True:
        keys += 1
        if keys % (HOPS_PER_SLICE // 4) == 0:  # a key costs about four hops over a bracket
            yield
        if body[pos : pos + 1] != b'"':
            raise Malformed(pos)
        key_end = yield from skip_string(body, pos)
        raw_key = body[pos:key_end]
        pos = yield from _ws(body, key_end)
        if body[pos : pos + 1] != b":":
            raise Malformed(pos)
        start = yield from _ws(body, pos + 1)
        end = yield from skip_value(body, start)
        if _is_model_key(raw_key):
            found.append((start, end))
            if first_only:
                return found
            # Stop early when no other `model` key can follow: the rest may be megabytes of ids.
            if not (yield from _model_key_follows(body, end)):
                return found
        pos = yield from _ws(body, end)
        sep = body[pos : pos + 1]
        if sep == b"}":
            return found
        if sep != b",":
            raise Malformed(pos)
        pos = yield from _ws(body, pos + 1)


def _model_key_follows(body: bytes, pos: int) -> Generator[None, None, bool]:
    """Whether `"model"` (or a spelling with escapes) occurs at or after `pos`.

    Quote to quote with memchr: a regex search for the key walks an 8 MB token-id list at
    2 ms, `bytes.find` of the 7-byte key at 8 ms (`,` and `l` share a slot of its skip
    filter); the quotes in such a list are few: 0.1 ms. A body of many short strings is
    left to the regex search after a few thousand hops.
    """
    find, hops = body.find, 0
    while True:
        q = find(b'"', pos, pos + _FIND_WINDOW)
        if q < 0:
            if pos + _FIND_WINDOW >= len(body):
                return False
            pos += _FIND_WINDOW
            yield
            continue
        if _MODEL_LIKE.match(body, q):
            return True
        pos, hops = q + 1, hops + 1
        if hops == 4096:
            return (yield from search(_MODEL_LIKE, body, pos, _MODEL_LIKE_MAX)) >= 0
