"""Every Prometheus metric of the sidecar, bound to an injected registry; bounded labels."""

from __future__ import annotations

import time
from collections.abc import Iterable
from typing import Generic, TypeVar

from aiohttp import web
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector

from proxy.core.phase import PHASES, SERVING

# Route labels are bounded by the table in routes.py (`route_label`); methods by this set.
METHODS = frozenset(("GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"))
OTHER = "other"

# Generations can run for many minutes: buckets reach 600 s.
DURATION_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600)
OVERHEAD_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.5)


def method_label(method: str) -> str:
    return method if method in METHODS else OTHER


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


class Metrics:
    """The sidecar's metrics; one instance per app, registered in the registry it is given."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.registry = registry
        self._outcomes()
        self._on_the_way()
        self._upstream()
        self._holdings()
        self.engine = EngineMetrics(registry)
        self.background_errors = self._counter(
            "background_errors",
            "Rounds of the health or discovery loop that failed unexpectedly (and were survived).",
            ("task",),
        )

    def _outcomes(self) -> None:
        """How each request ended: its status, its times, its failures."""
        self.requests = self._counter(
            "requests",
            "Requests answered, by route, method and status sent.",
            ("route", "method", "status"),
        )
        self.duration = self._histogram(
            "request_duration_seconds",
            "Time from request to the last byte of the response.",
            DURATION_BUCKETS,
        )
        self.ttfb = self._histogram(
            "upstream_time_to_first_byte_seconds",
            "Time from sending the upstream request to its response headers.",
            DURATION_BUCKETS,
        )
        self.overhead = self._histogram(
            "overhead_seconds",
            "The sidecar's own time per request: the request's duration less the upstream's.",
            OVERHEAD_BUCKETS,
        )
        self.failures = self._counter(
            "failures",
            "Failures by route, source (upstream|sidecar), reason and status.",
            ("route", "source", "reason", "status"),
        )

    def _on_the_way(self) -> None:
        """What happens to requests on their way: resolutions, requests in flight, hang-ups."""
        registry, route = self.registry, ("route",)
        self.resolutions = self._counter(
            "model_resolutions",
            "Model resolutions by the rule that decided them.",
            ("rule", "served_model"),
        )
        self.in_flight = Family(
            Gauge(
                PREFIX + "in_flight_requests",
                "Requests being served now.",
                route,
                registry=registry,
                # With --workers N, each process's count lives in its file until it exits.
                multiprocess_mode="livesum",
            )
        )
        self.disconnects = self._counter(
            "client_disconnects", "Clients that hung up before the response was complete.", route
        )

    def _upstream(self) -> None:
        """The upstream as the background checks see it."""
        registry = self.registry
        self.upstream_up = Gauge(
            PREFIX + "upstream_up",
            "1 when the upstream answered its last health check, else 0.",
            registry=registry,
            # The supervisor checks once per pod and every worker mirrors it: the live maximum
            # is the supervisor's answer, and a dead worker's last value cannot linger.
            multiprocess_mode="livemax",
        )
        self.discoveries = self._counter(
            "discoveries", "Reads of the upstream's /v1/models, by outcome.", ("outcome",)
        )

    def _holdings(self) -> None:
        """What clients hold of the sidecar: connections and buffered bodies."""
        registry = self.registry
        self.client_connections = Gauge(
            PREFIX + "client_connections",
            "Client connections open on the proxy port.",
            registry=registry,
            multiprocess_mode="livesum",
        )
        self.connections_closed = self._counter(
            "client_connections_closed",
            "Client connections the sidecar closed itself, by reason (a timeout, or the limit).",
            ("reason",),
        )
        self.buffered_bytes = Gauge(
            PREFIX + "buffered_bytes",
            "Bytes of request and response bodies held whole now (the memory budget's use).",
            registry=registry,
            multiprocess_mode="livesum",
        )
        self.budget_refusals = Counter(
            PREFIX + "buffer_budget_refusals",
            "Bodies the memory budget had no room for: a response streamed, a request refused.",
            registry=registry,
        )

    def _counter(self, name: str, doc: str, labels: tuple[str, ...]) -> Family[Counter]:
        return Family(Counter(PREFIX + name, doc, labels, registry=self.registry))

    def _histogram(self, name: str, doc: str, buckets: tuple[float, ...]) -> Family[Histogram]:
        return Family(
            Histogram(PREFIX + name, doc, ("route",), buckets=buckets, registry=self.registry)
        )


# Phases last from seconds (a pause around a weight sync) to hours (a sleeping engine).
PHASE_BUCKETS = (0.1, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600, 1800, 3600, 14400)


class EngineState(Collector):
    """The engine's phase and weight version, as the lifecycle last set them."""

    def __init__(self) -> None:
        self.phase = SERVING
        self.version: str | None = None
        self.long = False  # the current phase has lasted past --phase-long-after
        self.version_changed = time.time()  # when the version last changed (or was first read)

    def collect(self) -> Iterable[Metric]:
        phase = GaugeMetricFamily(
            PREFIX + "engine_phase",
            "1 for the engine's current phase (serving, paused, sleeping, weight_sync), else 0.",
            labels=("phase",),
        )
        for name in PHASES:
            phase.add_metric((name,), 1 if name == self.phase else 0)
        version = GaugeMetricFamily(
            PREFIX + "weight_version_info",
            "1, labelled with the weight version vLLM reports now (GET /weight_info).",
            labels=("version",),
        )
        if self.version is not None:
            version.add_metric((self.version,), 1)
        long = GaugeMetricFamily(
            PREFIX + "engine_phase_long",
            "1 when the current phase has lasted past --phase-long-after, labelled with it.",
            labels=("phase",),
        )
        long.add_metric((self.phase,), 1 if self.long else 0)
        changed = GaugeMetricFamily(
            PREFIX + "weight_version_changed_timestamp_seconds",
            "When the weight version last changed, or was first read (Unix time).",
        )
        changed.add_metric((), self.version_changed)
        return (phase, version, long, changed)


class EngineMetrics:
    """The engine lifecycle: phase, weight version, and what phases did to requests."""

    def __init__(self, registry: CollectorRegistry) -> None:
        # Read at scrape time, not kept in gauges: with --workers N only the supervisor's state
        # is exported, and an old version's series goes with it (multiprocess mode cannot remove).
        self.state = EngineState()
        registry.register(self.state)
        self.weight_updates = Counter(
            PREFIX + "weight_updates",
            "Weight updates finished (a successful /finish_weight_update).",
            registry=registry,
        )
        self.phase_duration = Family(
            Histogram(
                PREFIX + "engine_phase_duration_seconds",
                "How long each phase lasted, observed when it ends.",
                ("phase",),
                buckets=PHASE_BUCKETS,
                registry=registry,
            )
        )
        self._requests(registry)

    def _requests(self, registry: CollectorRegistry) -> None:
        """What phases did to requests."""
        self.requests = Family(
            Counter(
                PREFIX + "phase_requests",
                "Data-plane requests a phase held, refused (503) or had vLLM abort, by route.",
                ("phase", "route", "outcome"),
                registry=registry,
            )
        )
        self.held = Gauge(
            PREFIX + "held_requests",
            "Requests held now, waiting for the engine.",
            registry=registry,
            multiprocess_mode="livesum",
        )
        self.unpaused_sync = Counter(
            PREFIX + "weight_update_running_requests",
            "Requests running when a weight update started: a missing pause before the update.",
            registry=registry,
        )


class WorkerMetrics:
    """The supervisor's own metrics with `--workers` above 1."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.restarts = Counter(
            PREFIX + "worker_restarts",
            "Worker processes that exited unexpectedly and were started again.",
            registry=registry,
        )
        self.live = Gauge(
            PREFIX + "workers",
            "Worker processes serving the proxy port now.",
            registry=registry,
            multiprocess_mode="livemax",
        )


# Its slot on an app (aiohttp's typed key, declared beside what it holds).
METRICS = web.AppKey("metrics", Metrics)
