"""Shared fixtures: a scripted fake vLLM on a real socket, and the sidecar in front of it."""

from __future__ import annotations

import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from aiohttp.test_utils import TestServer
from prometheus_client import CollectorRegistry

from proxy.client.admin import create_admin_app
from proxy.config.settings import Settings
from proxy.wiring.app import create_app
from tests.fake_vllm import FakeVLLM
from tests.processes import SidecarProcess
from tests.sidecar import MakeSidecar, Sidecar, StartSidecar

# tests/skyrl04 needs skyrl 0.4, hence Python 3.12: `make test` runs it in .venv-skyrl04.
collect_ignore = [] if sys.version_info >= (3, 12) else ["skyrl04"]


@pytest.fixture
def fake() -> FakeVLLM:
    return FakeVLLM()


@pytest.fixture
async def upstream(fake: FakeVLLM, aiohttp_server: Any) -> TestServer:
    # vLLM's server (uvicorn, FastAPI) inflates no request body: neither does its fake.
    server: TestServer = await aiohttp_server(fake.app(), auto_decompress=False)
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


@pytest.fixture
async def start_sidecar(tmp_path: Path) -> AsyncIterator[StartSidecar]:
    """The real `python -m proxy` process (the production runner), ready, on free ports, in its
    own process group with its log under the test's tmp_path."""
    started: list[SidecarProcess] = []

    async def start(upstream: str, *args: str) -> tuple[Any, str]:
        process = SidecarProcess(upstream, tmp_path, "--health-interval", "0.1", *args)
        started.append(process)
        await process.start_serving()
        assert process.proc is not None
        return process.proc, process.url

    yield start
    for process in started:
        process.kill()
