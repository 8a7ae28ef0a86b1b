"""One request's record, and how it is observed: the request metrics and the one log line."""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field

from proxy.core.errors import SidecarFailure
from proxy.core.resolution import ABSENT
from proxy.core.routes import Route, labelled

from .logs import capped, text_field
from .metrics import Metrics, method_label

log = logging.getLogger("proxy.access")

CLIENT_CLOSED = 499  # nginx's convention for a client that hung up before the answer


@dataclass(slots=True)
class RequestRecord:
    method: str
    path: str
    request_id: str
    route: str = ""
    row: Route = field(init=False)  # the route's row in core/routes.py
    # The client's X-Request-Id when it was refused (not a short printable token) and replaced.
    client_request_id: str | None = None
    started: float = field(default_factory=time.perf_counter)
    status: int = 0
    requested: str | None = None
    resolved: str | None = None
    rule: str = ABSENT
    reason: str | None = None
    source: str | None = None  # the first failure's envelope source (upstream, sidecar)
    held: float = 0.0  # seconds a phase held it before it went upstream
    upstream_time: float = 0.0
    duration: float = 0.0

    def __post_init__(self) -> None:
        self.route, self.row = labelled(self.path)

    def elapsed(self) -> float:
        return time.perf_counter() - self.started

    def fail(self, metrics: Metrics, source: str, reason: str, status: int) -> None:
        """Count one failure; the first one names the request's outcome in the log."""
        metrics.failures.labels(self.route, source, reason, str(status)).inc()
        if self.reason is None:
            self.reason, self.source = reason, source

    def disconnected(self, metrics: Metrics) -> None:
        """Count a client that hung up; its hang-up names the outcome unless a failure did."""
        metrics.disconnects.labels(self.route).inc()
        self.reason = self.reason or "client_disconnected"

    def client_left(self, metrics: Metrics) -> None:
        """A client that left before its answer was complete (status 499, nginx's)."""
        self.disconnected(metrics)
        self.status = CLIENT_CLOSED

    def fail_with(self, metrics: Metrics, failure: SidecarFailure) -> None:
        self.fail(metrics, failure.source, failure.reason, failure.status)

    def finish(self, metrics: Metrics) -> None:
        self.duration = duration = self.elapsed()
        metrics.requests.labels(self.route, method_label(self.method), str(self.status)).inc()
        metrics.duration.labels(self.route).observe(duration)
        metrics.overhead.labels(self.route).observe(max(duration - self.upstream_time, 0.0))
        if log.isEnabledFor(logging.INFO):
            # Client-sent values are escaped and capped: a newline or a space in them must
            # not forge a line or a field of this one.
            log.info(
                "%s %s %d %.1fms model=%s->%s rule=%s request_id=%s%s%s",
                text_field(self.method),
                text_field(self.path),
                self.status,
                duration * 1000,
                text_field(self.requested),
                text_field(self.resolved),
                self.rule,
                self.request_id,
                f" reason={self.reason}" if self.reason else "",
                f" client_request_id={text_field(self.client_request_id)}"
                if self.client_request_id is not None
                else "",
                # Built only by the JSON formatter, and only when it runs.
                extra={"fields": self.log_fields},
            )

    def log_fields(self) -> dict[str, object]:
        fields: dict[str, object] = {
            "method": capped(self.method),
            "path": capped(self.path),
            "status": self.status,
            "duration_ms": round(self.duration * 1000, 3),
            "model_requested": None if self.requested is None else capped(self.requested),
            "model_resolved": self.resolved,
            "rule": self.rule,
            "request_id": self.request_id,
            "reason": self.reason,
        }
        if self.client_request_id is not None:
            fields["client_request_id"] = capped(self.client_request_id)
        return fields
