"""The two servers of the end-to-end tests: a real `vllm serve` and the sidecar, via their CLIs."""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from pathlib import Path

from tests.support import free_port

from ._processes import ROOT, ManagedProcess

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


class SidecarProcess(ManagedProcess):
    """The sidecar, started through its CLI (`python -m proxy`) in the test venv."""

    def __init__(self, upstream_url: str, run_dir: Path, *extra_args: str) -> None:
        self.port = free_port()
        self.admin_port = free_port()
        argv = [
            os.environ.get("SIDECAR_PYTHON", sys.executable),
            "-m",
            "proxy",
            "--upstream-url",
            upstream_url,
            "--host",
            "127.0.0.1",
            "--port",
            str(self.port),
            "--admin-port",
            str(self.admin_port),
            *extra_args,
        ]
        env = {k: v for k, v in os.environ.items() if not k.startswith("VLLM_SIDECAR_")}
        super().__init__("sidecar", argv, env, run_dir / f"sidecar-{self.port}.log")

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def admin_url(self) -> str:
        return f"http://127.0.0.1:{self.admin_port}"

    def start(self) -> None:
        super().start()
        self.wait_until(f"{self.admin_url}/readyz", deadline_s=60)
