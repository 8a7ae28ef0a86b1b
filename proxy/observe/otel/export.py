"""Spans leave the process here: a bounded queue and one export thread. When the collector is
slow or gone, spans are dropped and counted (vllm_sidecar_trace_spans_dropped_total{reason}),
never held without bound and never in a request's way: `on_end` is an append under a lock."""

from __future__ import annotations

import collections
import logging
import threading
from collections.abc import Callable, Sequence

from opentelemetry.context import Context
from opentelemetry.sdk.trace import ReadableSpan, Span, SpanProcessor
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult

log = logging.getLogger(__name__)

QUEUE_FULL = "queue_full"
EXPORT_FAILED = "export_failed"

Dropped = Callable[[str, int], None]  # (reason, spans)


class BoundedExport(SpanProcessor):
    """The SDK's BatchSpanProcessor, with the two things it lacks: each dropped span counted by
    why, and one log line per outage (the exporter's own lines are quieted: see `quiet`)."""

    def __init__(
        self,
        exporter: SpanExporter,
        dropped: Dropped,
        *,
        max_queue: int = 2048,
        batch: int = 512,
        interval: float = 2.0,
    ) -> None:
        self._exporter, self._dropped = exporter, dropped
        self._max_queue, self._batch, self._interval = max_queue, batch, interval
        self._spans: collections.deque[ReadableSpan] = collections.deque()
        self._cond = threading.Condition()
        self._stopping = False
        self._flushing = False
        self._busy = 0  # spans taken off the queue whose export has not ended
        self._failing = False
        self._thread = threading.Thread(target=self._run, name="otel-export", daemon=True)
        self._thread.start()

    def on_start(self, span: Span, parent_context: Context | None = None) -> None:
        pass

    def on_end(self, span: ReadableSpan) -> None:
        if not span.context.trace_flags.sampled:
            return
        with self._cond:
            if len(self._spans) >= self._max_queue:
                full = True
            else:
                full = False
                self._spans.append(span)
                if len(self._spans) >= self._batch:
                    self._cond.notify_all()
        if full:
            self._dropped(QUEUE_FULL, 1)

    def _run(self) -> None:
        # As the SDK's batch processor: a batch leaves when it is full or `interval` after the
        # last one, so that one HTTP request carries many spans.
        while True:
            with self._cond:
                self._cond.wait_for(self._due, self._interval)
                if not self._spans and self._stopping:
                    return
                take = min(len(self._spans), self._batch)
                batch = [self._spans.popleft() for _ in range(take)]
                self._flushing = self._flushing and bool(self._spans)
                self._busy = take
            if batch:
                self._export(batch)
            with self._cond:
                self._busy = 0
                self._cond.notify_all()

    def _due(self) -> bool:
        return len(self._spans) >= self._batch or self._stopping or self._flushing

    def _export(self, batch: Sequence[ReadableSpan]) -> None:
        try:
            ok = self._exporter.export(batch) == SpanExportResult.SUCCESS
        except Exception:  # an exporter's bug must not end the export thread
            log.debug("span export raised", exc_info=True)
            ok = False
        if not ok:
            self._dropped(EXPORT_FAILED, len(batch))
            if not self._failing:
                log.warning(
                    "traces: the collector did not take %d spans; dropping and counting them "
                    "(vllm_sidecar_trace_spans_dropped_total) until it does",
                    len(batch),
                )
        elif self._failing:
            log.info("traces: the collector takes spans again")
        self._failing = not ok

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        """Wait until every queued span was exported or dropped (tests; shutdown)."""
        with self._cond:
            self._flushing = True
            self._cond.notify_all()
            return self._cond.wait_for(
                lambda: not self._spans and not self._busy, timeout_millis / 1000
            )

    def shutdown(self) -> None:
        with self._cond:
            self._stopping = True
            self._cond.notify_all()
        self._thread.join(timeout=self._interval + 1)
        self._exporter.shutdown()


def quiet() -> None:
    """The OTLP exporter logs each failed batch (and each retry); the sidecar says it once."""
    logging.getLogger("opentelemetry.exporter.otlp").setLevel(logging.CRITICAL)
