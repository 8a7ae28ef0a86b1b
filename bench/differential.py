"""The differential harness's long run (issue 25), on demand: generated upstream answers and
client requests through the sidecar on the lean hop, on aiohttp's client and through nginx
(tests/differential/). Prints the cases generated, the accepted differences by rule, and each
kind of open difference with a reproducer; exits 1 when any is open.

    PYTHONPATH=$PWD .venv/bin/python bench/differential.py --examples 2000 --seed 25
"""

from __future__ import annotations

import argparse
import re
import sys
import tempfile
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tests.differential.compare import Difference
from tests.differential.peers import running
from tests.differential.run import Outcome, Tally, sweep


def kind_of(difference: Difference) -> str:
    """One line per kind of difference: its aspect and which hops agreed."""
    aspect = re.sub(r"x-f\d+", "x-f<n>", difference.aspect)
    groups: dict[str, list[str]] = defaultdict(list)
    for hop, value in difference.values:
        groups[value].append(hop)
    return f"{aspect}: " + " | ".join(sorted("=".join(hops) for hops in groups.values()))


def report(kind: str, tally: Tally, show: int) -> None:
    print(f"\n== {kind}: {tally.cases} cases, {tally.alike} alike, {len(tally.open)} open")
    for name, count in tally.accepted.most_common():
        print(f"  accepted {count:5}  {name}")
    kinds: dict[str, list[Outcome]] = defaultdict(list)
    for outcome in tally.open:
        for line in {kind_of(difference) for difference in outcome.open}:
            kinds[line].append(outcome)
    for line, outcomes in sorted(kinds.items(), key=lambda item: -len(item[1])):
        print(f"  open {len(outcomes):5}  {line}")
        for outcome in outcomes[:show]:
            print("    " + outcome.report().replace("\n", "\n    "))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--examples", type=int, default=2000, help="cases of each kind")
    parser.add_argument(
        "--seed", type=int, help="hypothesis's seed (none: the short test's cases, derandomized)"
    )
    parser.add_argument("--kind", choices=["answers", "requests", "both"], default="both")
    parser.add_argument("--show", type=int, default=1, help="reproducers per kind of difference")
    parser.add_argument("--source", type=Path, help="run the sidecars from this checkout's proxy/")
    parser.add_argument("--no-nginx", action="store_true", help="compare the two sidecars only")
    args = parser.parse_args()
    kinds = ["answers", "requests"] if args.kind == "both" else [args.kind]
    open_ = 0
    with (
        tempfile.TemporaryDirectory(prefix="differential-") as run_dir,
        running(Path(run_dir), source=args.source, nginx=not args.no_nginx) as peers,
    ):
        seed = "derandomized" if args.seed is None else f"seed {args.seed}"
        print(f"hops: {', '.join(peers.hops)}; {seed}; {args.examples} cases each")
        for kind in kinds:
            tally = sweep(peers, kind, args.examples, seed=args.seed)
            report(kind, tally, args.show)
            open_ += len(tally.open)
    return 1 if open_ else 0


if __name__ == "__main__":
    sys.exit(main())
