"""The sidecar under test in-process (`make_sidecar`) or as a process (`SidecarProcess`, what
`start_sidecar` returns), and what the tests read from it: metrics, raw responses, the error
envelope."""

from __future__ import annotations

import asyncio
import os
import sys
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Self

from aiohttp import ClientResponse, web
from aiohttp.test_utils import TestClient
from prometheus_client import CollectorRegistry

from proxy.upstream.discovery import DISCOVERY
from tests.metrics import metric_value, require_metric
from tests.processes import ManagedProcess
from tests.support import eventually, free_port

COMPLETION = {"model": "org/tiny-model", "prompt": [[1, 2]]}


async def control(sidecar: Sidecar, path: str, **kwargs: Any) -> ClientResponse:
    """A control-plane POST through the proxy port, its body read."""
    resp = await sidecar.client.post(path, **kwargs)
    await resp.read()
    return resp


@dataclass
class Sidecar:
    client: TestClient[web.Request, web.Application]
    admin: TestClient[web.Request, web.Application]
    app: web.Application
    registry: CollectorRegistry

    def metric(self, name: str, **labels: str) -> float:
        """A sample's value, 0.0 if not counted yet; fails for a metric never registered."""
        return require_metric(self.registry, name, labels)

    def sample(self, name: str, **labels: str) -> float | None:
        """A sample's value, or None when this label set was never counted."""
        return metric_value(self.registry, name, labels)

    async def wait_ready(self, within: float = 5.0) -> None:
        discovery = self.app[DISCOVERY]
        await eventually(lambda: discovery.readiness()[0], "the sidecar is ready", within, 0.01)


class SidecarProcess(ManagedProcess):
    """A sidecar running as a process, its proxy port and admin port on loopback: started from
    its CLI (`cli`), the console script as deployed (tests/deploy), the image's entrypoint under
    buildah (tests/image)."""

    def __init__(
        self,
        name: str,
        argv: Sequence[str],
        env: Mapping[str, str],
        log_path: Path,
        *,
        port: int,
        admin_port: int,
    ) -> None:
        super().__init__(name, argv, env, log_path)
        self.port, self.admin_port = port, admin_port

    @classmethod
    def cli(cls, upstream_url: str, run_dir: Path, *extra_args: str) -> Self:
        """`python -m proxy` in the test venv (or $SIDECAR_PYTHON), on free ports."""
        port, admin_port = free_port(), free_port()
        argv = [
            os.environ.get("SIDECAR_PYTHON", sys.executable),
            "-m",
            "proxy",
            "--upstream-url",
            upstream_url,
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--admin-port",
            str(admin_port),
            *extra_args,
        ]
        env = {k: v for k, v in os.environ.items() if not k.startswith("VLLM_SIDECAR_")}
        log = run_dir / f"sidecar-{port}.log"
        return cls("sidecar", argv, env, log, port=port, admin_port=admin_port)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def admin_url(self) -> str:
        return f"http://127.0.0.1:{self.admin_port}"

    def start(self) -> None:
        self.spawn()
        self.wait_until(f"{self.admin_url}/readyz", deadline_s=60)

    async def start_serving(self) -> None:
        """Start, and wait for readiness without blocking the loop the upstream may run in."""
        self.spawn()
        await self.serving(f"{self.admin_url}/readyz", deadline_s=60)


MakeSidecar = Callable[..., Awaitable[Sidecar]]
StartSidecar = Callable[..., Awaitable[SidecarProcess]]


async def raw_http(client: TestClient[web.Request, web.Application], request: bytes) -> bytes:
    """Send exact request bytes (no client-side URL normalization); return the raw response."""
    assert client.port is not None
    reader, writer = await asyncio.open_connection("127.0.0.1", client.port)
    try:
        writer.write(request)
        await writer.drain()
        return await asyncio.wait_for(reader.read(), 10)  # the requests send Connection: close
    finally:
        writer.close()


def failures(
    sidecar: Sidecar,
    reason: str,
    status: str,
    source: str = "sidecar",
    route: str = "/v1/completions",
) -> float:
    return sidecar.metric(
        "vllm_sidecar_failures_total", route=route, source=source, reason=reason, status=status
    )


async def assert_envelope(resp: ClientResponse, status: int, reason: str) -> dict[str, Any]:
    """Check the error envelope's status, reason and request id; return its `error` object."""
    assert resp.status == status
    assert resp.headers["X-Sidecar-Error"] == reason
    err: dict[str, Any] = (await resp.json())["error"]
    assert (err["code"], err["reason"]) == (status, reason)
    assert err["request_id"] == resp.headers["X-Request-Id"]
    return err
