"""What /proc says about live processes: a group's members, a process's children, its open file
descriptors and resident memory, the processes running a command."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from pathlib import Path


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
