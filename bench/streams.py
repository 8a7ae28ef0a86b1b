"""The RL-shaped cells (`rl-512`, `held-2000`): run bench/streams_client.py, read /proc meanwhile.

`rl-512`: 512 streams open at once at vLLM's pace (a token event every 20-50 ms, 200 tokens
each, back to back), for RL_SECONDS; per relayed event: CPU, and the delay each token gained
on its way (the fake stamps the time it wrote it); RSS per open stream from the peak during
the window. `held-2000`: the engine paused, 2,000 requests sent and held, RSS per held request
read while they wait; then resumed, and every one answered. The sidecar is paused through its
own /pause (it holds the requests itself, as the lifecycle does); every other target forwards
them into the paused fake upstream, which holds them as vLLM queues them.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import subprocess
import time
from pathlib import Path
from typing import Any

import loads
from procs import cpu_seconds, http, rss_bytes
from targets import BENCH, ROOT, Env

CLIENT = BENCH / "streams_client.py"
# (seconds, warm-up) of an rl cell: streams start within the first second, and the first
# events of each are not counted.
RL_SECONDS, RL_QUICK = (12.0, 3.0), (2.0, 0.5)
HELD_SETTLE, HELD_QUICK_COUNT = 2.0, 200


def _client(env: Env, mode: str, url: str, body: Path, streams: int) -> list[str]:
    argv = [str(ROOT / ".venv" / "bin" / "python"), str(CLIENT), mode, "--url", url]
    argv += ["--body", str(body), "--streams", str(streams)]
    return ["taskset", "-c", env.load_cpus, *argv] if env.load_cpus else argv


def _result(out: str) -> dict[str, Any]:
    for line in out.splitlines():
        if line.startswith("STREAMS_JSON "):
            result: dict[str, Any] = json.loads(line.removeprefix("STREAMS_JSON "))
            return result
    raise RuntimeError(f"streams client gave no result: {out[-500:]}")


def run_rl(
    args: argparse.Namespace, env: Env, url: str, pid: int | None, scen: loads.Scenario, body: Path
) -> dict[str, Any]:
    seconds, warm = RL_QUICK if args.quick else RL_SECONDS
    rss0 = rss_bytes(pid) if pid else None
    argv = _client(env, "rl", url, body, scen.connections)
    argv += ["--seconds", str(seconds), "--warmup", str(warm)]
    popen = subprocess.Popen(argv, stdout=subprocess.PIPE, text=True)
    time.sleep(warm)
    cpu0 = cpu_seconds(pid) if pid else None
    peak = 0
    while popen.poll() is None:
        if pid:
            peak = max(peak, rss_bytes(pid))
        time.sleep(0.25)
    cpu1 = cpu_seconds(pid) if pid else None
    out = popen.communicate(timeout=60)[0]
    res = _result(out)
    events = int(res["events"])
    cpu = None if cpu0 is None or cpu1 is None else cpu1 - cpu0
    row: dict[str, Any] = {
        "requests": events,
        "duration_s": res["window_s"],
        "errors": {"stream": int(res["errors"])},
        "rps": res["events_per_s"],
        "p50_us": res["delay_p50_us"],
        "p90_us": None,
        "p99_us": res["delay_p99_us"],
        "gap_p50_us": res["gap_p50_us"],
        "gap_p99_us": res["gap_p99_us"],
        "answers": res["answers"],
        "cpu_s": cpu,
        "cpu_ms_per_1k": None if cpu is None or not events else cpu * 1e6 / events,
        "rss_mb": rss_bytes(pid) / 2**20 if pid else None,
        "open_rss_mb": peak / 2**20 if pid else None,
        "rss_per_stream_kb": None if rss0 is None else (peak - rss0) / scen.connections / 1024,
        "check": f"200, {res['answers']} streams ended, {events} events timed",
    }
    return row


def run_held(
    args: argparse.Namespace,
    env: Env,
    name: str,
    url: str,
    pid: int | None,
    scen: loads.Scenario,
    body: Path,
) -> dict[str, Any]:
    count = HELD_QUICK_COUNT if args.quick else scen.connections
    # The sidecar holds through its own pause; the others pass the requests to a paused vLLM.
    engine = url if name.startswith("sidecar") else env.upstream_url
    rss0 = rss_bytes(pid) if pid else None
    cpu0 = cpu_seconds(pid) if pid else None
    argv = _client(env, "held", url, body, count)
    argv += ["--warmup", str(HELD_SETTLE), "--pause-url", engine + "/pause"]
    argv += ["--resume-url", engine + "/resume"]
    popen = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert popen.stdin is not None
    assert popen.stdout is not None
    try:
        line = popen.stdout.readline()
        if line.strip() != "HELD":
            raise RuntimeError(f"streams client did not hold its requests: {line[:300]}")
        held = rss_bytes(pid) if pid else 0
        popen.stdin.write("\n")
        popen.stdin.flush()
        out = popen.communicate(timeout=180)[0]
    finally:
        if popen.poll() is None:
            popen.kill()
        # Whatever happened, the engine must not stay paused for the cells after this one.
        with contextlib.suppress(OSError):
            http("POST", engine + "/resume", b"{}")
    cpu1 = cpu_seconds(pid) if pid else None
    res = _result(out)
    cpu = None if cpu0 is None or cpu1 is None else cpu1 - cpu0
    answers = int(res["answers"])
    return {
        "requests": answers,
        "duration_s": res["window_s"],
        "errors": {"held": int(res["errors"])},
        "rps": answers / res["window_s"] if res["window_s"] else 0.0,
        "p50_us": res["p50_us"],
        "p90_us": None,
        "p99_us": res["p99_us"],
        "cpu_s": cpu,
        "cpu_ms_per_1k": None if cpu is None or not answers else cpu * 1e6 / answers,
        "rss_mb": held / 2**20 if pid else None,
        "rss_per_held_kb": None if rss0 is None else (held - rss0) / count / 1024,
        "held": count,
        "check": f"200, {answers} of {count} held requests answered after the resume",
    }
