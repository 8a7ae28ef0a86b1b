"""Fixtures of the deployment tests: the real `vllm-sidecar` process in front of a fake vLLM."""

from __future__ import annotations

import sys
from collections.abc import Iterator

import pytest

from tests.processes import spawn
from tests.sidecar import SidecarProcess
from tests.support import free_port

from .stack import ROOT, SERVED, Stack, start_sidecar


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    logs = tmp_path_factory.mktemp("stack")
    vllm_port = free_port()
    vllm = spawn(
        [
            sys.executable,
            "-m",
            "tests.fake_vllm",
            "--port",
            str(vllm_port),
            "--served-model-name",
            SERVED,
            "--root",
            ROOT,
        ],
        logs / "fake-vllm.log",
    )
    sidecar: SidecarProcess | None = None
    try:
        sidecar, env = start_sidecar(vllm_port, logs)
        sidecar.wait_until(f"{sidecar.admin_url}/readyz", deadline_s=30)
        yield Stack(vllm_port, vllm, sidecar, env)
    finally:
        if sidecar is not None:
            sidecar.stop()
        vllm.stop()
