"""Where one request's instructions go, by function and by layer (`instructions.py --profile`).

Callgrind sees only C symbols: every Python function is `_PyEval_EvalFrameDefault`. Python
3.12's `-X perf` gives each code object its own trampoline, a few bytes of code through which
every call of it passes, and writes their addresses to /tmp/perf-<pid>.map. Callgrind names a
trampoline by its address; `--fn-skip` on every C symbol (every name that starts with a letter
or `_`) hands the cost of a skipped function to its caller, so every instruction is counted to
the innermost Python function on the stack: its own bytecode and the C it calls (dict, bytes,
uvloop's loop, multidict, orjson), never a Python function it calls. That is a function's self
cost, and the map gives its file, and so its layer.

The counts are those of `bench/instructions.py` (the same fake upstream, requests and slow
clock), under 3.12 instead of .venv's 3.11: shares, not budgets.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

from cgdump import Trampolines, read_dump
from counting import SCENARIOS, Counter, sidecar_argv
from procs import free_port
from targets import BENCH, HF_PATH, ROOT, SERVED, Env

VENV = ROOT / ".venv-bench-layers"  # Python 3.12 with .venv's pins; made on first use
LETTERS = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"


# Not skipped: the process's first functions (callgrind asserts that one is not) and the cycle
# collector, whose pass over the whole heap lands in one request of a window now and then and
# is its own line, not a share of the function that happened to allocate.
KEPT = ("_start", "_dl", "gc_collect_main")


def _skips() -> list[str]:
    """`--fn-skip` patterns for every C symbol (a name that starts with a letter or `_`) but
    those that start with one of KEPT: the prefixes that lead to none of them, shortest first."""
    out, todo = [], [""]
    while todo:
        prefix = todo.pop()
        for c in LETTERS + "_" + ("0123456789" if prefix else ""):
            name = prefix + c
            if any(kept.startswith(name) for kept in KEPT):
                if name not in KEPT:
                    todo.append(name)
            else:
                out.append(f"--fn-skip={name}*")
    return out


SKIP = _skips()
PROFILED = {name: SCENARIOS[name] for name in ("json", "sse")}
LAYERS = (  # (layer, a pattern on the function's file), the first match wins
    ("proxy/upstream/lean (the lean hop)", r"/proxy/upstream/lean/"),
    ("proxy/client/", r"/proxy/client/"),
    ("proxy/engine/", r"/proxy/engine/"),
    ("proxy/observe/", r"/proxy/observe/"),
    ("proxy/core/", r"/proxy/core/"),
    ("proxy/, other (wiring/, upstream/)", r"/proxy/"),
    ("the baseline proxy's own code", r"/baseline_proxy\.py:"),
    ("aiohttp client", r"/aiohttp/(client|connector|tracing|cookiejar)"),
    ("aiohttp server (and its HTTP parser/writer)", r"/aiohttp/"),
    ("prometheus_client", r"/prometheus_client/"),
    ("the cycle collector (gc)", r":gc_collect_main$"),
    ("asyncio, uvloop (and the loop's C)", r"/asyncio/|/uvloop/|^\(C, no Python frame\)"),
    ("multidict, yarl, propcache", r"/multidict/|/yarl/|/propcache/"),
    ("dataclasses' generated `__init__`s", r"^<string>:"),
    ("stdlib, other (logging, json, ...)", r"/lib/python3\.\d+/(?!site-packages)|^<frozen"),
    ("native code without a symbol", r"^\(native"),
)
OTHER = "other"


def python312() -> Path:
    """Python 3.12 with the pins of .venv (`LAYERS_PYTHON` names another one)."""
    if named := os.environ.get("LAYERS_PYTHON"):
        return Path(named)
    python = VENV / "bin" / "python"
    if python.exists():
        return python
    subprocess.run([_base312(), "-m", "venv", str(VENV)], check=True)
    pins = ROOT / "requirements" / "runtime.txt"
    pip = [str(VENV / "bin" / "pip"), "install", "-q", "-r", str(pins)]
    subprocess.run(pip, check=True, stdout=subprocess.DEVNULL)
    return python


def _base312() -> str:
    """The first Python 3.12 that runs: a pyenv shim on PATH may name a version it will not
    start (exit 127), so each is tried."""
    pyenv = str(Path.home() / ".pyenv/versions/3.12.1/bin/python")
    for candidate in (shutil.which("python3.12"), pyenv):
        if candidate and subprocess.run([candidate, "-c", ""], capture_output=True).returncode == 0:
            return candidate
    raise SystemExit("the profile needs Python 3.12: name one in LAYERS_PYTHON")


def layer(name: str) -> str:
    return next((lay for lay, pattern in LAYERS if re.search(pattern, name)), OTHER)


@dataclass
class Profile:
    """A process's instructions per request, by function (self cost), per scenario."""

    label: str
    per_function: dict[str, dict[str, float]]  # scenario -> file:qualname -> instructions

    def by_layer(self, scenario: str) -> dict[str, float]:
        out: dict[str, float] = defaultdict(float)
        for name, cost in self.per_function[scenario].items():
            out[layer(name)] += cost
        return dict(out)


def _profile(label: str, argv: list[str], cwd: Path, env: Env, requests: int) -> Profile:
    before = set(Path("/tmp").glob("perf-*.map"))
    counter = Counter(env, requests, valgrind=SKIP)
    counter.count(argv, cwd, PROFILED, {"PYTHONPERFSUPPORT": "1"})
    (new,) = set(Path("/tmp").glob("perf-*.map")) - before
    trampolines = Trampolines.read(shutil.move(new, env.run_dir / f"{label}-{new.name}"))
    per_function = {}
    for scenario, dump in counter.dumps.items():
        costs = read_dump(dump)
        fns: dict[str, float] = defaultdict(float)
        for fn, cost in costs.own.items():
            fns[trampolines.name(fn, costs.objects.get(fn, "???"))] += cost / requests
        per_function[scenario] = dict(fns)
    return Profile(label, per_function)


def profiles(env: Env, requests: int) -> list[Profile]:
    python = python312()
    sidecar = sidecar_argv(env, ROOT, python)
    baseline = [str(python), str(BENCH / "proxies" / "baseline_proxy.py")]
    baseline += ["--upstream-url", env.upstream_url, "--port", str(free_port())]
    baseline += ["--alias", f"{HF_PATH}={SERVED}"]
    return [
        _profile("sidecar", sidecar, ROOT, env, requests),
        _profile("baseline", baseline, ROOT, env, requests),
    ]


def layer_table(runs: list[Profile]) -> str:
    cols = [(p, s) for p in runs for s in PROFILED]
    layers = {name: b for p, s in cols for name, b in p.by_layer(s).items()}
    order = [name for name, _ in LAYERS if name in layers] + [
        n for n in layers if n not in dict(LAYERS)
    ]
    head = " | ".join(f"{p.label} {s}" for p, s in cols)
    rows = [f"| layer | {head} |", "|---|" + "---:|" * len(cols)]
    totals = [sum(p.by_layer(s).values()) for p, s in cols]
    for name in order:
        cells = []
        for (p, s), tot in zip(cols, totals, strict=True):
            value = p.by_layer(s).get(name, 0.0)
            cells.append(f"{value:,.0f} ({value / tot:.1%})" if value else "-")
        rows.append(f"| {name} | {' | '.join(cells)} |")
    rows.append(f"| **total** | {' | '.join(f'**{t:,.0f}**' for t in totals)} |")
    return "\n".join(rows)


def top_functions(run: Profile, scenario: str, n: int = 25) -> str:
    fns = run.per_function[scenario]
    tot = sum(fns.values())
    rows = [f"| {run.label} {scenario}: function (self) | instructions | share | layer |"]
    rows.append("|---|---:|---:|---|")
    for name, cost in sorted(fns.items(), key=lambda kv: -kv[1])[:n]:
        short = re.sub(r"^.*/(site-packages|lib/python3\.\d+)/", "", name)
        short = short.replace(str(ROOT) + "/", "")
        rows.append(f"| `{short}` | {cost:,.0f} | {cost / tot:.1%} | {layer(name)} |")
    return "\n".join(rows)


def profile(env: Env, requests: int) -> str:
    """The layer table for the sidecar and the baseline, then each one's top functions."""
    runs = profiles(env, requests)
    parts = [f"Instructions per request by layer (self cost; {requests} requests each):", ""]
    parts.append(layer_table(runs))
    for run in runs:
        for scenario in PROFILED:
            parts += ["", top_functions(run, scenario)]
    return "\n".join(parts)


if __name__ == "__main__":
    sys.exit("run it as `bench/instructions.py --profile`")
