"""The Rust frontend's tier: the same tests, on a vLLM that serves through `vllm/vllm-rs`
(`VLLM_USE_RUST_FRONTEND=1`, scripts/test-env.d/15-vllm-rs.sh) in place of its Python API
server. Same engine, same settings as the shared `dev_engine`; only the HTTP frontend differs.

Each module here imports the tests it runs (and their module's fixtures) from the module that
holds them; the fixtures below stand in for tests/conftest.py's and tests/e2e/conftest.py's
under this folder, so those tests meet the Rust frontend. Its one vLLM starts with the first
test here and stops after the last: the rest of the run does not carry a second engine.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.processes import running
from tests.sidecar import SidecarProcess
from tests.vllm_servers import DevVllm, TinyModel, rust_vllm


@pytest.fixture(scope="package")
def _shared_rust_vllm(
    tiny_model: TinyModel, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[DevVllm]:
    with rust_vllm(tiny_model, tmp_path_factory.mktemp("vllm-rust")) as server:
        yield server


@pytest.fixture(scope="module")
def dev_engine(_shared_rust_vllm: DevVllm) -> Iterator[DevVllm]:
    _shared_rust_vllm.check_alive()
    yield _shared_rust_vllm
    _shared_rust_vllm.serve_again()


@pytest.fixture(scope="package")
def vllm_server(_shared_rust_vllm: DevVllm) -> Iterator[DevVllm]:
    _shared_rust_vllm.check_alive()
    yield _shared_rust_vllm
    _shared_rust_vllm.serve_again()


@pytest.fixture(scope="package")
def sidecar(
    vllm_server: DevVllm, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[SidecarProcess]:
    """tests/e2e/conftest.py's, here too: a package fixture there is cached for the whole of
    tests/e2e, this folder included, and would keep the Python frontend's sidecar."""
    with running(SidecarProcess.cli(vllm_server.url, tmp_path_factory.mktemp("sidecar"))) as proc:
        yield proc
