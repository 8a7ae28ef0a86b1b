"""Skipping over JSON values in a byte string, each call to C bounded to one window.

The skips are generators: they yield after each slice of work (about a thousand hops over
brackets and strings, or one window searched in C, a millisecond or two either way), so that a
hostile body (millions of brackets, keys or escapes) can be walked a slice at a time.
"""

from __future__ import annotations

import re
from collections.abc import Generator

# Possessive quantifiers: the plain `(?:\\.[^"\\]*)*` kept a backtracking frame per escape and
# took 0.7 s over a 4 MB string of escapes, in one C call; this form takes 25 ms.
_WS = re.compile(rb"[ \t\n\r]*+")
_STRING_BODY = re.compile(rb'[^"\\]*+(?:\\.[^"\\]*+)*+', re.DOTALL)
_SCALAR = re.compile(rb"-?(?:0|[1-9][0-9]*)(?:\.[0-9]+)?(?:[eE][+-]?[0-9]+)?|true|false|null")
_STRUCTURAL = re.compile(rb'["\[\]{}]')
_CLOSERS = {ord("["): ord("]"), ord("{"): ord("}")}
# One C call looks at no more than this: about a millisecond of regex work.
WINDOW = 256 << 10
HOPS_PER_SLICE = 1024


class Malformed(Exception):
    def __init__(self, pos: int) -> None:
        super().__init__(pos)
        self.pos = pos


def _run(pattern: re.Pattern[bytes], body: bytes, pos: int) -> Generator[None, None, int]:
    """Where a run of `pattern` from `pos` ends, one window at a time. The patterns are
    possessive, so a window edge only cuts them mid-token at a string's `\\x` escape."""
    while True:
        edge = min(len(body), pos + WINDOW)
        end = pattern.match(body, pos, edge).end()  # type: ignore[union-attr]  # `*+` matches
        if edge == len(body) or end < edge - 1 or (end == edge - 1 and body[end] != 0x5C):
            return end
        pos = end
        yield


def skip_ws(body: bytes, pos: int) -> Generator[None, None, int]:
    return (yield from _run(_WS, body, pos))


def _string_end(body: bytes, pos: int) -> int:
    """Where the string opened at `pos` ends, when one window tells; else -1."""
    end = _STRING_BODY.match(body, pos + 1, pos + 1 + WINDOW).end()  # type: ignore[union-attr]
    return end + 1 if body[end : end + 1] == b'"' else -1


def skip_string(body: bytes, pos: int) -> Generator[None, None, int]:
    end = _string_end(body, pos)
    if end >= 0:
        return end
    end = yield from _run(_STRING_BODY, body, pos + 1)
    if body[end : end + 1] != b'"':
        raise Malformed(end)
    return end + 1


def search(
    pattern: re.Pattern[bytes], body: bytes, pos: int, overlap: int = 0
) -> Generator[None, None, int]:
    """The start of the next match of `pattern` at or after `pos`, or -1; window by window."""
    while pos < len(body):
        m = pattern.search(body, pos, min(len(body), pos + WINDOW + overlap))
        if m is not None:
            return m.start()
        pos += WINDOW
        yield
    return -1


def skip_container(body: bytes, pos: int) -> Generator[None, None, int]:
    stack = [_CLOSERS[body[pos]]]
    pos += 1
    hops = 0
    while stack:
        hops += 1
        if hops % HOPS_PER_SLICE == 0:
            yield
        # The windowed generators only when one window does not tell: they cost a third more.
        m = _STRUCTURAL.search(body, pos, pos + WINDOW)
        at = m.start() if m is not None else (yield from search(_STRUCTURAL, body, pos))
        if at < 0:
            raise Malformed(len(body))
        c = body[at]
        if c == 0x22:  # '"'
            pos = _string_end(body, at)
            if pos < 0:
                pos = yield from skip_string(body, at)
        elif c in _CLOSERS:
            stack.append(_CLOSERS[c])
            pos = at + 1
        elif stack.pop() == c:
            pos = at + 1
        else:
            raise Malformed(at)
    return pos


def skip_value(body: bytes, pos: int) -> Generator[None, None, int]:
    if pos >= len(body):
        raise Malformed(pos)
    c = body[pos]
    if c == 0x22:
        return (yield from skip_string(body, pos))
    if c in _CLOSERS:
        return (yield from skip_container(body, pos))
    # Python's own JSON reader (vLLM's) refuses integers of over 4300 digits anyway.
    m = _SCALAR.match(body, pos, pos + 4096)
    if m is None:
        raise Malformed(pos)
    return m.end()
