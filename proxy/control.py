"""Which routes steer the engine (control plane) or use it (data plane), and the control token."""

from __future__ import annotations

import hmac

# Routes that change what the engine does or holds: vLLM 0.32's dev-mode and RL routes, LoRA,
# and SkyRL's own weight-sync routes. Reads (/is_paused, /weight_info, ...) stay open.
CONTROL_ROUTES = frozenset(
    (
        "/pause /resume /sleep /wake_up /abort_requests /collective_rpc /reset_prefix_cache "
        "/reset_mm_cache /reset_encoder_cache /release_kv_cache_memory "
        "/init_weight_transfer_engine /shutdown_weight_transfer_engine /start_weight_update "
        "/start_draft_weight_update /update_weights /finish_weight_update /update_weight_version "
        "/weight_checker /scale_elastic_ep /fetch_weights /init_weight_update_communicator "
        "/update_weights_skyrl /destroy_weights_update_group /v1/load_lora_adapter "
        "/v1/unload_lora_adapter /skyrl/v1/load_lora_adapter"
    ).split()
)
# Routes whose requests run on the engine: the ones a pause holds and an abort ends.
DATA_ROUTES = frozenset(
    (
        "/v1/completions /v1/chat/completions /v1/chat/completions/batch /v1/responses "
        "/v1/messages /inference/v1/generate /skyrl/v1/generate /v1/embeddings /pooling /score "
        "/v1/score /rerank /v1/rerank /classify /invocations /generative_scoring "
        "/v1/audio/transcriptions /v1/audio/translations"
    ).split()
)
CONTROL, DATA = "control", "data"


def normalized(path: str) -> str:
    # `/pause/` reaches vLLM's /pause through Starlette's slash redirect: the same route.
    return path.rstrip("/") or "/"


def plane(method: str, path: str) -> str | None:
    """`control`, `data`, or None for everything else (reads, health, metrics, tokenize)."""
    path = normalized(path)
    if path in CONTROL_ROUTES:
        return CONTROL
    if method == "POST" and path in DATA_ROUTES:
        return DATA
    return None


def authorized(header: str | None, token: bytes) -> bool:
    """Whether an Authorization header carries `Bearer <token>`, compared in constant time."""
    scheme, _, given = (header or "").strip().partition(" ")
    # RFC 9110 section 11.1: the scheme is case-insensitive.
    if scheme.lower() != "bearer":
        return False
    return hmac.compare_digest(given.strip().encode("utf-8", "surrogateescape"), token)
