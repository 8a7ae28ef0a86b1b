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

import bisect
import os
import re
import shutil
import subprocess
import sys
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

from counting import SCENARIOS, Counter, sidecar_argv
from procs import free_port
from targets import BENCH, HF_PATH, ROOT, SERVED, Env

VENV = ROOT / ".venv-bench-layers"  # Python 3.12 with .venv's pins; made on first use
LETTERS = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"
CHARS = LETTERS + "_0123456789"


def _skips() -> list[str]:
    """Every C symbol but `_start*` and `_dl*`: the process's first function must be one that
    is not skipped (callgrind asserts it); the loader's few instructions are not in a count."""
    out = [f"{c}*" for c in LETTERS] + [f"_{c}*" for c in CHARS if c not in "sd"]
    for kept in ("_start", "_dl"):
        for i in range(2, len(kept)):
            out += [f"{kept[:i]}{c}*" for c in CHARS if c != kept[i]]
    return [f"--fn-skip={pattern}" for pattern in out]


SKIP = _skips()
PROFILED = {name: SCENARIOS[name] for name in ("json", "sse")}
LAYERS = (  # (layer, a pattern on the function's file), the first match wins
    ("proxy/upstream/lean (the lean hop)", r"/proxy/upstream/lean/"),
    ("proxy/client/", r"/proxy/client/"),
    ("proxy/engine/", r"/proxy/engine/"),
    ("proxy/observe/", r"/proxy/observe/"),
    ("proxy/core/", r"/proxy/core/"),
    ("proxy/, other (wiring/, upstream/)", r"/proxy/"),
    ("the baseline proxy's own code", r"/baseline_proxy\.py$"),
    ("aiohttp client", r"/aiohttp/(client|connector|tracing|cookiejar)"),
    ("aiohttp server (and its HTTP parser/writer)", r"/aiohttp/"),
    ("prometheus_client", r"/prometheus_client/"),
    ("asyncio, uvloop (and the loop's C)", r"/asyncio/|/uvloop/|^\(C, no Python frame\)"),
    ("multidict, yarl, propcache", r"/multidict/|/yarl/|/propcache/"),
    ("dataclasses' generated `__init__`s", r"^<string>$"),
    ("stdlib, other (logging, json, ...)", r"/lib/python3\.\d+/(?!site-packages)|^<frozen"),
)
OTHER = "other"


def python312() -> Path:
    """Python 3.12 with the pins of .venv (`LAYERS_PYTHON` names another one)."""
    if named := os.environ.get("LAYERS_PYTHON"):
        return Path(named)
    python = VENV / "bin" / "python"
    if python.exists():
        return python
    base = shutil.which("python3.12") or str(Path.home() / ".pyenv/versions/3.12.1/bin/python")
    subprocess.run([base, "-m", "venv", str(VENV)], check=True)
    pins = ROOT / "requirements" / "runtime.txt"
    pip = [str(VENV / "bin" / "pip"), "install", "-q", "-r", str(pins)]
    subprocess.run(pip, check=True, stdout=subprocess.DEVNULL)
    return python


@dataclass
class Trampolines:
    """/tmp/perf-<pid>.map: each trampoline's start, end and `py::qualname:file` name."""

    starts: list[int]
    ends: list[int]
    names: list[str]

    @classmethod
    def read(cls, path: Path) -> Trampolines:
        rows = []
        for line in path.read_text().splitlines():
            start, size, name = line.split(" ", 2)
            rows.append((int(start, 16), int(start, 16) + int(size, 16), name))
        rows.sort()
        return cls([r[0] for r in rows], [r[1] for r in rows], [r[2] for r in rows])

    def name(self, fn: str) -> str:
        """`file:qualname` of the trampoline at `fn`'s address, or what callgrind named it."""
        if not fn.startswith("0x"):
            return f"(C, no Python frame):{fn}"
        address = int(fn, 16)
        i = bisect.bisect_right(self.starts, address) - 1
        if i < 0 or address >= self.ends[i] or not self.names[i].startswith("py::"):
            return "(a Python function started before -X perf):" + fn
        qualname, _, file = self.names[i][4:].rpartition(":")
        return f"{file}:{qualname}"


@dataclass
class Costs:
    """One dump's instructions: each function's self cost, and its calls' inclusive cost."""

    own: dict[str, int]
    calls: dict[str, int]


def read_dump(dump: Path) -> Costs:
    """A callgrind dump's costs by function name (`'2`, a recursion's depth, dropped)."""
    names: dict[str, str] = {}
    own: dict[str, int] = defaultdict(int)
    calls: dict[str, int] = defaultdict(int)
    fn, in_call = "", False
    for line in dump.read_text().splitlines():
        if line.startswith("fn="):
            fn = _name(names, line[3:])
        elif line.startswith("cfn="):
            _name(names, line[4:])
        elif line.startswith("calls="):
            in_call = True
        elif line[:1].isdigit() or line[:1] in "+-*":
            cost = int(line.split()[-1]) if len(line.split()) > 1 else 0
            if in_call:
                calls[fn] += cost
            else:
                own[fn] += cost
            in_call = False
    return Costs(dict(own), dict(calls))


def _name(names: dict[str, str], spec: str) -> str:
    """`(id) name` defines a compressed name, `(id)` uses it."""
    if spec.startswith("("):
        key, _, rest = spec.partition(")")
        if rest.strip():
            names[key] = rest.strip().split("'")[0]
        return names.get(key, spec)
    return spec.strip().split("'")[0]


def layer(name: str) -> str:
    file = name.rpartition(":")[0]
    return next((lay for lay, pattern in LAYERS if re.search(pattern, file)), OTHER)


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
            fns[trampolines.name(fn)] += cost / requests
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
