"""Worker processes (`--workers N`) in the bench: their targets, cores, and report sections."""

from __future__ import annotations

from typing import Any

from loads import LONG_SSE_EVENTS, SSE_EVENTS
from targets import Target, sidecar_workers

Row = dict[str, Any]


def cpu_list(spec: str | None) -> list[str]:
    """`taskset -c` syntax ("0", "1,3", "2-5") -> the cores, in order."""
    out: list[str] = []
    for part in (spec or "").split(","):
        first, _, last = part.partition("-")
        if first:
            out += [str(c) for c in range(int(first), int(last or first) + 1)]
    return out


def scaling_targets(
    scale: str | None, proxy_cpus: str | None, load_cpus: str | None
) -> list[Target]:
    """`--workers N` for each N of --scale, each on N cores: the proxy's first, then the load
    generator's (shared with it; the report says so). N above the machine's cores is dropped."""
    pool = cpu_list(proxy_cpus)
    pool += [c for c in cpu_list(load_cpus) if c not in pool]
    counts = [int(n) for n in (scale or "").split(",") if n]
    return [sidecar_workers(n, ",".join(pool[:n])) for n in counts if n <= max(len(pool), 1)]


def _find(rows: list[Row], target: str, scenario: str) -> Row | None:
    for row in rows:
        if row["target"] == target and row["scenario"] == scenario and row["status"] == "ok":
            return row
    return None


def _ratio(a: float | None, b: float | None) -> float | None:
    return None if a is None or not b else a / b


def _fmt(value: float | None, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def scaled(doc: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    """The scaling targets that ran, fewest workers first."""
    found = [(n, t) for n, t in doc["targets"].items() if t.get("workers") and t["status"] == "ok"]
    return sorted(found, key=lambda nt: int(nt[1]["workers"]))


def scaling_rows(doc: dict[str, Any], scenario: str = "json-c64") -> list[Row]:
    """Per scaling target: req/s, its ratio to one worker's, CPU per request, memory."""
    targets = scaled(doc)
    base = _find(doc["runs"], targets[0][0], scenario) if targets else None
    out = []
    for name, t in targets:
        row = _find(doc["runs"], name, scenario)
        rps = row["rps"] if row else None
        out.append(
            {
                "target": name,
                "workers": t["workers"],
                "cpus": t["cpus"],
                "shares_load_cpus": t["shares_load_cpus"],
                "rps": rps,
                "over_one": _ratio(rps, base["rps"]) if base and t["workers"] > 1 else None,
                "cpu_us": row["cpu_ms_per_1k"] if row else None,
                "idle_rss_mb": t.get("idle_rss_mb"),
                "idle_rss_each_mb": t.get("idle_rss_each_mb", []),
            }
        )
    return out


def scaling_markdown(doc: dict[str, Any]) -> list[str]:
    rows = scaling_rows(doc)
    if not rows:
        return []
    lines = [
        "",
        "## Worker processes (`--workers N`, json at 64 connections)",
        "",
        "N workers on N cores. Where those cores include the load generator's (the fake upstream",
        "and wrk), the workers compete with it, and the ratio understates what N free cores give.",
        "",
        "| workers | cores | shares the load's cores | req/s | ÷ 1 worker | CPU µs / req | "
        "idle RSS, all processes | idle RSS per process |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        each = ", ".join(f"{mb:.1f}" for mb in r["idle_rss_each_mb"]) or "-"
        lines.append(
            f"| {r['workers']} | {r['cpus'] or 'any'} | {'yes' if r['shares_load_cpus'] else 'no'}"
            f" | {_fmt(r['rps'], ',.0f')} | {_fmt(r['over_one'], '.2f')} | "
            f"{_fmt(r['cpu_us'], '.0f')} | {_fmt(r['idle_rss_mb'], '.1f')} MB | {each} MB |"
        )
    return lines


def per_event(doc: dict[str, Any]) -> list[Row]:
    """CPU per relayed SSE event: the difference between 500-event and 20-event streams."""
    out = []
    for name, t in doc["targets"].items():
        short = _find(doc["runs"], name, "sse-c64")
        long = _find(doc["runs"], name, "sse500-c64")
        if not (short and long) or short["cpu_ms_per_1k"] is None:
            continue
        extra = LONG_SSE_EVENTS - SSE_EVENTS
        out.append(
            {
                "target": name,
                "label": t["label"],
                "rps": long["rps"],
                "cpu_us_per_stream": long["cpu_ms_per_1k"],
                "cpu_us_per_event": (long["cpu_ms_per_1k"] - short["cpu_ms_per_1k"]) / extra,
                "events_per_s": long["rps"] * LONG_SSE_EVENTS,
            }
        )
    return out


def per_event_markdown(doc: dict[str, Any]) -> list[str]:
    rows = per_event(doc)
    if not rows:
        return []
    lines = [
        "",
        f"## Cost per SSE event ({LONG_SSE_EVENTS}-event streams against {SSE_EVENTS}-event "
        "ones, 64 connections)",
        "",
        "| target | streams / s | events / s | CPU µs / stream | CPU µs / extra event |",
        "|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['label']} | {r['rps']:,.0f} | {r['events_per_s']:,.0f} | "
            f"{r['cpu_us_per_stream']:,.0f} | {r['cpu_us_per_event']:.1f} |"
        )
    return lines
