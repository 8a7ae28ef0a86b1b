"""Watching a relayed SSE stream for the error events vLLM puts inside a 200 response."""

from __future__ import annotations

from typing import Any

import orjson

_ERROR_MARK = b'"error"'
_ABORT_MARK = b'"finish_reason":"abort"'  # vLLM's compact JSON: the engine aborted the request
_MAX_TAIL = 1 << 20  # an event line longer than this cannot be an error event worth parsing


def is_event_stream(content_type: str | None) -> bool:
    if content_type is None:
        return False
    return content_type.split(";", 1)[0].strip().lower() == "text/event-stream"


class ErrorWatcher:
    """Fed the stream's chunks as they pass; collects `data: {"error": ...}` events.

    Chunks may split a line anywhere, so the last partial line is carried to the next chunk.
    Most chunks hold no `"error"` at all and cost one substring search.
    """

    def __init__(self) -> None:
        self._tail = b""
        self.errors: list[Any] = []
        self.aborted = False

    def take(self) -> list[Any]:
        """The error events found since the last call."""
        found, self.errors = self.errors, []
        return found

    def feed(self, chunk: bytes) -> bool:
        """Watch one chunk; True when it completed an error event."""
        data = self._tail + chunk if self._tail else chunk
        cut = data.rfind(b"\n") + 1
        rest = len(data) - cut
        self._tail = data[cut:] if 0 < rest <= _MAX_TAIL else b""
        self.aborted = self.aborted or _ABORT_MARK in data
        if data.find(_ERROR_MARK, 0, cut) < 0:  # no copy of the chunk, unlike `in data[:cut]`
            return False
        for line in data[:cut].split(b"\n"):
            if line.startswith(b"data:") and _ERROR_MARK in line:
                self._inspect(line[5:].strip())
        return bool(self.errors)

    def _inspect(self, payload: bytes) -> None:
        try:
            event = orjson.loads(payload)
        except orjson.JSONDecodeError:
            return
        if isinstance(event, dict) and "error" in event:
            self.errors.append(event)
