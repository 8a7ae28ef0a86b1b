#!/usr/bin/env python3
"""The flake hunt (`make flaky N=5`): the real-vLLM tiers and the load tier N times, and every test
that failed at least once, with how often and its first failure.

A test that fails one run in five fails CI one submission in five: this finds it before CI does.
Each round runs the 3.11 suite's `-m vllm` tests, then tests/skyrl04's, as `make test` runs them
(their own venvs), then the fake-upstream load tests (the chaos run, load, memory: timing-bound on
two cores too, and CI runs the chaos run twice), each into a JUnit XML file; the table is read
from those files. Exit 1 when any test failed in any round. Standard library only.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TIERS = {
    "suite": [".venv/bin/pytest", "-m", "vllm"],
    "skyrl04": [".venv-skyrl04/bin/pytest", "tests/skyrl04", "-m", "vllm"],
    "load": [".venv/bin/pytest", "tests/reliability", "-m", "slow and not vllm"],
}


def failures(report: Path) -> dict[str, str]:
    """test id -> the first line of its failure, from one JUnit XML report."""
    if not report.exists():
        return {f"<{report.stem}: no report>": "pytest wrote no report (it crashed?)"}
    found: dict[str, str] = {}
    for case in ET.parse(report).iter("testcase"):
        for outcome in ("failure", "error"):
            node = case.find(outcome)
            if node is not None:
                test = f"{case.get('classname', '')}::{case.get('name', '')}"
                message = (node.get("message") or node.text or outcome).strip()
                found[test] = f"{outcome}: {message.splitlines()[0][:200] if message else ''}"
    return found


def run_round(number: int, tiers: list[str], out: Path) -> dict[str, str]:
    failed: dict[str, str] = {}
    for tier in tiers:
        report = out / f"{tier}-{number}.xml"
        start = time.monotonic()
        argv = [*TIERS[tier], "-p", "no:cacheprovider", f"--junitxml={report}", "-q"]
        done = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, check=False)
        (out / f"{tier}-{number}.log").write_text(done.stdout + done.stderr)
        found = failures(report)
        failed.update(found)
        print(
            f"round {number} {tier}: exit {done.returncode}, {len(found)} failed,"
            f" {time.monotonic() - start:.0f} s",
            flush=True,
        )
    return failed


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("-n", "--rounds", type=int, default=5)
    tiers_help = "comma-separated: suite,skyrl04,load"
    parser.add_argument("--tiers", default=",".join(TIERS), help=tiers_help)
    parser.add_argument("--out", type=Path, help="keep the reports and logs here")
    args = parser.parse_args()
    tiers = args.tiers.split(",")
    out = args.out or Path(tempfile.mkdtemp(prefix="flaky-"))
    out.mkdir(parents=True, exist_ok=True)
    seen: dict[str, list[tuple[int, str]]] = defaultdict(list)
    for number in range(1, args.rounds + 1):
        for test, why in run_round(number, tiers, out).items():
            seen[test].append((number, why))
    print(f"\n{args.rounds} rounds of {', '.join(tiers)}; reports and logs in {out}")
    if not seen:
        print("no test failed in any round")
        return 0
    print("| test | failed | rounds | first failure |\n|---|---|---|---|")
    for test, runs in sorted(seen.items(), key=lambda item: -len(item[1])):
        rounds = ", ".join(str(n) for n, _ in runs)
        print(f"| `{test}` | {len(runs)} of {args.rounds} | {rounds} | {runs[0][1]} |")
    return 1


if __name__ == "__main__":
    sys.exit(main())
