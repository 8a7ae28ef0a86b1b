"""Processes the end-to-end tests start, each in its own group, and stop without leftovers.

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
import urllib.error
import urllib.request
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import TypeVar

ROOT = Path(__file__).resolve().parents[2]

_PR_SET_PDEATHSIG = 1
# Resolved once here: the child between fork and exec should do as little as possible.
_prctl = ctypes.CDLL(None, use_errno=True).prctl
_alive: set[ManagedProcess] = set()


def http_status(url: str, timeout: float = 2.0) -> int | None:
    """The status `url` answers with, or None when nothing answers."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as resp:
            return int(resp.status)
    except urllib.error.HTTPError as exc:
        return exc.code
    except (OSError, ValueError):
        return None


def _die_with_parent() -> None:
    # Runs in the child between fork and exec. PR_SET_PDEATHSIG fires when the forking *thread*
    # exits, so these processes must be started from the main thread (pytest's fixtures are).
    _prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)


def group_members(pgid: int) -> list[int]:
    """Live (non-zombie) processes whose process group is `pgid`."""
    members = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        # Fields after the parenthesised command: state, ppid, pgrp, ...
        fields = stat.rsplit(")", 1)[1].split()
        if fields[0] != "Z" and int(fields[2]) == pgid:
            members.append(int(entry.name))
    return members


def processes_with_args(*args: str) -> list[int]:
    """Live processes whose command line holds `args` as consecutive arguments (a zombie's is
    empty)."""
    wanted = "\0".join(args).encode()
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and int(entry.name) != os.getpid():
            with contextlib.suppress(OSError):
                cmdline = (entry / "cmdline").read_bytes()
                if b"\0" + wanted + b"\0" in b"\0" + cmdline:
                    found.append(int(entry.name))
    return found


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

    def start(self) -> None:
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

    def wait_until(self, url: str, expect: int = 200, deadline_s: float = 300.0) -> None:
        """Poll `url` until it answers `expect`; fail early if the process exits."""
        end = time.monotonic() + deadline_s
        while time.monotonic() < end:
            if not self.running:
                raise RuntimeError(f"{self!r} exited before {url} answered:\n{self.log_tail()}")
            if http_status(url) == expect:
                return
            time.sleep(0.25)
        raise RuntimeError(f"{self!r}: {url} not {expect} after {deadline_s} s:\n{self.log_tail()}")

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


P = TypeVar("P", bound=ManagedProcess)


@contextlib.contextmanager
def running(process: P) -> Iterator[P]:
    """Start `process`, and stop it whatever happens in the block (failure, Ctrl-C)."""
    try:
        process.start()
        yield process
    finally:
        process.stop()
