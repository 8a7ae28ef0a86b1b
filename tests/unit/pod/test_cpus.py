"""How many workers `--workers 0` starts: the cgroup's CPU quota, then the affinity mask."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from proxy.pod.cpus import available_cpus, quota_cpus, worker_count


@pytest.mark.parametrize(
    ("cpu_max", "v1_quota", "v1_period", "cpus"),
    [
        ("max 100000\n", None, None, None),  # cgroup v2, no limit
        ("200000 100000\n", None, None, 2),  # a 2-CPU limit
        ("150000 100000\n", None, None, 2),  # 1.5 CPUs: a second worker still has work
        ("50000 100000\n", None, None, 1),  # half a CPU: one worker
        (None, "-1\n", "100000\n", None),  # cgroup v1, no limit
        (None, "400000\n", "100000\n", 4),
        (None, None, None, None),  # no cgroup files at all
    ],
)
def test_quota(
    cpu_max: str | None, v1_quota: str | None, v1_period: str | None, cpus: int | None
) -> None:
    assert quota_cpus(cpu_max, v1_quota, v1_period) == cpus


def test_a_quota_below_the_affinity_mask_wins(tmp_path: Path) -> None:
    (tmp_path / "cpu.max").write_text("100000 100000\n")
    assert available_cpus(tmp_path) == 1
    assert worker_count(0, tmp_path) == 1
    assert worker_count(3, tmp_path) == 3  # a number is taken as given


def test_without_a_quota_the_affinity_mask_counts_not_the_host(tmp_path: Path) -> None:
    assert available_cpus(tmp_path) == len(os.sched_getaffinity(0))
    (tmp_path / "cpu.max").write_text("6400000 100000\n")  # a limit above the mask
    assert available_cpus(tmp_path) == len(os.sched_getaffinity(0))
