"""The start of `--workers N`: the metrics directory and the port, then the supervisor.

Both are set up before anything imports prometheus_client, which picks its multiprocess mode
when it is first imported."""

from __future__ import annotations

import os
import sys
import tempfile

from proxy.config.settings import Settings

from .port import shared_socket

MULTIPROC_ENV = "PROMETHEUS_MULTIPROC_DIR"


def run(settings: Settings) -> None:
    """Supervise `settings.workers` worker processes until SIGTERM, then drain them all."""
    # prometheus_client chooses its value class when it is first imported: the directory must be
    # in the environment by then, in this process and (inherited) in every worker.
    if "prometheus_client" in sys.modules:
        raise RuntimeError("--workers needs PROMETHEUS_MULTIPROC_DIR set before prometheus_client")
    try:
        reserved = shared_socket(settings.host, settings.port, listen=False)
    except OSError as exc:
        sys.exit(f"vllm-sidecar: cannot bind {settings.host}:{settings.port}: {exc}")
    settings = settings.model_copy(update={"port": reserved.getsockname()[1]})
    with reserved, tempfile.TemporaryDirectory(prefix="vllm-sidecar-metrics-") as path:
        os.environ[MULTIPROC_ENV] = path
        from proxy.wiring import server

        from . import supervisor

        server.run_loop(supervisor.Supervisor(settings, path).run())
