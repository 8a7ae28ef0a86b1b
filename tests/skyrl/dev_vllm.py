"""A real vLLM for the SkyRL tests (0.2 and 0.4): dev routes on, scale-out routes on."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from tests.e2e._servers import VLLM_VENV, TinyModel, VllmServer
from tests.processes import ROOT, running


class DevVllm(VllmServer):
    """vLLM with its dev routes (`VLLM_SERVER_DEV_MODE=1`: pause, sleep, is_sleeping,
    get_world_size) and `--enable-scale-out`, without which vLLM 0.32 answers SkyRL 0.4's
    /inference/v1/generate with 403. (Sleep works on CPU without `--enable-sleep-mode`,
    which the CPU platform refuses.)"""

    def __init__(self, model: TinyModel, run_dir: Path) -> None:
        super().__init__(
            model.path,
            run_dir,
            served_model_name=model.name,
            extra_args=("--enable-scale-out",),
            extra_env={"VLLM_SERVER_DEV_MODE": "1"},
        )
        self.hf_path = model.hf_path


def tiny_model_dir() -> Path:
    """The tiny local model's directory, built by scripts/tiny_model.py if it is not yet."""
    done = subprocess.run(
        [str(VLLM_VENV / "bin/python"), str(ROOT / "scripts/tiny_model.py")],
        capture_output=True,
        text=True,
        check=True,
        timeout=600,
    )
    return Path(done.stdout.strip().splitlines()[-1])


@contextmanager
def dev_vllm(run_dir: Path) -> Iterator[DevVllm]:
    """The tiny local model (scripts/tiny_model.py) served by a DevVllm until the block ends."""
    server = DevVllm(TinyModel(tiny_model_dir()), run_dir)
    with running(server):
        yield server
