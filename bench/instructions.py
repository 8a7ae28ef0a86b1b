#!/usr/bin/env python3
"""Instructions per request, counted by valgrind's callgrind: the same on a busy or an idle box.

wrk's req/s and /proc's CPU seconds move by 10-15% between runs on this shared 2-core machine,
which hides a change of a few percent. Callgrind counts the instructions the sidecar's process
executes, not time: the same count for the same code, inputs and environment (docs: the env
skill). Each tree is started under callgrind with collection off, warmed up, and counted over
`--requests` requests of each scenario (one connection, kept alive), sent to the bench's fake
upstream (nginx + Lua, bench/upstream/):

    PYTHONPATH=$PWD .venv/bin/python bench/instructions.py --tree before=/tmp/old --tree after=.

prints instructions per request for each tree and scenario and each tree's ratio to the first.
"""

from __future__ import annotations

import argparse
import http.client as httpclient
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from procs import Child, free_port, http, spawn, wait_until
from targets import HF_PATH, ROOT, Env, start_upstream

SCENARIOS = {
    "json": {"model": HF_PATH, "prompt": [1, 2, 3, 4] * 64, "max_tokens": 16},
    "sse": {"model": HF_PATH, "prompt": [1, 2, 3, 4] * 64, "max_tokens": 16, "stream": True},
}


def _send(conn: httpclient.HTTPConnection, body: bytes) -> None:
    conn.request("POST", "/v1/completions", body, {"Content-Type": "application/json"})
    resp = conn.getresponse()
    data = resp.read()
    if resp.status != 200:
        raise SystemExit(f"{resp.status}: {data[:300]!r}")


def _control(pid: int, *flags: str) -> None:
    subprocess.run(["callgrind_control", *flags, str(pid)], check=True, capture_output=True)


def _total(out: Path) -> int:
    """The `totals:` line of the newest dump of a callgrind run (its `summary:` counts only
    what was collected at the start, none here)."""
    dumps = sorted(out.parent.glob(out.name + ".*"), key=lambda p: p.stat().st_mtime)
    for line in dumps[-1].read_text().splitlines():
        if line.startswith("totals:"):
            return int(line.split()[1])
    raise SystemExit(f"no totals in {dumps[-1]}")


def count(tree: Path, env: Env, run: Path, requests: int) -> dict[str, float]:
    """Instructions per request of each scenario for the sidecar of `tree`."""
    port, admin = free_port(), free_port()
    out = run / f"callgrind.{tree.name or 'tree'}.{port}"
    argv = [
        "valgrind",
        "--tool=callgrind",
        "--instr-atstart=no",
        f"--callgrind-out-file={out}",
        str(ROOT / ".venv/bin/python"),
        "-m",
        "proxy",
        *("--upstream-url", env.upstream_url, "--host", "127.0.0.1"),
        *("--port", str(port), "--admin-port", str(admin), "--log-level", "warning"),
    ]
    # Run from the tree: `python -m` puts the working directory before PYTHONPATH, so run from
    # another checkout it would import that checkout's proxy/ for every tree.
    child: Child = spawn(
        "sidecar",
        argv,
        cpus=None,
        log=run / f"{port}.log",
        env={"PYTHONPATH": str(tree)},
        cwd=tree,
    )
    try:
        ready = f"http://127.0.0.1:{admin}/readyz"
        wait_until(lambda: http("GET", ready, timeout=30)[0] == 200, child, 600, "readyz")
        per: dict[str, float] = {}
        for name, payload in SCENARIOS.items():
            body = json.dumps(payload).encode()
            conn = httpclient.HTTPConnection("127.0.0.1", port, timeout=120)
            for _ in range(max(20, requests // 5)):  # warm: caches, lazily built tables
                _send(conn, body)
            _control(child.pid, "--zero")
            _control(child.pid, "-i", "on")
            for _ in range(requests):
                _send(conn, body)
            _control(child.pid, "-i", "off")
            _control(child.pid, "--dump")
            time.sleep(0.5)
            per[name] = _total(out) / requests
            conn.close()
        return per
    finally:
        child.stop()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tree", action="append", required=True, metavar="LABEL=DIR")
    parser.add_argument("--requests", type=int, default=300)
    args = parser.parse_args()
    trees = [(label, Path(path).resolve()) for label, path in (t.split("=", 1) for t in args.tree)]
    with tempfile.TemporaryDirectory(prefix="instructions-") as tmp:
        run = Path(tmp)
        env = Env(run, None, None)
        upstream = start_upstream(env)
        try:
            counts = {label: count(tree, env, run, args.requests) for label, tree in trees}
        finally:
            upstream.stop()
    first = counts[trees[0][0]]
    print(f"| tree | {' | '.join(f'{s} instructions / request' for s in SCENARIOS)} | ratio |")
    print(f"|---|{'---|' * len(SCENARIOS)}---|")
    for label, per in counts.items():
        ratios = ", ".join(f"{per[s] / first[s]:.3f}" for s in SCENARIOS)
        cells = " | ".join(f"{per[s]:,.0f}" for s in SCENARIOS)
        print(f"| {label} | {cells} | {ratios} |")
    return 0


if __name__ == "__main__":
    os.environ.setdefault("PYTHONHASHSEED", "0")
    sys.exit(main())
