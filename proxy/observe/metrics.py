"""Every Prometheus metric of the sidecar, bound to an injected registry; bounded labels."""

from __future__ import annotations

from aiohttp import web
from prometheus_client import CollectorRegistry, Counter, Gauge

from .engine_metrics import EngineMetrics
from .family import PREFIX, Counts
from .plain import Counters, Histograms, counter, histogram

# Route labels are bounded by the table in routes.py (`route_label`); methods by this set.
METHODS = frozenset(("GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"))
OTHER = "other"

# Generations can run for many minutes: buckets reach 600 s.
DURATION_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600)
OVERHEAD_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.5)


def method_label(method: str) -> str:
    return method if method in METHODS else OTHER


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
        # Whether a trace reads each request's record (wiring/tracing.py sets it): read once
        # per request, on an object the handler holds already, so off costs one attribute read.
        self.traced = False
        self.trace_drops = self._counter(
            "trace_spans_dropped",
            "Spans not exported (--otlp-traces-endpoint): queue_full, export_failed.",
            ("reason",),
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
        self.in_flight = Counts(
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
        self.continuations = self._counter(
            "continuations",
            "Generations a phase cut short, by outcome: continued (a part sent), refused (its"
            " hold was), failed (vLLM refused a part), exhausted (--continue-max).",
            ("route", "outcome"),
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

    def alert_share(self, share: float) -> None:
        """--offpolicy-alert-share, exported only when set: the alert joins on it, so without it
        VllmSidecarOffPolicyShareHigh cannot fire (docs/offpolicy.md)."""
        Gauge(
            PREFIX + "offpolicy_alert_share",
            "The off-policy token share above which VllmSidecarOffPolicyShareHigh fires.",
            registry=self.registry,
            multiprocess_mode="livemax",
        ).set(share)

    def _counter(self, name: str, doc: str, labels: tuple[str, ...]) -> Counters:
        return counter(self.registry, name, doc, labels)

    def _histogram(self, name: str, doc: str, buckets: tuple[float, ...]) -> Histograms:
        return histogram(self.registry, name, doc, ("route",), buckets)


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
