"""The long chaos run of issue 20, on demand: `.venv/bin/python bench/chaos.py --seed 20
--seconds 300` (ledger, summary and the sidecar's log in --out, or a temporary directory).

The harness is tests/chaos/ (the CI runs a short one: tests/reliability/test_chaos.py)."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository: tests/, proxy/

from tests.chaos.run import main

if __name__ == "__main__":
    sys.exit(main())
