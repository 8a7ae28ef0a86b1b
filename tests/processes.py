"""Processes the tests start (fake or real vLLM, Prometheus; the sidecar's is tests/sidecar.py's
`SidecarProcess`), each in its own group.

Each process is started in a new session (its own process group), so stopping it reaches every
child vLLM forks (engine core, worker, resource tracker), and with a parent-death signal, so a
test run that dies without tearing down still takes them along. SIGKILL skips vLLM's own
cleanup of its shared-memory queues, so the /dev/shm files the group had mapped are removed
after it is gone. An atexit hook stops whatever a run left behind.
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import os
import signal
import subprocess
import time
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import TypeVar

from tests.procfs import group_members
from tests.support import http_status, wait_http_ok, wait_until

ROOT = Path(__file__).resolve().parents[1]

_PR_SET_PDEATHSIG = 1
# Resolved once here: the child between fork and exec should do as little as possible.
_prctl = ctypes.CDLL(None, use_errno=True).prctl
_alive: set[ManagedProcess] = set()


def _die_with_parent() -> None:
    # Runs in the child between fork and exec. PR_SET_PDEATHSIG fires when the forking *thread*
    # exits, so these processes must be started from the main thread (pytest's fixtures are).
    _prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)


def _shm_inodes(pids: Sequence[int]) -> set[int]:
    """Inodes of the /dev/shm files these processes have mapped.

    By inode, not by name: glibc creates a POSIX semaphore under a temporary name and renames it,
    so /proc/PID/maps shows a name that no longer exists.
    """
    found: set[int] = set()
    for pid in pids:
        with contextlib.suppress(OSError):
            for line in Path(f"/proc/{pid}/maps").read_text().splitlines():
                parts = line.split(maxsplit=5)
                if len(parts) == 6 and parts[5].startswith("/dev/shm/"):
                    found.add(int(parts[4]))
    return found


def _unlink_shm(inodes: set[int]) -> None:
    if not inodes:
        return
    with contextlib.suppress(OSError):
        for entry in os.scandir("/dev/shm"):
            with contextlib.suppress(OSError):
                if entry.inode() in inodes:
                    os.unlink(entry.path)


class ManagedProcess:
    """One command in its own process group, its output in a log file."""

    def __init__(
        self, name: str, argv: Sequence[str], env: Mapping[str, str], log_path: Path
    ) -> None:
        self.name = name
        self.argv = list(argv)
        self.env = dict(env)
        self.log_path = log_path
        self.proc: subprocess.Popen[bytes] | None = None

    def __repr__(self) -> str:
        pid = self.proc.pid if self.proc else None
        return f"<{type(self).__name__} {self.name} pid={pid}>"

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    @property
    def pid(self) -> int:
        assert self.proc is not None, f"{self!r} was never started"
        return self.proc.pid

    def send_signal(self, sig: signal.Signals) -> None:
        """Signal the process alone (a supervisor drains its workers itself), not its group."""
        assert self.proc is not None, f"{self!r} was never started"
        self.proc.send_signal(sig)

    def wait(self, timeout_s: float) -> int:
        """Its exit status, once it has exited; TimeoutExpired after `timeout_s`."""
        assert self.proc is not None, f"{self!r} was never started"
        return self.proc.wait(timeout_s)

    def start(self) -> None:
        """Start the process; subclasses also wait here until it serves."""
        self.spawn()

    def spawn(self) -> None:
        assert not self.running, f"{self!r} is already running"
        with self.log_path.open("ab") as log:
            self.proc = subprocess.Popen(
                self.argv,
                env=self.env,
                cwd=ROOT,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                preexec_fn=_die_with_parent,
            )
        _alive.add(self)

    def log_tail(self, chars: int = 4000) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-chars:]
        except OSError:
            return ""

    def check_alive(self) -> None:
        """Raise, with the end of the log, if the process has exited."""
        if not self.running:
            raise RuntimeError(f"{self!r} exited:\n{self.log_tail()}")

    def wait_until(self, url: str, expect: int = 200, deadline_s: float = 300.0) -> None:
        """Poll `url` until it answers `expect`; fail early if the process exits."""

        def answered() -> bool:
            self.check_alive()
            return http_status(url) == expect

        wait_until(answered, f"{self!r}: {url} answers {expect}\n{self.log_tail()}", deadline_s)

    async def serving(self, url: str, deadline_s: float = 30.0) -> None:
        """`wait_until` for a process whose peer runs in the caller's event loop."""
        await wait_http_ok(url, deadline_s, alive=self.check_alive)

    def signal_group(self, sig: signal.Signals) -> None:
        if self.proc is not None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, sig)

    def stop(self, grace_s: float = 20.0) -> None:
        """SIGTERM the group, SIGKILL what is left after `grace_s`; wait for all of it."""
        if self.proc is None:
            return
        shm = _shm_inodes(group_members(self.proc.pid))
        self.signal_group(signal.SIGTERM)
        if not self._wait_group_gone(grace_s):
            self.signal_group(signal.SIGKILL)
            self._wait_group_gone(30.0)
        self._forget(shm)

    def kill(self) -> None:
        """SIGKILL the whole group at once, as a crash would; wait until it is gone."""
        if self.proc is None:
            return
        shm = _shm_inodes(group_members(self.proc.pid))
        self.signal_group(signal.SIGKILL)
        self._wait_group_gone(30.0)
        self._forget(shm)

    def _wait_group_gone(self, timeout_s: float) -> bool:
        assert self.proc is not None
        end = time.monotonic() + timeout_s
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(timeout=timeout_s)
        while time.monotonic() < end:
            if not group_members(self.proc.pid):
                return True
            time.sleep(0.1)
        return not group_members(self.proc.pid)

    def _forget(self, shm: set[int]) -> None:
        leftover = group_members(self.proc.pid) if self.proc else []
        if leftover:
            raise RuntimeError(f"{self!r}: processes {leftover} outlived SIGKILL")
        _unlink_shm(shm)
        _alive.discard(self)
        self.proc = None


@atexit.register
def _stop_leftovers() -> None:
    for process in list(_alive):
        process.kill()


def spawn(args: list[str], log: Path, env: dict[str, str] | None = None) -> ManagedProcess:
    """Start `args` in its own process group, output to `log`, environment on top of ours."""
    process = ManagedProcess(Path(args[0]).name, args, {**os.environ, **(env or {})}, log)
    process.spawn()
    return process


P = TypeVar("P", bound=ManagedProcess)


@contextlib.contextmanager
def running(process: P) -> Iterator[P]:
    """Start `process`, and stop it whatever happens in the block (failure, Ctrl-C)."""
    try:
        process.start()
        yield process
    finally:
        process.stop()
