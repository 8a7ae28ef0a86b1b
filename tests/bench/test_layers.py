"""The profile by layer (bench/layers.py, bench/cgdump.py): pure, no callgrind."""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "bench"))

import cgdump  # noqa: E402
import layers  # noqa: E402

# Two trampolines (a handler that calls a metric's inc) and a C function no Python frame runs.
DUMP = """\
events: Ir
ob=(1) ???
fn=(1) 0x0000000005000000
0 300
cob=(1)
cfn=(2) 0x000000000500000b
calls=2 0
0 90
0 10
fn=(2)
0 90
ob=(2) /usr/lib/libuv.so
fn=(3) uv_run
0 40
ob=(1)
fn=(4) 0x0000000004000000
0 7
totals: 537
"""
MAP = """\
5000000 b py::handle:/repo/proxy/client/forward.py
500000b b py::MutexValue.inc:/venv/lib/python3.12/site-packages/prometheus_client/values.py
"""


def test_each_instruction_goes_to_the_innermost_python_function(tmp_path: Path) -> None:
    (tmp_path / "d").write_text(DUMP)
    (tmp_path / "m").write_text(MAP)
    costs = cgdump.read_dump(tmp_path / "d")
    names = cgdump.Trampolines.read(tmp_path / "m")
    own = {names.name(fn, costs.objects[fn]): cost for fn, cost in costs.own.items()}
    assert own == {
        "/repo/proxy/client/forward.py:handle": 310,  # the call's inclusive 90 is not its own
        "/venv/lib/python3.12/site-packages/prometheus_client/values.py:MutexValue.inc": 90,
        "(C, no Python frame):uv_run": 40,
        "(native code without a symbol, ???):0x0000000004000000": 7,
    }
    assert costs.calls == {"0x0000000005000000": 90}
    assert [layers.layer(name) for name in own] == [
        "proxy/client/",
        "prometheus_client",
        "asyncio, uvloop (and the loop's C)",
        "native code without a symbol",
    ]


def test_every_c_symbol_is_skipped_but_the_start_and_the_cycle_collector() -> None:
    def skipped(name: str) -> bool:
        return any(name.startswith(p.removeprefix("--fn-skip=")[:-1]) for p in layers.SKIP)

    c_symbols = ("_PyEval_EvalFrameDefault", "uv_run", "PyObject_Call", "_sre_match", "gc_traverse")
    for name in c_symbols:
        assert skipped(name), name
    for name in ("_start", "_dl_start", "gc_collect_main", "0x0000000005000000"):
        assert not skipped(name), name
    assert layers.layer("(C, no Python frame):gc_collect_main") == "the cycle collector (gc)"
