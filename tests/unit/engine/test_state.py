"""The engine state's transitions, without sockets or an event loop (`proxy/engine/state.py`)."""

from __future__ import annotations

import pytest
from prometheus_client import CollectorRegistry

from proxy.core.errors import EnginePaused, EngineSleeping, UpstreamUnreachable, WeightSync
from proxy.core.phase import PAUSED, SERVING, SLEEPING, WEIGHT_SYNC, Engine, next_version
from proxy.engine.state import ALONE, FOLLOWER, Change, EngineState, Role, Snapshot
from proxy.observe.engine_metrics import EngineMetrics


def make(
    hold_timeout: float | None = None, role: Role = ALONE, registry: CollectorRegistry | None = None
) -> tuple[EngineState, list[Change]]:
    metrics = EngineMetrics(registry or CollectorRegistry())
    state = EngineState(metrics, hold_timeout=hold_timeout, role=role)
    changes: list[Change] = []
    state.listeners.append(changes.append)
    return state, changes


def test_a_round_of_calls_moves_the_phase_and_tells_each_change() -> None:
    state, changes = make()
    pause = state.enter("/pause")
    assert (state.phase, state.calls) == (PAUSED, 1)
    sync = state.enter("/start_weight_update")
    assert state.phase == WEIGHT_SYNC
    state.answered(sync, "/start_weight_update", awake=True, version=None)
    state.answered(pause, "/pause", awake=True, version=None)
    assert (state.phase, state.calls) == (WEIGHT_SYNC, 0)
    finish = state.enter("/finish_weight_update")
    state.answered(finish, "/finish_weight_update", awake=True, version="step-1")
    assert (state.phase, state.version, state.updates) == (PAUSED, "step-1", 1)
    assert [(c.kind, c.before) for c in changes] == [
        ("engine", SERVING),
        ("engine", PAUSED),
        ("version", WEIGHT_SYNC),  # the version first: held requests leave with the new one
        ("engine", WEIGHT_SYNC),
    ]
    assert state.epoch == 3  # the version alone does not make a probe stale


def test_a_failed_call_reverts_unless_something_else_moved_the_phase() -> None:
    state, _ = make()
    call = state.enter("/sleep")
    state.failed(call, "/sleep")
    assert (state.phase, state.calls) == (SERVING, 0)
    call = state.enter("/pause")
    state.set(Engine(SLEEPING), "reconciled")
    state.failed(call, "/pause")
    assert state.phase == SLEEPING


def test_a_call_left_by_its_caller_keeps_its_phase() -> None:
    state, _ = make()
    call = state.enter("/pause")
    state.leave(call)
    assert (state.phase, state.calls) == (PAUSED, 0)


def test_a_partial_wake_up_leaves_the_engine_asleep() -> None:
    state, _ = make()
    state.answered(state.enter("/sleep"), "/sleep", awake=True, version=None)
    state.answered(state.enter("/wake_up"), "/wake_up", awake=False, version=None)
    assert state.phase == SLEEPING


def test_only_a_change_is_told() -> None:
    state, changes = make()
    state.set(Engine(), "same")
    state.set_version(None)
    state.engine_down(None)
    assert changes == []
    state.set_version("v1")
    state.set_version("v1")
    state.engine_down("refused")
    state.engine_down("refused")
    state.engine_down(None)
    assert [c.kind for c in changes] == ["version", "down", "down"]
    assert state.down is None


@pytest.mark.parametrize(
    ("pod", "asked", "chosen"),
    [
        (None, None, (None, "--phase-hold-timeout")),
        (None, 3.0, (3.0, "X-Sidecar-Hold-Timeout")),
        (10.0, 3.0, (3.0, "X-Sidecar-Hold-Timeout")),
        (10.0, 10.0, (10.0, "X-Sidecar-Hold-Timeout")),
        (2.0, 3.0, (2.0, "--phase-hold-timeout")),
        (2.0, None, (2.0, "--phase-hold-timeout")),
    ],
)
def test_the_shorter_deadline_and_the_name_it_cites(
    pod: float | None, asked: float | None, chosen: tuple[float | None, str]
) -> None:
    state, _ = make(hold_timeout=pod)
    assert state.deadline(asked) == chosen


@pytest.mark.parametrize(
    ("engine", "failure", "word"),
    [
        (Engine(PAUSED), EnginePaused, "paused"),
        (Engine(SLEEPING), EngineSleeping, "sleeping"),
        (Engine(PAUSED, syncing=True), WeightSync, "weight sync"),
    ],
)
def test_a_refusal_names_the_phase_and_what_was_not_done(
    engine: Engine, failure: type[Exception], word: str
) -> None:
    state, _ = make()
    state.set(engine, "test")
    refused = state.refusal("chat", "held 2s (--phase-hold-timeout)")
    assert isinstance(refused, failure)
    text = str(refused)
    assert text.startswith(f"The engine is {word} (for ")
    assert "the request was not sent to it: held 2s (--phase-hold-timeout). Retry after 1s." in text
    cut = state.refusal("chat", "quiet", outcome="cut")
    assert "the stream was ended: quiet." in str(cut)


def test_retry_after_follows_recent_durations() -> None:
    state, _ = make()
    state.durations.record(PAUSED, 30.0)
    state.set(Engine(PAUSED), "test")
    assert state.refusal("chat", "x").retry_after in (29, 30)


def test_a_held_request_ends_at_once_while_vllm_is_down() -> None:
    state, _ = make()
    state.set(Engine(PAUSED), "test")
    state.check_up("chat")  # up: nothing
    state.engine_down("connection refused")
    with pytest.raises(UpstreamUnreachable, match=r"while the engine was paused \(connection"):
        state.check_up("chat")


def test_the_long_flag_is_set_for_the_phase_it_was_timed_for_and_reset_by_the_next() -> None:
    state, _ = make()
    state.set(Engine(PAUSED), "test")
    assert not state.mark_long(SLEEPING)
    assert state.mark_long(PAUSED)
    assert state.long
    assert state.metrics.state.long
    state.set(Engine(), "resumed")
    assert not state.long
    assert not state.metrics.state.long


def test_only_the_lead_records_phase_durations() -> None:
    name = "vllm_sidecar_engine_phase_duration_seconds_count"
    for role, recorded in ((ALONE, 1.0), (FOLLOWER, None)):
        registry = CollectorRegistry()
        state, _ = make(role=role, registry=registry)
        state.set(Engine(PAUSED), "test")
        state.set(Engine(), "test")
        assert registry.get_sample_value(name, {"phase": PAUSED}) == recorded
        assert state.durations.recent[SERVING]  # Retry-After's basis, kept by every copy


def test_a_follower_takes_the_snapshot_it_is_sent() -> None:
    lead, _ = make()
    lead.enter("/pause")
    lead.set_version("v2")
    lead.engine_down("reset")
    follower, changes = make(role=FOLLOWER)
    follower.follow(lead.snapshot())
    history = lead.snapshot().history
    assert [(u.version, u.by) for u in history] == [("v2", "vllm")]
    assert (
        follower.snapshot()
        == lead.snapshot()
        == Snapshot(Engine(PAUSED, syncing=False), version="v2", down="reset", history=history)
    )
    assert [c.kind for c in changes] == ["engine", "version", "down"]
    assert follower.calls == 0  # calls are the lead's


def test_an_unnamed_update_is_named_after_the_last() -> None:
    assert next_version("default") == "default+1"
    assert next_version("default+1") == "default+2"
    assert next_version("step+x") == "step+x+1"


def test_the_history_says_who_named_each_version_and_starts_anew_after_a_restart() -> None:
    state, _ = make()
    state.set_version("default")  # the first read of vLLM
    for name in ("step-1", None):  # the trainer names one, then none: the sidecar names it
        call = state.enter("/finish_weight_update")
        state.answered(call, "/finish_weight_update", awake=True, version=name or "step-1+1")
    state.set_version("step-7")  # read from vLLM: an update made around the sidecar
    assert [(u.index, u.version, u.by) for u in state.history.updates] == [
        (0, "default", "vllm"),
        (1, "step-1", "trainer"),
        (2, "step-1+1", "sidecar"),
        (3, "step-7", "vllm"),
    ]
    assert state.history.position() == {"default": 0, "step-1": 1, "step-1+1": 2, "step-7": 3}
    state.engine_down("refused")
    state.engine_down(None)
    state.set_version("step-7")  # back with the same name: its updates before are gone
    assert [(u.index, u.version, u.by) for u in state.history.updates] == [(4, "step-7", "restart")]


def test_the_history_keeps_the_last_64() -> None:
    state, _ = make()
    for n in range(100):
        state.set_version(f"v{n}")
    assert len(state.history.updates) == 64
    assert state.history.updates[0].version == "v36"
    assert state.history.position()["v99"] == 99
