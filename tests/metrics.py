"""Reading metrics in tests: a sample's value, told apart from a metric never registered."""

from __future__ import annotations

from collections.abc import Iterable, Mapping

import aiohttp
from prometheus_client import CollectorRegistry
from prometheus_client.metrics_core import Metric
from prometheus_client.parser import text_string_to_metric_families

# The sample names a family of each type exposes (prometheus_client's exposition).
_SUFFIXES = {
    "counter": ("_total", "_created"),
    "gauge": ("",),
    "histogram": ("_bucket", "_count", "_sum", "_created"),
    "summary": ("", "_count", "_sum", "_created"),
    "info": ("_info",),
}


class Samples:
    """One snapshot of every sample, and every sample name a registered family can have."""

    def __init__(self, families: Iterable[Metric]) -> None:
        self.values: dict[tuple[str, frozenset[tuple[str, str]]], float] = {}
        self.names: set[str] = set()
        for family in families:
            self.names.update(family.name + s for s in _SUFFIXES.get(family.type, ("",)))
            for s in family.samples:
                self.names.add(s.name)
                self.values[(s.name, frozenset(s.labels.items()))] = s.value

    @classmethod
    def of(cls, registry: CollectorRegistry) -> Samples:
        return cls(registry.collect())

    @classmethod
    def parse(cls, text: str) -> Samples:
        return cls(text_string_to_metric_families(text))

    def value(self, name: str, labels: Mapping[str, str]) -> float | None:
        """The sample with exactly these labels, or None when there is none."""
        return self.values.get((name, frozenset(labels.items())))

    def require(self, name: str, labels: Mapping[str, str]) -> float:
        """The sample's value; 0.0 for a label set not counted yet; a failure for a name that
        no registered metric has (a typo, a metric renamed or removed)."""
        if name not in self.names:
            raise AssertionError(f"no metric {name!r}; registered: {sorted(self.names)}")
        value = self.value(name, labels)
        return 0.0 if value is None else value

    def total(self, name: str, labels: Mapping[str, str]) -> float:
        """The sum of the samples `name` whose labels include `labels` (a failure if unknown)."""
        self.require(name, labels)
        wanted = labels.items()
        return sum(
            v for (n, ls), v in self.values.items() if n == name and wanted <= dict(ls).items()
        )


def metric_value(registry: CollectorRegistry, name: str, labels: Mapping[str, str]) -> float | None:
    """The sample `name` with exactly `labels`, or None: never registered, or never set."""
    return Samples.of(registry).value(name, labels)


def require_metric(registry: CollectorRegistry, name: str, labels: Mapping[str, str]) -> float:
    """Like `metric_value`, but 0.0 for an unset label set and a failure for an unknown name."""
    return Samples.of(registry).require(name, labels)


async def scrape(admin_url: str) -> Samples:
    """A running sidecar's metrics, from its admin port."""
    async with aiohttp.ClientSession() as session, session.get(f"{admin_url}/metrics") as resp:
        assert resp.status == 200
        return Samples.parse(await resp.text())


def sample(metrics: Samples, name: str, **labels: str) -> float:
    """`Samples.require` with the labels as keywords."""
    return metrics.require(name, labels)


async def metric(http: aiohttp.ClientSession, url: str, name: str, **labels: str) -> float:
    """The sum of the samples called `name` whose labels include `labels`, read from `url`.

    Asked uncompressed: aiohttp asks for gzip by default, and a server's gzip of its /metrics
    waits its turn for a CPU that vLLM's engine spins on (docs/testing.md: up to 5 s), while a
    poll is meant to see the moment."""
    async with http.get(url, headers={"Accept-Encoding": "identity"}) as resp:
        assert resp.status == 200
        return Samples.parse(await resp.text()).total(name, labels)
