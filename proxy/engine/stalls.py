"""Streams a phase stalled: vLLM sent their headers, then nothing while the engine does not serve.

A stream forwarded just before a pause (or a pause made around the sidecar) is queued or frozen
inside vLLM with its 200 headers already sent, so no 503 can be answered any more. It is bounded
like a held request: no byte for --phase-hold-timeout while the engine does not serve, and the
upstream read is ended with the phase's failure, which the relay turns into an SSE error event
and [DONE]; vLLM sees the connection close and drops the request.
"""

from __future__ import annotations

import asyncio

import aiohttp

from proxy.core.errors import Interrupted

# A phase's first second is left alone whatever the hold timeout: the abort vLLM sends running
# streams on /pause arrives in it, and must reach the client as vLLM sent it.
MIN_QUIET = 1.0


class Stalls:
    """The data-plane streams in flight, and the sweep that ends those a phase stalled."""

    def __init__(self) -> None:
        self.streams: dict[object, tuple[str, aiohttp.ClientResponse]] = {}
        self._sweep: asyncio.Task[None] | None = None

    def add(self, key: object, route: str, resp: aiohttp.ClientResponse) -> None:
        self.streams[key] = (route, resp)

    def discard(self, key: object) -> None:
        self.streams.pop(key, None)

    def received(self) -> dict[object, int]:
        """Bytes each stream has received so far."""
        return {key: resp.content.total_bytes for key, (_, resp) in self.streams.items()}

    def stalled(self, before: dict[object, int]) -> list[tuple[str, aiohttp.ClientResponse]]:
        """The streams still in flight that received nothing since `before` was taken."""
        return [
            entry
            for key, count in before.items()
            if (entry := self.streams.get(key)) is not None
            and entry[1].content.total_bytes == count
        ]

    @staticmethod
    def cut(resp: aiohttp.ClientResponse, failure: Interrupted) -> None:
        resp.content.set_exception(failure)

    def start(self, sweep: asyncio.Task[None]) -> None:
        self.stop()
        self._sweep = sweep

    def stop(self) -> None:
        if self._sweep is not None and not self._sweep.done():
            self._sweep.cancel()
        self._sweep = None
