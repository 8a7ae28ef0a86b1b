"""Fixtures of the image tests: the image built once per module, a container per test, and the
pod (the sidecar container as the Deployment runs it) in front of a fake vLLM."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.processes import spawn
from tests.support import free_port, wait_until

from .buildah import Container, Image, build_image, image_size
from .pod import Pod, sidecar_env, start_sidecar


@pytest.fixture(scope="module")
def image(request: pytest.FixtureRequest) -> Image:
    built = build_image()
    size, base = image_size(built.id), image_size(built.base)
    line = (
        f"image {built.id.removeprefix('sha256:')[:12]}: {size / 1e6:.0f} MB"
        f" ({base / 1e6:.0f} MB of it the local base), {built.seconds:.0f} s to build"
    )
    # Printed in `make test`'s output: past the capture, which holds file descriptor 1 here.
    plugins = request.config.pluginmanager
    reporter, capture = plugins.get_plugin("terminalreporter"), plugins.get_plugin("capturemanager")
    if reporter is not None and capture is not None:
        with capture.global_and_fixture_disabled():
            reporter.write_line(line)
    return built


@pytest.fixture
def container(image: Image, tmp_path: Path) -> Iterator[Container]:
    made = Container(image, tmp_path)
    try:
        yield made
    finally:
        made.remove()


@pytest.fixture(scope="module")
def pod(image: Image, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Pod]:
    """The sidecar container as deploy/kubernetes runs it (its environment: two workers, JSON
    logs; a read-only root with a writable /tmp), ready, in front of a fake vLLM process."""
    logs = tmp_path_factory.mktemp("pod")
    vllm_port = free_port()
    vllm = spawn([sys.executable, "-m", "tests.fake_vllm", "--port", str(vllm_port)], logs / "vllm")
    made: Container | None = None
    try:
        made = Container(image, logs)
        made.read_only()
        env = sidecar_env(vllm_port, pod=True)
        sidecar = start_sidecar(image, made, env)
        ready = Pod(made, sidecar, env)
        sidecar.wait_until(f"{sidecar.admin_url}/readyz", deadline_s=60)
        # Ready once one worker listens; the pod is whole when all of them do.
        workers = int(env["VLLM_SIDECAR_WORKERS"])
        wait_until(lambda: ready.listening_workers() == workers, f"{workers} workers listen", 30)
        yield ready
    finally:
        if made is not None:
            made.remove()
        vllm.stop()
