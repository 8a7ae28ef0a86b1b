"""When to try a failed call again: only what the envelope marks retryable, bounded, backed off."""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TypeVar

from proxy.skyrl.errors import SidecarError

T = TypeVar("T")


@dataclass(frozen=True)
class RetryPolicy:
    """At most ``attempts`` tries within ``budget_s`` seconds; waits double from ``base_s``.

    The defaults ride out a weight sync or a wake-up (the sidecar's phase refusals are 503s
    with ``retryable: true`` and a ``Retry-After``) without hiding a server that stays down.
    """

    attempts: int = 6
    budget_s: float = 120.0
    base_s: float = 0.5
    max_wait_s: float = 30.0

    def wait(self, error: SidecarError, attempt: int) -> float:
        """Seconds before try ``attempt + 1``: the ``Retry-After`` asked for, else backoff."""
        if error.retry_after is not None:
            return min(error.retry_after, self.max_wait_s)
        backoff = min(self.base_s * 2 ** (attempt - 1), self.max_wait_s)
        return float(backoff * random.uniform(0.5, 1.0))  # jitter, not cryptography


NEVER = RetryPolicy(attempts=1)


async def retrying(policy: RetryPolicy, call: Callable[[], Awaitable[T]]) -> T:
    """``call()``, again after a retryable ``SidecarError`` while attempts and budget last."""
    deadline = time.monotonic() + policy.budget_s
    attempt = 1
    while True:
        try:
            return await call()
        except SidecarError as error:
            if not error.retryable or attempt >= policy.attempts:
                raise
            wait = policy.wait(error, attempt)
            if time.monotonic() + wait > deadline:
                raise
        await asyncio.sleep(wait)
        attempt += 1
