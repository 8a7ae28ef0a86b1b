"""Small helpers for the end-to-end tests: SSE events and Prometheus samples."""

from __future__ import annotations

from typing import Any

import aiohttp
import orjson

from tests.metrics import Samples

DONE = "[DONE]"


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


async def metric(http: aiohttp.ClientSession, url: str, name: str, **labels: str) -> float:
    """The sum of the samples called `name` whose labels include `labels`, read from `url`."""
    async with http.get(url) as resp:
        assert resp.status == 200
        return Samples.parse(await resp.text()).total(name, labels)
