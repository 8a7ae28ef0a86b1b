"""The differential harness's long run, on demand: `python bench/differential.py --examples N
--seed S` sends N generated upstream answers through the sidecar on both upstream clients and
prints how many were generated and which differed (tests/reliability/differential.py)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from hypothesis import HealthCheck, given, seed, settings

from tests.reliability.differential import ACCEPTED, answers, explain, peers


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--examples", type=int, default=2000)
    parser.add_argument("--seed", type=int, default=25)
    args = parser.parse_args()
    counts = {"generated": 0, "same": 0, "accepted": 0, "differ": 0}
    differences: list[str] = []

    with peers() as both:

        @seed(args.seed)
        @settings(
            max_examples=args.examples,
            deadline=None,
            database=None,
            suppress_health_check=list(HealthCheck),
        )
        @given(answer=answers())
        def run(answer: tuple[bytes, bool]) -> None:
            counts["generated"] += 1
            difference = explain(both.through_both(*answer))
            if difference is None:
                counts["same"] += 1
            elif difference in ACCEPTED:
                counts["accepted"] += 1
            else:
                counts["differ"] += 1
                differences.append(f"{answer[0][:300]!r}\n{difference[:600]}")

        run()
    print(" ".join(f"{k}={v}" for k, v in counts.items()))
    for text in differences[:20]:
        print("---\n" + text)
    return 1 if counts["differ"] else 0


if __name__ == "__main__":
    sys.exit(main())
