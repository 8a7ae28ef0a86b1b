"""An older vLLM (0.20: no /is_paused, /is_sleeping, /weight_info), or one without dev mode,
is told at start-up: one log line and `vllm_sidecar_upstream_lacks{feature}`, from the 404s the
engine probe met (proxy/wiring/reconcile.py)."""

from __future__ import annotations

import logging

import pytest
from aiohttp.test_utils import TestServer

from tests.fake_vllm import FakeVLLM
from tests.sidecar import MakeSidecar, Sidecar
from tests.support import eventually

LACKS = "vllm_sidecar_upstream_lacks"
FEATURES = ("pause_state", "sleep_state", "weight_versions")


def lacks(sidecar: Sidecar) -> dict[str, float | None]:
    return {f: sidecar.sample(LACKS, feature=f) for f in FEATURES}


async def test_a_vllm_without_the_state_routes_is_told_once_with_what_it_lacks(
    upstream: TestServer,
    make_sidecar: MakeSidecar,
    fake: FakeVLLM,
    caplog: pytest.LogCaptureFixture,
) -> None:
    for route in ("GET /is_paused", "GET /is_sleeping", "GET /weight_info"):
        fake.script(route, fake.not_found, times=100)
    with caplog.at_level(logging.INFO, logger="proxy.wiring.reconcile"):
        sidecar = await make_sidecar(str(upstream.make_url("")))
        await eventually(lambda: lacks(sidecar) == dict.fromkeys(FEATURES, 1.0))
    [line] = [r.getMessage() for r in caplog.records if r.name == "proxy.wiring.reconcile"]
    assert line.startswith("vLLM answers 404 for /is_paused, /is_sleeping, /weight_info")
    assert "weight versions" in line


async def test_only_what_is_missing_is_told_and_only_once(
    upstream: TestServer,
    make_sidecar: MakeSidecar,
    fake: FakeVLLM,
    caplog: pytest.LogCaptureFixture,
) -> None:
    fake.script("GET /weight_info", fake.not_found, times=100)
    with caplog.at_level(logging.INFO, logger="proxy.wiring.reconcile"):
        sidecar = await make_sidecar(str(upstream.make_url("")), health_interval=0.05)
        await eventually(lambda: fake.forwarded("/weight_info") >= 4)  # probed again and again
    assert lacks(sidecar) == {"pause_state": 0.0, "sleep_state": 0.0, "weight_versions": 1.0}
    [line] = [r.getMessage() for r in caplog.records if r.name == "proxy.wiring.reconcile"]
    assert line.startswith("vLLM answers 404 for /weight_info (")


async def test_a_vllm_in_dev_mode_lacks_nothing_and_says_nothing(
    upstream: TestServer,
    make_sidecar: MakeSidecar,
    fake: FakeVLLM,
    caplog: pytest.LogCaptureFixture,
) -> None:
    with caplog.at_level(logging.INFO, logger="proxy.wiring.reconcile"):
        sidecar = await make_sidecar(str(upstream.make_url("")), health_interval=0.05)
        await eventually(lambda: lacks(sidecar) == dict.fromkeys(FEATURES, 0.0))
    assert not [r for r in caplog.records if r.name == "proxy.wiring.reconcile"]
