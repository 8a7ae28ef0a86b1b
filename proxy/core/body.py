"""Find and replace the top-level `model` of a JSON body without touching any other byte.

Token-id prompts make bodies of many megabytes; parsing and re-serializing them would cost tens of
milliseconds and could change number formatting. Instead a small scanner walks the top-level keys,
skipping values with C-speed regex and `bytes.find`, and only the `model` value's bytes are
swapped. Anything the scanner cannot follow is handed to orjson, which names the syntax error.

A hostile body (millions of brackets, keys or escapes) must not hold the event loop, so the scan
is a generator (`modelkeys`, built on `jsonskip`): it yields after each slice of work, and its
driver decides where the slices run and how many a body may take (`step`, `find_model`,
`inbound._locate`).
"""

from __future__ import annotations

from collections.abc import Generator
from dataclasses import dataclass

import orjson

from .errors import InvalidJSON, InvalidModel, InvalidRequest
from .jsonskip import Malformed
from .modelkeys import TooComplex, leading_model, model_spans, sole_model

# Longer than any served name or local path; a longer one is refused rather than resolved,
# logged and compared with every served name (difflib is quadratic).
MAX_MODEL_CHARS = 1024
# The most bytes a value of MAX_MODEL_CHARS characters takes as JSON: a character outside the BMP
# escaped as a surrogate pair (`\ud83d\ude00`, as Python's json.dumps writes an emoji) is 12
# bytes, and the quotes. The cap counts characters, however they are written.
_MAX_MODEL_SPAN = 12 * MAX_MODEL_CHARS + 2
# orjson names the syntax error best, but in one call over the whole body: only this much.
_ORJSON_MESSAGE_BYTES = 1 << 20
# About a second or two of scanning on a small machine; a body that needs more before its
# `model` is refused (SkyRL and the openai SDK put `model` first). A 64 MiB token-id list
# takes about 300 slices.
MAX_SLICES = 2000

# A scan: yields between slices of work, returns its answer.
Scan = Generator[None, None, "ModelField | None"]


@dataclass(frozen=True, slots=True)
class ModelField:
    """Where the top-level `model` value sits; `value` is None when it is not a string."""

    value: str | None
    start: int
    end: int


def _syntax_error(body: bytes, pos: int) -> InvalidJSON:
    if len(body) > _ORJSON_MESSAGE_BYTES:
        return InvalidJSON(f"The request body is not valid JSON: unexpected input at byte {pos}")
    try:
        orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        return InvalidJSON(f"The request body is not valid JSON: {exc}")
    return InvalidJSON("The request body is not valid JSON")


def _too_long(size: int, unit: str = "characters") -> InvalidModel:
    return InvalidModel(
        f"The `model` value is {size} {unit} long; no served name is longer than "
        f"{MAX_MODEL_CHARS} characters.",
        param="model",
    )


def _field(body: bytes, start: int, end: int) -> ModelField:
    if body[start] != 0x22:
        return ModelField(None, start, end)
    if end - start > _MAX_MODEL_SPAN:
        raise _too_long(end - start - 2, "bytes")  # more than MAX_MODEL_CHARS characters
    try:
        value = orjson.loads(body[start:end])
    except orjson.JSONDecodeError as exc:
        message = f"The `model` value is not a valid JSON string: {exc}"
        raise InvalidJSON(message, param="model") from None
    if len(value) > MAX_MODEL_CHARS:
        raise _too_long(len(value))
    return ModelField(value, start, end)


def scan_model_in_head(head: bytes) -> Scan:
    """The top-level `model` when its whole value lies in `head`, a body's first bytes.

    None when the head cannot tell (no model key yet, or a value cut at the end): the caller
    then reads the whole body and scans it with `scan_model`.
    """
    try:
        spans = yield from model_spans(head, first_only=True)
    except Malformed:
        return None
    return _field(head, *spans[0]) if spans else None


# Python's json.loads (vLLM's reader) also takes UTF-16 and UTF-32, with or without a BOM, and a
# UTF-8 BOM; the scan would find no `model` in them and forward, unresolved, a name vLLM reads.
_BOMS = (b"\xef\xbb\xbf", b"\xff\xfe", b"\xfe\xff")


def _check_encoding(body: bytes) -> None:
    head = body[:4]
    if head.startswith(_BOMS) or b"\x00" in head:  # UTF-8 JSON has no NUL outside strings
        raise InvalidJSON(
            "The request body is UTF-16 or UTF-32 JSON, or starts with a byte-order mark: send "
            "UTF-8 without one (RFC 8259 section 8.1)."
        )


def scan_model(body: bytes) -> Scan:
    """The top-level `model` of a JSON object body; None when there is no such key.

    Raises InvalidJSON when the body cannot be read as JSON up to the model, InvalidRequest
    when it has more than one top-level `model` key (which one a server honours is undefined),
    and InvalidModel for a name longer than any served one.
    """
    _check_encoding(body)
    if (span := leading_model(body)) is not None:
        return _field(body, *span)
    if (spans := sole_model(body)) is None:
        try:
            spans = yield from model_spans(body, first_only=False)
        except Malformed as exc:
            raise _syntax_error(body, exc.pos) from None
    if not spans:
        return None
    if len(spans) > 1:
        raise InvalidRequest(
            f"The request body has {len(spans)} top-level `model` keys; send exactly one.",
            param="model",
        )
    return _field(body, *spans[0])


def step(scan: Scan, slices: int) -> tuple[bool, ModelField | None]:
    """Run `scan` for one slice: (True, its answer) when it finished, else (False, None).

    `slices` is how many it has had so far; past MAX_SLICES it is told to stop (TooComplex),
    which it may answer with the `model` it already found.
    """
    try:
        if slices >= MAX_SLICES:
            scan.throw(TooComplex())
        else:
            next(scan)
    except StopIteration as done:
        return True, done.value
    return False, None


def find_model(body: bytes) -> ModelField | None:
    """`scan_model` run to its end at once (for callers off the event loop, and tests)."""
    return run_to_end(scan_model(body))


def run_to_end(scan: Scan) -> ModelField | None:
    """A scan's answer, its slices run back to back."""
    slices = 0
    while True:
        done, field = step(scan, slices)
        if done:
            return field
        slices += 1


def replace_model(body: bytes, field: ModelField, name: str) -> bytes:
    """The body with only the `model` value's bytes replaced."""
    # One copy of the body instead of three (slice, then two concatenations).
    return b"".join((body[: field.start], orjson.dumps(name), memoryview(body)[field.end :]))
