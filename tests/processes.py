"""Processes the tests start (sidecar, fake or real vLLM, Prometheus), each in its own group.

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
import sys
import time
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import TypeVar

from tests.support import free_port, http_status, wait_http_ok, wait_until

ROOT = Path(__file__).resolve().parents[1]

_PR_SET_PDEATHSIG = 1
# Resolved once here: the child between fork and exec should do as little as possible.
_prctl = ctypes.CDLL(None, use_errno=True).prctl
_alive: set[ManagedProcess] = set()


def _die_with_parent() -> None:
    # Runs in the child between fork and exec. PR_SET_PDEATHSIG fires when the forking *thread*
    # exits, so these processes must be started from the main thread (pytest's fixtures are).
    _prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)


def _live() -> Iterator[tuple[int, list[str]]]:
    """Each live (non-zombie) process: its pid, and the fields of its /proc stat after the
    parenthesised command (state, ppid, pgrp, ...)."""
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        fields = stat.rsplit(")", 1)[1].split()
        if fields[0] != "Z":
            yield int(entry.name), fields


def group_members(pgid: int) -> list[int]:
    """Live processes whose process group is `pgid`."""
    return [pid for pid, fields in _live() if int(fields[2]) == pgid]


def children(pid: int) -> list[int]:
    """Live children of `pid`, in pid order: a supervisor's workers."""
    return sorted(child for child, fields in _live() if int(fields[1]) == pid)


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


def fd_count(pid: int) -> int:
    """Open file descriptors of a process."""
    return len(os.listdir(f"/proc/{pid}/fd"))


def rss_bytes(pid: int) -> int:
    """Resident memory of a process, from /proc/<pid>/status."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError(f"no VmRSS for pid {pid}")


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


class SidecarProcess(ManagedProcess):
    """The sidecar, started through its CLI (`python -m proxy`) in the test venv."""

    def __init__(self, upstream_url: str, run_dir: Path, *extra_args: str) -> None:
        self.port = free_port()
        self.admin_port = free_port()
        argv = [
            os.environ.get("SIDECAR_PYTHON", sys.executable),
            "-m",
            "proxy",
            "--upstream-url",
            upstream_url,
            "--host",
            "127.0.0.1",
            "--port",
            str(self.port),
            "--admin-port",
            str(self.admin_port),
            *extra_args,
        ]
        env = {k: v for k, v in os.environ.items() if not k.startswith("VLLM_SIDECAR_")}
        super().__init__("sidecar", argv, env, run_dir / f"sidecar-{self.port}.log")

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def admin_url(self) -> str:
        return f"http://127.0.0.1:{self.admin_port}"

    def start(self) -> None:
        self.spawn()
        self.wait_until(f"{self.admin_url}/readyz", deadline_s=60)

    async def start_serving(self) -> None:
        """Start, and wait for readiness without blocking the loop the upstream may run in."""
        self.spawn()
        await self.serving(f"{self.admin_url}/readyz", deadline_s=60)
