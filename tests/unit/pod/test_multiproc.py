"""The pod's merged /metrics: a scrape while a worker creates its metric file still answers."""

from __future__ import annotations

from pathlib import Path

from prometheus_client import CollectorRegistry, Counter, generate_latest
from prometheus_client.registry import Collector

from proxy.pod.multiproc import pod_registry


class _Nothing(Collector):
    def collect(self) -> list[object]:  # type: ignore[override]
        return []


def test_a_metric_file_not_yet_sized_is_left_out_of_the_scrape(tmp_path: Path) -> None:
    declared = CollectorRegistry()
    Counter("vllm_sidecar_requests", "Requests.", registry=declared)
    (tmp_path / "counter_4242.db").write_bytes(b"")  # created, not yet sized: a starting worker
    text = generate_latest(pod_registry(str(tmp_path), declared, live=_Nothing())).decode()
    assert "# TYPE vllm_sidecar_requests_total counter" in text
