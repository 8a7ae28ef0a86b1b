"""Every Prometheus metric of the sidecar, bound to an injected registry; bounded labels."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

# vLLM 0.32's routes (default and dev mode) and SkyRL's weight-sync routes; anything else is
# counted as `other` so that a client cannot mint label values.
KNOWN_ROUTES = frozenset(
    (
        "/health /ping /load /version /metrics /tokenize /detokenize /invocations /server_info "
        "/v1/models /v1/completions /v1/chat/completions /v1/chat/completions/batch /v1/messages "
        "/v1/messages/count_tokens /v1/responses /v1/embeddings /v1/score /v1/rerank /pooling "
        "/score /rerank /classify /generative_scoring /v1/audio/transcriptions "
        "/v1/audio/translations /v1/load_lora_adapter /v1/unload_lora_adapter /sleep /wake_up "
        "/is_sleeping /pause /resume /is_paused /reset_prefix_cache /reset_mm_cache "
        "/reset_encoder_cache /collective_rpc /abort_requests /release_kv_cache_memory "
        "/init_weight_transfer_engine /start_weight_update /finish_weight_update /update_weights "
        "/update_weight_version /weight_info /weight_checker /get_world_size "
        "/init_weight_update_communicator /update_named_weights /destroy_weights_update_group "
        "/kv_event_sources /is_scaling_elastic_ep /scale_elastic_ep"
    ).split()
)
METHODS = frozenset(("GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"))
OTHER = "other"

# Generations can run for many minutes: buckets reach 600 s.
DURATION_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600)
OVERHEAD_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.5)


def route_label(path: str) -> str:
    """A bounded route template for a raw path."""
    if path in KNOWN_ROUTES:
        return path
    if path.startswith("/v1/responses/"):
        return "/v1/responses/{id}/cancel" if path.endswith("/cancel") else "/v1/responses/{id}"
    return OTHER


def method_label(method: str) -> str:
    return method if method in METHODS else OTHER


class Metrics:
    """The sidecar's metrics; one instance per app, registered in the registry it is given."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.registry = registry
        p = "vllm_sidecar_"
        self.requests = Counter(
            p + "requests",
            "Requests answered, by route, method and status sent.",
            ("route", "method", "status"),
            registry=registry,
        )
        self.duration = Histogram(
            p + "request_duration_seconds",
            "Time from request to the last byte of the response.",
            ("route",),
            buckets=DURATION_BUCKETS,
            registry=registry,
        )
        self.ttfb = Histogram(
            p + "upstream_time_to_first_byte_seconds",
            "Time from sending the upstream request to its response headers.",
            ("route",),
            buckets=DURATION_BUCKETS,
            registry=registry,
        )
        self.overhead = Histogram(
            p + "overhead_seconds",
            "The sidecar's own time per request: the request's duration less the upstream's.",
            ("route",),
            buckets=OVERHEAD_BUCKETS,
            registry=registry,
        )
        self.failures = Counter(
            p + "failures",
            "Failures by route, source (upstream|sidecar), reason and status.",
            ("route", "source", "reason", "status"),
            registry=registry,
        )
        self.resolutions = Counter(
            p + "model_resolutions",
            "Model resolutions by the rule that decided them.",
            ("rule", "served_model"),
            registry=registry,
        )
        self.in_flight = Gauge(
            p + "in_flight_requests",
            "Requests being served now.",
            ("route",),
            registry=registry,
        )
        self.disconnects = Counter(
            p + "client_disconnects",
            "Clients that hung up before the response was complete.",
            ("route",),
            registry=registry,
        )
        self.upstream_up = Gauge(
            p + "upstream_up",
            "1 when the upstream answered its last health check, else 0.",
            registry=registry,
        )
        self.discoveries = Counter(
            p + "discoveries",
            "Reads of the upstream's /v1/models, by outcome.",
            ("outcome",),
            registry=registry,
        )
