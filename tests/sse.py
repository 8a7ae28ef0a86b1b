"""Reading a Server-Sent Events answer as a client does: the one reader the tests share.

(Two read SSE their own way, for their own reasons: the chaos run's ledger keeps every event as
it came, the malformed ones too, and the training loop stops at a stream's first tokens.)"""

from __future__ import annotations

from typing import Any

import aiohttp
import orjson

DONE = "[DONE]"


def events(text: str) -> list[str]:
    """The events of a whole SSE body, without their blank-line separators."""
    return [e for e in text.split("\n\n") if e]


async def read_events(resp: aiohttp.ClientResponse) -> list[str]:
    """The events of a whole SSE response, read to its end."""
    return events(await resp.text())


async def sse_data(resp: aiohttp.ClientResponse, limit: int | None = None) -> list[Any]:
    """The `data:` payloads of an SSE response, JSON-decoded, `[DONE]` kept as a string.

    With `limit`, stop after that many events and leave the rest of the stream unread.
    """
    events: list[Any] = []
    async for raw in resp.content:
        line = raw.decode().rstrip("\r\n")
        if not line.startswith("data:"):
            continue
        payload = line[5:].strip()
        events.append(DONE if payload == DONE else orjson.loads(payload))
        if payload == DONE or (limit is not None and len(events) >= limit):
            break
    return events


def parse_sse(text: str) -> list[Any]:
    """The `data:` payloads of a whole SSE body, JSON-decoded, `[DONE]` kept as a string."""
    events: list[Any] = []
    for line in text.splitlines():
        if line.startswith("data:"):
            payload = line[5:].strip()
            events.append(DONE if payload == DONE else orjson.loads(payload))
    return events
