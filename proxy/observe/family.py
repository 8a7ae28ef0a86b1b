"""What every metric of the sidecar shares: the name prefix and a labelled family's cache."""

from __future__ import annotations

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
