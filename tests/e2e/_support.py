"""Small helpers for the end-to-end tests: Prometheus samples read from a live process."""

from __future__ import annotations

import aiohttp

from tests.metrics import Samples


async def metric(http: aiohttp.ClientSession, url: str, name: str, **labels: str) -> float:
    """The sum of the samples called `name` whose labels include `labels`, read from `url`.

    Asked uncompressed: aiohttp asks for gzip by default, and a server's gzip of its /metrics
    waits its turn for a CPU that vLLM's engine spins on (docs/testing.md: up to 5 s), while a
    poll is meant to see the moment."""
    async with http.get(url, headers={"Accept-Encoding": "identity"}) as resp:
        assert resp.status == 200
        return Samples.parse(await resp.text()).total(name, labels)
