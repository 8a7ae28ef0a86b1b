#!/usr/bin/env python3
"""Bench the sidecar against its peers, side by side in one run: `python3 bench/run.py`.

Starts a fake vLLM (nginx + Lua) and wrk on one core, each target in turn on the other, checks
that every target really reached the upstream with the served model, times each scenario, and
writes results.json and results.md under bench/results/<time>/. Stdlib only.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import loads
import profiling
import report
import streams
from procs import cpu_seconds, http, rss_bytes, rss_each, settle
from scaling import cpu_list, scaling_targets
from targets import (
    BENCH,
    HF_PATH,
    NGINX_MODULES,
    ROOT,
    SERVED,
    TARGETS,
    Env,
    Running,
    Target,
    install_chart,
    sidecar_variant,
    start_sidecar,
    start_upstream,
)

# Targets whose failure fails the run (peers may be absent or broken without failing it).
REQUIRED = ("direct", "sidecar")
SLOW_MIN_REQUESTS, SLOW_SECONDS = 20, 20.0


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument(
        "--quick",
        action="store_true",
        help="CI smoke: short cells; peers only if already installed",
    )
    p.add_argument("--targets", default=",".join(TARGETS), help="comma-separated, in run order")
    p.add_argument(
        "--scenarios",
        default=",".join(name for name, scen in loads.SCENARIOS.items() if scen.default),
        help="comma-separated (rl-2000 only when named)",
    )
    p.add_argument("--seconds", type=float, help="timed seconds per cell (default 5, quick 1)")
    p.add_argument(
        "--warmup", type=float, help="warm-up seconds per cell (default 1, quick 0: none)"
    )
    p.add_argument("--big-mb", type=float, default=8.0, help="size of the token-id request")
    p.add_argument(
        "--rounds", type=int, help="repeat all cells, keep each best (default 2, quick 1)"
    )
    p.add_argument(
        "--variant",
        action="append",
        default=[],
        metavar="LABEL=FLAGS",
        help="also time the sidecar with extra flags, e.g. quiet='--log-level warning'",
    )
    p.add_argument(
        "--scale",
        metavar="N,N",
        help="also time `--workers N` for each N (e.g. 1,2), on N cores: the proxy's first,\n"
        "then the load generator's (shared with it, and the report says so)",
    )
    p.add_argument("--no-install", action="store_true", help="skip peers that are not installed")
    p.add_argument("--out", type=Path, help="results folder (default bench/results/<time>)")
    p.add_argument("--load-cpus", help="cores for upstream + wrk (default 0)")
    p.add_argument("--proxy-cpus", help="cores for the target (default 1)")
    p.add_argument(
        "--profile",
        choices=("py-spy", "pyinstrument"),
        help="profile the sidecar while it is timed (see docs/bench.md)",
    )
    p.add_argument(
        "--soak",
        type=float,
        metavar="SECONDS",
        help="instead: the sidecar at 64 connections this long, RSS sampled",
    )
    args = p.parse_args(argv)
    args.seconds = args.seconds or (1.0 if args.quick else 5.0)
    args.rounds = args.rounds or (1 if args.quick else 2)
    args.warmup = args.warmup if args.warmup is not None else (0.0 if args.quick else 1.0)
    args.no_install = args.no_install or args.quick
    cores = os.cpu_count() or 1
    args.load_cpus = args.load_cpus or ("0" if cores >= 2 else None)
    args.proxy_cpus = args.proxy_cpus or ("1" if cores >= 2 else None)
    args.cores = cores
    return args


def ensure_tools() -> None:
    missing = [t for t in ("nginx", "wrk", "taskset") if not shutil.which(t)]
    if missing or not NGINX_MODULES.exists():
        if os.geteuid() != 0:
            sys.exit("bench needs nginx, its Lua module, wrk: run bench/setup-system.sh as root")
        subprocess.run(["bash", str(BENCH / "setup-system.sh")], check=True)


Bodies = dict[tuple[str, str, bool, int, str | None], Path]


def write_bodies(run_dir: Path, big_mb: float) -> Bodies:
    """One body file per (kind, model, stream, ...); the aliasing targets get the HF path."""
    files = {}
    big = int(big_mb * 1024 * 1024)
    for scen in loads.SCENARIOS.values():
        for model in (SERVED, HF_PATH):
            key = loads.body_key(scen, model)
            if key not in files:
                path = run_dir / f"body-{scen.body}-{'sse' if scen.stream else 'json'}-"
                paced = f"-paced{scen.pace}" if scen.pace else ""
                name = f"{path.name}{scen.events}{paced}-{model.replace('/', '_')}.json"
                path = path.with_name(name)
                data = loads.make_body(scen.body, model, scen.stream, big, scen.events, scen.pace)
                path.write_bytes(data)
                files[key] = path
    return files


def git_commit() -> str:
    out = subprocess.run(
        ["git", "-C", str(ROOT), "describe", "--always", "--dirty"],
        capture_output=True,
        text=True,
        check=False,
    )
    return out.stdout.strip() or "?"


def run_cell(
    args: argparse.Namespace,
    env: Env,
    name: str,
    url: str,
    pid: int | None,
    scen: loads.Scenario,
    body: Path,
) -> dict[str, Any]:
    row: dict[str, Any] = {"target": name, "scenario": scen.name, "status": "ok"}
    if scen.kind == "rl":
        return _paced(row, streams.run_rl(args, env, url, pid, scen, body), pid)
    if scen.kind == "held":
        return _paced(row, streams.run_held(args, env, name, url, pid, scen, body), pid)
    try:
        row["check"] = loads.check(url, body.read_bytes(), scen.stream, scen.events)
    except (loads.CheckFailed, OSError, ValueError) as err:
        return {**row, "status": "check_failed", "reason": str(err)[:300]}
    seconds = args.seconds
    if scen.body != "small":  # slow targets need a while to finish even one 8 MB request
        seconds = max(seconds, 2.0 if args.quick else 6.0)
    if args.warmup > 0:
        loads.wrk(url, body, scen.connections, args.warmup, args.load_cpus)
    cpu0 = cpu_seconds(pid) if pid else None
    prof = profiling.start(args.profile, name, pid, scen.name, seconds, env) if pid else None
    res = loads.wrk(url, body, scen.connections, seconds, args.load_cpus)
    if int(res["requests"]) < SLOW_MIN_REQUESTS and not args.quick:  # type: ignore[call-overload]
        # A slow target (LiteLLM) gets a longer window rather than a figure from 3 requests.
        seconds = SLOW_SECONDS
        cpu0 = cpu_seconds(pid) if pid else None
        res = loads.wrk(url, body, scen.connections, seconds, args.load_cpus)
    cpu1 = cpu_seconds(pid) if pid else None
    if pid:
        row["settle_s"] = round(settle(pid), 2)
    if prof:
        row["profile"] = profiling.finish(prof)
    requests = int(res["requests"])
    errors: dict[str, int] = res["errors"]  # type: ignore[assignment]
    lat: dict[str, Any] = res["latency_us"]  # type: ignore[assignment]
    row.update(
        requests=requests,
        duration_s=int(res["duration_us"]) / 1e6,  # type: ignore[call-overload]
        errors=errors,
        rps=requests / (int(res["duration_us"]) / 1e6),  # type: ignore[call-overload]
        p50_us=lat["percentiles"]["50"],
        p90_us=lat["percentiles"]["90"],
        p99_us=lat["percentiles"]["99"],
        mean_us=lat["mean"],
        max_us=lat["max"],
        cpu_s=None if cpu0 is None else cpu1 - cpu0,  # type: ignore[operator]
        cpu_ms_per_1k=None if cpu0 is None or not requests else (cpu1 - cpu0) * 1e6 / requests,  # type: ignore[operator]
        rss_mb=rss_bytes(pid) / 2**20 if pid else None,
    )
    bad = sum(errors.values())
    if requests == 0:
        row.update(status="no_requests", reason=f"no request completed in {seconds:g} s")
    elif bad:
        row["check"] += f"; {bad} errors under load: {errors}"
    return row


def _paced(row: dict[str, Any], measured: dict[str, Any], pid: int | None) -> dict[str, Any]:
    """An RL-shaped cell's row (bench/streams.py measured it against the paced upstream)."""
    row.update(measured)
    if pid:
        row["settle_s"] = round(settle(pid), 2)
    if not row["requests"]:
        row.update(status="no_requests", reason="no event or answer in the window")
    return row


def start_target(
    args: argparse.Namespace, env: Env, target: Target, doc: dict[str, Any]
) -> Running | None:
    name = target.name
    info: dict[str, Any] = {"label": target.label, "aliasing": target.aliasing, "status": "ok"}
    if target.workers:
        shared = set(cpu_list(target.cpus)) & set(cpu_list(args.load_cpus))
        info.update(workers=target.workers, cpus=target.cpus, shares_load_cpus=bool(shared))
    doc["targets"][name] = info
    reason = target.missing()
    if reason and target.install and not args.no_install:
        target.install()
        reason = target.missing()
    if reason:
        info.update(status="skipped", reason=reason)
        print(f"[{name}] skipped: {reason}", flush=True)
        return None
    print(f"[{name}] starting", flush=True)
    try:
        wrap = profiling.wrapper(args.profile, env) if name == "sidecar" else None
        running = start_sidecar(env, wrap) if wrap else target.start(env)
    except (RuntimeError, OSError, subprocess.SubprocessError) as err:
        info.update(status="error", reason=str(err).splitlines()[0][:200])
        print(f"[{name}] failed to start: {err}", flush=True)
        return None
    info["version"] = running.version
    return running


def measure(
    args: argparse.Namespace,
    env: Env,
    targets: list[tuple[Target, Running]],
    bodies: Bodies,
    doc: dict[str, Any],
) -> None:
    """Every scenario, every target in turn (so that neighbours in time are compared), R rounds;
    the round with the best rate is kept per cell, all rounds are in the JSON."""
    broken: set[tuple[str, str]] = set()
    for rnd in range(args.rounds):
        for sname in args.scenarios.split(","):
            scen = loads.SCENARIOS[sname]
            for i, (target, running) in enumerate(targets):
                name = target.name
                if (name, sname) in broken or (rnd and target.one_round):
                    continue
                if scen.kind != "wrk" and running.child and args.profile != "pyinstrument":
                    # RSS per stream or per held request is the growth of a fresh process: one
                    # that ran the other cells reuses their freed memory and shows none.
                    running.child.stop()
                    running = target.start(env)
                    targets[i] = (target, running)
                    time.sleep(1.0)
                pid = running.child.pid if running.child else None
                model = HF_PATH if target.aliasing else SERVED
                body = bodies[loads.body_key(scen, model)]
                try:
                    row = run_cell(args, env, name, running.url, pid, scen, body)
                except (RuntimeError, OSError, subprocess.SubprocessError) as err:
                    reason = str(err).splitlines()[0][:200]
                    row = {"target": name, "scenario": sname, "status": "error", "reason": reason}
                row["round"] = rnd + 1
                doc["rounds"].append(row)
                if row["status"] != "ok":
                    broken.add((name, sname))
                print(f"[{name}] {sname} round {rnd + 1}: {_brief(row)}", flush=True)
    for target, _ in targets:
        for sname in args.scenarios.split(","):
            cells = [
                r for r in doc["rounds"] if (r["target"], r["scenario"]) == (target.name, sname)
            ]
            failed = [r for r in cells if r["status"] != "ok"]
            best = failed[0] if failed else _best(cells)
            if best is not None:
                doc["runs"].append(dict(best))


def _best(cells: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The round to keep: the best rate; for the RL cells, whose rate the paced upstream
    sets, the lowest per-token delay (or resume-to-answer latency)."""
    if not cells:
        return None
    if loads.SCENARIOS[cells[0]["scenario"]].kind != "wrk":
        return min(cells, key=lambda r: r["p50_us"])
    return max(cells, key=lambda r: r["rps"])


CHART_VENV = ROOT / ".venv-bench-chart"


def chart_note(args: argparse.Namespace, results: Path, png: Path) -> str:
    """Draw chart.png with matplotlib, from a venv of its own (made on first use, unless
    --no-install): the runner stays standard-library Python."""
    python = CHART_VENV / "bin" / "python"
    if not python.exists() and not args.no_install:
        install_chart()
    if not python.exists():
        return f"chart: skipped (no {CHART_VENV.name}; run without --no-install to make it)"
    done = subprocess.run(
        [str(python), str(BENCH / "chart.py"), str(results), str(png)],
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode:
        return f"chart: failed: {done.stderr.strip().splitlines()[-1:]}"
    return f"chart: {png}"


def _brief(row: dict[str, Any]) -> str:
    if row["status"] != "ok":
        return f"{row['status']}: {row.get('reason')}"
    return f"{row['rps']:,.0f} req/s, p50 {row['p50_us']} us, p99 {row['p99_us']} us"


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    ensure_tools()
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    out = (args.out or BENCH / "results" / stamp).resolve()
    run_dir = out / "run"
    run_dir.mkdir(parents=True, exist_ok=True)
    env = Env(run_dir, args.load_cpus, args.proxy_cpus)
    if args.soak:
        return profiling.soak(args, env, write_bodies(run_dir, 0.001), out)
    t0 = time.monotonic()
    bodies = write_bodies(run_dir, args.big_mb)
    big_key = loads.body_key(loads.SCENARIOS["ids8mb-c1"], SERVED)
    doc: dict[str, Any] = {
        "meta": {
            "started": datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"),
            "commit": git_commit(),
            "cores": args.cores,
            "load_cpus": args.load_cpus,
            "proxy_cpus": args.proxy_cpus,
            "seconds": args.seconds,
            "warmup": args.warmup,
            "quick": args.quick,
            "big_bytes": bodies[big_key].stat().st_size,
            "profile": args.profile,
            "rounds": args.rounds,
            "scale": args.scale,
        },
        "targets": {},
        "runs": [],
        "rounds": [],
    }
    chosen = [TARGETS[n] for n in args.targets.split(",")]
    chosen += [sidecar_variant(*v.split("=", 1)) for v in args.variant]
    chosen += scaling_targets(args.scale, args.proxy_cpus, args.load_cpus)
    upstream = start_upstream(env)
    started: list[tuple[Target, Running]] = []
    try:
        # The upstream must refuse the HF path, or the aliasing checks below prove nothing.
        refused = bodies[loads.body_key(loads.SCENARIOS["json-c1"], HF_PATH)].read_bytes()
        status = http("POST", env.upstream_url + "/v1/completions", refused)[0]
        if status != 404:
            sys.exit(f"fake upstream answered {status} to an unserved model, expected 404")
        for target in chosen:
            running = start_target(args, env, target, doc)
            if running is not None:
                started.append((target, running))
        time.sleep(1.0)
        for target, running in started:
            pid = running.child.pid if running.child else None
            doc["targets"][target.name]["idle_rss_mb"] = rss_bytes(pid) / 2**20 if pid else None
            each = [b / 2**20 for b in rss_each(pid)] if pid else []
            doc["targets"][target.name]["idle_rss_each_mb"] = each
        measure(args, env, started, bodies, doc)
        for target, running in started:
            pid = running.child.pid if running.child else None
            doc["targets"][target.name]["final_rss_mb"] = rss_bytes(pid) / 2**20 if pid else None
    finally:
        for target, running in started:
            if running.child:
                running.child.stop(grace=30 if args.profile == "pyinstrument" else 5)
                profiling.after_stop(args.profile, env, doc, target.name)
        upstream.stop()
    doc["meta"]["wall_s"] = round(time.monotonic() - t0, 1)
    json_path, md_path = report.write(doc, out)
    print(md_path.read_text())
    print(chart_note(args, json_path, out / "chart.png"))
    ran = [n for n, t in doc["targets"].items() if t["status"] == "ok"]
    skipped = [f"{n} ({t['reason']})" for n, t in doc["targets"].items() if t["status"] != "ok"]
    print(f"targets run: {', '.join(ran) or 'none'}; not run: {', '.join(skipped) or 'none'}")
    print(f"results: {json_path} and {md_path} ({doc['meta']['wall_s']} s)")
    failed = [
        f"{r['target']}/{r['scenario']}: {r['status']} {r.get('reason', '')}"
        for r in doc["runs"]
        if r["target"] in REQUIRED and (r["status"] != "ok" or sum(r["errors"].values()))
    ]
    failed += [
        f"{n}: {doc['targets'][n].get('reason')}"
        for n in REQUIRED
        if n in doc["targets"] and doc["targets"][n]["status"] != "ok"
    ]
    for line in failed:
        print(f"FAILED {line}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
