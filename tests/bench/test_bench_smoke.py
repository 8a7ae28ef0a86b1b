"""CI smoke of bench/run.py: it runs end to end and writes a well-formed report (no speed)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCENARIOS = {
    "json-c1", "json-c64", "sse-c1", "sse-c64", "ids8mb-c1", "sse500-c64", "rl-512", "held-2000",
}  # fmt: skip
REQUIRED = ("direct", "nginx", "baseline", "sidecar")

pytestmark = pytest.mark.slow
Bench = tuple[subprocess.CompletedProcess[str], Path]


@pytest.fixture(scope="module")
def bench(tmp_path_factory: pytest.TempPathFactory) -> Bench:
    out = tmp_path_factory.mktemp("bench")
    # Peers (vllm-router, LiteLLM) run only where their venvs already exist: --quick installs none.
    # The targets every code path of the runner needs (no proxy, a peer process, the baseline,
    # the sidecar, the scaling table), each cell half a second: a smoke, not a measurement.
    proc = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "run.py"), "--quick", "--big-mb", "1",
         "--targets", ",".join(REQUIRED), "--seconds", "0.5", "--scale", "1,2",
         "--out", str(out)],
        capture_output=True, text=True, timeout=600, check=False, cwd=ROOT,
    )  # fmt: skip
    return proc, out


def test_exits_zero_and_says_which_targets_ran(
    bench: Bench,
) -> None:
    proc, _ = bench
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    ran_line = next(line for line in proc.stdout.splitlines() if line.startswith("targets run:"))
    for name in REQUIRED:
        assert name in ran_line.partition(";")[0]


def test_json_report_has_every_cell_of_the_required_targets(
    bench: Bench,
) -> None:
    doc = json.loads((bench[1] / "results.json").read_text())
    assert doc["meta"]["quick"] is True
    assert doc["meta"]["big_bytes"] >= 1024 * 1024
    for name in REQUIRED:
        assert doc["targets"][name]["status"] == "ok"
        rows = {r["scenario"]: r for r in doc["runs"] if r["target"] == name}
        assert set(rows) == SCENARIOS
        for row in rows.values():
            assert row["status"] == "ok", row
            assert row["check"].startswith("200"), row
            assert row["requests"] > 0
            assert row["errors"] == dict.fromkeys(row["errors"], 0), row
            assert row["p50_us"] <= row["p99_us"]
            assert row["added_p50_us"] is not None
            assert set(row["sidecar_over_target"]) == {"rps", "added_p50", "cpu_per_1k", "rss"}
    for row in doc["runs"]:
        if row["target"] in ("nginx", "baseline", "sidecar") and row["status"] == "ok":
            # Counted in 10 ms clock ticks: nginx can hold 200 requests through a pause in less
            # than one, so for held-2000 only that the figure was taken.
            floor = 0 if row["scenario"] == "held-2000" else 1e-9
            assert row["cpu_ms_per_1k"] >= floor, row
            assert row["rss_mb"] > 1
    assert doc["targets"]["sidecar"]["idle_rss_mb"] > 1
    assert "goals" not in doc  # figures, not a pass/fail tally against targets


def test_markdown_report_has_the_glance_table_and_one_table_per_scenario(
    bench: Bench,
) -> None:
    md = (bench[1] / "results.md").read_text()
    assert "## At a glance" in md
    assert "targets (sidecar)" not in md
    for scenario in SCENARIOS:
        assert f"(`{scenario}`)" in md
    glance = md.split("## At a glance", 1)[1].split("\n## ", 1)[0]
    for label in ("direct to upstream", "nginx proxy_pass", "minimal aiohttp", "vllm-sidecar"):
        assert label in glance


def test_workers_scale_and_sse_cost_per_event_are_reported(bench: Bench) -> None:
    doc = json.loads((bench[1] / "results.json").read_text())
    workers = {row["workers"]: row for row in doc["workers"]}
    # --scale 1,2 on this project's 2-core machines: both rows, the second as a ratio.
    assert sorted(workers) == [1, 2]
    assert workers[1]["over_one"] is None
    assert len(workers[1]["idle_rss_each_mb"]) == 1  # one worker: the sidecar's own process
    assert workers[2]["rps"] > 0
    assert workers[2]["over_one"] == workers[2]["rps"] / workers[1]["rps"]
    assert len(workers[2]["idle_rss_each_mb"]) == 3  # the supervisor and two workers
    events = {row["target"]: row for row in doc["sse_per_event"]}
    assert events["sidecar"]["events_per_s"] == events["sidecar"]["rps"] * 500
    md = (bench[1] / "results.md").read_text()
    assert "## Worker processes" in md
    assert "## Cost per SSE event" in md


def test_rl_shaped_cells_time_every_event_and_every_held_request(bench: Bench) -> None:
    doc = json.loads((bench[1] / "results.json").read_text())
    rows = {(r["target"], r["scenario"]): r for r in doc["runs"]}
    for name in REQUIRED:
        rl, held = rows[(name, "rl-512")], rows[(name, "held-2000")]
        assert rl["requests"] > 512  # events timed: every stream sent several
        assert rl["gap_p50_us"] is not None
        assert held["requests"] == held["held"]  # every held request answered after the resume
    for name in ("baseline", "sidecar"):
        assert rows[(name, "rl-512")]["rss_per_stream_kb"] is not None
        assert rows[(name, "held-2000")]["rss_per_held_kb"] is not None
    md = (bench[1] / "results.md").read_text()
    assert "(`rl-512`)" in md
    assert "RSS per held request" in md


def test_the_chart_is_drawn(bench: Bench) -> None:
    proc, out = bench
    # make test-env builds it; without it the run says the chart was skipped, and this fails.
    assert (ROOT / ".venv-bench-chart" / "bin" / "python").exists(), (
        "no .venv-bench-chart: run scripts/test-env.d/60-bench.sh (make test-env)"
    )
    assert "chart: skipped" not in proc.stdout
    assert (out / "chart.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
