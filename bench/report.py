"""The results writer: JSON and Markdown, every ratio against the sidecar."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import scaling
from loads import SCENARIOS

Row = dict[str, Any]
REF = "sidecar"


def us(value: float | None) -> str:
    if value is None:
        return "-"
    if abs(value) >= 1000:
        return f"{value / 1000:.2f} ms"
    return f"{value:.0f} µs"


def num(value: float | None, digits: int = 0) -> str:
    if value is None:
        return "-"
    return f"{value:,.{digits}f}"


def mb(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f} MB"


def ratio(a: float | None, b: float | None) -> float | None:
    # Added latencies near zero (nginx) or below it (noise) make no meaningful ratio.
    if a is None or b is None or b <= 0 or a < 0:
        return None
    return a / b


def rx(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}x"


def find(rows: list[Row], target: str, scenario: str) -> Row | None:
    for row in rows:
        if row["target"] == target and row["scenario"] == scenario and row["status"] == "ok":
            return row
    return None


def add_derived(rows: list[Row]) -> None:
    """Added latency over direct, and the sidecar's ratios to each target, per scenario."""
    ok = [row for row in rows if row["status"] == "ok"]
    for row in ok:
        direct = find(rows, "direct", row["scenario"])
        for q in ("p50", "p99"):
            base = direct[f"{q}_us"] if direct else None
            row[f"added_{q}_us"] = None if base is None else row[f"{q}_us"] - base
    for row in ok:
        ref = find(rows, REF, row["scenario"]) or {}
        row["sidecar_over_target"] = {
            key: ratio(ref.get(field), row.get(field))
            for key, field in (
                ("rps", "rps"),
                ("added_p50", "added_p50_us"),
                ("cpu_per_1k", "cpu_ms_per_1k"),
                ("rss", "rss_mb"),
            )
        }


def markdown(doc: dict[str, Any]) -> str:
    rows: list[Row] = doc["runs"]
    targets: dict[str, Any] = doc["targets"]
    meta = doc["meta"]
    lines = [
        f"# vllm-sidecar bench, {meta['started']}",
        "",
        f"Commit `{meta['commit']}`, {meta['cores']} cores; proxy under test on CPU "
        f"{meta['proxy_cpus']}, fake upstream (nginx+Lua) and wrk on CPU {meta['load_cpus']}; "
        f"{meta['seconds']:g} s per cell after {meta['warmup']:g} s warm-up, targets taking "
        f"turns per scenario, best of {meta.get('rounds', 1)} round(s). Ratios are "
        "sidecar ÷ target from this one run (req/s: above 1 means the sidecar is faster; "
        "added latency and CPU: below 1 means the sidecar costs less).",
        "",
        "| target | version | aliasing | ran | idle RSS | RSS at the end |",
        "|---|---|---|---|---|---|",
    ]
    for t in targets.values():
        alias = "rewrites HF path" if t["aliasing"] else "sent the served name"
        ran = "yes" if t["status"] == "ok" else f"no: {t['reason']}"
        lines.append(
            f"| {t['label']} | {t.get('version') or '-'} | {alias} | {ran} | "
            f"{mb(t.get('idle_rss_mb'))} | {mb(t.get('final_rss_mb'))} |"
        )
    lines += ["", "## At a glance", ""]
    lines += [
        "| target | req/s at 64 conn | p50 at 1 conn | added p50 | SSE req/s at 64 | "
        "8 MB added p50 | CPU ms / 1k req (64 conn) | sidecar ÷ target req/s (64 conn) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for name, t in targets.items():
        if t["status"] != "ok":
            continue
        c64, c1 = find(rows, name, "json-c64"), find(rows, name, "json-c1")
        sse, big = find(rows, name, "sse-c64"), find(rows, name, "ids8mb-c1")
        lines.append(
            f"| {t['label']} | {num(c64 and c64['rps'])} | {us(c1 and c1['p50_us'])} | "
            f"{us(c1 and c1.get('added_p50_us'))} | {num(sse and sse['rps'])} | "
            f"{us(big and big.get('added_p50_us'))} | {num(c64 and c64['cpu_ms_per_1k'], 1)} | "
            f"{rx(c64 and c64['sidecar_over_target']['rps'])} |"
        )
    for sname, scen in SCENARIOS.items():
        cells = [r for r in rows if r["scenario"] == sname]
        if not cells or scen.kind != "wrk":
            continue
        header = (
            "| target | req/s | p50 | p99 | added p50 | added p99 | CPU ms / 1k req | RSS after | "
            "sidecar ÷ target: req/s | added p50 | CPU | check |"
        )
        lines += _section(f"## {scen.label} (`{sname}`)", None, header, cells, targets, _wrk_line)
    lines += rl_markdown(rows, targets)
    lines += scaling.scaling_markdown(doc)
    lines += scaling.per_event_markdown(doc)
    return "\n".join(lines) + "\n"


def rl_markdown(rows: list[Row], targets: dict[str, Any]) -> list[str]:
    """The RL-shaped sections of results.md."""
    lines: list[str] = []
    for name, (intro, header, line) in PACED_TABLES.items():
        cells = [r for r in rows if r["scenario"] == name]
        if cells:
            title = f"## {SCENARIOS[name].label} (`{name}`)"
            lines += _section(title, intro, header, cells, targets, line)
    return lines


def _section(
    title: str,
    intro: str | None,
    header: str,
    cells: list[Row],
    targets: dict[str, Any],
    line: Callable[[Row], str],
) -> list[str]:
    """One scenario's table: a row per target, its figures or why it has none."""
    columns = header.count("|") - 1
    lines = ["", title, "", *([intro, ""] if intro else []), header, "|" + "---|" * columns]
    for r in cells:
        label = targets[r["target"]]["label"]
        if r["status"] != "ok":
            lines.append(f"| {label} | {r['status']}: {r.get('reason')} |" + " |" * (columns - 2))
        else:
            lines.append(f"| {label} | {line(r)}")
    return lines


def _wrk_line(r: Row) -> str:
    s = r["sidecar_over_target"]
    return (
        f"{num(r['rps'])} | {us(r['p50_us'])} | {us(r['p99_us'])} | "
        f"{us(r.get('added_p50_us'))} | {us(r.get('added_p99_us'))} | "
        f"{num(r['cpu_ms_per_1k'], 1)} | {mb(r['rss_mb'])} | {rx(s['rps'])} | "
        f"{rx(s['added_p50'])} | {rx(s['cpu_per_1k'])} | {r['check']} |"
    )


def _rl_line(r: Row) -> str:
    cpu = r.get("sidecar_over_target", {}).get("cpu_per_1k")
    return (
        f"{num(r['rps'])} | {us(r['p50_us'])} | {us(r['p99_us'])} | "
        f"{us(r.get('added_p50_us'))} | {us(r.get('added_p99_us'))} | {us(r['gap_p99_us'])} | "
        f"{num(r['cpu_ms_per_1k'], 1)} | {kb(r['rss_per_stream_kb'])} | "
        f"{'-' if cpu is None else f'{cpu:.2f}x'} | {r['check']} |"
    )


def _held_line(r: Row) -> str:
    return (
        f"{r['held']:,} | {mb(r['rss_mb'])} | {kb(r['rss_per_held_kb'])} | "
        f"{us(r['p50_us'])} | {us(r['p99_us'])} | {num(r['cpu_ms_per_1k'], 1)} | "
        f"{r['check']} |"
    )


# Each RL-shaped scenario's table: what its figures mean, its columns, a target's row.
PACED_TABLES: dict[str, tuple[str, str, Callable[[Row], str]]] = {
    "rl-512": (
        "Delay: from the fake upstream writing a token's event to the client reading it; "
        "added: over direct's. Gap p99: a token's arrival gap less the upstream's own gap "
        "(jitter). RSS per stream: the peak during the window less the RSS before, / 512.",
        "| target | events/s | delay p50 | delay p99 | added p50 | added p99 | gap p99 | "
        "CPU ms / 1k events | RSS per open stream | sidecar ÷ target: CPU | check |",
        _rl_line,
    ),
    "rl-2000": (
        "Delay: from the fake upstream writing a token's event to the client reading it; "
        "added: over direct's. Gap p99: a token's arrival gap less the upstream's own gap "
        "(jitter). RSS per stream: the peak during the window less the RSS before, / 2,000.",
        "| target | events/s | delay p50 | delay p99 | added p50 | added p99 | gap p99 | "
        "CPU ms / 1k events | RSS per open stream | sidecar ÷ target: CPU | check |",
        _rl_line,
    ),
    "held-2000": (
        "The sidecar holds the requests itself (paused through its /pause); the others "
        "have passed them on to the paused fake upstream, which holds them as vLLM would. "
        "Latency: from the resume to each answer.",
        "| target | held | RSS while held | RSS per held request | p50 | p99 | "
        "CPU ms / 1k requests | check |",
        _held_line,
    ),
}


def kb(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f} KB"


def write(doc: dict[str, Any], out_dir: Path) -> tuple[Path, Path]:
    add_derived(doc["runs"])
    doc["workers"] = scaling.scaling_rows(doc)
    doc["sse_per_event"] = scaling.per_event(doc)
    json_path, md_path = out_dir / "results.json", out_dir / "results.md"
    json_path.write_text(json.dumps(doc, indent=2) + "\n")
    md_path.write_text(markdown(doc))
    return json_path, md_path
