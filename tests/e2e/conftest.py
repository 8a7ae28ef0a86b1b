"""Fixtures for the end-to-end tests: a tiny local model, a real vLLM serving it, the sidecar.

The expensive parts are started once: building the model (cached on disk between runs) and one
`vllm serve` (20-50 s on two cores) for the whole run (tests/conftest.py's `dev_engine`). Tests
that kill or restart vLLM get their own server in `test_e2e_lifecycle.py`. Everything a test run
starts is stopped by its fixture's finalizer, also on failure or Ctrl-C.
"""

from __future__ import annotations

import subprocess
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import aiohttp
import pytest

from tests.processes import ROOT, running
from tests.sidecar import SidecarProcess
from tests.vllm_servers import VLLM_VENV, DevVllm, TinyModel, VllmServer


@pytest.fixture(scope="session")
def vllm_python() -> Path:
    python = VLLM_VENV / "bin/python"
    if not (VLLM_VENV / "bin/vllm").exists():
        pytest.fail(
            f"no vLLM at {VLLM_VENV}: run `bash scripts/test-env.sh` "
            "(or deselect these tests with -m 'not vllm')"
        )
    return python


@pytest.fixture(scope="session")
def tiny_model(vllm_python: Path) -> TinyModel:
    done = subprocess.run(
        [str(vllm_python), str(ROOT / "scripts/tiny_model.py")],
        capture_output=True,
        text=True,
        check=False,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr
    return TinyModel(Path(done.stdout.strip().splitlines()[-1]))


@pytest.fixture(scope="package")
def vllm_server(_shared_dev_vllm: DevVllm) -> Iterator[VllmServer]:
    """The run's shared real vLLM (tests/conftest.py), serving the model under its basename."""
    _shared_dev_vllm.check_alive()
    yield _shared_dev_vllm
    _shared_dev_vllm.serve_again()


@pytest.fixture(scope="package")
def sidecar(
    vllm_server: VllmServer, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[SidecarProcess]:
    """The sidecar in front of the shared vLLM, started through its CLI."""
    with running(SidecarProcess.cli(vllm_server.url, tmp_path_factory.mktemp("sidecar"))) as proc:
        yield proc


@pytest.fixture
async def http() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=120)) as session:
        yield session
