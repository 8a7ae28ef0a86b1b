"""The resource check: the supervisor's and each live worker's RSS and open descriptors, back
to their own start once the chaos is over."""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING

from tests.procfs import children
from tests.support import eventually

from .checks import Check

if TYPE_CHECKING:
    from .faults import Chaos

MiB = 1 << 20
FD_SLACK = 3  # per process: the health check's and a pooled upstream connection, open or not
RSS_SLACK = 16 * MiB  # per process over its own start: arenas after MB bodies (seen: 0-2.4 MiB)


def usage(pid: int) -> tuple[int, int]:
    """A process's resident memory (bytes) and open descriptors."""
    rss = 0
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            rss = int(line.split()[1]) * 1024
    return rss, len(os.listdir(f"/proc/{pid}/fd"))


async def returned(chaos: Chaos) -> dict[int, dict[str, int]]:
    """Each live process's start and end, once within the tolerance or at the deadline."""
    live = [chaos.supervisor, *children(chaos.supervisor)]

    def within() -> bool:
        return all(_within(chaos.start_usage[pid], usage(pid)) for pid in live)

    try:
        await eventually(within, "RSS and descriptors back to their start", within=60, every=0.5)
    except AssertionError:
        pass  # the check below says by how much
    return {
        pid: {
            "rss_start": chaos.start_usage[pid][0],
            "fds_start": chaos.start_usage[pid][1],
            "rss_end": usage(pid)[0],
            "fds_end": usage(pid)[1],
        }
        for pid in live
    }


def _within(start: tuple[int, int], end: tuple[int, int]) -> bool:
    return end[0] <= start[0] + RSS_SLACK and end[1] <= start[1] + FD_SLACK


def resources_check(resources: dict[int, dict[str, int]]) -> Check:
    check = Check(
        "RSS and open descriptors return to their start",
        detail=f"(tolerance {RSS_SLACK // MiB} MiB, {FD_SLACK} fds a process)",
    )
    for pid, r in resources.items():
        if not _within((r["rss_start"], r["fds_start"]), (r["rss_end"], r["fds_end"])):
            check.problems.append(f"pid {pid}: {r}")
    return check
