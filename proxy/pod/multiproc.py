"""The pod's `/metrics`: every process's samples, merged in prometheus_client's multiprocess mode.

The library's own MultiProcessCollector merges the files each process writes."""

from __future__ import annotations

import glob
import os
from collections.abc import Iterable

from prometheus_client import CollectorRegistry
from prometheus_client.metrics_core import Metric
from prometheus_client.multiprocess import MultiProcessCollector, mark_process_dead
from prometheus_client.registry import Collector


class PodCollector(Collector):
    """The live families, the merged samples of every process, then each declared family no
    process has written yet, empty: a labelled metric with no sample still shows its HELP and
    TYPE, as it does with one process (the merged files only know what was written)."""

    def __init__(self, path: str, declared: CollectorRegistry, live: Collector) -> None:
        self._path, self._declared, self._live = path, declared, live

    def collect(self) -> Iterable[Metric]:
        live = list(self._live.collect())
        seen = {family.name for family in live}
        yield from live
        files = _written(self._path)
        for family in MultiProcessCollector.merge(files, accumulate=True):  # type: ignore[no-untyped-call]
            seen.add(family.name)
            yield family
        for family in self._declared.collect():
            if family.name not in seen:
                yield Metric(family.name, family.documentation, family.type, family.unit)


def _written(path: str) -> list[str]:
    """The processes' metric files, less one a starting worker has created but not yet sized:
    the library reads its first 8 bytes unguarded, and a scrape at that moment was a 500."""
    files = []
    for name in glob.glob(os.path.join(path, "*.db")):
        try:
            if os.path.getsize(name) >= 8:
                files.append(name)
        except OSError:  # gone meanwhile (a dead process's live gauges)
            continue
    return files


def pod_registry(path: str, declared: CollectorRegistry, *, live: Collector) -> CollectorRegistry:
    """A registry for the admin `/metrics`: every worker's and the supervisor's samples, and
    `live`'s, read from the supervisor at scrape time (the pod's engine phase and version)."""
    registry = CollectorRegistry()
    registry.register(PodCollector(path, declared, live))
    return registry


def process_gone(pid: int, path: str) -> None:
    """Drop an exited process's live gauges (in-flight requests); its counters stay counted."""
    mark_process_dead(pid, path)  # type: ignore[no-untyped-call]
