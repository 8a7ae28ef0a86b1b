"""The performance budget's verdict (bench/budget.py): pure, no callgrind."""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "bench"))

import budget  # noqa: E402

BUDGET = {"json": 800_000.0, "sse": 950_000.0, "generate": 1_000_000.0}


def test_a_count_grown_past_three_percent_fails_and_says_what_to_do() -> None:
    measured = {**BUDGET, "sse": 950_000 * 1.031}
    lines = budget.compare(BUDGET, measured)
    assert [line.scenario for line in budget.failed(lines)] == ["sse"]
    text = budget.report(lines)
    assert "perf-budget: FAILED: sse grew by more than 3%" in text
    assert "| sse | 950,000 | 979,450 | 1.031 | OVER |" in text
    assert "raises the budget in the same commit" in text


def test_counts_within_three_percent_or_smaller_pass() -> None:
    measured = {"json": 800_000 * 1.029, "sse": 900_000.0, "generate": 1_000_000.0}
    lines = budget.compare(BUDGET, measured)
    assert budget.failed(lines) == []
    assert "perf-budget: ok" in budget.report(lines)


def test_a_budgeted_scenario_left_unmeasured_fails_and_a_new_one_does_not() -> None:
    lines = budget.compare(BUDGET, {"json": 800_000.0, "sse": 950_000.0, "chat": 5.0})
    assert [line.scenario for line in budget.failed(lines)] == ["generate"]
    assert "| chat | - | 5 | - | new |" in budget.table(lines)


def test_the_budget_file_round_trips(tmp_path: Path) -> None:
    path = tmp_path / "budget.json"
    budget.write(path, {"json": 800_000.4}, {"python": "3.11.7"})
    doc = budget.load(path)
    assert doc["counts"] == {"json": 800_000}
    assert doc["tolerance"] == budget.TOLERANCE == 0.03
    assert doc["measured_on"] == {"python": "3.11.7"}


def test_the_checked_in_budget_has_the_three_scenarios() -> None:
    doc = budget.load(ROOT / "bench" / "budget.json")
    assert set(doc["counts"]) == {"json", "sse", "generate"}
    assert all(count > 100_000 for count in doc["counts"].values())
