"""A relayed SSE stream: the error events vLLM puts inside a 200 response, and event ends."""

from __future__ import annotations

from typing import Any

import orjson

_ERROR_MARK = b'"error"'
# vLLM's compact JSON: an event with a choice (a usage event's list is empty).
_CHOICE = b'"choices":[{'
# The Python server puts the key on every choice event, null until the choice's last; the Rust
# frontend (VLLM_USE_RUST_FRONTEND=1) only on a choice's last event, which carries no token.
_FINISH = b'"finish_reason":'
_UNENDED = b'"finish_reason":null'
_ABORT = b'"finish_reason":"abort"'  # the engine aborted the request
_MAX_TAIL = 1 << 20  # an event line longer than this cannot be an error event worth parsing
# The blank lines that end an event (WHATWG HTML 9.2.6), and the most of one event held: aiohttp's
# own read buffer is of this order, and a token's event with logprobs is ~1 KiB.
_BLANK_LINES = (b"\n\n", b"\r\n\r\n", b"\r\r")
_MAX_HELD = 64 * 1024


def is_event_stream(content_type: str | None) -> bool:
    if content_type is None:
        return False
    return content_type.split(";", 1)[0].strip().lower() == "text/event-stream"


class ErrorWatcher:
    """Fed the stream's chunks as they pass; collects `data: {"error": ...}` events, and counts
    the choice events (`events`), those with a `finish_reason` key (`keyed`), the last of a
    choice (`ends`, its reason not null) and aborted ones (`aborts`).

    Chunks may split a line anywhere, so the last partial line is carried to the next chunk.
    Most chunks hold no `"error"` at all and cost two substring searches.
    """

    def __init__(self) -> None:
        self._tail = b""
        self.errors: list[Any] = []
        self.events = self.keyed = self.ends = self.aborts = 0

    @property
    def aborted(self) -> bool:
        return self.aborts > 0

    def _choices(self, data: bytes, end: int) -> None:
        """Count the choice events in `data[:end]` (whole lines only: a key is never cut): four
        counts in C at most, whatever the number of events in the chunk."""
        if events := data.count(_CHOICE, 0, end):
            self.events += events
            if keyed := data.count(_FINISH, 0, end):
                self.keyed += keyed
                if ends := keyed - data.count(_UNENDED, 0, end):
                    self.ends += ends
                    self.aborts += data.count(_ABORT, 0, end)

    def take(self) -> list[Any]:
        """The error events found since the last call."""
        found, self.errors = self.errors, []
        return found

    def passes(self, chunk: bytes) -> bool:
        """The common chunk, told with a few searches: nothing carried before it, whole events
        (it ends with a blank line), no `"error"` in it; its events are counted as `feed`
        counts them. False: the chunk is to be fed."""
        if self._tail or not chunk.endswith(b"\n\n") or _ERROR_MARK in chunk:
            return False
        if events := chunk.count(_CHOICE):  # `_choices`, inlined: this runs for every chunk
            self.events += events
            if keyed := chunk.count(_FINISH):
                self.keyed += keyed
                if ends := keyed - chunk.count(_UNENDED):
                    self.ends += ends
                    self.aborts += chunk.count(_ABORT)
        return True

    def feed(self, chunk: bytes) -> bool:
        """Watch one chunk; True when it completed an error event."""
        data = self._tail + chunk if self._tail else chunk
        if data.endswith(b"\n"):  # vLLM writes each event whole: nothing is carried
            cut, self._tail = len(data), b""
        else:
            cut = data.rfind(b"\n") + 1
            self._tail = data[cut:] if len(data) - cut <= _MAX_TAIL else b""
        self._choices(data, cut)
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


class EventFramer:
    """Cuts a relayed stream at its last event end; the unended rest waits for the next chunk.

    An upstream that breaks inside an event would otherwise leave half a `data:` line before
    the sidecar's error event: JSON no client parses (the openai SDK dies on it with a
    JSONDecodeError instead of reading the error). An SSE client drops an unended event, so
    `held` is dropped on a failure. One event over _MAX_HELD passes as it comes.
    """

    def __init__(self) -> None:
        self.held = b""

    def whole(self, chunk: bytes) -> bytes:
        """The bytes of `chunk` (after those held) up to the last event end."""
        data = self.held + chunk if self.held else chunk
        if data.endswith(b"\n\n"):  # vLLM writes each event whole: the common case
            self.held = b""
            return data
        end = max((at + len(s) for s in _BLANK_LINES if (at := data.rfind(s)) >= 0), default=0)
        if len(data) - end > _MAX_HELD:
            self.held = b""
            return data
        self.held = data[end:]
        return data[:end]
