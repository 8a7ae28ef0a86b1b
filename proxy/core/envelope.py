"""The one error envelope: every error the sidecar returns is built here, as pure data."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from http import HTTPStatus
from typing import Any, NotRequired, TypedDict

import orjson

from .errors import ModelAmbiguous, SidecarFailure
from .upstream_body import upstream_message

SSE_DONE = b"data: [DONE]\n\n"


# The wire contract (README, "The error envelope"); key order is the order written below.
class ModelBlock(TypedDict):
    requested: str | None
    resolved: str | None
    served: list[str]  # the first SERVED_SHOWN
    suggestions: list[str]
    served_total: NotRequired[int]  # when there are more than SERVED_SHOWN


# Served names an envelope lists, and its message names: with thousands of LoRA adapters, every
# 404 would otherwise carry them all (50,001 names made each one 1.55 MB). The admin port's
# GET /models lists them all.
SERVED_SHOWN = 50
SERVED_NAMED = 20


class UpstreamBlock(TypedDict):
    status: int
    method: str
    path: str
    content_type: str | None
    body: Any  # the upstream's JSON as parsed, else its text
    body_truncated: bool


class ErrorBlock(TypedDict):
    message: str
    type: str
    param: str | None
    code: int
    source: str
    reason: str
    retryable: bool
    request_id: str
    model: NotRequired[ModelBlock]
    upstream: NotRequired[UpstreamBlock]


class Envelope(TypedDict):
    error: ErrorBlock


@dataclass(frozen=True, slots=True)
class ModelInfo:
    requested: str | None
    resolved: str | None
    served: tuple[str, ...] = ()
    suggestions: tuple[str, ...] = ()

    def as_dict(self) -> ModelBlock:
        block: ModelBlock = {
            "requested": self.requested,
            "resolved": self.resolved,
            "served": list(self.served[:SERVED_SHOWN]),
            "suggestions": list(self.suggestions),
        }
        if len(self.served) > SERVED_SHOWN:
            block["served_total"] = len(self.served)
        return block


@dataclass(frozen=True, slots=True)
class UpstreamReply:
    """What the upstream answered with, as far as the sidecar read it."""

    status: int
    method: str
    path: str
    content_type: str | None
    body: Any = None
    body_truncated: bool = False

    def as_dict(self) -> UpstreamBlock:
        return {
            "status": self.status,
            "method": self.method,
            "path": self.path,
            "content_type": self.content_type,
            "body": self.body,
            "body_truncated": self.body_truncated,
        }


def status_type(status: int) -> str:
    """`404` -> `NotFoundError`, the naming vLLM and the OpenAI SDK use."""
    try:
        phrase = HTTPStatus(status).phrase
    except ValueError:
        return "Error"
    name = "".join(w.capitalize() for w in phrase.replace("-", " ").split())
    return name if name.endswith("Error") else name + "Error"


def _envelope(
    *,
    message: str,
    type_: str,
    param: str | None,
    code: int,
    source: str,
    reason: str,
    retryable: bool,
    request_id: str,
    model: ModelInfo | None,
    upstream: UpstreamReply | None,
) -> Envelope:
    error: ErrorBlock = {
        "message": message,
        "type": type_,
        "param": param,
        "code": code,
        "source": source,
        "reason": reason,
        "retryable": retryable,
        "request_id": request_id,
    }
    if model is not None:
        error["model"] = model.as_dict()
    if upstream is not None:
        error["upstream"] = upstream.as_dict()
    return {"error": error}


def from_failure(
    failure: SidecarFailure,
    *,
    request_id: str,
    model: ModelInfo | None = None,
    upstream: UpstreamReply | None = None,
) -> Envelope:
    """The envelope for a failure the sidecar itself detected."""
    if isinstance(failure, ModelAmbiguous) and failure.candidates and model is not None:
        # The served names the ambiguous one matched are the names to ask for instead.
        model = dataclasses.replace(model, suggestions=failure.candidates)
    return _envelope(
        message=failure.message,
        type_=status_type(failure.status),
        param=failure.param,
        code=failure.status,
        source=failure.source,
        reason=failure.reason,
        retryable=failure.retryable,
        request_id=request_id,
        model=model,
        upstream=upstream,
    )


def from_upstream_status(
    reply: UpstreamReply, *, request_id: str, model: ModelInfo | None = None
) -> Envelope:
    """The envelope for an upstream 4xx/5xx: its status kept, its body attached."""
    body = reply.body
    err = body.get("error") if isinstance(body, dict) else None
    err = err if isinstance(err, dict) else {}
    message = (
        f"Upstream returned {reply.status} for {reply.method} {reply.path}: "
        f"{upstream_message(body)}"
    )
    if model is not None and model.resolved is None and model.served and reply.status == 404:
        more = len(model.served) - SERVED_NAMED
        message += f" Served: {', '.join(model.served[:SERVED_NAMED])}"
        if more > 0:
            message += f" and {more} more (the admin port's GET /models lists them all)"
        if model.suggestions:
            message += f". Did you mean: {', '.join(model.suggestions)}?"
    type_ = err.get("type") if isinstance(err.get("type"), str) else status_type(reply.status)
    param = err.get("param") if isinstance(err.get("param"), str) else None
    return _envelope(
        message=message,
        type_=str(type_),
        param=param,
        code=reply.status,
        source="upstream",
        reason="upstream_status",
        retryable=reply.status in (408, 429) or reply.status >= 500,
        request_id=request_id,
        model=model,
        upstream=reply,
    )


def encode(envelope: Envelope) -> bytes:
    try:
        return orjson.dumps(envelope)
    except TypeError:
        # A peer's non-UTF-8 header bytes reach us as lone surrogates (aiohttp decodes headers
        # with surrogateescape), which JSON cannot carry: replace them rather than fail.
        return orjson.dumps(_scrub(envelope))


def _scrub(value: Any) -> Any:
    if isinstance(value, str):
        return value.encode("utf-8", "replace").decode("utf-8")
    if isinstance(value, dict):
        return {_scrub(k): _scrub(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_scrub(v) for v in value]
    return value


def sse_event(envelope: Envelope) -> bytes:
    """One SSE error event then the end marker, the way vLLM reports in-stream errors."""
    return b"data: " + encode(envelope) + b"\n\n" + SSE_DONE
