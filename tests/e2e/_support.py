"""Small helpers for the end-to-end tests: Prometheus samples read from a live process."""

from __future__ import annotations

import aiohttp

from tests.metrics import Samples


async def metric(http: aiohttp.ClientSession, url: str, name: str, **labels: str) -> float:
    """The sum of the samples called `name` whose labels include `labels`, read from `url`."""
    async with http.get(url) as resp:
        assert resp.status == 200
        return Samples.parse(await resp.text()).total(name, labels)
