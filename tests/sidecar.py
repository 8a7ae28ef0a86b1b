"""The sidecar under test in-process (`make_sidecar`) or as a process (`start_sidecar`), and what
the tests read from it: metrics, raw responses, the error envelope."""

from __future__ import annotations

import asyncio
import subprocess
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from aiohttp import ClientResponse, web
from aiohttp.test_utils import TestClient
from prometheus_client import CollectorRegistry

from proxy.upstream.discovery import DISCOVERY
from tests.metrics import metric_value, require_metric
from tests.support import eventually

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


MakeSidecar = Callable[..., Awaitable[Sidecar]]
StartSidecar = Callable[..., Awaitable[tuple[subprocess.Popen[bytes], str]]]


def admin_of(proc: subprocess.Popen[bytes]) -> str:
    """The admin URL of a sidecar process started with --admin-port."""
    args = list(proc.args)  # type: ignore[arg-type]
    return f"http://127.0.0.1:{args[args.index('--admin-port') + 1]}"


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
