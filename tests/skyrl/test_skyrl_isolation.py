"""proxy never needs skyrl, and proxy.skyrl needs nothing of proxy but itself."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

import proxy

pytestmark = pytest.mark.skyrl

PACKAGE = Path(proxy.__file__).parent


def test_importing_every_other_proxy_module_imports_no_skyrl() -> None:
    code = (
        "import pkgutil, sys, importlib, proxy\n"
        "names = [m.name for m in pkgutil.iter_modules(proxy.__path__, 'proxy.')\n"
        "         if m.name != 'proxy.skyrl']\n"
        "names += [m.name for n in list(names) if hasattr(importlib.import_module(n), '__path__')\n"
        "          for m in pkgutil.iter_modules(sys.modules[n].__path__, n + '.')]\n"
        "for name in names: importlib.import_module(name)\n"
        "assert len(names) > 5, names\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] == 'skyrl'))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert (out.returncode, out.stdout.strip()) == (0, "[]"), out.stderr


def imported_modules(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            names.add("." * node.level + (node.module or ""))
    return names


def test_proxy_skyrl_depends_on_the_envelope_shape_not_on_proxy_code() -> None:
    for path in (PACKAGE / "skyrl").glob("*.py"):
        ours = {m for m in imported_modules(path) if m.startswith(("proxy", "."))}
        assert all(m.startswith("proxy.skyrl") for m in ours), (path.name, ours)


def test_no_other_proxy_module_imports_proxy_skyrl() -> None:
    for path in PACKAGE.rglob("*.py"):
        if path.is_relative_to(PACKAGE / "skyrl"):
            continue
        assert not {m for m in imported_modules(path) if "skyrl" in m}, path.name
