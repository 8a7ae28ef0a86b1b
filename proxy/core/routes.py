"""The routes the sidecar knows by name, each with its engine plane: add a release's routes here.

`ROUTES` is the one place to teach the sidecar a vLLM or SkyRL release's new routes: one line
each, `"/path": PLANE`, and tests/unit/test_routes.py checks every entry. A route in the table is
its own metric label (`route_label`); any other path is counted as `other`, so a client cannot
mint label values. The plane is what the engine lifecycle (control.py, gate.py) does with it:

- `CONTROL`: steers the engine (any method); needs the control token and may change the phase;
- `DATA`: a POST runs on the engine; held while it does not serve, and stamped with the weight
  version;
- `OTHER`: reads, health, tokenizing: passed on untouched.
"""

from __future__ import annotations

CONTROL, DATA, OTHER = "control", "data", "other"

ROUTES: dict[str, str] = {
    # vLLM 0.32: the server's own routes.
    "/health": OTHER,
    "/ping": OTHER,
    "/load": OTHER,
    "/version": OTHER,
    "/metrics": OTHER,
    "/tokenize": OTHER,
    "/detokenize": OTHER,
    "/server_info": OTHER,
    "/invocations": DATA,
    # vLLM 0.32: the OpenAI-compatible API and its relatives.
    "/v1/models": OTHER,
    "/v1/completions": DATA,
    "/v1/chat/completions": DATA,
    "/v1/chat/completions/batch": DATA,
    "/v1/messages": DATA,
    "/v1/messages/count_tokens": OTHER,
    "/v1/responses": DATA,
    "/v1/embeddings": DATA,
    "/v1/score": DATA,
    "/v1/rerank": DATA,
    "/pooling": DATA,
    "/score": DATA,
    "/rerank": DATA,
    "/classify": DATA,
    "/generative_scoring": DATA,
    "/v1/audio/transcriptions": DATA,
    "/v1/audio/translations": DATA,
    "/v1/load_lora_adapter": CONTROL,
    "/v1/unload_lora_adapter": CONTROL,
    # vLLM 0.32: dev mode and RL (sleep, pause, weight transfer, elastic EP).
    "/sleep": CONTROL,
    "/wake_up": CONTROL,
    "/is_sleeping": OTHER,
    "/pause": CONTROL,
    "/resume": CONTROL,
    "/is_paused": OTHER,
    "/reset_prefix_cache": CONTROL,
    "/reset_mm_cache": CONTROL,
    "/reset_encoder_cache": CONTROL,
    "/collective_rpc": CONTROL,
    "/abort_requests": CONTROL,
    "/release_kv_cache_memory": CONTROL,
    "/init_weight_transfer_engine": CONTROL,
    "/shutdown_weight_transfer_engine": CONTROL,
    "/start_weight_update": CONTROL,
    "/start_draft_weight_update": CONTROL,
    "/update_weights": CONTROL,
    "/finish_weight_update": CONTROL,
    "/update_weight_version": CONTROL,
    "/weight_info": OTHER,
    "/weight_checker": CONTROL,
    "/fetch_weights": CONTROL,
    "/kv_event_sources": OTHER,
    "/is_scaling_elastic_ep": OTHER,
    "/scale_elastic_ep": CONTROL,
    # SkyRL's own: its weight sync and world size.
    "/get_world_size": OTHER,
    "/init_weight_update_communicator": CONTROL,
    "/update_weights_skyrl": CONTROL,
    "/destroy_weights_update_group": CONTROL,
    # vLLM's scale-out routes (`--enable-scale-out`) and SkyRL 0.4's RemoteInferenceClient.
    "/inference/v1/generate": DATA,
    "/v1/chat/completions/render": OTHER,
    "/v1/completions/render": OTHER,
    "/skyrl/v1/generate": DATA,
    "/skyrl/v1/load_lora_adapter": CONTROL,
    "/finish_session": OTHER,
}

_RESPONSES = "/v1/responses/"  # /v1/responses/{id} and /v1/responses/{id}/cancel


def route_label(path: str) -> str:
    """A bounded route template for a raw path: a known route, a responses id template, or
    `other`."""
    if path in ROUTES:
        return path
    if path.startswith(_RESPONSES):
        return "/v1/responses/{id}/cancel" if path.endswith("/cancel") else "/v1/responses/{id}"
    return OTHER


def plane_of(path: str) -> str:
    """`control`, `data` or `other`; `/pause/` is /pause (Starlette redirects the slash)."""
    return ROUTES.get(normalized(path), OTHER)


def normalized(path: str) -> str:
    # `/pause/` reaches vLLM's /pause through Starlette's slash redirect: the same route.
    return path.rstrip("/") or "/"
