"""The engine lifecycle's metrics: phase and version read at scrape time, what phases did."""

from __future__ import annotations

import time
from collections.abc import Iterable

from prometheus_client import CollectorRegistry, Counter, Gauge
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector

from proxy.core.phase import PHASES, SERVING

from .family import PREFIX
from .plain import counter, histogram

# Phases last from seconds (a pause around a weight sync) to hours (a sleeping engine).
PHASE_BUCKETS = (0.1, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600, 1800, 3600, 14400)


class PhaseCollector(Collector):
    """The engine's phase and weight version, as the lifecycle last set them."""

    def __init__(self) -> None:
        self.phase = SERVING
        self.version: str | None = None
        self.long = False  # the current phase has lasted past --phase-long-after
        self.version_changed = time.time()  # when the version last changed (or was first read)

    def collect(self) -> Iterable[Metric]:
        phase = _gauge(
            "engine_phase",
            "1 for the engine's current phase (serving, paused, sleeping, weight_sync), else 0.",
            "phase",
            [((name,), 1 if name == self.phase else 0) for name in PHASES],
        )
        version = _gauge(
            "weight_version_info",
            "1, labelled with the weight version vLLM reports now (GET /weight_info).",
            "version",
            [] if self.version is None else [((self.version,), 1)],
        )
        long = _gauge(
            "engine_phase_long",
            "1 when the current phase has lasted past --phase-long-after, labelled with it.",
            "phase",
            [((self.phase,), 1 if self.long else 0)],
        )
        changed = _gauge(
            "weight_version_changed_timestamp_seconds",
            "When the weight version last changed, or was first read (Unix time).",
            None,
            [((), self.version_changed)],
        )
        return (phase, version, long, changed)


def _gauge(
    name: str, doc: str, label: str | None, samples: list[tuple[tuple[str, ...], float]]
) -> GaugeMetricFamily:
    family = GaugeMetricFamily(PREFIX + name, doc, labels=(label,) if label else ())
    for values, value in samples:
        family.add_metric(values, value)
    return family


class EngineMetrics:
    """The engine lifecycle: phase, weight version, and what phases did to requests."""

    def __init__(self, registry: CollectorRegistry) -> None:
        # Read at scrape time, not kept in gauges: with --workers N only the supervisor's state
        # is exported, and an old version's series goes with it (multiprocess mode cannot remove).
        self.state = PhaseCollector()
        registry.register(self.state)
        self.weight_updates = Counter(
            PREFIX + "weight_updates",
            "Weight updates finished (a successful /finish_weight_update).",
            registry=registry,
        )
        self.phase_duration = histogram(
            registry,
            "engine_phase_duration_seconds",
            "How long each phase lasted, observed when it ends.",
            ("phase",),
            PHASE_BUCKETS,
        )
        self._requests(registry)

    def _requests(self, registry: CollectorRegistry) -> None:
        """What phases did to requests."""
        self.requests = counter(
            registry,
            "phase_requests",
            "Data-plane requests a phase held, refused (503) or had vLLM abort, by route.",
            ("phase", "route", "outcome"),
        )
        self.held = Gauge(
            PREFIX + "held_requests",
            "Requests held now, waiting for the engine.",
            registry=registry,
            multiprocess_mode="livesum",
        )
        self.generated_tokens = counter(
            registry,
            "generated_tokens",
            "Tokens of generation answers by route and lag: how many weight updates behind"
            " the pod's newest version at the answer's end their weights were (0, 1, 2, 3+),"
            " straddled (an update during an answer without spans), unknown (no version).",
            ("route", "lag"),
        )
        self.upstream_lacks = Gauge(
            PREFIX + "upstream_lacks",
            "1 for each lifecycle feature vLLM cannot support, its route answering 404 (an older"
            " vLLM, or no VLLM_SERVER_DEV_MODE=1): pause_state, sleep_state, weight_versions.",
            ("feature",),
            registry=registry,
            multiprocess_mode="livemax",
        )
        self.estimated_tokens = counter(
            registry,
            "estimated_generated_tokens",
            "Of the generated tokens, those a stream's events told, not vLLM's usage: an"
            " estimate (short at --stream-interval above 1), by route.",
            ("route",),
        )
        self.straddling_answers = counter(
            registry,
            "straddling_answers",
            "Generation answers made under more than one weight version, by route.",
            ("route",),
        )
        self.unpaused_sync = Counter(
            PREFIX + "weight_update_running_requests",
            "Requests running when a weight update started: a missing pause before the update.",
            registry=registry,
        )
