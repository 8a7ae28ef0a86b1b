"""An upstream's body as the sidecar judges it: an error body as the envelope attaches it,
decoded (JSON, else text) with its human message found, whatever its shape (never raises); a
generation's body without a choice."""

from __future__ import annotations

import zlib
from typing import Any

import orjson


def decode_body(
    raw: bytes, *, content_type: str | None, content_encoding: str | None, truncated: bool
) -> Any:
    """The upstream body as JSON when it is JSON, else as text; never raises."""
    if content_encoding and content_encoding.lower() in ("gzip", "deflate", "x-gzip"):
        try:
            # wbits 47 accepts both gzip and zlib framing; a cut body yields what it can.
            raw = zlib.decompressobj(47).decompress(raw)
        except zlib.error:
            return raw.decode("utf-8", "replace")
    if not truncated and raw and (content_type is None or "json" in content_type.lower()):
        try:
            return orjson.loads(raw)
        except orjson.JSONDecodeError:
            pass
    return raw.decode("utf-8", "replace")


def upstream_message(body: Any) -> str:
    """The human part of an upstream error body, whatever its shape."""
    if isinstance(body, dict):
        err = body.get("error")
        if isinstance(err, dict) and isinstance(err.get("message"), str):
            return str(err["message"])
        if isinstance(err, str):
            return err
        for key in ("detail", "message"):
            if isinstance(body.get(key), str):
                return str(body[key])
        return orjson.dumps(body).decode()[:500]
    if isinstance(body, str):
        text = " ".join(body.split())
        return text[:500] if text else "(empty body)"
    return "(empty body)" if body is None else str(body)[:500]


# A generation answered 200 with no choice at all is never vLLM's (it answers n >= 1 choices or
# an error); relayed, SkyRL's clients index it and die with an IndexError far from the cause.
# JSON escapes every quote inside a string, so these bytes can only be the key and its value.
_CHOICES_KEY = b'"choices":'


def no_choices(body: bytes) -> bool:
    """The first `"choices":` key (vLLM writes it before any nested object) holds `[]`."""
    at = body.find(_CHOICES_KEY)
    if at < 0:
        return False
    value = body[at + len(_CHOICES_KEY) : at + len(_CHOICES_KEY) + 16].lstrip()
    return value[:1] == b"[" and value[1:].lstrip()[:1] == b"]"
