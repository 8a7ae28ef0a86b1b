"""The memory budget: bytes taken for a request's task, given back when it ends; no sockets."""

from __future__ import annotations

import asyncio

import pytest
from prometheus_client import CollectorRegistry

from proxy.client.budget import LARGE, Budget
from proxy.core.errors import BufferBudgetExhausted
from proxy.observe.metrics import Metrics


def budget(limit: int) -> tuple[Budget, CollectorRegistry]:
    registry = CollectorRegistry()
    return Budget(limit, Metrics(registry)), registry


def sample(registry: CollectorRegistry, name: str) -> float | None:
    return registry.get_sample_value(f"vllm_sidecar_{name}")


async def holding(b: Budget, size: int, release: asyncio.Event) -> bool:
    taken = b.try_hold(size)
    await release.wait()
    return taken


async def test_bytes_are_held_until_the_task_ends() -> None:
    b, registry = budget(100)
    release = asyncio.Event()
    task = asyncio.create_task(holding(b, 60, release))
    await asyncio.sleep(0)  # the task runs up to its wait
    assert (b.used, sample(registry, "buffered_bytes")) == (60, 60)
    release.set()
    assert await task
    await asyncio.sleep(0)  # done callbacks run on the next turn of the loop
    assert (b.used, sample(registry, "buffered_bytes")) == (0, 0)


async def test_past_the_limit_is_refused_counted_and_takes_nothing() -> None:
    b, registry = budget(100)
    release = asyncio.Event()
    task = asyncio.create_task(holding(b, 60, release))
    await asyncio.sleep(0)
    assert not b.try_hold(41)
    assert b.used == 60
    assert sample(registry, "buffer_budget_refusals_total") == 1
    with pytest.raises(BufferBudgetExhausted, match="of 41 bytes"):
        b.hold(41)
    assert b.try_hold(40)  # exactly up to the limit is room
    release.set()
    await task


async def test_the_heap_is_trimmed_once_a_burst_of_large_bodies_is_over() -> None:
    b, _ = budget(10 * LARGE)
    trims: list[None] = []
    b.trim = lambda: trims.append(None)
    release = asyncio.Event()
    tasks = [asyncio.create_task(holding(b, size, release)) for size in (LARGE, 10)]
    await asyncio.sleep(0)
    release.set()
    await asyncio.gather(*tasks)
    await asyncio.sleep(0)
    assert (b.used, len(trims)) == (0, 1)


async def test_small_bodies_leave_the_heap_alone() -> None:
    b, _ = budget(100)
    trims: list[None] = []
    b.trim = lambda: trims.append(None)
    release = asyncio.Event()
    release.set()
    await asyncio.create_task(holding(b, 10, release))
    await asyncio.sleep(0)
    assert (b.used, trims) == (0, [])
