"""The phase state machine and phase durations, without sockets."""

from __future__ import annotations

import pytest

from proxy.core.phase import (
    PAUSED,
    SERVING,
    SLEEPING,
    WEIGHT_SYNC,
    Durations,
    Engine,
    on_answer,
    on_send,
    reconciled,
)


def test_a_trainers_round_enters_on_send_and_leaves_on_answer() -> None:
    engine = Engine()
    engine = on_send(engine, "/pause")
    assert engine.phase == PAUSED
    engine = on_send(engine, "/start_weight_update")
    assert engine.phase == WEIGHT_SYNC
    assert on_send(engine, "/finish_weight_update").phase == WEIGHT_SYNC  # not before its answer
    engine = on_answer(engine, "/finish_weight_update")
    assert engine.phase == PAUSED  # the sync ran inside the pause
    assert on_send(engine, "/resume").phase == PAUSED
    assert on_answer(engine, "/resume").phase == SERVING


def test_sleep_and_a_partial_wake_up() -> None:
    engine = on_send(Engine(), "/sleep")
    assert engine.phase == SLEEPING
    assert on_send(engine, "/pause").phase == SLEEPING  # a pause does not wake it
    assert on_answer(engine, "/resume").phase == SLEEPING
    assert on_answer(engine, "/wake_up", fully_awake=False).phase == SLEEPING
    assert on_answer(engine, "/wake_up").phase == SERVING


@pytest.mark.parametrize(
    "path", ["/reset_prefix_cache", "/collective_rpc", "/v1/load_lora_adapter"]
)
def test_other_control_calls_leave_the_phase(path: str) -> None:
    for engine in (Engine(), Engine(PAUSED), Engine(SLEEPING, syncing=True)):
        assert on_send(engine, path) == engine
        assert on_answer(engine, path) == engine


def test_an_update_without_a_pause_is_still_a_sync() -> None:
    engine = on_send(Engine(), "/start_weight_update")
    assert engine.phase == WEIGHT_SYNC
    assert on_answer(engine, "/finish_weight_update").phase == SERVING


def test_reconciling_with_vllms_flags() -> None:
    assert reconciled(Engine(), busy=True, restarted=False) == Engine(PAUSED)
    assert reconciled(Engine(SLEEPING), busy=True, restarted=False) == Engine(SLEEPING)
    assert reconciled(Engine(SLEEPING), busy=False, restarted=False) == Engine(SERVING)
    syncing = Engine(PAUSED, syncing=True)
    # vLLM has no sync flag: only its finish or a restart ends one.
    assert reconciled(syncing, busy=False, restarted=False) == Engine(SERVING, syncing=True)
    assert reconciled(syncing, busy=False, restarted=True) == Engine(SERVING)


def test_retry_after_is_what_is_typically_left_of_the_phase() -> None:
    durations = Durations(keep=3)
    assert durations.retry_after(PAUSED, 0.0) == 1  # no history yet
    for seconds in (10.0, 12.0, 600.0):
        durations.record(PAUSED, seconds)
    assert durations.retry_after(PAUSED, 2.0) == 10  # the median, 12, less the 2 gone
    assert durations.retry_after(PAUSED, 30.0) == 1
    assert durations.retry_after(SLEEPING, 0.0) == 1
    for seconds in (1.0, 1.0, 1.0):
        durations.record(PAUSED, seconds)
    assert durations.retry_after(PAUSED, 0.2) == 1  # only the last `keep` count
