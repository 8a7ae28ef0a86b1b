"""The pod's `/metrics` with `--workers N`: prometheus_client's multiprocess mode, every process's
files merged by the library's own MultiProcessCollector."""

from __future__ import annotations

from collections.abc import Iterable

from prometheus_client import CollectorRegistry
from prometheus_client.metrics_core import Metric
from prometheus_client.multiprocess import MultiProcessCollector, mark_process_dead
from prometheus_client.registry import Collector


class PodCollector(Collector):
    """The merged samples of every process, then each declared family no process has written
    yet, empty: a labelled metric with no sample still shows its HELP and TYPE, as it does
    with one process (the merged files only know what was written)."""

    def __init__(self, path: str, declared: CollectorRegistry) -> None:
        self._merged = MultiProcessCollector(None, path)  # type: ignore[no-untyped-call]
        self._declared = declared

    def collect(self) -> Iterable[Metric]:
        seen = set()
        for family in self._merged.collect():  # type: ignore[no-untyped-call]
            seen.add(family.name)
            yield family
        for family in self._declared.collect():
            if family.name not in seen:
                yield Metric(family.name, family.documentation, family.type, family.unit)


def pod_registry(path: str, declared: CollectorRegistry) -> CollectorRegistry:
    """A registry for the admin `/metrics`: every worker's and the supervisor's samples."""
    registry = CollectorRegistry()
    registry.register(PodCollector(path, declared))
    return registry


def process_gone(pid: int, path: str) -> None:
    """Drop an exited process's live gauges (in-flight requests); its counters stay counted."""
    mark_process_dead(pid, path)  # type: ignore[no-untyped-call]
