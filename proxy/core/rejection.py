"""vLLM 0.33's answer to a request sent into a pause: a retryable 503 that provably did not run.

In 0.33 `/pause?mode=abort|wait` makes the engine reject new requests instead of queueing them
(`EngineCore._reject_add_while_paused`): a non-stream gets a 503 JSON error, a stream a 200
whose first event is that error, then `[DONE]`. The sidecar holds everything during a pause it
relayed, so it meets this only for a pause made around it; the request never ran, so it is
sent again once the engine serves, as vLLM 0.32 alone would have queued it.
"""

from __future__ import annotations

import orjson

# vLLM 0.33 (vllm/v1/engine/core.py): the words of the rejection; its `engine_paused` code
# is dropped before the answer is written, and the type differs by route.
PAUSED = "Generation is paused"
MAX_PEEK = 64 << 10  # bytes of an answer read to tell a rejection from anything else
PEEK_SECONDS = 1.0  # longest a stream's headers wait for its first event


def _is_rejection(error: object) -> bool:
    if not isinstance(error, dict):
        return False
    message = error.get("message")
    return error.get("code") == 503 and isinstance(message, str) and message.startswith(PAUSED)


def rejected_body(status: int, body: bytes) -> bool:
    """A non-stream answer: 503, `{"error": {"code": 503, "message": "Generation is paused…"}}`."""
    if status != 503:
        return False
    try:
        payload = orjson.loads(body)
    except orjson.JSONDecodeError:
        return False
    return isinstance(payload, dict) and _is_rejection(payload.get("error"))


def first_event_end(data: bytes) -> int:
    """Where the first SSE event that is not a comment ends in `data`, or -1 if not yet."""
    at = 0
    while True:
        end = data.find(b"\n\n", at)
        if end < 0:
            return -1
        if not data.startswith(b":", at):  # `: keep-alive` comments may come first
            return end + 2
        at = end + 2


def rejected_stream(head: bytes) -> bool:
    """A stream whose first event is the rejection: `data: {"error": {...}}`."""
    end = first_event_end(head)
    if end < 0 or head.find(b'"error"', 0, end) < 0:  # a token's event: no parse needed
        return False
    for line in head[:end].splitlines():
        if line.startswith(b"data:"):
            try:
                payload = orjson.loads(line[5:])
            except orjson.JSONDecodeError:
                return False
            return isinstance(payload, dict) and _is_rejection(payload.get("error"))
    return False
