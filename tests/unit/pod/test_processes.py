"""A worker's process as the supervisor runs it (`proxy/pod/processes.py`): the restart backoff
docs/workers.md promises, and how an exit reads in the log."""

from __future__ import annotations

import signal

from proxy.pod.processes import MAX_BACKOFF, STEADY, describe, quick_deaths, restart_delay


def test_a_worker_that_keeps_dying_fast_waits_longer_each_time_up_to_five_seconds() -> None:
    quick, delays = 0, []
    for _ in range(8):
        quick = quick_deaths(STEADY / 2, quick)
        delays.append(restart_delay(quick))
    assert delays == [0.2, 0.4, 0.8, 1.6, 3.2, 5.0, 5.0, 5.0]
    assert MAX_BACKOFF == 5.0


def test_a_worker_that_ran_steadily_is_started_again_at_once() -> None:
    assert quick_deaths(STEADY, before=5) == 0
    assert restart_delay(0) == 0.0


def test_an_exit_reads_as_its_signal_or_its_status() -> None:
    assert describe(-signal.SIGKILL) == "SIGKILL"
    assert describe(3) == "status 3"
    assert describe(-200) == "status -200"  # no such signal
