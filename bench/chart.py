"""chart.png beside results.md: each scenario's CPU per request and added latency, per target.

Run by bench/run.py with a Python that has matplotlib (`.venv-bench-chart`, made on first use
from bench/proxies/requirements-peers.txt; the runner itself stays standard-library Python):
`python bench/chart.py results.json chart.png`. Two rows of small panels, one column per
scenario: CPU per request (per 1,000 events for rl-512), then added p50 latency over direct
(the per-token delay for rl-512). The sidecar's bar is drawn dark, so a reader sees at a
glance where it stands among its peers.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # after the backend is chosen

# Short names for the bars; anything else keeps its target name.
SHORT = {
    "direct": "direct",
    "nginx": "nginx",
    "router": "vllm-router",
    "litellm": "LiteLLM",
    "baseline": "aiohttp min",
    "sidecar": "sidecar",
}


def _cells(doc: dict[str, Any], scenario: str, field: str) -> list[tuple[str, float]]:
    out = []
    for row in doc["runs"]:
        if row["scenario"] != scenario or row["status"] != "ok" or row["target"] == "direct":
            continue
        value = row.get(field)
        if value is not None:
            out.append((SHORT.get(row["target"], row["target"]), float(value)))
    return out


def _color(name: str) -> str:
    if name == "sidecar":
        return "#1f3b73"
    return "#5b7fb8" if name.startswith("sidecar") else "#b9c9e0"  # a variant; a peer


def draw(doc: dict[str, Any], path: Path) -> Path:
    scenarios = [s for s in dict.fromkeys(r["scenario"] for r in doc["runs"]) if s != "held-2000"]
    if not scenarios:
        raise ValueError("no scenario to draw")
    fig, axes = plt.subplots(
        2, len(scenarios), figsize=(2.6 * len(scenarios) + 0.6, 6.2), squeeze=False
    )
    rows = (
        ("cpu_ms_per_1k", "CPU µs per request", 1.0),
        ("added_p50_us", "added p50 latency, µs", 1.0),
    )
    for col, scenario in enumerate(scenarios):
        for r, (field, label, scale) in enumerate(rows):
            ax = axes[r][col]
            cells = _cells(doc, scenario, field)
            names = [n for n, _ in cells]
            values = [v * scale for _, v in cells]
            colors = [_color(n) for n in names]
            ax.barh(names, values, color=colors)
            positive = [v for v in values if v > 0]
            if positive and max(positive) > 30 * min(positive):
                ax.set_xscale("log")  # LiteLLM next to nginx: a linear axis shows one bar
            ax.invert_yaxis()
            ax.tick_params(labelsize=7)
            if r == 0:
                ax.set_title(scenario, fontsize=9)
            if col == 0:
                ax.set_xlabel(label, fontsize=8)
            elif scenario in ("rl-512", "rl-2000"):
                ax.set_xlabel("per event" if r == 0 else "per token", fontsize=7)
            for y, v in enumerate(values):
                ax.text(v, y, f" {v:,.0f}", va="center", fontsize=6)
            ax.margins(x=0.25)
    meta = doc["meta"]
    fig.suptitle(
        f"vllm-sidecar bench {meta['started']} (commit {meta['commit']}): lower is better;"
        " a log axis where values span more than 30x",
        fontsize=10,
    )
    fig.tight_layout()
    fig.savefig(path, dpi=72)
    plt.close(fig)
    return path


def main() -> None:
    doc = json.loads(Path(sys.argv[1]).read_text())
    draw(doc, Path(sys.argv[2]))


if __name__ == "__main__":
    main()
