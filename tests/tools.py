"""Command-line tools the tests run (promtool, hadolint, buildah, ...): where each is installed."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import pytest


def tool(name: str, part: str = "30-deploy-tools.sh") -> str:
    """Path of a command-line tool: the test venv's bin first, then PATH.

    A missing tool fails the test: `part` of scripts/test-env.d/ installs it, so a skip here
    would only hide a broken test environment.
    """
    venv_bin = Path(sys.executable).parent / name
    if venv_bin.exists():
        return str(venv_bin)
    found = shutil.which(name)
    if found is None:
        pytest.fail(f"{name} is not installed: run `make test-env` ({part})")
    return found
