"""Pure checks of skyrl 0.4's answers: the counts and keys its client indexes without looking."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from proxy.skyrl.checks import Answer

GENERATE_PATHS = ("/inference/v1/generate", "/skyrl/v1/generate")
COMPLETION_PATHS = ("/v1/completions", "/v1/chat/completions")
# The key each data-plane answer must carry, and its type, for the client's indexing to hold.
REQUIRED = {
    "/tokenize": ("tokens", list),
    "/detokenize": ("prompt", str),
    "/get_world_size": ("world_size", int),
    "/is_sleeping": ("is_sleeping", bool),
}


def body_required(path: str) -> bool:
    """Whether a success on `path` must carry a body: the client indexes these answers."""
    return path in REQUIRED or path in GENERATE_PATHS or path in COMPLETION_PATHS


def expected_choices(path: str, request: Mapping[str, Any]) -> int | None:
    """How many choices the request asks for: ``n`` per prompt; ``None`` for other routes."""
    if path in GENERATE_PATHS:
        params = request.get("sampling_params")
        n = params.get("n", 1) if isinstance(params, Mapping) else 1
        return n if isinstance(n, int) else 1
    if path not in COMPLETION_PATHS:
        return None
    n = request.get("n", 1)
    n = n if isinstance(n, int) and n > 0 else 1
    prompt = request.get("prompt")
    batched = isinstance(prompt, list) and prompt and not isinstance(prompt[0], int)
    return n * (len(prompt) if batched and isinstance(prompt, list) else 1)


def check_shape(answer: Answer, path: str, request: Any, body: Mapping[str, Any]) -> None:
    """``SidecarError`` when ``body`` lacks what skyrl 0.4 reads from it for ``path``."""
    if path in REQUIRED:
        key, kind = REQUIRED[path]
        value = body.get(key)
        if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
            raise answer.fail(f"the answer has no {kind.__name__} {key!r}: {answer.text()}")
        return
    want = expected_choices(path, request) if isinstance(request, Mapping) else None
    if want is None:
        return
    choices = body.get("choices")
    if not isinstance(choices, list):
        raise answer.fail(f"the answer has no 'choices' list: {answer.text()}")
    if len(choices) != want:
        raise answer.fail(f"{len(choices)} choices came back for {want} requested")
    if path in GENERATE_PATHS:
        for i, choice in enumerate(choices):
            if not isinstance(choice, Mapping) or not isinstance(choice.get("token_ids"), list):
                raise answer.fail(f"choice {i} has no 'token_ids' list: {answer.text()}")
