"""Shared fixtures: a scripted fake vLLM on a real socket, and the sidecar in front of it."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer
from prometheus_client import CollectorRegistry

from proxy.admin import create_admin_app
from proxy.app import create_app
from proxy.keys import DISCOVERY
from proxy.settings import Settings
from tests.fake_vllm import FakeVLLM
from tests.support import free_port, wait_http_ok

# tests/skyrl04 needs skyrl 0.4, hence Python 3.12: `make test` runs it in .venv-skyrl04.
collect_ignore = [] if sys.version_info >= (3, 12) else ["skyrl04"]


@dataclass
class Sidecar:
    client: TestClient[web.Request, web.Application]
    admin: TestClient[web.Request, web.Application]
    app: web.Application
    registry: CollectorRegistry

    def metric(self, name: str, **labels: str) -> float:
        return self.registry.get_sample_value(name, labels) or 0.0

    async def wait_ready(self, within: float = 5.0) -> None:
        discovery = self.app[DISCOVERY]
        for _ in range(int(within / 0.01)):
            if discovery.readiness()[0]:
                return
            await asyncio.sleep(0.01)
        raise AssertionError(f"sidecar not ready: {discovery.readiness()[1]}")


MakeSidecar = Callable[..., Awaitable[Sidecar]]


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


@pytest.fixture
def fake() -> FakeVLLM:
    return FakeVLLM()


@pytest.fixture
async def upstream(fake: FakeVLLM, aiohttp_server: Any) -> TestServer:
    server: TestServer = await aiohttp_server(fake.app())
    return server


@pytest.fixture
def make_sidecar(aiohttp_client: Any) -> MakeSidecar:
    async def make(upstream_url: str, *, ready: bool = True, **options: Any) -> Sidecar:
        options.setdefault("health_interval", 0.05)
        options.setdefault("miss_refresh_interval", 0)
        settings = Settings(upstream_url=upstream_url, **options)
        registry = CollectorRegistry()
        app = create_app(settings, registry=registry)
        client = await aiohttp_client(app)
        admin = await aiohttp_client(create_admin_app(app))
        sidecar = Sidecar(client, admin, app, registry)
        if ready:
            await sidecar.wait_ready()
        return sidecar

    return make


@pytest.fixture
async def sidecar(upstream: TestServer, make_sidecar: MakeSidecar) -> Sidecar:
    return await make_sidecar(str(upstream.make_url("")))


StartSidecar = Callable[..., Any]


def _spawn(*args: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen([sys.executable, "-m", "proxy", *args])


@pytest.fixture
async def start_sidecar() -> AsyncIterator[StartSidecar]:
    """The real `python -m proxy` process (the production runner), ready, on free ports."""
    procs: list[subprocess.Popen[bytes]] = []

    async def start(upstream: str, *args: str) -> tuple[subprocess.Popen[bytes], str]:
        port, admin = free_port(), free_port()
        proc = _spawn(
            "--upstream-url", upstream, "--host", "127.0.0.1", "--port", str(port),
            "--admin-port", str(admin), "--health-interval", "0.1", *args,
        )  # fmt: skip
        procs.append(proc)
        await wait_http_ok(f"http://127.0.0.1:{admin}/readyz")
        return proc, f"http://127.0.0.1:{port}"

    yield start
    for proc in procs:
        if proc.poll() is None:
            proc.kill()
        proc.wait(10)
