"""Counters and histograms counted as plain numbers in one process, and written at scrape.

prometheus_client's children take a lock on every inc and observe, and a histogram walks its
buckets in Python: a request made eight such calls. In one process a child here is a number
and a list, bumped on the event loop's thread, and the family turns them into the same samples
(`_total`, `_created`, `_bucket`, `_sum`, `_count`) when scraped. With `--workers` every
process must write its samples to its file, so there `counter` and `histogram` give
prometheus_client's own metrics, through `Family`.
"""

from __future__ import annotations

import os
import time
from bisect import bisect_left
from collections.abc import Callable, Iterator
from typing import Generic, Protocol, TypeVar

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.metrics_core import CounterMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector
from prometheus_client.samples import Sample
from prometheus_client.utils import floatToGoString

from .family import PREFIX, Family, one_process

# prometheus_client's switch for the `_created` samples, honoured here as it does.
CREATED = os.environ.get("PROMETHEUS_DISABLE_CREATED_SERIES", "False").lower() not in (
    "true",
    "1",
    "t",
)


C = TypeVar("C", "PlainCount", "PlainBuckets")


class CounterChild(Protocol):
    def inc(self, amount: float = 1) -> None: ...


class HistogramChild(Protocol):
    def observe(self, amount: float) -> None: ...


class Counters(Protocol):
    def labels(self, *values: str) -> CounterChild: ...


class Histograms(Protocol):
    def labels(self, *values: str) -> HistogramChild: ...


class PlainCount:
    __slots__ = ("created", "value")

    def __init__(self) -> None:
        self.value = 0.0
        self.created = time.time()

    def inc(self, amount: float = 1) -> None:
        self.value += amount


class PlainBuckets:
    """One histogram child: a count per bucket (not cumulative; the last is +Inf) and a sum."""

    __slots__ = ("bounds", "counts", "created", "total")

    def __init__(self, bounds: tuple[float, ...]) -> None:
        self.bounds = bounds
        self.counts = [0] * (len(bounds) + 1)
        self.total = 0.0
        self.created = time.time()

    def observe(self, amount: float) -> None:
        # A bucket holds the values at or below its bound (`le`): the first bound >= amount.
        self.counts[bisect_left(self.bounds, amount)] += 1
        self.total += amount


class _Plain(Collector, Generic[C]):
    """A labelled family of plain children, one per label set (bounded sets, as `Family`'s)."""

    def __init__(
        self, name: str, doc: str, labelnames: tuple[str, ...], make: Callable[[], C]
    ) -> None:
        self.name, self.doc, self.labelnames = name, doc, labelnames
        self._make: Callable[[], C] = make
        self._children: dict[tuple[str, ...], C] = {}

    def labels(self, *values: str) -> C:
        child = self._children.get(values)
        if child is None:
            if len(values) != len(self.labelnames):
                raise ValueError(f"{self.name} takes labels {self.labelnames}, got {values}")
            child = self._children[values] = self._make()
        return child


class PlainCounters(_Plain[PlainCount]):
    """A labelled counter family of plain counts."""

    def __init__(self, name: str, doc: str, labelnames: tuple[str, ...]) -> None:
        super().__init__(name, doc, labelnames, PlainCount)

    def collect(self) -> Iterator[Metric]:
        family = CounterMetricFamily(self.name, self.doc, labels=self.labelnames)
        for values, child in list(self._children.items()):
            family.add_metric(values, child.value, created=child.created if CREATED else None)
        yield family


class PlainHistograms(_Plain[PlainBuckets]):
    """A labelled histogram family of plain bucket counts."""

    def __init__(
        self, name: str, doc: str, labelnames: tuple[str, ...], bounds: tuple[float, ...]
    ) -> None:
        self.bounds = tuple(float(bound) for bound in bounds)
        self._les = [floatToGoString(b) for b in self.bounds] + ["+Inf"]  # type: ignore[no-untyped-call]
        super().__init__(name, doc, labelnames, lambda: PlainBuckets(self.bounds))

    def collect(self) -> Iterator[Metric]:
        family = HistogramMetricFamily(self.name, self.doc, labels=self.labelnames)
        for values, child in list(self._children.items()):
            cumulative, buckets = 0, []
            for le, count in zip(self._les, child.counts, strict=True):
                cumulative += count
                buckets.append((le, cumulative))
            family.add_metric(values, buckets, child.total)
            if CREATED:
                labels = dict(zip(self.labelnames, values, strict=True))
                family.samples.append(Sample(self.name + "_created", labels, child.created))
        yield family


def counter(
    registry: CollectorRegistry, name: str, doc: str, labelnames: tuple[str, ...]
) -> Counters:
    """A labelled counter named `vllm_sidecar_<name>_total`: plain counts in one process."""
    if one_process():
        plain = PlainCounters(PREFIX + name, doc, labelnames)
        registry.register(plain)
        return plain
    return Family(Counter(PREFIX + name, doc, labelnames, registry=registry))


def histogram(
    registry: CollectorRegistry,
    name: str,
    doc: str,
    labelnames: tuple[str, ...],
    buckets: tuple[float, ...],
) -> Histograms:
    """A labelled histogram named `vllm_sidecar_<name>`: plain counts in one process."""
    if one_process():
        plain = PlainHistograms(PREFIX + name, doc, labelnames, buckets)
        registry.register(plain)
        return plain
    return Family(Histogram(PREFIX + name, doc, labelnames, buckets=buckets, registry=registry))
