"""The process manager behind the vLLM fixtures leaves nothing running and nothing in /dev/shm."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.processes import ManagedProcess, running
from tests.procfs import group_members
from tests.support import wait_until

# A parent that forks a child into its group and maps a shared-memory file, like vLLM's API
# server with its engine core; `ignore_term` makes it shrug off SIGTERM, like a stuck worker.
TREE = """
import signal, subprocess, sys, time
from multiprocessing import shared_memory
if sys.argv[1] == "ignore_term":
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
shm = shared_memory.SharedMemory(create=True, size=4096)
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
print(shm.name, child.pid, flush=True)
time.sleep(600)
"""


def start_tree(tmp_path: Path, mode: str) -> tuple[ManagedProcess, Path]:
    proc = ManagedProcess("tree", [sys.executable, "-c", TREE, mode], {}, tmp_path / "tree.log")
    proc.start()
    wait_until(lambda: proc.log_tail().strip(), "the tree prints its shm name", 30)
    shm_name = proc.log_tail().split()[0]
    shm = Path("/dev/shm") / shm_name
    assert shm.exists()
    assert proc.proc is not None
    assert len(group_members(proc.proc.pid)) >= 2
    return proc, shm


@pytest.mark.parametrize("mode", ["plain", "ignore_term"])
def test_stop_ends_the_whole_group(tmp_path: Path, mode: str) -> None:
    proc, shm = start_tree(tmp_path, mode)
    assert proc.proc is not None
    pgid = proc.proc.pid
    proc.stop(grace_s=1.0)
    assert group_members(pgid) == []
    assert not shm.exists()
    assert not proc.running


def test_kill_ends_the_whole_group_and_its_shared_memory(tmp_path: Path) -> None:
    proc, shm = start_tree(tmp_path, "plain")
    assert proc.proc is not None
    pgid = proc.proc.pid
    proc.kill()
    assert group_members(pgid) == []
    assert not shm.exists()


def test_running_stops_on_keyboard_interrupt(tmp_path: Path) -> None:
    proc = ManagedProcess("sleep", ["sleep", "600"], {"PATH": "/usr/bin:/bin"}, tmp_path / "s.log")
    pgids: list[int] = []

    def interrupted_block() -> None:
        with running(proc):
            assert proc.proc is not None
            pgids.append(proc.proc.pid)
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        interrupted_block()
    assert len(pgids) == 1
    assert group_members(pgids[0]) == []


def test_a_killed_test_run_takes_its_processes_along(tmp_path: Path) -> None:
    # A stand-in for a pytest run that is SIGKILLed: no finalizer, no atexit hook runs.
    root, log = str(Path(__file__).resolve().parents[2]), str(tmp_path / "s.log")
    runner = f"""
import sys
sys.path.insert(0, {root!r})
from pathlib import Path
from tests.processes import ManagedProcess
proc = ManagedProcess("sleep", ["sleep", "600"], {{"PATH": "/usr/bin:/bin"}}, Path({log!r}))
proc.start()
print(proc.proc.pid, flush=True)
sys.stdin.read()
"""
    with subprocess.Popen(
        [sys.executable, "-c", runner], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    ) as parent:
        assert parent.stdout is not None
        pgid = int(parent.stdout.readline())
        assert group_members(pgid) != []
        parent.kill()
    wait_until(lambda: not group_members(pgid), "the orphaned group is gone", 30)
