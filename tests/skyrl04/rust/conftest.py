"""SkyRL 0.4's client against the Rust frontend: the real-vLLM tests of
tests/skyrl04/test_client_vllm.py on a vLLM that serves through `vllm/vllm-rs`
(`VLLM_USE_RUST_FRONTEND=1`), as tests/e2e/rust/ does for the 3.11 tiers. Its one vLLM starts
with the first test here and stops after the last."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.vllm_servers import DevVllm, TinyModel, rust_vllm, tiny_model_dir


@pytest.fixture(scope="package")
def _shared_rust_vllm(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DevVllm]:
    model = TinyModel(tiny_model_dir())
    with rust_vllm(model, tmp_path_factory.mktemp("vllm-rust")) as server:
        yield server


@pytest.fixture(scope="module")
def dev_engine(_shared_rust_vllm: DevVllm) -> Iterator[DevVllm]:
    _shared_rust_vllm.check_alive()
    yield _shared_rust_vllm
    _shared_rust_vllm.serve_again()
