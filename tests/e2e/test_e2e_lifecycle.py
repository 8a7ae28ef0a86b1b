"""A real vLLM that hangs up, dies, stays down and comes back under another name.

These tests get their own vLLM (the shared one must stay up) that allows 131072 tokens, past the
tiny model's 32768 positions (VLLM_ALLOW_LONG_MAX_MODEL_LEN), so that a generation lasts minutes
and a hang-up or a kill always lands in its middle. 4096 were not enough on a quiet machine: the
tiny model sent all of them, [DONE] included, before the kill landed; 32768 last about a minute,
which one CI machine finished while its test waited.
Each test brings vLLM into the state it needs; in file order they cost two vLLM starts: the
first, and the restart under a new name.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from tests.metrics import metric
from tests.processes import running
from tests.sidecar import SidecarProcess
from tests.sse import DONE, sse_data
from tests.support import eventually
from tests.vllm_servers import TinyModel, VllmServer

pytestmark = pytest.mark.vllm

LONG_CONTEXT = 131072
RENAMED = "tiny-llama-v2"


@pytest.fixture(scope="module")
def vllm(tiny_model: TinyModel, tmp_path_factory: pytest.TempPathFactory) -> Iterator[VllmServer]:
    server = VllmServer(
        tiny_model.path,
        tmp_path_factory.mktemp("vllm-lifecycle"),
        served_model_name=tiny_model.name,
        max_model_len=LONG_CONTEXT,
        extra_env={"VLLM_ALLOW_LONG_MAX_MODEL_LEN": "1"},
    )
    with running(server):
        yield server


@pytest.fixture(scope="module")
def sidecar(vllm: VllmServer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[SidecarProcess]:
    # A short health interval only makes the sidecar notice vLLM's comings and goings sooner.
    proc = SidecarProcess.cli(
        vllm.url, tmp_path_factory.mktemp("sidecar"), "--health-interval", "0.5"
    )
    with running(proc):
        yield proc


@pytest.fixture
def vllm_up(vllm: VllmServer, sidecar: SidecarProcess) -> VllmServer:
    if not vllm.running:
        vllm.start()
        sidecar.wait_until(f"{sidecar.admin_url}/readyz")
    return vllm


def long_stream(model: str) -> dict[str, Any]:
    return {
        "model": model,
        "prompt": [1, 2, 3],
        "max_tokens": LONG_CONTEXT - 8,
        "ignore_eos": True,
        "stream": True,
    }


async def vllm_metric(http: aiohttp.ClientSession, vllm: VllmServer, name: str) -> float:
    return await metric(http, f"{vllm.url}/metrics", name)


async def test_client_hang_up_aborts_the_generation_in_vllm(
    http: aiohttp.ClientSession, vllm_up: VllmServer, sidecar: SidecarProcess, tiny_model: TinyModel
) -> None:
    # vLLM 0.32 does not count a request its client abandoned in request_success_total (only
    # engine-side aborts get finished_reason="abort"); its gauges, counters and log show it.
    finished = await vllm_metric(http, vllm_up, "vllm:request_success_total")
    generated = await vllm_metric(http, vllm_up, "vllm:generation_tokens_total")
    disconnects = f"{sidecar.admin_url}/metrics", "vllm_sidecar_client_disconnects_total"
    hung_up = await metric(http, *disconnects, route="/v1/completions")
    payload = long_stream(tiny_model.hf_path)

    resp = await http.post(f"{sidecar.url}/v1/completions", json=payload)
    assert resp.status == 200
    request_id = resp.headers["X-Request-Id"]
    first = await sse_data(resp, limit=3)
    assert all("choices" in e for e in first)
    assert await vllm_metric(http, vllm_up, "vllm:num_requests_running") == 1
    resp.close()  # hang up: the connection is dropped, not returned to the pool

    async def sidecar_counted() -> bool:
        return await metric(http, *disconnects, route="/v1/completions") == hung_up + 1

    await eventually(sidecar_counted, "the sidecar counts the client's disconnect", within=60)

    async def vllm_logged_abort() -> bool:
        # vLLM names the request after the X-Request-Id the sidecar sent it, and logs
        # "Request ... aborted." only when the request's generator is cancelled.
        return any(
            f"cmpl-{request_id}" in line and "aborted" in line.lower()
            for line in vllm_up.log_tail(200_000).splitlines()
        )

    await eventually(vllm_logged_abort, "vLLM logs the abort of this very request", within=60)

    async def vllm_idle() -> bool:
        return await vllm_metric(http, vllm_up, "vllm:num_requests_running") == 0

    await eventually(vllm_idle, "vLLM has no running request", within=60)
    # Idle, yet the request neither finished nor generated all it was asked for: it was aborted.
    stopped_at = await vllm_metric(http, vllm_up, "vllm:generation_tokens_total") - generated
    assert 0 < stopped_at < payload["max_tokens"]
    assert await vllm_metric(http, vllm_up, "vllm:request_success_total") == finished


async def test_vllm_killed_mid_stream_ends_in_an_error_event(
    http: aiohttp.ClientSession, vllm_up: VllmServer, sidecar: SidecarProcess, tiny_model: TinyModel
) -> None:
    labels = {"route": "/v1/completions", "source": "sidecar", "reason": "upstream_disconnected"}
    failures = f"{sidecar.admin_url}/metrics", "vllm_sidecar_failures_total"
    before = await metric(http, *failures, **labels)

    async with http.post(
        f"{sidecar.url}/v1/completions", json=long_stream(tiny_model.hf_path)
    ) as resp:
        assert resp.status == 200
        first = await sse_data(resp, limit=3)
        vllm_up.kill()
        rest = await sse_data(resp)
        request_id = resp.headers["X-Request-Id"]

    assert all("choices" in e for e in first)
    *chunks, error_event, done = rest
    assert done == DONE
    assert all("choices" in e for e in chunks)
    err = error_event["error"]
    assert (err["code"], err["source"], err["reason"]) == (502, "sidecar", "upstream_disconnected")
    assert err["retryable"] is True
    assert err["request_id"] == request_id
    assert await metric(http, *failures, **labels) == before + 1


async def test_vllm_down_gives_502_and_not_ready(
    http: aiohttp.ClientSession, vllm: VllmServer, sidecar: SidecarProcess, tiny_model: TinyModel
) -> None:
    vllm.kill()  # already gone when the test above ran first
    labels = {"route": "/v1/completions", "reason": "upstream_unreachable", "status": "502"}
    failures = f"{sidecar.admin_url}/metrics", "vllm_sidecar_failures_total"
    before = await metric(http, *failures, **labels)

    payload = {"model": tiny_model.hf_path, "prompt": [1, 2], "max_tokens": 1}
    async with http.post(f"{sidecar.url}/v1/completions", json=payload) as resp:
        status, body, header = resp.status, await resp.json(), resp.headers["X-Sidecar-Error"]
    assert status == 502
    assert header == "upstream_unreachable"
    err = body["error"]
    assert (err["code"], err["source"], err["reason"]) == (502, "sidecar", "upstream_unreachable")
    assert err["retryable"] is True
    assert await metric(http, *failures, **labels) == before + 1

    async def not_ready() -> bool:
        async with http.get(f"{sidecar.admin_url}/readyz") as resp:
            return resp.status == 503

    await eventually(not_ready, "/readyz turns 503", within=60)
    async with http.get(f"{sidecar.admin_url}/readyz") as resp:
        readiness = await resp.json()
    assert readiness["ready"] is False
    assert readiness["upstream_healthy"] is False
    assert await metric(http, f"{sidecar.admin_url}/metrics", "vllm_sidecar_upstream_up") == 0
    async with http.get(f"{sidecar.admin_url}/livez") as resp:
        assert resp.status == 200


async def test_restart_under_another_name_is_learned_without_restarting_the_sidecar(
    http: aiohttp.ClientSession, vllm: VllmServer, sidecar: SidecarProcess, tiny_model: TinyModel
) -> None:
    assert sidecar.proc is not None
    sidecar_pid = sidecar.proc.pid
    vllm.restart(RENAMED)

    async def learned() -> bool:
        async with http.get(f"{sidecar.admin_url}/readyz") as resp:
            return resp.status == 200 and (await resp.json())["served"] == [RENAMED]

    await eventually(learned, f"the sidecar is ready and knows {RENAMED}", within=60)
    for name in (tiny_model.hf_path, tiny_model.name, str(tiny_model.path)):
        payload = {"model": name, "prompt": [1, 2], "max_tokens": 1}
        async with http.post(f"{sidecar.url}/v1/completions", json=payload) as resp:
            body = await resp.json()
        assert resp.status == 200, (name, body)
        assert body["model"] == RENAMED
    async with http.get(f"{sidecar.admin_url}/models") as resp:
        [served] = (await resp.json())["served"]
    assert (served["id"], Path(served["root"])) == (RENAMED, tiny_model.path)
    assert sidecar.proc.pid == sidecar_pid
    assert sidecar.running
