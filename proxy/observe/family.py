"""What every metric of the sidecar shares: the name prefix and a labelled family's cache."""

from __future__ import annotations

import os
from typing import Generic, TypeVar

from prometheus_client import Counter, Gauge, Histogram

M = TypeVar("M", Counter, Gauge, Histogram)


class Family(Generic[M]):
    """A labelled metric whose children are looked up once per label set, then cached.

    prometheus_client's `labels()` validates and locks on every call; on the request path a
    dict lookup does. Label values come from bounded sets, so the cache is bounded too.
    """

    __slots__ = ("_children", "metric")

    def __init__(self, metric: M) -> None:
        self.metric: M = metric
        self._children: dict[tuple[str, ...], M] = {}

    def labels(self, *values: str) -> M:
        child = self._children.get(values)
        if child is None:
            child = self._children[values] = self.metric.labels(*values)
        return child


PREFIX = "vllm_sidecar_"
# prometheus_client's multiprocess mode (`--workers`, pod/launch.py): a process's samples reach
# its file only through a value's set or inc, never through a function read at scrape.
MULTIPROC_ENV = "PROMETHEUS_MULTIPROC_DIR"


def one_process() -> bool:
    return not os.environ.get(MULTIPROC_ENV)


class Count:
    """A gauge child counted up and down on the request path. In one process it is a plain int
    that the gauge reads when scraped: an inc or dec of the child takes a lock and two checks,
    and each request made two. A worker's child is moved with it."""

    __slots__ = ("child", "n")

    def __init__(self, child: Gauge) -> None:
        self.n = 0
        self.child: Gauge | None = None
        if one_process():
            child.set_function(lambda: self.n)
        else:
            self.child = child

    def inc(self) -> None:
        self.n += 1
        if self.child is not None:
            self.child.inc()

    def dec(self) -> None:
        self.n -= 1
        if self.child is not None:
            self.child.dec()


class Counts:
    """A labelled gauge of `Count`s, one per label set (bounded sets, as `Family`'s)."""

    __slots__ = ("_counts", "family")

    def __init__(self, metric: Gauge) -> None:
        self.family = Family(metric)
        self._counts: dict[tuple[str, ...], Count] = {}

    def labels(self, *values: str) -> Count:
        count = self._counts.get(values)
        if count is None:
            count = self._counts[values] = Count(self.family.labels(*values))
        return count
