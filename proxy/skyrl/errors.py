"""SidecarError: one failed call to the sidecar, with the error envelope it answered."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

# Longest piece of a foreign text (an upstream or non-envelope body) quoted in a message.
_SNIPPET = 300


class SidecarError(RuntimeError):
    """A call to the sidecar (or through it, to vLLM) failed; ``str()`` says why in one line.

    ``envelope`` is the parsed error body (``{"error": {...}}``) when there was one, ``status`` the
    HTTP status when an answer came back (``None`` when the sidecar could not be reached),
    ``retry_after`` the seconds its ``Retry-After`` header asked for. A ``RuntimeError`` so that
    code catching SkyRL's own control-plane failures catches it too.
    """

    def __init__(
        self,
        message: str,
        *,
        reason: str,
        method: str,
        url: str,
        status: int | None = None,
        request_id: str | None = None,
        envelope: Mapping[str, Any] | None = None,
        retry_after: float | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.reason = reason
        self.method = method
        self.url = url
        self.status = status
        self.request_id = request_id
        self.envelope = envelope
        self.retry_after = retry_after

    @property
    def error(self) -> Mapping[str, Any]:
        """The envelope's ``error`` object, or an empty mapping."""
        error = self.envelope.get("error") if self.envelope else None
        return error if isinstance(error, Mapping) else {}

    @property
    def retryable(self) -> bool:
        """The envelope says the same request may succeed later (a phase, an overload)."""
        return self.error.get("retryable") is True

    @property
    def served(self) -> list[str]:
        """The names the upstream serves, when the envelope lists them (model errors)."""
        model = self.error.get("model")
        served = model.get("served") if isinstance(model, Mapping) else None
        return [str(name) for name in served] if isinstance(served, Sequence) else []

    @property
    def upstream_message(self) -> str | None:
        """The upstream's own error text, from the envelope's ``upstream.body``."""
        upstream = self.error.get("upstream")
        body = upstream.get("body") if isinstance(upstream, Mapping) else None
        if isinstance(body, Mapping):
            inner = body.get("error", body.get("message"))
            if isinstance(inner, Mapping):
                inner = inner.get("message")
            return None if inner is None else str(inner)
        return None if body in (None, "") else str(body)

    def _is_model_error(self) -> bool:
        reason = self.error.get("reason")
        return self.error.get("param") == "model" or (
            isinstance(reason, str) and reason.startswith("model_")
        )

    def __str__(self) -> str:
        line = f"{self.method} {self.url}"
        line += f" -> {self.status} {self.reason}" if self.status is not None else f" {self.reason}"
        line += f": {self.message}"
        upstream = self.upstream_message
        if upstream and upstream not in self.message:
            line += f" (upstream said: {clip(upstream)})"
        served = self.served
        if self._is_model_error() and not all(name in self.message for name in served):
            line += f" (served models: {', '.join(served) or 'none'})"
        if self.request_id:
            line += f" [request id {self.request_id}]"
        return " ".join(line.split())

    def __reduce__(self) -> tuple[Any, ...]:
        # Ray ships a worker's exception to the driver by pickle; the default would call
        # __init__ with the message alone and fail on the keyword-only fields.
        return (_restore, (type(self), self.message, dict(self.__dict__)))

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(reason={self.reason!r}, status={self.status!r}, "
            f"url={self.url!r}, request_id={self.request_id!r}, message={self.message!r})"
        )


def _restore(cls: type[SidecarError], message: str, state: dict[str, Any]) -> SidecarError:
    error = cls.__new__(cls)
    RuntimeError.__init__(error, message)
    error.__dict__.update(state)
    return error


def clip(text: str) -> str:
    text = " ".join(text.split())
    return text if len(text) <= _SNIPPET else text[:_SNIPPET] + "..."
