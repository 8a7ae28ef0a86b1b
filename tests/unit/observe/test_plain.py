"""Plain counts give the very samples prometheus_client's own metrics give."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.samples import Sample

from proxy.observe.plain import PlainCounters, PlainHistograms

BOUNDS = (0.005, 0.01, 0.1, 1, 2.5, 600)
LABELS = st.sampled_from(["/v1/completions", "/v1/chat/completions", "other"])
# Bounds themselves, values between them and beyond the last: `le` is inclusive.
VALUES = st.one_of(st.sampled_from(BOUNDS), st.floats(0, 1000, allow_nan=False))


def samples(registry: CollectorRegistry) -> list[tuple[str, str, dict[str, str], float]]:
    """Every sample but the `_created` times (each side takes its own clock)."""
    out = []
    for family in registry.collect():
        for sample in family.samples:
            value = 0.0 if sample.name.endswith("_created") else sample.value
            out.append((family.type, sample.name, sample.labels, value))
    return out


def created(registry: CollectorRegistry) -> list[Sample]:
    return [s for f in registry.collect() for s in f.samples if s.name.endswith("_created")]


@given(st.lists(st.tuples(LABELS, VALUES), max_size=40))
def test_a_histogram_as_prometheus_client_writes_it(observations: list[tuple[str, float]]) -> None:
    ours, theirs = CollectorRegistry(), CollectorRegistry()
    plain = PlainHistograms("x_seconds", "doc", ("route",), BOUNDS)
    ours.register(plain)
    real = Histogram("x_seconds", "doc", ("route",), buckets=BOUNDS, registry=theirs)
    for route, value in observations:
        plain.labels(route).observe(value)
        real.labels(route).observe(value)
    assert samples(ours) == samples(theirs)
    assert len(created(ours)) == len(created(theirs))


@given(st.lists(st.tuples(LABELS, st.integers(1, 5)), max_size=40))
def test_a_counter_as_prometheus_client_writes_it(incs: list[tuple[str, int]]) -> None:
    ours, theirs = CollectorRegistry(), CollectorRegistry()
    plain = PlainCounters("x_requests", "doc", ("route",))
    ours.register(plain)
    real = Counter("x_requests", "doc", ("route",), registry=theirs)
    for route, amount in incs:
        plain.labels(route).inc(amount)
        real.labels(route).inc(amount)
    assert samples(ours) == samples(theirs)
    assert len(created(ours)) == len(created(theirs))


def test_a_wrong_number_of_labels_is_refused() -> None:
    plain = PlainCounters("x_requests", "doc", ("route", "status"))
    with pytest.raises(ValueError, match="route"):
        plain.labels("/v1/models")
