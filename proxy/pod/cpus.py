"""How many CPUs this process may use: the cgroup's CPU quota and the scheduler's affinity."""

from __future__ import annotations

import math
import os
from pathlib import Path

CGROUP = Path("/sys/fs/cgroup")


def quota_cpus(cpu_max: str | None, cfs_quota: str | None, cfs_period: str | None) -> int | None:
    """CPUs a CFS quota allows, rounded up; None when there is no quota.

    cgroup v2 writes `cpu.max` as `<quota> <period>` or `max <period>`; cgroup v1 has
    `cpu.cfs_quota_us` (-1: none) and `cpu.cfs_period_us`. Kubernetes sets them from a CPU limit.
    """
    if cpu_max is not None:
        quota, _, period = cpu_max.strip().partition(" ")
        if quota == "max" or not period:
            return None
        return max(1, math.ceil(int(quota) / int(period)))
    if cfs_quota is None or cfs_period is None or int(cfs_quota) <= 0:
        return None
    return max(1, math.ceil(int(cfs_quota) / int(cfs_period)))


def _read(path: Path) -> str | None:
    try:
        return path.read_text()
    except (OSError, ValueError):
        return None


def available_cpus(root: Path = CGROUP) -> int:
    """The CPUs this process can run on, capped by its cgroup's quota; os.cpu_count() is the
    host's, which in a container with a 2-CPU limit on a 96-core node would mean 96 workers."""
    try:
        cpus = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # pragma: no cover - not Linux
        cpus = os.cpu_count() or 1
    v1 = root / "cpu"
    quota = quota_cpus(
        _read(root / "cpu.max"), _read(v1 / "cpu.cfs_quota_us"), _read(v1 / "cpu.cfs_period_us")
    )
    return max(1, min(cpus, quota or cpus))


def worker_count(requested: int, root: Path = CGROUP) -> int:
    """`--workers`: a number as given, or 0 for one per available CPU."""
    return requested if requested > 0 else available_cpus(root)
