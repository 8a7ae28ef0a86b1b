#!/usr/bin/env python3
"""Instructions per request, counted by valgrind's callgrind: the same on a busy or an idle box.

wrk's req/s and /proc's CPU seconds move by 10-15% between runs on this shared 2-core machine,
which hides a change of a few percent. Callgrind counts the instructions the sidecar's process
executes, not time: the same count for the same code, inputs and environment. Each tree is
started under callgrind with collection off, warmed up, and counted over `--requests` requests
of each scenario (one connection, kept alive), sent to the bench's fake upstream (nginx + Lua,
bench/upstream/):

    PYTHONPATH=$PWD .venv/bin/python bench/instructions.py --tree before=/tmp/old --tree after=.

prints instructions per request for each tree and scenario and each tree's ratio to the first.
`--budget bench/budget.json` checks this tree against the budget (`make perf-budget`, exit 1
when a count grew by more than 3%); `--write-budget` writes the budget anew; `--profile` splits
one JSON and one SSE request by layer (bench/layers.py, docs/performance.md).
"""

from __future__ import annotations

import argparse
import os
import platform
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import budget as budgets
from counting import SCENARIOS, Counter, sidecar_argv
from targets import ROOT, Env, _version, start_upstream

BUDGET = ROOT / "bench" / "budget.json"


@contextmanager
def upstream_env(keep: Path | None = None) -> Iterator[Env]:
    """A run directory (`keep`, or a temporary one) and the fake upstream, stopped at the end."""
    with tempfile.TemporaryDirectory(prefix="instructions-") as tmp:
        run = keep or Path(tmp)
        run.mkdir(parents=True, exist_ok=True)
        upstream = start_upstream(env := Env(run, None, None))
        try:
            yield env
        finally:
            upstream.stop()


def compare_trees(trees: list[tuple[str, Path]], requests: int, keep: Path | None) -> int:
    with upstream_env(keep) as env:
        counts = {
            label: Counter(env, requests).count(sidecar_argv(env, tree), tree, SCENARIOS)
            for label, tree in trees
        }
    first = counts[trees[0][0]]
    print(f"| tree | {' | '.join(f'{s} instructions / request' for s in SCENARIOS)} | ratio |")
    print(f"|---|{'---|' * len(SCENARIOS)}---|")
    for label, per in counts.items():
        ratios = ", ".join(f"{per[s] / first[s]:.3f}" for s in SCENARIOS)
        cells = " | ".join(f"{per[s]:,.0f}" for s in SCENARIOS)
        print(f"| {label} | {cells} | {ratios} |")
    return 0


def measured_on() -> dict[str, str]:
    """What a count depends on besides the code: the interpreter and the libraries' builds."""
    python = ROOT / ".venv" / "bin" / "python"
    libs = {name: _version(python, name) for name in ("aiohttp", "multidict", "yarl", "uvloop")}
    argv = [str(python), "-c", "import platform; print(platform.python_version())"]
    version = subprocess.run(argv, capture_output=True, text=True, check=True).stdout.strip()
    return {"python": version, "machine": platform.machine(), **libs}


def check_budget(path: Path, requests: int, write: bool, keep: Path | None) -> int:
    with upstream_env(keep) as env:
        measured = Counter(env, requests).count(sidecar_argv(env, ROOT), ROOT, SCENARIOS)
    meta = measured_on()
    if write:
        budgets.write(path, measured, meta)
        print(budgets.table(budgets.compare(measured, measured)))
        print(f"perf-budget: wrote {path}; say why in the commit message.")
        return 0
    doc = budgets.load(path)
    lines = budgets.compare(doc["counts"], measured)
    print(budgets.report(lines, doc.get("tolerance", budgets.TOLERANCE)))
    if doc.get("measured_on") != meta:
        print(f"note: the budget was measured on {doc.get('measured_on')}, this run on {meta}:")
        print("      a count can move with the interpreter's or a library's build alone.")
    return 1 if budgets.failed(lines, doc.get("tolerance", budgets.TOLERANCE)) else 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    mode = parser.add_mutually_exclusive_group(required=True)
    mode.add_argument("--tree", action="append", metavar="LABEL=DIR")
    mode.add_argument("--budget", type=Path, nargs="?", const=BUDGET, metavar="JSON")
    mode.add_argument("--write-budget", type=Path, nargs="?", const=BUDGET, metavar="JSON")
    mode.add_argument("--profile", action="store_true", help="by layer: docs/performance.md")
    parser.add_argument("--requests", type=int, default=1000)
    parser.add_argument(
        "--keep", type=Path, metavar="DIR", help="keep the callgrind dumps (callgrind_annotate)"
    )
    args = parser.parse_args()
    if args.profile:
        import layers  # only the profile needs Python 3.12's perf trampolines

        with upstream_env(args.keep) as env:
            print(layers.profile(env, args.requests))
        return 0
    if args.budget or args.write_budget:
        path, write = args.budget or args.write_budget, bool(args.write_budget)
        return check_budget(path, args.requests, write, args.keep)
    trees = [(label, Path(path).resolve()) for label, path in (t.split("=", 1) for t in args.tree)]
    return compare_trees(trees, args.requests, args.keep)


if __name__ == "__main__":
    os.environ.setdefault("PYTHONHASHSEED", "0")
    sys.exit(main())
