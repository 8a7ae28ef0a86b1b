"""The sidecar's error hierarchy: one class per failure reason, each knowing its status."""

from __future__ import annotations

from typing import ClassVar


class SidecarFailure(Exception):
    """A failure the sidecar reports to the client as an error envelope."""

    reason: ClassVar[str] = "internal_error"
    status: ClassVar[int] = 500
    source: ClassVar[str] = "sidecar"
    retryable: ClassVar[bool] = False
    param: str | None = None

    def __init__(self, message: str, *, param: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        if param is not None:
            self.param = param

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(reason={self.reason!r}, status={self.status}, {self.message!r})"
        )


class InternalError(SidecarFailure):
    """An exception that is not a SidecarFailure: a bug, or a library failing unforeseen."""


class UpstreamUnreachable(SidecarFailure):
    reason = "upstream_unreachable"
    status = 502
    retryable = True


class UpstreamTimeout(SidecarFailure):
    reason = "upstream_timeout"
    status = 504
    retryable = True


class UpstreamDisconnected(SidecarFailure):
    reason = "upstream_disconnected"
    status = 502
    retryable = True


class UpstreamInvalidResponse(SidecarFailure):
    """The upstream answered with something that is not valid HTTP."""

    reason = "upstream_invalid_response"
    status = 502
    retryable = True


class ModelAmbiguous(SidecarFailure):
    """A name two served models claim; `candidates` are their served names."""

    reason = "model_ambiguous"
    status = 400
    param = "model"

    def __init__(self, message: str, *, candidates: tuple[str, ...] = ()) -> None:
        super().__init__(message)
        self.candidates = candidates


class InvalidModel(SidecarFailure):
    """A `model` value no served name could ever match (longer than any real one)."""

    reason = "invalid_model"
    status = 400
    param = "model"


class InvalidJSON(SidecarFailure):
    reason = "invalid_json"
    status = 400


class InvalidRequest(SidecarFailure):
    """A request the sidecar cannot forward unambiguously (e.g. two top-level `model` keys)."""

    reason = "invalid_request"
    status = 400


class BodyTooLarge(SidecarFailure):
    reason = "body_too_large"
    status = 413


class ShuttingDown(SidecarFailure):
    """The grace period ran out while this request was still in flight."""

    reason = "shutting_down"
    status = 503
    retryable = True


class UpstreamPoolExhausted(SidecarFailure):
    """Every pooled upstream connection (--max-connections) stayed busy past --pool-timeout."""

    reason = "upstream_pool_exhausted"
    status = 503
    retryable = True


class BufferBudgetExhausted(SidecarFailure):
    """A body that must be held whole would take the sidecar past its memory budget."""

    reason = "buffer_budget_exhausted"
    status = 503
    retryable = True


class PhaseRefusal(SidecarFailure):
    """A request an engine phase refused; `retry_after` (seconds) goes out as Retry-After."""

    status = 503
    retryable = True

    def __init__(self, message: str, *, retry_after: int) -> None:
        super().__init__(message)
        self.retry_after = retry_after


class EnginePaused(PhaseRefusal):
    """The engine stayed paused (`/pause`) past the hold deadline, or the hold queue was full."""

    reason = "engine_paused"


class EngineSleeping(PhaseRefusal):
    reason = "engine_sleeping"


class WeightSync(PhaseRefusal):
    """Weights were being replaced: forwarding then is what crashes vLLM."""

    reason = "weight_sync"


class Unauthorized(SidecarFailure):
    """A control-plane call without the sidecar's control token (`--control-token`)."""

    reason = "unauthorized"
    status = 401


class Interrupted(Exception):
    """An upstream read the sidecar ended itself (a stream stuck in an engine phase,
    engine/stalls.py): set on the answer's reader, it is raised where the relay reads next, and
    carries the failure the client is told (upstream/session.py's `classify`)."""

    def __init__(self, failure: SidecarFailure) -> None:
        super().__init__(failure.message)
        self.failure = failure
