"""The chaos run of issue 20, short and seeded: every kind of client against `--workers 2` in
front of a vLLM that restarts, pauses, sleeps, syncs weights, resets and errs, while workers are
killed; every request in the ledger, every ledger check must hold. The harness is tests/chaos/;
the long run is bench/chaos.py (docs/chaos.md)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.chaos.clients import KINDS
from tests.chaos.faults import ACTIONS
from tests.chaos.run import Config, run

# Part of every run (about 50 s); `-m "not slow"` leaves it out with the other load tests.
pytestmark = [pytest.mark.slow, pytest.mark.timeout(400)]

SEED = 20
SECONDS = 40.0


async def test_a_seeded_chaos_run_passes_every_ledger_check(tmp_path: Path) -> None:
    config = Config(SEED, SECONDS, lanes=6, out=tmp_path / "chaos", kill_every=(7.0, 12.0))
    report = await run(config)
    assert report.failed == [], report.describe()
    summary = report.summary
    # The chaos did happen: each client kind, each fault of the fake, each engine action, kills.
    assert set(summary["by_kind"]) >= {*KINDS, "control"}, summary["by_kind"]
    assert set(summary["chaos"]) >= {*ACTIONS, "kill", "replaced"}, summary["chaos"]
    faults = {"ok", "slow", "error", "reset_head", "reset_body", "cut_event", "stream_error"}
    assert set(summary["upstream_faults"]) == faults, summary["upstream_faults"]
    assert summary["by_outcome"].get("lost", 0) + summary["by_outcome"]["hung_up"] > 0
