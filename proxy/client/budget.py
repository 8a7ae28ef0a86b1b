"""The memory budget: bytes all requests together may hold as whole bodies, in and out.

A body is held whole only where it must be: a request body whose `model` has to be found and
replaced, a response read to its end so that an upstream cut can still become a 502. Each such
body takes its size from one budget first; past it, a response streams through instead (with
backpressure, as every stream does) and a request is refused with a retryable 503 rather than
taking the pod past its memory limit. Without it, four 60 MB bodies took 800 MiB, and twenty
clients that did not read a 16 MB answer held 770 MiB.
"""

from __future__ import annotations

import asyncio
import ctypes
import ctypes.util
import logging
from collections.abc import Callable

from aiohttp import web
from prometheus_client import Gauge

from proxy.core.errors import BufferBudgetExhausted
from proxy.observe.family import one_process
from proxy.observe.metrics import Metrics

log = logging.getLogger(__name__)


# A body this large or larger is a burst worth trimming the heap after (map_large_buffers's
# threshold): small bodies leave nothing a trim would give back, and a trim walks the whole heap.
LARGE = 1 << 20


class Budget:
    def __init__(self, limit: int, metrics: Metrics) -> None:
        self.limit, self.metrics = limit, metrics
        self.used = 0
        self._held: dict[asyncio.Task[object], int] = {}  # what each request's task holds
        self.large_freed = False  # since the last trim
        self.trim = _malloc_trim()
        # In one process the gauge reads `used` when it is scraped: four sets a request (a
        # lock each) were 2% of a JSON request's instructions. A worker's samples live in its
        # multiprocess file, which only a set writes.
        self._gauge: Gauge | None = None
        if one_process():
            metrics.buffered_bytes.set_function(lambda: self.used)
        else:
            self._gauge = metrics.buffered_bytes

    def _used(self, used: int) -> None:
        self.used = used
        if self._gauge is not None:
            self._gauge.set(used)

    def try_hold(self, size: int) -> bool:
        """Take `size` bytes until the current request's task ends, its answer written out;
        False when they would pass the limit."""
        task = asyncio.current_task()
        if task is None:
            return False
        if self.used + size > self.limit:
            self.metrics.budget_refusals.inc()
            return False
        self._used(self.used + size)
        # One callback a request gives back all it held (its body, then its answer): a
        # callback each cost a closure and a call more per request.
        held = self._held.get(task)
        if held is None:
            task.add_done_callback(self._ended)
            held = 0
        self._held[task] = held + size
        return True

    def _ended(self, task: asyncio.Task[object]) -> None:
        self.give_back(self._held.pop(task))

    def hold(self, size: int) -> None:
        """As `try_hold`, or a retryable 503 when the budget has no room for `size` bytes now."""
        if not self.try_hold(size):
            raise self.exhausted(f"this body of {size} bytes")

    def exhausted(self, body: str) -> BufferBudgetExhausted:
        return BufferBudgetExhausted(
            f"The sidecar holds as many request and response bodies as its memory budget"
            f" allows (--buffer-budget-bytes {self.limit}); {body} would pass it. Retry shortly."
        )

    def give_back(self, size: int) -> None:
        """`size` bytes back; `size` at or past LARGE (a request's bodies together) marks a
        burst worth trimming the heap after."""
        self._used(self.used - size)
        self.large_freed = self.large_freed or size >= LARGE
        if not self.used and self.large_freed and self.trim is not None:
            # A burst of large bodies is over: hand the heap's free pages back to the kernel
            # (the pieces of streamed chunks between them would keep RSS up otherwise).
            self.large_freed = False
            self.trim()


class Lease:
    """Bytes taken from the budget as a body of unknown size arrives (chunked, or inflated as it
    is read): each part before it is kept, all given back when the request's task ends. (One
    callback for the whole body, not one per part.)"""

    __slots__ = ("budget", "size")

    def __init__(self, budget: Budget) -> None:
        self.budget, self.size = budget, 0
        task = asyncio.current_task()
        assert task is not None  # a request's handler
        task.add_done_callback(self._end)

    def take(self, size: int) -> None:
        """`size` more bytes, or a retryable 503 when they would pass the budget."""
        budget = self.budget
        if budget.used + size > budget.limit:
            budget.metrics.budget_refusals.inc()
            raise budget.exhausted(f"this body, {self.size + size} bytes so far,")
        budget._used(budget.used + size)
        self.size += size

    def _end(self, _: object) -> None:
        if self.size:
            self.budget.give_back(self.size)


_M_MMAP_THRESHOLD = -3  # glibc's mallopt parameter


def _libc() -> ctypes.CDLL | None:
    name = ctypes.util.find_library("c")
    try:
        return ctypes.CDLL(name) if name else None
    except OSError:
        return None


def _malloc_trim() -> Callable[[], None] | None:
    libc = _libc()
    trim = getattr(libc, "malloc_trim", None)  # glibc only
    return None if trim is None else lambda: trim(0)


def map_large_buffers(threshold: int = 1 << 20) -> None:
    """Have glibc serve allocations over `threshold` from their own mappings.

    glibc raises its mmap threshold each time such a mapping is freed (up to 32 MiB), after
    which multi-megabyte bodies come from the heap and stay in RSS once freed: 136 MiB after
    the clients had left. A fixed threshold returns each body's pages as soon as it is freed.
    """
    mallopt = getattr(_libc(), "mallopt", None)  # glibc only; musl has none
    if mallopt is None or mallopt(_M_MMAP_THRESHOLD, threshold) != 1:
        log.debug("large buffers stay with the allocator's defaults")


# Its slot on an app (aiohttp's typed key, declared beside what it holds).
BUDGET = web.AppKey("budget", Budget)
