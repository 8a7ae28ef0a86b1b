"""The ledger: one entry per request the chaos run sent, what was sent and what came back."""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

# How a request ended, as its client saw it.
ANSWERED = "answered"  # a whole HTTP response (JSON, or a stream read to its end)
HUNG_UP = "hung_up"  # the client left on purpose, where its kind says
LOST = "lost"  # the connection failed under the client (a worker killed), or the framing broke


@dataclass
class Entry:
    seq: int
    kind: str
    rid: str
    nonce: str
    method: str
    path: str
    stream: bool
    tokens: int
    body_bytes: int
    sent: float = 0.0  # seconds since the run began
    ended: float = 0.0
    outcome: str = ""
    status: int | None = None
    headers: dict[str, str] = field(default_factory=dict)  # the few the checks read
    body: Any = None  # JSON answer or envelope, parsed; text when it was not JSON
    events: list[Any] = field(default_factory=list)  # a stream's events: parsed, "[DONE]", text
    error: str | None = None  # the client-side exception of a lost request
    note: str = ""  # for a control call: its step in the controller's plan


class Ledger:
    """Entries in memory for the checks, and each written to a JSONL file as it ends."""

    def __init__(self, path: Path | None) -> None:
        self.entries: list[Entry] = []
        self.began = time.monotonic()
        self.events: list[dict[str, Any]] = []  # the chaos itself: kills, restarts, phases
        self._out = path.open("w") if path is not None else None

    def now(self) -> float:
        return time.monotonic() - self.began

    def open(self, **fields: Any) -> Entry:
        entry = Entry(seq=len(self.entries), **fields)
        entry.sent = self.now()
        self.entries.append(entry)
        return entry

    def close(self, entry: Entry, outcome: str) -> None:
        entry.outcome, entry.ended = outcome, self.now()
        if self._out is not None:
            self._out.write(json.dumps({"request": asdict(entry)}, default=str) + "\n")

    def happened(self, what: str, **fields: Any) -> dict[str, Any]:
        event = {"what": what, "at": self.now(), **fields}
        self.events.append(event)
        if self._out is not None:
            self._out.write(json.dumps({"chaos": event}) + "\n")
        return event

    def finish(self) -> None:
        if self._out is not None:
            self._out.close()
            self._out = None
