"""The error hierarchy: each failure's reason, status, source and retryability, as sent."""

from __future__ import annotations

import pytest

from proxy.core import errors
from proxy.core.errors import (
    BodyTooLarge,
    BufferBudgetExhausted,
    EnginePaused,
    EngineSleeping,
    InternalError,
    InvalidJSON,
    InvalidModel,
    InvalidRequest,
    ModelAmbiguous,
    PhaseRefusal,
    ShuttingDown,
    SidecarFailure,
    Unauthorized,
    UpstreamDisconnected,
    UpstreamInvalidResponse,
    UpstreamPoolExhausted,
    UpstreamTimeout,
    UpstreamUnreachable,
    WeightSync,
)

# (class, reason, status, retryable): what a client sees in the envelope and the status line.
TABLE: list[tuple[type[SidecarFailure], str, int, bool]] = [
    (SidecarFailure, "internal_error", 500, False),
    (InternalError, "internal_error", 500, False),
    (UpstreamUnreachable, "upstream_unreachable", 502, True),
    (UpstreamTimeout, "upstream_timeout", 504, True),
    (UpstreamDisconnected, "upstream_disconnected", 502, True),
    (UpstreamInvalidResponse, "upstream_invalid_response", 502, True),
    (ModelAmbiguous, "model_ambiguous", 400, False),
    (InvalidModel, "invalid_model", 400, False),
    (InvalidJSON, "invalid_json", 400, False),
    (InvalidRequest, "invalid_request", 400, False),
    (BodyTooLarge, "body_too_large", 413, False),
    (ShuttingDown, "shutting_down", 503, True),
    (UpstreamPoolExhausted, "upstream_pool_exhausted", 503, True),
    (BufferBudgetExhausted, "buffer_budget_exhausted", 503, True),
    (EnginePaused, "engine_paused", 503, True),
    (EngineSleeping, "engine_sleeping", 503, True),
    (WeightSync, "weight_sync", 503, True),
    (Unauthorized, "unauthorized", 401, False),
]


def _all_failure_classes() -> set[type[SidecarFailure]]:
    found: set[type[SidecarFailure]] = set()
    todo: list[type[SidecarFailure]] = [SidecarFailure]
    while todo:
        cls = todo.pop()
        found.add(cls)
        todo.extend(cls.__subclasses__())
    return {cls for cls in found if cls.__module__ == errors.__name__}


@pytest.mark.parametrize(("cls", "reason", "status", "retryable"), TABLE)
def test_each_failure_has_its_reason_status_and_retryability(
    cls: type[SidecarFailure], reason: str, status: int, retryable: bool
) -> None:
    assert cls.reason == reason
    assert cls.status == status
    assert cls.retryable is retryable
    assert cls.source == "sidecar"  # none of them is vLLM's own answer


def test_the_table_covers_every_class_in_the_module() -> None:
    # PhaseRefusal is the abstract base of the three phase refusals: never raised itself.
    assert _all_failure_classes() - {PhaseRefusal} == {row[0] for row in TABLE}


def test_reasons_are_unique_apart_from_the_internal_error_base() -> None:
    concrete = [row for row in TABLE if row[0] is not SidecarFailure]
    reasons = [reason for _, reason, _, _ in concrete]
    assert len(reasons) == len(set(reasons))


def test_exactly_the_gateway_and_unavailable_statuses_are_retryable() -> None:
    for cls, _, status, retryable in TABLE:
        assert retryable is (status in (502, 503, 504)), cls.__name__


def test_every_failure_is_an_exception_and_a_sidecar_failure() -> None:
    for cls, *_ in TABLE:
        assert issubclass(cls, Exception)
        assert issubclass(cls, SidecarFailure)
    assert issubclass(EnginePaused, PhaseRefusal)
    assert issubclass(EngineSleeping, PhaseRefusal)
    assert issubclass(WeightSync, PhaseRefusal)
    assert not issubclass(ShuttingDown, PhaseRefusal)  # no Retry-After: the pod is going away


def test_the_message_is_kept_and_is_the_exceptions_text() -> None:
    failure = InvalidJSON("not valid JSON: unexpected end (char 12)")
    assert failure.message == "not valid JSON: unexpected end (char 12)"
    assert str(failure) == "not valid JSON: unexpected end (char 12)"
    assert failure.args == ("not valid JSON: unexpected end (char 12)",)


def test_repr_names_the_class_reason_status_and_message() -> None:
    assert repr(BodyTooLarge("over 16 MiB")) == (
        "BodyTooLarge(reason='body_too_large', status=413, 'over 16 MiB')"
    )
    assert repr(InternalError("boom")) == (
        "InternalError(reason='internal_error', status=500, 'boom')"
    )


def test_param_defaults_to_none_and_is_set_per_instance() -> None:
    assert InvalidJSON("x").param is None
    with_param = InvalidRequest("two keys", param="model")
    assert with_param.param == "model"
    assert InvalidRequest("again").param is None  # the instance's param did not leak to the class
    assert InvalidRequest.param is None


def test_model_failures_name_the_model_param() -> None:
    assert InvalidModel("too long").param == "model"
    assert InvalidModel.param == "model"
    assert InvalidModel("x", param="other").param == "other"  # an explicit param still wins
    assert ModelAmbiguous("two").param == "model"


def test_model_ambiguous_keeps_its_candidates() -> None:
    failure = ModelAmbiguous("`qwen` names two models", candidates=("qwen-a", "qwen-b"))
    assert failure.candidates == ("qwen-a", "qwen-b")
    assert failure.message == "`qwen` names two models"
    assert ModelAmbiguous("none listed").candidates == ()


@pytest.mark.parametrize("cls", [EnginePaused, EngineSleeping, WeightSync])
def test_phase_refusals_carry_retry_after(cls: type[PhaseRefusal]) -> None:
    failure = cls("the engine is busy", retry_after=7)
    assert failure.retry_after == 7
    assert failure.message == "the engine is busy"
    assert failure.status == 503
    assert failure.retryable is True


def test_retry_after_is_required_for_a_phase_refusal() -> None:
    with pytest.raises(TypeError):
        EnginePaused("paused")  # type: ignore[call-arg]


def test_a_failure_can_be_raised_and_caught_as_its_base() -> None:
    with pytest.raises(SidecarFailure) as raised:
        raise WeightSync("weights are being replaced", retry_after=3)
    assert raised.value.reason == "weight_sync"
    assert isinstance(raised.value, PhaseRefusal)
