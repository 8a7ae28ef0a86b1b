"""A real vLLM for the SkyRL tests (0.2 and 0.4): dev routes on, scale-out routes on."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from tests.e2e._processes import ROOT, running
from tests.e2e._servers import VLLM_VENV, TinyModel, VllmServer


class DevVllm(VllmServer):
    """vLLM with its dev routes (`VLLM_SERVER_DEV_MODE=1`: pause, sleep, is_sleeping,
    get_world_size) and `--enable-scale-out`, without which vLLM 0.32 answers SkyRL 0.4's
    /inference/v1/generate with 403. (Sleep works on CPU without `--enable-sleep-mode`,
    which the CPU platform refuses.)"""

    hf_path = ""

    def _env(self) -> dict[str, str]:
        return {**super()._env(), "VLLM_SERVER_DEV_MODE": "1"}

    # VllmServer.start builds its argv inline; the flag is added as it is set.
    @property  # type: ignore[override]
    def argv(self) -> list[str]:
        return self._argv

    @argv.setter
    def argv(self, value: list[str]) -> None:
        self._argv = [*value, "--enable-scale-out"] if value else []


@contextmanager
def dev_vllm(run_dir: Path) -> Iterator[DevVllm]:
    """The tiny local model (scripts/tiny_model.py) served by a DevVllm until the block ends."""
    done = subprocess.run(
        [str(VLLM_VENV / "bin/python"), str(ROOT / "scripts/tiny_model.py")],
        capture_output=True,
        text=True,
        check=True,
        timeout=600,
    )
    model = TinyModel(Path(done.stdout.strip().splitlines()[-1]))
    server = DevVllm(model.path, run_dir, served_model_name=model.name)
    server.hf_path = model.hf_path
    with running(server):
        yield server
