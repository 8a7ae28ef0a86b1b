"""The performance budget: instructions per request held against bench/budget.json (pure)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

TOLERANCE = 0.03  # a count may grow by 3% before the budget fails (DESIGN.md)

ADVICE = """\
What to do: find what grew with `bench/instructions.py --profile` (docs/performance.md).
A change that pays for a feature raises the budget in the same commit (`make perf-budget
UPDATE=1`), and the commit message says what the instructions buy. Otherwise, cut it."""


@dataclass(frozen=True)
class Line:
    """One scenario's budget against what was measured."""

    scenario: str
    budget: float | None  # None: a scenario the budget does not know yet
    measured: float | None  # None: a scenario the budget has and the run did not measure

    @property
    def ratio(self) -> float | None:
        if self.budget is None or self.measured is None:
            return None
        return self.measured / self.budget

    def over(self, tolerance: float = TOLERANCE) -> bool:
        """Over the budget: grown past the tolerance, or a budgeted scenario left unmeasured."""
        if self.measured is None:
            return True
        ratio = self.ratio
        return ratio is not None and ratio > 1 + tolerance


def compare(budget: dict[str, float], measured: dict[str, float]) -> list[Line]:
    """Each scenario of either side, in the budget's order, then any new ones."""
    names = list(budget) + [name for name in measured if name not in budget]
    return [Line(name, budget.get(name), measured.get(name)) for name in names]


def failed(lines: list[Line], tolerance: float = TOLERANCE) -> list[Line]:
    return [line for line in lines if line.over(tolerance)]


def _cell(value: float | None) -> str:
    return "-" if value is None else f"{value:,.0f}"


def table(lines: list[Line], tolerance: float = TOLERANCE) -> str:
    """The comparison as a Markdown table, each line marked ok, OVER or new."""
    rows = ["| scenario | budget | measured | ratio | |", "|---|---:|---:|---:|---|"]
    for line in lines:
        ratio = "-" if line.ratio is None else f"{line.ratio:.3f}"
        mark = "OVER" if line.over(tolerance) else ("new" if line.budget is None else "ok")
        cells = (line.scenario, _cell(line.budget), _cell(line.measured), ratio, mark)
        rows.append("| " + " | ".join(cells) + " |")
    return "\n".join(rows)


def report(lines: list[Line], tolerance: float = TOLERANCE) -> str:
    """The table, the verdict, and on a failure what to do about it."""
    bad = failed(lines, tolerance)
    out = [table(lines, tolerance), ""]
    if not bad:
        out.append(f"perf-budget: ok (each count within {tolerance:.0%} of bench/budget.json)")
        return "\n".join(out)
    names = ", ".join(line.scenario for line in bad)
    out.append(f"perf-budget: FAILED: {names} grew by more than {tolerance:.0%}.")
    out.append(ADVICE)
    return "\n".join(out)


def load(path: Path) -> dict[str, Any]:
    doc: dict[str, Any] = json.loads(path.read_text())
    return doc


def write(path: Path, counts: dict[str, float], meta: dict[str, Any]) -> None:
    """A new budget: the counts rounded to whole instructions, and what they were measured on."""
    doc = {
        "about": "Instructions per request (callgrind), `make perf-budget`; DESIGN.md.",
        "tolerance": TOLERANCE,
        "counts": {name: round(value) for name, value in counts.items()},
        "measured_on": meta,
    }
    path.write_text(json.dumps(doc, indent=2) + "\n")
