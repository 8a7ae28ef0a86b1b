"""Small helpers for the end-to-end tests: SSE events, Prometheus samples, bounded waits."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Any

import aiohttp
import orjson
from prometheus_client.parser import text_string_to_metric_families

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
        text = await resp.text()
    total = 0.0
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name and labels.items() <= sample.labels.items():
                total += sample.value
    return total


async def eventually(
    check: Callable[[], Awaitable[bool]], what: str, deadline_s: float = 60.0
) -> None:
    """Poll `check` until it holds; the deadline only bounds a hang, it asserts no speed."""
    end = time.monotonic() + deadline_s
    while not await check():
        if time.monotonic() > end:
            raise AssertionError(f"never happened within {deadline_s} s: {what}")
        await asyncio.sleep(0.2)
