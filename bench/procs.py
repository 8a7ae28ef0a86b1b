"""Processes for the bench: free ports, pinned children, readiness, CPU time and RSS from /proc."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

CLK_TCK = os.sysconf("SC_CLK_TCK")
PAGE = os.sysconf("SC_PAGE_SIZE")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class Child:
    """One started process (and its process group), with its log file."""

    name: str
    popen: subprocess.Popen[bytes]
    log: Path

    @property
    def pid(self) -> int:
        return self.popen.pid

    def alive(self) -> bool:
        return self.popen.poll() is None

    def tail(self, n: int = 20) -> str:
        try:
            lines = self.log.read_text(errors="replace").splitlines()
        except OSError:
            return ""
        return "\n".join(lines[-n:])

    def stop(self, grace: float = 5.0) -> None:
        if not self.alive():
            return
        # Each child leads its own process group: stop it and whatever it forked, nothing else.
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.pid, signal.SIGTERM)
        try:
            self.popen.wait(grace)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.pid, signal.SIGKILL)
            self.popen.wait(5)


def spawn(
    name: str,
    argv: Sequence[str],
    *,
    cpus: str | None,
    log: Path,
    env: Mapping[str, str] | None = None,
    cwd: Path | None = None,
) -> Child:
    cmd = ["taskset", "-c", cpus, *argv] if cpus else list(argv)
    full_env = {**os.environ, **(env or {})}
    with log.open("ab") as out:
        popen = subprocess.Popen(
            cmd,
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=full_env,
            cwd=cwd,
            start_new_session=True,
        )
    return Child(name, popen, log)


def http(
    method: str,
    url: str,
    body: bytes | None = None,
    timeout: float = 30.0,
) -> tuple[int, dict[str, str], bytes]:
    """One request; returns (status, headers, body) for any HTTP status."""
    headers = {"Content-Type": "application/json"} if body is not None else {}
    req = urllib.request.Request(url, data=body, method=method, headers=headers)
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            return resp.status, {k.lower(): v for k, v in resp.headers.items()}, resp.read()
    except urllib.error.HTTPError as err:
        return err.code, {k.lower(): v for k, v in err.headers.items()}, err.read()


def wait_until(check: Callable[[], bool], child: Child | None, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if child is not None and not child.alive():
            raise RuntimeError(f"{what}: exited with {child.popen.returncode}\n{child.tail()}")
        try:
            if check():
                return
        except (OSError, urllib.error.URLError):
            pass
        time.sleep(0.2)
    tail = child.tail() if child else ""
    raise RuntimeError(f"{what}: not ready after {timeout:.0f} s\n{tail}")


def _stat_fields(pid: int) -> list[str] | None:
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # The command name may hold spaces and parentheses: split after the last ')'.
    return raw[raw.rindex(")") + 2 :].split()


def tree(pid: int) -> list[int]:
    """The pid and all its live descendants."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            fields = _stat_fields(int(entry))
            if fields:
                children.setdefault(int(fields[1]), []).append(int(entry))
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        todo.extend(children.get(p, []))
    return out


def cpu_seconds(pid: int) -> float:
    """User + system CPU of the process tree (fields 14 and 15 of /proc/<pid>/stat)."""
    ticks = 0
    for p in tree(pid):
        fields = _stat_fields(p)
        if fields:
            ticks += int(fields[11]) + int(fields[12])
    return ticks / CLK_TCK


def rss_bytes(pid: int) -> int:
    return sum(rss_each(pid))


def rss_each(pid: int) -> list[int]:
    """The RSS of the process and of each live descendant (a supervisor and its workers)."""
    out = []
    for p in tree(pid):
        fields = _stat_fields(p)
        if fields:
            out.append(int(fields[21]) * PAGE)
    return out


def settle(pid: int, *, busy: float = 0.05, limit: float = 20.0, step: float = 0.25) -> float:
    """Wait until the process tree is idle (under `busy` of a core), at most `limit` seconds.

    A slow target keeps working through its backlog after wrk stops; without this it would
    steal the core from the next target's cell. Returns the seconds waited.
    """
    start = time.monotonic()
    last = cpu_seconds(pid)
    while time.monotonic() - start < limit:
        time.sleep(step)
        now = cpu_seconds(pid)
        if now - last < busy * step:
            break
        last = now
    return time.monotonic() - start
