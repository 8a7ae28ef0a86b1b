"""The real vLLM servers, shared by every tier that needs one: a real `vllm serve` via its CLI.

`VllmServer` serves a local model directory on CPU; `DevVllm` is the run's shared one (dev
routes, scale-out, weight transfer), `rust_vllm` the same behind vLLM's Rust frontend. The
sidecar in front of them runs via its own CLI as tests/sidecar.py's `SidecarProcess`.
"""

from __future__ import annotations

import os
import subprocess
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.processes import ROOT, ManagedProcess, running
from tests.support import free_port

__all__ = [
    "VLLM_VENV",
    "DevVllm",
    "TinyModel",
    "VllmServer",
    "rust_vllm",
    "tiny_model_dir",
]

VLLM_VENV = Path(os.environ.get("VLLM_VENV", ROOT / ".venv-vllm"))


@dataclass(frozen=True)
class TinyModel:
    """The model directory `.../<org>/<name>` (see scripts/tiny_model.py) and its names."""

    path: Path

    @property
    def name(self) -> str:
        return self.path.name

    @property
    def hf_path(self) -> str:
        return f"{self.path.parent.name}/{self.path.name}"


class VllmServer(ManagedProcess):
    """A real `vllm serve` of a local model directory on 127.0.0.1, on CPU, offline."""

    def __init__(
        self,
        model_dir: Path,
        run_dir: Path,
        *,
        served_model_name: str,
        max_model_len: int = 512,
        port: int | None = None,
        extra_args: tuple[str, ...] = (),
        extra_env: dict[str, str] | None = None,
    ) -> None:
        self.extra_args, self.extra_env = extra_args, extra_env or {}
        self.model_dir = model_dir
        self.run_dir = run_dir
        self.port = port or free_port()
        self.max_model_len = max_model_len
        self.served_model_name = served_model_name
        self.starts = 0
        super().__init__("vllm", [], self._env(), run_dir / "vllm.log")

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def _env(self) -> dict[str, str]:
        # Everything vLLM, torch, HF and the usage reporter write goes under this run's directory.
        home, tmp, cache = (self.run_dir / d for d in ("home", "tmp", "cache"))
        for d in (home, tmp, cache):
            d.mkdir(parents=True, exist_ok=True)
        keep = ("PATH", "LANG", "LC_ALL", "TZ")
        env = {k: os.environ[k] for k in keep if k in os.environ}
        env.update(
            HOME=str(home),
            TMPDIR=str(tmp),
            XDG_CACHE_HOME=str(cache),
            XDG_CONFIG_HOME=str(home / ".config"),
            VLLM_CACHE_ROOT=str(cache / "vllm"),
            VLLM_CONFIG_ROOT=str(home / ".config/vllm"),
            HF_HOME=str(cache / "huggingface"),
            HF_HUB_OFFLINE="1",
            TRANSFORMERS_OFFLINE="1",
            VLLM_NO_USAGE_STATS="1",
            DO_NOT_TRACK="1",
            VLLM_CPU_KVCACHE_SPACE="1",
            PYTHONUNBUFFERED="1",
        )
        env.update(self.extra_env)
        return env

    def start(self) -> None:
        self.argv = [
            str(VLLM_VENV / "bin/vllm"),
            "serve",
            str(self.model_dir),
            "--served-model-name",
            self.served_model_name,
            "--dtype",
            "float32",
            "--max-model-len",
            str(self.max_model_len),
            "--enforce-eager",
            "--enable-log-requests",
            "--host",
            "127.0.0.1",
            "--port",
            str(self.port),
            *self.extra_args,
        ]
        self.starts += 1
        with self.log_path.open("a") as log:
            log.write(f"\n==== start {self.starts}: {' '.join(self.argv)}\n")
        super().start()
        self.wait_until(f"{self.url}/health")

    def restart(self, served_model_name: str | None = None) -> None:
        """Stop, then start again on the same port, optionally under another served name."""
        self.stop()
        if served_model_name is not None:
            self.served_model_name = served_model_name
        self.start()


class DevVllm(VllmServer):
    """The vLLM most real-vLLM tests share (tests/conftest.py's `dev_engine`): dev routes
    (`VLLM_SERVER_DEV_MODE=1`: pause, sleep, is_sleeping, get_world_size), `--enable-scale-out`
    (without it vLLM 0.32 answers SkyRL 0.4's /inference/v1/generate with 403), a weight-transfer
    backend (start/finish_weight_update run on CPU with nccl named), a long context (a
    generation that cannot end on its own before a test cuts it), and one compute thread,
    unbound: bound, vLLM's worker holds both cores of a two-core VM while it generates, and
    nothing else runs meanwhile, not its own API server (which then relays tokens seconds
    late), not the sidecar, not the test; unbound with a thread per core, two vLLMs (the
    training loop's) and everything else fight for the cores, and generation crawled at 4-30
    tokens a second where one thread makes 200-400. Sleep works on CPU without
    `--enable-sleep-mode`, which the CPU platform refuses."""

    CONTEXT = 32768

    def __init__(self, model: TinyModel, run_dir: Path, *, rust: bool = False) -> None:
        super().__init__(
            model.path,
            run_dir,
            served_model_name=model.name,
            max_model_len=self.CONTEXT,
            extra_args=("--enable-scale-out", "--weight-transfer-config", '{"backend": "nccl"}'),
            extra_env={
                "VLLM_SERVER_DEV_MODE": "1",
                "VLLM_CPU_OMP_THREADS_BIND": "nobind",
                "OMP_NUM_THREADS": "1",
                # vLLM's Rust frontend in place of its Python API server, same engine
                # (scripts/test-env.d/15-vllm-rs.sh).
                **({"VLLM_USE_RUST_FRONTEND": "1"} if rust else {}),
            },
        )
        self.hf_path = model.hf_path
        self.rust = rust

    def serve_again(self) -> None:
        """Resume and wake vLLM on its own port, whatever a test left it in (both are no-ops on
        a serving engine), so that the next module meets it serving."""
        for path in ("/resume", "/wake_up"):
            request = urllib.request.Request(f"{self.url}{path}", method="POST")
            with urllib.request.urlopen(request, timeout=120) as resp:
                assert resp.status == 200, path


@contextmanager
def rust_vllm(model: TinyModel, run_dir: Path) -> Iterator[DevVllm]:
    """A DevVllm on vLLM's Rust frontend (scripts/test-env.d/15-vllm-rs.sh), for the block."""
    if not list((VLLM_VENV / "lib").glob("python3*/site-packages/vllm/vllm-rs")):
        pytest.fail(f"no vllm-rs in {VLLM_VENV}: run `bash scripts/test-env.sh`")
    with running(DevVllm(model, run_dir, rust=True)) as server:
        assert "Launching Rust frontend" in server.log_tail(10**6)
        yield server


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
