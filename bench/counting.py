"""Counting one process's instructions per request under callgrind, scenario by scenario."""

from __future__ import annotations

import http.client as httpclient
import json
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from procs import Child, free_port, http, spawn, wait_until
from targets import HF_PATH, ROOT, Env

PROMPT = [1, 2, 3, 4] * 64


@dataclass(frozen=True)
class Scenario:
    """One request, sent again and again on one kept-alive connection."""

    path: str
    payload: dict[str, Any]
    headers: dict[str, str] = field(default_factory=dict)

    def body(self) -> bytes:
        return json.dumps(self.payload).encode()


# SkyRL 0.4's RemoteInferenceClient.generate: `sampling_params`, `model`, `token_ids` in that
# order, the session in a header; the sampling params are what its get_vllm_sampling_params
# makes of SkyRL's defaults (logprobs 1, max_generate_length lowered to the others' 16).
SKYRL_SAMPLING = {
    "min_tokens": 1,
    "skip_special_tokens": True,
    "include_stop_str_in_output": True,
    "max_tokens": 16,
    "temperature": 1.0,
    "top_p": 1.0,
    "top_k": -1,
    "min_p": 0.0,
    "logprobs": 1,
    "stop": None,
}
SCENARIOS = {
    "json": Scenario("/v1/completions", {"model": HF_PATH, "prompt": PROMPT, "max_tokens": 16}),
    # The upstream writes the stream at once (`X-Bench-Burst`): read as it came, events flushed
    # one by one piled up in the proxy's socket by chance, two or five to a read, and the
    # count moved by 2% from run to run; spaced apart it grew with the spacing.
    "sse": Scenario(
        "/v1/completions",
        {"model": HF_PATH, "prompt": PROMPT, "max_tokens": 16, "stream": True},
        {"X-Bench-Burst": "1"},
    ),
    "generate": Scenario(
        "/inference/v1/generate",
        {"sampling_params": SKYRL_SAMPLING, "model": HF_PATH, "token_ids": PROMPT},
        {"X-Session-ID": "rollout-0"},
    ),
}


# The upstream's health and model list read once an hour, not every 5 and 30 seconds: they run
# on the clock, not per request, and callgrind slows the clock's share of a count by the box's
# speed and by chance (one health check more or less moved a count by 0.3%).
QUIET_BACKGROUND = ("--health-interval", "3600", "--discovery-interval", "3600")


# The counted process's clocks run a thousand times slower than the wall's (libfaketime): work
# that runs on the clock (log flushes and connection sweeps twice a second, the Date header
# once a second, a histogram's search for its bucket) would otherwise grow with callgrind's
# slowdown, which varies with the box and its load, and moved a count by up to 3%. No timer a
# request waits on fires in a count, and none of the background's does.
FAKETIME_LIB = Path("/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1")
SLOW_CLOCK = {"LD_PRELOAD": str(FAKETIME_LIB), "FAKETIME": "+0 x0.001"}


def sidecar_argv(env: Env, tree: Path, python: Path = ROOT / ".venv/bin/python") -> list[str]:
    """The sidecar of `tree`, quiet (`--log-level warning`, as the counts have always been)."""
    port, admin = free_port(), free_port()
    return [
        str(python),
        "-m",
        "proxy",
        *("--upstream-url", env.upstream_url, "--host", "127.0.0.1"),
        *("--port", str(port), "--admin-port", str(admin), "--log-level", "warning"),
        *QUIET_BACKGROUND,
    ]


def _port(argv: list[str]) -> int:
    return int(argv[argv.index("--port") + 1])


def _ready_url(argv: list[str]) -> str:
    if "--admin-port" in argv:
        return f"http://127.0.0.1:{argv[argv.index('--admin-port') + 1]}/readyz"
    return f"http://127.0.0.1:{_port(argv)}/v1/models"


def _send(conn: httpclient.HTTPConnection, scenario: Scenario, body: bytes) -> None:
    headers = {"Content-Type": "application/json", **scenario.headers}
    conn.request("POST", scenario.path, body, headers)
    resp = conn.getresponse()
    data = resp.read()
    if resp.status != 200:
        raise SystemExit(f"{scenario.path} {resp.status}: {data[:300]!r}")


def _control(pid: int, *flags: str) -> None:
    subprocess.run(["callgrind_control", *flags, str(pid)], check=True, capture_output=True)


def total(dump: Path) -> int:
    """The `totals:` line of a callgrind dump (its `summary:` counts only what was collected at
    the start, none here)."""
    for line in dump.read_text().splitlines():
        if line.startswith("totals:"):
            return int(line.split()[1])
    raise SystemExit(f"no totals in {dump}")


@dataclass
class Counter:
    """Starts a process under callgrind and counts each scenario's requests."""

    env: Env
    requests: int
    valgrind: list[str] = field(default_factory=list)  # more callgrind options
    dumps: dict[str, Path] = field(default_factory=dict)  # each scenario's dump, by name

    def count(
        self,
        argv: list[str],
        cwd: Path,
        scenarios: dict[str, Scenario],
        environ: dict[str, str] | None = None,
    ) -> dict[str, float]:
        """Instructions per request of each scenario for the process `argv` starts."""
        out = self.env.run_dir / f"callgrind.{_port(argv)}"
        cmd = ["valgrind", "--tool=callgrind", "--instr-atstart=no"]
        cmd += [f"--callgrind-out-file={out}", *self.valgrind, *argv]
        # Run from the tree: `python -m` puts the working directory before PYTHONPATH, so run
        # from another checkout it would import that checkout's proxy/ for every tree.
        environ = {"PYTHONPATH": str(cwd), **SLOW_CLOCK, **(environ or {})}
        log = self.env.run_dir / f"{_port(argv)}.log"
        child: Child = spawn("counted", cmd, cpus=None, log=log, env=environ, cwd=cwd)
        try:
            ready = _ready_url(argv)
            wait_until(lambda: http("GET", ready, timeout=30)[0] == 200, child, 600, ready)
            return {
                name: self._one(child, out, name, s, _port(argv)) for name, s in scenarios.items()
            }
        finally:
            child.stop()

    def _one(self, child: Child, out: Path, name: str, scenario: Scenario, port: int) -> float:
        body = scenario.body()
        conn = httpclient.HTTPConnection("127.0.0.1", port, timeout=120)
        for _ in range(max(20, self.requests // 5)):  # warm: caches, lazily built tables
            _send(conn, scenario, body)
        with self._window(child, out) as window:
            for _ in range(self.requests):
                _send(conn, scenario, body)
        conn.close()
        self.dumps[name] = window.dump
        return total(window.dump) / self.requests

    @contextmanager
    def _window(self, child: Child, out: Path) -> Iterator[Window]:
        """Counts what the process executes inside the `with`; the dump is on the result."""
        before = set(out.parent.glob(out.name + ".*"))
        _control(child.pid, "--zero")
        _control(child.pid, "-i", "on")
        window = Window()
        yield window
        _control(child.pid, "-i", "off")
        _control(child.pid, "--dump")
        window.dump = _new_dump(out, before)


@dataclass
class Window:
    dump: Path = Path()


def _new_dump(out: Path, before: set[Path]) -> Path:
    """The dump `callgrind_control --dump` asked for, once it is written in full."""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        new = set(out.parent.glob(out.name + ".*")) - before
        for dump in new:
            if "\ntotals:" in dump.read_text():
                return dump
        time.sleep(0.1)
    raise SystemExit(f"no callgrind dump for {out}")
