"""The routes the sidecar knows by name, each with its rules, and what it does with any other.

`ROUTES` is the one place to teach the sidecar a vLLM or SkyRL release's new routes: one row
each, and tests/unit/core/test_routes.py checks every row. tests/unit/core/test_vllm_routes.py
fails on a route vLLM mounts that the table does not name (scripts/vllm_routes.py lists them).
A route in the table is its own metric label (`route_label`; a path with an id in it is labelled
by its template); any other path is counted as `other`, so a client cannot mint label values.
A row's `plane` is what the engine lifecycle (core/control.py, engine/gate.py) does with it:

- `CONTROL`: steers the engine (any method); needs the control token and may change the phase.
  Every route vLLM itself calls dev-only or operator-only is one: pause, sleep, weights, abort,
  the profiler, fault tolerance, collective_rpc, LoRA;
- `DATA`: a POST runs on the engine; held while it does not serve, and stamped with the weight
  version;
- `OTHER`: reads, health, tokenizing, rendering: passed on untouched.

No closed world: a path the table does not name is a `DATA` route. A POST to it is held in a
phase and stamped as a generation is, because a release's new generation route must not reach
vLLM during a weight sync; a read (any other method) passes untouched.

The rest of a row says what else is special about the route: the phase step a control call takes
(phase.py says what each step does to the phase), whether the weight version is read again after
its answer, whether its 200 must hold a choice, and whether it is vLLM's health.
"""

from __future__ import annotations

from dataclasses import dataclass

CONTROL, DATA, OTHER = "control", "data", "other"
# The phase steps of control calls (phase.py: `on_send`, `on_answer`).
PAUSE, RESUME, SLEEP, WAKE_UP = "pause", "resume", "sleep", "wake_up"
SYNC_START, SYNC_END = "sync_start", "sync_end"


@dataclass(frozen=True, slots=True)
class Route:
    plane: str
    # The phase step a control call takes; None leaves the phase (LoRA, caches, collective_rpc).
    step: str | None = None
    # The weight version is read again from vLLM after the call's answer.
    versions: bool = False
    # A generation: a 200 with no choice at all is never vLLM's (relay.py refuses one).
    choices: bool = False
    # vLLM's health: a GET also tells whether vLLM answers in time (exchange.py).
    own_health: bool = False
    # A generation a phase cut short can be continued: how its body says it (continuation.py).
    continues: str | None = None


_CONTROL, _DATA, _OTHER = Route(CONTROL), Route(DATA), Route(OTHER)

ROUTES: dict[str, Route] = {
    # vLLM 0.32: the server's own routes, and FastAPI's docs.
    "/health": Route(OTHER, own_health=True),
    "/ping": _OTHER,
    "/load": _OTHER,
    "/version": _OTHER,
    "/metrics": _OTHER,
    "/tokenize": _OTHER,
    "/detokenize": _OTHER,
    "/tokenizer_info": _OTHER,
    "/server_info": _OTHER,
    "/openapi.json": _OTHER,
    "/docs": _OTHER,
    "/docs/oauth2-redirect": _OTHER,
    "/redoc": _OTHER,
    "/invocations": _DATA,
    # vLLM 0.32: the OpenAI-compatible API and its relatives.
    "/v1/models": _OTHER,
    "/v1/completions": Route(DATA, choices=True, continues="completions"),
    "/v1/chat/completions": Route(DATA, choices=True, continues="chat"),
    "/v1/chat/completions/batch": _DATA,
    "/v1/messages": _DATA,
    "/v1/messages/count_tokens": _OTHER,
    "/v1/responses": _DATA,
    # A stored response is read, or cancelled by whoever holds its id: the client's own.
    "/v1/responses/{id}": _OTHER,
    "/v1/responses/{id}/cancel": _OTHER,
    "/v1/embeddings": _DATA,
    "/v1/score": _DATA,
    "/v1/rerank": _DATA,
    "/v2/embed": _DATA,
    "/v2/rerank": _DATA,
    "/pooling": _DATA,
    "/score": _DATA,
    "/rerank": _DATA,
    "/classify": _DATA,
    "/generative_scoring": _DATA,
    "/v1/systemone": _DATA,
    "/v1/decisions": _DATA,  # vLLM 0.33
    "/cohere/v2/chat": _DATA,
    "/v1/audio/transcriptions": _DATA,
    "/v1/audio/translations": _DATA,
    # A WebSocket: the sidecar drops `Upgrade` (hop-by-hop), so here it is only ever a GET.
    "/v1/realtime": _OTHER,
    # LoRA, at vLLM's routes and SageMaker's (`/adapters/{name}` is a DELETE).
    "/v1/load_lora_adapter": _CONTROL,
    "/v1/unload_lora_adapter": _CONTROL,
    "/adapters": _CONTROL,
    "/adapters/{name}": _CONTROL,
    # vLLM 0.32: the profiler ("only for local development") and fault tolerance.
    "/start_profile": _CONTROL,
    "/stop_profile": _CONTROL,
    "/fault_tolerance/apply": _CONTROL,
    "/fault_tolerance/status": _OTHER,
    # vLLM 0.32: dev mode and RL (sleep, pause, weight transfer, elastic EP).
    "/sleep": Route(CONTROL, step=SLEEP),
    "/wake_up": Route(CONTROL, step=WAKE_UP),
    "/is_sleeping": _OTHER,
    "/pause": Route(CONTROL, step=PAUSE),
    "/resume": Route(CONTROL, step=RESUME),
    "/is_paused": _OTHER,
    "/reset_prefix_cache": _CONTROL,
    "/reset_mm_cache": _CONTROL,
    "/reset_encoder_cache": _CONTROL,
    "/collective_rpc": _CONTROL,
    "/abort_requests": _CONTROL,
    "/release_kv_cache_memory": _CONTROL,
    "/init_weight_transfer_engine": _CONTROL,
    "/shutdown_weight_transfer_engine": _CONTROL,
    "/start_weight_update": Route(CONTROL, step=SYNC_START),
    "/start_draft_weight_update": Route(CONTROL, step=SYNC_START),
    "/update_weights": _CONTROL,
    "/finish_weight_update": Route(CONTROL, step=SYNC_END, versions=True),
    "/update_weight_version": Route(CONTROL, versions=True),
    "/weight_info": _OTHER,
    "/weight_checker": _CONTROL,
    "/fetch_weights": _CONTROL,
    "/kv_event_sources": _OTHER,
    "/is_scaling_elastic_ep": _OTHER,
    "/scale_elastic_ep": _CONTROL,
    # vLLM's data-parallel supervisor (its own port): readiness.
    "/ready": _OTHER,
    "/readyz": _OTHER,
    # SkyRL's own: its weight sync and world size.
    "/get_world_size": _OTHER,
    "/init_weight_update_communicator": _CONTROL,
    "/update_weights_skyrl": _CONTROL,
    "/destroy_weights_update_group": _CONTROL,
    # vLLM's scale-out routes (`--enable-scale-out`) and SkyRL 0.4's RemoteInferenceClient.
    "/inference/v1/generate": Route(DATA, choices=True, continues="generate"),
    "/inference/v1/abort_requests": _CONTROL,
    "/v1/chat/completions/render": _OTHER,
    "/v1/completions/render": _OTHER,
    "/v1/messages/render": _OTHER,
    "/v1/responses/render": _OTHER,
    "/cohere/v2/chat/render": _OTHER,
    "/v1/chat/completions/derender": _OTHER,
    "/v1/completions/derender": _OTHER,
    "/skyrl/v1/generate": Route(DATA, choices=True),
    "/skyrl/v1/load_lora_adapter": _CONTROL,
    "/finish_session": _OTHER,
}


def _templates() -> dict[int, list[tuple[str, list[str]]]]:
    """The rows with an id in their path, by segment count."""
    found: dict[int, list[tuple[str, list[str]]]] = {}
    for key in ROUTES:
        if "{" in key:
            found.setdefault(key.count("/"), []).append((key, key.split("/")))
    return found


_TEMPLATES = _templates()


def template(path: str) -> str | None:
    """The row a raw path is, by name or by template; None for a path the table does not name."""
    if path in ROUTES:
        return path
    for key, parts in _TEMPLATES.get(path.count("/"), ()):
        # `{...}` stands for one segment, never an empty one (`/v1/responses//cancel`).
        if all(p == t or (t[0] == "{" and p) for p, t in zip(path.split("/"), parts, strict=True)):
            return key
    return None


def route_label(path: str) -> str:
    """A bounded route label for a raw path: the row it is (`/v1/responses/{id}`), or `other`."""
    return template(path) or OTHER


def labelled(path: str) -> tuple[str, Route]:
    """A raw path's route label and the row that label names (a data row for `other`, as
    `rule`): both found once, by the request's record, for every step that asks."""
    key = template(path)
    return (OTHER, _DATA) if key is None else (key, ROUTES[key])


def rule(path: str) -> Route:
    """The row of a raw path (`/pause/` is /pause: Starlette redirects the slash); a path the
    table does not name is a data route (no closed world: the module's docstring)."""
    key = template(normalized(path))
    return _DATA if key is None else ROUTES[key]


def plane_of(path: str) -> str:
    """`control`, `data` or `other`."""
    return rule(path).plane


def normalized(path: str) -> str:
    # `/pause/` reaches vLLM's /pause through Starlette's slash redirect: the same route.
    return path.rstrip("/") or "/"
