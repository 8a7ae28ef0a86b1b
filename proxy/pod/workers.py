"""`--workers N`: the private metrics directory and the shared port, set up before anything
imports prometheus_client; then the supervisor runs (`supervisor`)."""

from __future__ import annotations

import os
import socket
import sys
import tempfile

from proxy.config.settings import Settings

MULTIPROC_ENV = "PROMETHEUS_MULTIPROC_DIR"


def shared_socket(host: str, port: int, *, listen: bool) -> socket.socket:
    """A TCP socket on (host, port) with SO_REUSEPORT, so that every worker can bind the port.

    The supervisor holds one that never listens: it finds a taken port before any worker starts,
    fixes port 0 to one number, and keeps the port the pod's while a worker is restarted (the
    kernel lets only the same user join). Only listening sockets get connections."""
    family, kind, proto, _, address = socket.getaddrinfo(
        host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
    )[0]
    sock = socket.socket(family, kind, proto)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        sock.bind(address)
        if listen:
            sock.listen(1024)
            sock.setblocking(False)
    except OSError:
        sock.close()
        raise
    return sock


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
