"""What the sidecar's spans say: W3C trace context in and out, and the attributes of the server
span (one per request) and of a client span (one per upstream attempt). Names follow the
OpenTelemetry HTTP and GenAI conventions; the sidecar's own are under `vllm_sidecar.`."""

from __future__ import annotations

from collections.abc import Mapping, MutableMapping

from opentelemetry.context import Context
from opentelemetry.trace import Span, set_span_in_context
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator
from opentelemetry.util.types import AttributeValue

from proxy.observe.record import RequestRecord

_W3C = TraceContextTextMapPropagator()

Attributes = dict[str, AttributeValue]


def continued(headers: Mapping[str, str]) -> Context:
    """The client's `traceparent` (and `tracestate`) as the parent; an empty context (a new
    trace) when it sent none or one that does not parse."""
    return _W3C.extract(headers)


def inject(headers: MutableMapping[str, str], span: Span) -> None:
    """The span's context onto the upstream request: vLLM's spans become its children."""
    _W3C.inject(headers, context=set_span_in_context(span))


def server_start(method: str, path: str, route: str) -> Attributes:
    return {"http.request.method": method, "url.path": path[:1024], "http.route": route}


def server_end(rec: RequestRecord) -> Attributes:
    """What the record knows once the answer ended (or the client left)."""
    attrs: Attributes = {
        "http.response.status_code": rec.status,
        "vllm_sidecar.request_id": rec.request_id,
        "vllm_sidecar.model.rule": rec.rule,
    }
    if rec.requested is not None:
        attrs["gen_ai.request.model"] = rec.requested[:256]
    if rec.resolved is not None:
        attrs["gen_ai.response.model"] = rec.resolved
    if rec.reason is not None:
        attrs["error.type"] = rec.reason
        attrs["vllm_sidecar.error.reason"] = rec.reason
        if rec.source is not None:
            attrs["vllm_sidecar.error.source"] = rec.source
    elif rec.status >= 500:
        attrs["error.type"] = str(rec.status)
    if rec.held:
        attrs["vllm_sidecar.phase.held_seconds"] = round(rec.held, 6)
    if rec.client_request_id is not None:
        attrs["vllm_sidecar.client_request_id"] = rec.client_request_id[:256]
    return attrs


def weights(start: str | None, end: str | None) -> Attributes:
    """The weight version an answer started under, the one it ended under, and whether an
    update came between (straddled)."""
    if start is None:
        return {}
    attrs: Attributes = {"vllm_sidecar.weight.version": start}
    straddled = end is not None and end != start
    if straddled:
        attrs["vllm_sidecar.weight.version_end"] = str(end)
    attrs["vllm_sidecar.weight.straddled"] = straddled
    return attrs


def attempts(sent: int, parts: int) -> Attributes:
    """Upstream calls this request made: resends and continuation parts included."""
    return {"vllm_sidecar.upstream.attempts": sent, "vllm_sidecar.continued_parts": parts}


def client_start(method: str, url: str, request_id: str | None, attempt: int) -> Attributes:
    attrs: Attributes = {
        "http.request.method": method,
        "url.full": url[:2048],
        "vllm_sidecar.attempt": attempt,
    }
    if request_id is not None:
        attrs["vllm_sidecar.upstream.request_id"] = request_id  # what vLLM sees
    return attrs
