"""The tests' metric reader: a metric never registered is an error, not a zero."""

from __future__ import annotations

import pytest
from prometheus_client import CollectorRegistry, Counter, Gauge, generate_latest

from tests.metrics import Samples, metric_value, require_metric


@pytest.fixture
def registry() -> CollectorRegistry:
    registry = CollectorRegistry()
    Counter("demo_failures", "d", ["reason"], registry=registry).labels("timeout").inc(2)
    Counter("demo_hits", "d", ["route"], registry=registry)  # registered, never counted
    Gauge("demo_up", "d", registry=registry).set(1)
    return registry


def test_a_counted_sample_reads_its_value(registry: CollectorRegistry) -> None:
    assert metric_value(registry, "demo_failures_total", {"reason": "timeout"}) == 2
    assert require_metric(registry, "demo_up", {}) == 1


def test_a_label_set_never_counted_is_none_or_zero(registry: CollectorRegistry) -> None:
    assert metric_value(registry, "demo_failures_total", {"reason": "reset"}) is None
    assert require_metric(registry, "demo_failures_total", {"reason": "reset"}) == 0.0
    assert require_metric(registry, "demo_hits_total", {"route": "/x"}) == 0.0


def test_a_metric_never_registered_fails_and_lists_the_names(registry: CollectorRegistry) -> None:
    assert metric_value(registry, "demo_failure_total", {}) is None
    with pytest.raises(AssertionError, match=r"no metric 'demo_failure_total'.*demo_hits_total"):
        require_metric(registry, "demo_failure_total", {})


def test_scraped_text_reads_the_same(registry: CollectorRegistry) -> None:
    samples = Samples.parse(generate_latest(registry).decode())
    assert samples.require("demo_failures_total", {"reason": "timeout"}) == 2
    assert samples.require("demo_hits_total", {"route": "/x"}) == 0.0
    assert samples.total("demo_failures_total", {}) == 2
    with pytest.raises(AssertionError, match="no metric"):
        samples.total("demo_nothing_total", {})
