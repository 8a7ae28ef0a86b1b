"""Reading just enough of an answer to tell vLLM 0.33's paused rejection (core/rejection.py)."""

from __future__ import annotations

import asyncio
import contextlib

import aiohttp

from proxy.core.rejection import (
    MAX_PEEK,
    PEEK_SECONDS,
    first_event_end,
    rejected_body,
    rejected_stream,
)
from proxy.core.sse import is_event_stream


async def paused_rejection(resp: aiohttp.ClientResponse) -> tuple[bytes, bool]:
    """The bytes read to tell whether vLLM rejected the request as paused, and whether it did:
    a small 503's body, or a stream's first event. The relay goes on from those bytes."""
    if resp.status == 503 and (resp.content_length or MAX_PEEK + 1) <= MAX_PEEK:
        body = await resp.read()
        return body, rejected_body(resp.status, body)
    if resp.status != 200 or not is_event_stream(resp.headers.get("Content-Type")):
        return b"", False
    # Mostly the first event came with the headers: told without a timer or a wait.
    head = resp.content.read_nowait()
    if first_event_end(head) >= 0:
        return head, rejected_stream(head)
    # A rejection comes at once; a first token may take long (a long prompt): past a second
    # the stream is relayed as any other, its headers and every event as they come.
    with contextlib.suppress(TimeoutError):
        async with asyncio.timeout(PEEK_SECONDS):
            while first_event_end(head) < 0 and len(head) <= MAX_PEEK:
                chunk = await resp.content.readany()
                if not chunk:
                    break
                head += chunk
    return head, rejected_stream(head)
