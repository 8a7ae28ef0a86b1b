"""Real processes for the deployment tests: the `vllm-sidecar` CLI configured as deployed."""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from tests.manifests import manifest_env
from tests.processes import ManagedProcess
from tests.sidecar import SidecarProcess
from tests.support import free_port

# What the fake vLLM serves, and what it says the model was loaded from (its `root`), as with
# `vllm serve Qwen/Qwen2.5-0.5B-Instruct --served-model-name Qwen2.5-0.5B-Instruct`.
SERVED = "Qwen2.5-0.5B-Instruct"
ROOT = "Qwen/Qwen2.5-0.5B-Instruct"


@dataclass
class Stack:
    """A fake vLLM and the sidecar in front of it, each a real process on real ports."""

    vllm_port: int
    vllm: ManagedProcess
    sidecar: SidecarProcess
    env: dict[str, str] = field(default_factory=dict)


def sidecar_command() -> str:
    script = Path(sys.executable).parent / "vllm-sidecar"
    if not script.exists():
        pytest.fail("the vllm-sidecar console script is not installed: run `make test-env`")
    return str(script)


def start_sidecar(
    upstream_port: int, logs: Path, **extra_env: str
) -> tuple[SidecarProcess, dict[str, str]]:
    """The real CLI, configured by the Deployment's environment with test ports swapped in."""
    port, admin_port = free_port(), free_port()
    env = {
        **manifest_env(),
        "VLLM_SIDECAR_UPSTREAM_URL": f"http://127.0.0.1:{upstream_port}",
        "VLLM_SIDECAR_HOST": "127.0.0.1",
        "VLLM_SIDECAR_PORT": str(port),
        "VLLM_SIDECAR_ADMIN_PORT": str(admin_port),
        "VLLM_SIDECAR_HEALTH_INTERVAL": "0.2",
        "VLLM_SIDECAR_SHUTDOWN_GRACE": "1",
        **extra_env,
    }
    process = SidecarProcess(
        "vllm-sidecar",
        [sidecar_command()],
        {**os.environ, **env},
        logs / f"sidecar-{port}.log",
        port=port,
        admin_port=admin_port,
    )
    process.spawn()
    process.wait_until(f"{process.admin_url}/livez", deadline_s=30)
    return process, env
