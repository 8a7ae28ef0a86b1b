"""The installed vLLM mounts the routes its checked-in list says (the list the table is held to)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from tests.processes import ROOT

pytestmark = pytest.mark.vllm

LISTS = ROOT / "tests/unit/core/vllm_routes"


def test_the_installed_vllms_routes_are_the_ones_the_table_is_held_to(vllm_python: Path) -> None:
    # Guards: tests/unit/core/test_vllm_routes.py reading a stale list: a vLLM bump in
    # test-env.d without scripts/vllm-routes.sh would leave the new release's routes unchecked.
    # Builds vLLM's app (no engine, no model): seconds.
    done = subprocess.run(
        [str(vllm_python), str(ROOT / "scripts/vllm_routes.py")],
        capture_output=True,
        text=True,
        check=False,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    live = json.loads(done.stdout)
    listed = LISTS / f"{live['vllm']}.json"
    assert listed.exists(), f"no {listed}: run `bash scripts/vllm-routes.sh`"
    assert json.loads(listed.read_text()) == live, f"{listed} is stale: run scripts/vllm-routes.sh"
