"""The sidecar container as it is deployed: its environment (the Deployment's, or the image's
own defaults as `docker run` leaves them) and the ports it answers on."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass

from tests.manifests import manifest_env
from tests.sidecar import SidecarProcess
from tests.support import free_port, http_get

from .buildah import Container, Image


def sidecar_env(upstream_port: int, *, pod: bool, **extra: str) -> dict[str, str]:
    """The container's environment: the Deployment's (`pod`) or the image's own defaults, as
    `docker run -e VLLM_SIDECAR_UPSTREAM_URL=...` leaves them; then free ports, since with
    the host's network the image's 8080 and 8081 may be taken here, and loopback for both
    listeners, since the host's interfaces are the container's."""
    return {
        **(manifest_env() if pod else {}),
        "VLLM_SIDECAR_UPSTREAM_URL": f"http://127.0.0.1:{upstream_port}",
        "VLLM_SIDECAR_HOST": "127.0.0.1",
        "VLLM_SIDECAR_PORT": str(free_port()),
        "VLLM_SIDECAR_ADMIN_PORT": str(free_port()),
        "VLLM_SIDECAR_HEALTH_INTERVAL": "0.2",
        **extra,
    }


def start_sidecar(image: Image, container: Container, env: dict[str, str]) -> SidecarProcess:
    """The image's entrypoint, exactly as configured (buildah run does not apply it)."""
    port = int(env["VLLM_SIDECAR_PORT"])
    sidecar = SidecarProcess(
        f"{container.name}-sidecar",
        container.command(image.config()["Entrypoint"], env),
        os.environ,
        container.logs / f"{container.name}-sidecar-{port}.log",
        port=port,
        admin_port=int(env["VLLM_SIDECAR_ADMIN_PORT"]),
    )
    return container.start(sidecar)


@dataclass
class Pod:
    """A running sidecar container and the environment it was started with."""

    container: Container
    sidecar: SidecarProcess
    env: dict[str, str]

    def listening_workers(self) -> int:
        """How many workers serve the proxy port, as /readyz says (0 while not ready)."""
        status, body = http_get(f"{self.sidecar.admin_url}/readyz")
        return int(json.loads(body)["workers"]) if status == 200 else 0
