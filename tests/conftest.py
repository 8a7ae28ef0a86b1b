"""Shared fixtures: a scripted fake vLLM on a real socket, and the sidecar in front of it."""

from __future__ import annotations

import sys
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
from aiohttp.test_utils import TestServer
from prometheus_client import CollectorRegistry

from proxy.client.admin import create_admin_app
from proxy.config.settings import Settings
from proxy.wiring import dispatch
from proxy.wiring.app import create_app
from tests.fake_vllm import FakeVLLM
from tests.phoenix import Phoenix, running_phoenix
from tests.processes import running
from tests.sidecar import MakeSidecar, Sidecar, SidecarProcess, StartSidecar
from tests.vllm_servers import DevVllm, TinyModel, tiny_model_dir

# tests/skyrl04 needs skyrl 0.4, hence Python 3.12: `make test` runs it in .venv-skyrl04.
collect_ignore = [] if sys.version_info >= (3, 12) else ["skyrl04"]

# The modules whose outcome depends on the upstream client (--upstream-client: how a request is
# written to vLLM and its answer read, pooled, resent, relayed): `make faults-aiohttp` runs them
# again on aiohttp's client (`-m hop`). Not here: what the sidecar decides before or without the
# hop (model resolution's properties, log lines, the loop's stalls on bodies and model lists).
HOP_MODULES = frozenset(
    (
        "tests/reliability/test_chaos.py",
        "tests/reliability/test_client_faults.py",
        "tests/reliability/test_connection_bounds.py",
        "tests/reliability/test_hostile.py",
        "tests/reliability/test_hostile_upstream.py",
        "tests/reliability/test_load.py",
        "tests/reliability/test_memory.py",
        "tests/reliability/test_resend.py",
        "tests/reliability/test_silent_failures.py",
        "tests/reliability/test_upstream_faults.py",
        "tests/reliability/test_upstream_pool.py",
        "tests/test_failures.py",
        "tests/test_forward.py",
        "tests/test_upstream_guards.py",
    )
)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    root = Path(config.rootpath)
    for item in items:
        if item.path.relative_to(root).as_posix() in HOP_MODULES:
            item.add_marker(pytest.mark.hop)


@pytest.fixture
def fake() -> FakeVLLM:
    return FakeVLLM()


@pytest.fixture(scope="session")
def _shared_dev_vllm(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DevVllm]:
    """One real vLLM for the whole run (a start costs 20-50 s on two cores): see `dev_engine`."""
    server = DevVllm(TinyModel(tiny_model_dir()), tmp_path_factory.mktemp("vllm-dev"))
    with running(server):
        yield server


@pytest.fixture(scope="session")
def phoenix(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Phoenix]:
    """Arize Phoenix, a real OTLP receiver (tests/test_tracing.py), started once."""
    yield from running_phoenix(tmp_path_factory)


@pytest.fixture(scope="module")
def dev_engine(_shared_dev_vllm: DevVllm) -> Iterator[DevVllm]:
    """The real vLLM shared by every module that needs one serving and does not stop it
    (tests/e2e, tests/skyrl, tests/skyrl04; a module that kills or restarts vLLM starts its
    own). A module may pause it, sleep it, update its weights: it is serving again for the
    next (`serve_again`), and a test reads the weight version it starts from, never assumes it."""
    _shared_dev_vllm.check_alive()
    yield _shared_dev_vllm
    _shared_dev_vllm.serve_again()


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
        # The proxy port's dispatch as `serve` installs it (wiring/dispatch.py).
        dispatch.install(client.server.runner, app)
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

    async def start(upstream: str, *args: str) -> SidecarProcess:
        process = SidecarProcess.cli(upstream, tmp_path, "--health-interval", "0.1", *args)
        started.append(process)
        await process.start_serving()
        return process

    yield start
    for process in started:
        process.kill()
