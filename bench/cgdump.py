"""A callgrind dump read by function, and the names Python 3.12's perf trampolines give them."""

from __future__ import annotations

import bisect
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path


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

    def name(self, fn: str, ob: str = "???") -> str:
        """`file:qualname` of the trampoline at `fn`'s address, or what callgrind named it."""
        if not fn.startswith("0x"):
            return f"(C, no Python frame):{fn}"
        address = int(fn, 16)
        i = bisect.bisect_right(self.starts, address) - 1
        if i < 0 or address >= self.ends[i] or not self.names[i].startswith("py::"):
            # A stripped extension's function (its object names it) or an anonymous one's.
            return f"(native code without a symbol, {ob}):{fn}"
        qualname, _, file = self.names[i][4:].rpartition(":")
        return f"{file}:{qualname}"


@dataclass
class Costs:
    """One dump's instructions: each function's self cost, and its calls' inclusive cost."""

    own: dict[str, int]
    calls: dict[str, int]
    objects: dict[str, str]  # each function's object file (`???`: an anonymous mapping)


def read_dump(dump: Path) -> Costs:
    """A callgrind dump's costs by function name (`'2`, a recursion's depth, dropped)."""
    names: dict[str, str] = {}
    obs: dict[str, str] = {}
    own: dict[str, int] = defaultdict(int)
    calls: dict[str, int] = defaultdict(int)
    objects: dict[str, str] = {}
    fn, ob, in_call = "", "", False
    for line in dump.read_text().splitlines():
        if line.startswith("ob="):
            ob = _name(obs, line[3:])
        elif line.startswith("cob="):
            _name(obs, line[4:])
        elif line.startswith("fn="):
            fn = _name(names, line[3:])
            objects.setdefault(fn, ob)
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
    return Costs(dict(own), dict(calls), objects)


def _name(names: dict[str, str], spec: str) -> str:
    """`(id) name` defines a compressed name, `(id)` uses it."""
    if spec.startswith("("):
        key, _, rest = spec.partition(")")
        if rest.strip():
            names[key] = rest.strip().split("'")[0]
        return names.get(key, spec)
    return spec.strip().split("'")[0]
