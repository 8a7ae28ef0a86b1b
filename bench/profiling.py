"""Profiling the sidecar under the bench's load (py-spy, pyinstrument), and the RSS soak."""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import loads
from procs import rss_bytes
from targets import HF_PATH, ROOT, Env, start_sidecar, start_upstream

PROF_VENV = ROOT / ".venv-bench-prof"
FRAME = re.compile(r"^(?P<func>.*?) \((?P<file>[^:()]*)(?::\d+)?\)$")


def _ensure_prof_venv() -> Path:
    if not (PROF_VENV / "bin" / "py-spy").exists():
        subprocess.run(["python3.11", "-m", "venv", str(PROF_VENV)], check=True)
        subprocess.run(
            [str(PROF_VENV / "bin" / "pip"), "install", "-q", "py-spy", "pyinstrument"],
            check=True,
            stdout=subprocess.DEVNULL,
        )
    return PROF_VENV


def _site_packages() -> str:
    return str(next((PROF_VENV / "lib").glob("python3*/site-packages")))


def wrapper(kind: str | None, env: Env) -> tuple[list[str], dict[str, str]] | None:
    """How to start the sidecar under pyinstrument (py-spy attaches to it instead)."""
    if kind != "pyinstrument":
        return None
    _ensure_prof_venv()
    session = env.run_dir.parent / "sidecar.pyisession"
    wrap = ["-m", "pyinstrument", "-r", "pyisession", "-o", str(session)]
    return wrap, {"PYTHONPATH": _site_packages()}


@dataclass
class Recording:
    popen: subprocess.Popen[bytes]
    raw: Path


def start(
    kind: str | None, name: str, pid: int, scenario: str, seconds: float, env: Env
) -> Recording | None:
    if kind != "py-spy" or not name.startswith("sidecar"):
        return None
    venv = _ensure_prof_venv()
    raw = env.run_dir.parent / f"{name}-{scenario}.pyspy.txt"
    argv = [str(venv / "bin" / "py-spy"), "record", "--pid", str(pid), "--rate", "200"]
    argv += ["--duration", str(max(1, int(seconds))), "--nonblocking", "--format", "raw"]
    argv += ["--full-filenames"]
    argv += ["-o", str(raw)]
    if env.load_cpus:
        argv = ["taskset", "-c", env.load_cpus, *argv]
    popen = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return Recording(popen, raw)


def finish(rec: Recording) -> dict[str, str]:
    rec.popen.wait(120)
    summary = rec.raw.with_suffix(".top.txt")
    summary.write_text(summarize(rec.raw.read_text()))
    return {"collapsed": str(rec.raw), "top": str(summary)}


def _bucket(path: str) -> str:
    path = "/" + path
    for key, name in (
        ("/proxy/", "proxy (the sidecar)"),
        ("aiohttp/", "aiohttp"),
        ("asyncio/", "asyncio"),
        ("uvloop", "uvloop"),
        ("prometheus_client", "prometheus_client"),
        ("yarl", "yarl"),
        ("multidict", "multidict"),
        ("logging", "logging"),
        ("json", "json"),
        ("pydantic", "pydantic"),
    ):
        if key in path:
            return name
    return path.rsplit("/", 1)[-1] or "?"


def summarize(collapsed: str, top: int = 25) -> str:
    """A top-style text summary of py-spy's collapsed stacks: self and total time per function."""
    self_t: Counter[str] = Counter()
    total_t: Counter[str] = Counter()
    buckets: Counter[str] = Counter()
    proxy_inclusive: Counter[str] = Counter()
    n = 0
    for line in collapsed.splitlines():
        stack, _, count_s = line.rpartition(" ")
        if not stack or not count_s.isdigit():
            continue
        count = int(count_s)
        n += count
        frames = [_func(f) for f in stack.split(";")]
        funcs = [f for f, _ in frames]
        self_t[funcs[-1]] += count
        buckets[_bucket(frames[-1][1])] += count
        for f in set(funcs):
            total_t[f] += count
        # Time below each sidecar function, counted once per stack.
        for f in {f for f, path in frames if "/proxy/" in "/" + path}:
            proxy_inclusive[f] += count
    if not n:
        return "no samples\n"

    def table(title: str, counter: Counter[str]) -> list[str]:
        rows = [f"\n{title}", "   %   samples  function"]
        for name, c in counter.most_common(top):
            rows.append(f"{100 * c / n:5.1f}  {c:7d}  {name}")
        return rows

    out = [f"{n} samples (CPU only: idle waits are not sampled)"]
    out += table("self time by library (where the leaf frame lives)", buckets)
    out += table("self time by function", self_t)
    out += table("total time by function (inclusive)", total_t)
    out += table("total time under each sidecar function", proxy_inclusive)
    return "\n".join(out) + "\n"


def _func(frame: str) -> tuple[str, str]:
    m = FRAME.match(frame)
    if not m:
        return frame, ""
    path = m["file"]
    short = "/".join(path.split("/")[-2:])
    return f"{m['func']} ({short})", path


def after_stop(kind: str | None, env: Env, doc: dict[str, Any], name: str) -> None:
    """pyinstrument writes its session when the sidecar exits: render it as text and speedscope."""
    session = env.run_dir.parent / "sidecar.pyisession"
    if kind != "pyinstrument" or name != "sidecar" or not session.exists():
        return
    python = str(ROOT / ".venv" / "bin" / "python")
    rendered = {}
    for renderer, suffix in (("text", ".txt"), ("speedscope", ".speedscope.json")):
        out = session.with_suffix(suffix)
        subprocess.run(
            [python, "-m", "pyinstrument", "--load", str(session), "-r", renderer, "-o", str(out)]
            + (["--show-all"] if renderer == "text" else []),
            env={"PYTHONPATH": _site_packages()},
            check=False,
        )
        rendered[renderer] = str(out)
    doc["profiles"] = rendered


def soak(args: argparse.Namespace, env: Env, bodies: dict[Any, Path], out: Path) -> int:
    """The sidecar at 64 connections for args.soak seconds; RSS after each 30 s slice."""
    upstream = start_upstream(env)
    samples: list[dict[str, float]] = []
    try:
        running = start_sidecar(env)
        assert running.child is not None
        pid = running.child.pid
        body = bodies[loads.body_key(loads.SCENARIOS["json-c64"], HF_PATH)]
        url = running.url
        loads.check(url, body.read_bytes(), stream=False)
        samples.append({"t": 0.0, "rss_mb": rss_bytes(pid) / 2**20, "requests": 0})
        t0, total = time.monotonic(), 0
        while time.monotonic() - t0 < args.soak:
            res = loads.wrk(url, body, 64, min(30.0, args.soak), args.load_cpus)
            total += int(res["requests"])  # type: ignore[call-overload]
            sample = {"t": round(time.monotonic() - t0, 1), "rss_mb": rss_bytes(pid) / 2**20}
            samples.append({**sample, "requests": total})
            print(
                f"soak t={sample['t']:.0f}s rss={sample['rss_mb']:.1f} MB requests={total}",
                flush=True,
            )
        running.child.stop()
    finally:
        upstream.stop()
    path = out / "soak.json"
    path.write_text(json.dumps({"samples": samples}, indent=2) + "\n")
    first, last = samples[1]["rss_mb"], samples[-1]["rss_mb"]
    print(
        f"RSS idle {samples[0]['rss_mb']:.1f} MB; after first slice {first:.1f} MB; "
        f"at end {last:.1f} MB ({last - first:+.1f} MB); {path}"
    )
    return 0
