"""Fixtures for the end-to-end tests: a tiny local model, a real vLLM serving it, the sidecar.

The expensive parts are started once: building the model (cached on disk between runs) and one
`vllm serve` (20-50 s on two cores), stopped when the last test here is done. Tests that kill or
restart vLLM get their own server in `test_e2e_lifecycle.py`. Everything a test run starts is
stopped by its fixture's finalizer, also on failure or Ctrl-C.
"""

from __future__ import annotations

import subprocess
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import aiohttp
import pytest

from tests.processes import ROOT, running

from ._servers import VLLM_VENV, SidecarProcess, TinyModel, VllmServer


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
def vllm_server(
    tiny_model: TinyModel, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[VllmServer]:
    """One real vLLM for this package's tests, serving the model under its basename."""
    server = VllmServer(
        tiny_model.path,
        tmp_path_factory.mktemp("vllm-shared"),
        served_model_name=tiny_model.name,
    )
    with running(server):
        yield server


@pytest.fixture(scope="package")
def sidecar(
    vllm_server: VllmServer, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[SidecarProcess]:
    """The sidecar in front of the shared vLLM, started through its CLI."""
    with running(SidecarProcess(vllm_server.url, tmp_path_factory.mktemp("sidecar"))) as proc:
        yield proc


@pytest.fixture
async def http() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=120)) as session:
        yield session
