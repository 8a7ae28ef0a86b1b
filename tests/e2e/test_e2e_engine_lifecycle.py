"""The engine lifecycle against a real vLLM on CPU in dev mode: holds, deadlines, aborts, the
weight version and the control token, as a trainer drives them through the sidecar.

The run's shared vLLM (dev mode, a weight-transfer backend so that start/finish_weight_update
run on CPU: tests/conftest.py's `dev_engine`) and two sidecars in front of it: `guarded` holds
up to a minute and wants a control token; `strict` holds one second, so that its deadline is
reached. Each test leaves the engine
serving again, whatever happened.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import aiohttp
import orjson
import pytest

from tests.metrics import metric
from tests.processes import running
from tests.sidecar import SidecarProcess
from tests.sse import DONE, sse_data
from tests.support import eventually
from tests.vllm_servers import DevVllm, TinyModel, VllmServer

pytestmark = pytest.mark.vllm

TOKEN = "e2e-control-token"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
LONG_CONTEXT = DevVllm.CONTEXT


@pytest.fixture(scope="module")
def vllm(dev_engine: DevVllm) -> DevVllm:
    return dev_engine


def _sidecar(vllm: VllmServer, run_dir: Any, *args: str) -> SidecarProcess:
    return SidecarProcess.cli(vllm.url, run_dir, "--health-interval", "0.5", *args)


@pytest.fixture(scope="module")
def guarded(vllm: VllmServer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[SidecarProcess]:
    args = ("--phase-hold-timeout", "60", "--control-token", TOKEN)
    with running(_sidecar(vllm, tmp_path_factory.mktemp("guarded"), *args)) as proc:
        yield proc


@pytest.fixture(scope="module")
def strict(vllm: VllmServer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[SidecarProcess]:
    args = ("--phase-hold-timeout", "1")
    with running(_sidecar(vllm, tmp_path_factory.mktemp("strict"), *args)) as proc:
        yield proc


async def engine(http: aiohttp.ClientSession, sidecar: SidecarProcess) -> dict[str, Any]:
    async with http.get(f"{sidecar.admin_url}/engine") as resp:
        result: dict[str, Any] = await resp.json()
        return result


async def phase_gauge(http: aiohttp.ClientSession, sidecar: SidecarProcess) -> str:
    url, name = f"{sidecar.admin_url}/metrics", "vllm_sidecar_engine_phase"
    phases = ("serving", "paused", "sleeping", "weight_sync")
    values = {p: await metric(http, url, name, phase=p) for p in phases}
    [current] = [p for p, v in values.items() if v == 1]
    assert sum(values.values()) == 1
    return current


@pytest.fixture
async def serving(
    http: aiohttp.ClientSession, vllm: VllmServer, guarded: SidecarProcess, strict: SidecarProcess
) -> Any:
    """Both sidecars see a serving engine before and after the test (reset on vLLM's own port)."""

    async def reset() -> None:
        for path in ("/resume", "/wake_up"):
            async with http.post(f"{vllm.url}{path}") as resp:
                assert resp.status == 200, await resp.text()

        async def both_serving() -> bool:
            return all([(await engine(http, s))["phase"] == "serving" for s in (guarded, strict)])

        await eventually(both_serving, "both sidecars see the engine serving", within=60.0)

    await reset()
    yield
    await reset()


async def control(
    http: aiohttp.ClientSession, sidecar: SidecarProcess, path: str, **kwargs: Any
) -> int:
    async with http.post(f"{sidecar.url}{path}", headers=AUTH, **kwargs) as resp:
        assert resp.status == 200, await resp.text()
        return resp.status


def completion(model: TinyModel, **extra: Any) -> dict[str, Any]:
    return {"model": model.hf_path, "prompt": [1, 2, 3], "max_tokens": 4, **extra}


@pytest.mark.usefixtures("serving")
@pytest.mark.parametrize(
    ("enter", "leave", "phase"),
    [
        ("/pause?mode=abort", "/resume", "paused"),
        ("/pause?mode=wait", "/resume", "paused"),
        ("/pause?mode=keep", "/resume", "paused"),
        ("/sleep?level=1", "/wake_up", "sleeping"),
    ],
)
async def test_a_new_request_is_held_and_completes_after_the_engine_is_back(
    http: aiohttp.ClientSession,
    guarded: SidecarProcess,
    tiny_model: TinyModel,
    enter: str,
    leave: str,
    phase: str,
) -> None:
    await control(http, guarded, enter)
    assert await phase_gauge(http, guarded) == phase
    request = asyncio.create_task(
        http.post(f"{guarded.url}/v1/completions", json=completion(tiny_model))
    )

    async def held() -> bool:
        return (await engine(http, guarded))["held_requests"] == 1

    await eventually(held, "the request is held by the sidecar", within=60.0)
    await control(http, guarded, leave)
    assert await phase_gauge(http, guarded) == "serving"
    async with await asyncio.wait_for(request, 60) as resp:
        assert resp.status == 200, await resp.text()
        assert (await resp.json())["choices"][0]["finish_reason"] == "length"
        assert resp.headers["X-Weight-Version"]
    url = f"{guarded.admin_url}/metrics"
    labels = {"phase": phase, "route": "/v1/completions", "outcome": "held"}
    assert await metric(http, url, "vllm_sidecar_phase_requests_total", **labels) >= 1


@pytest.mark.usefixtures("serving")
@pytest.mark.parametrize(
    ("enter", "reason"),
    [("/pause?mode=keep", "engine_paused"), ("/sleep?level=1&mode=abort", "engine_sleeping")],
)
async def test_past_its_deadline_a_held_request_gets_the_503_envelope(
    http: aiohttp.ClientSession,
    strict: SidecarProcess,
    tiny_model: TinyModel,
    enter: str,
    reason: str,
) -> None:
    await control(http, strict, enter)
    payload = completion(tiny_model, stream=True)
    # The client's own timeout only turns a hang into a failure; the deadline is 1 s.
    async with http.post(
        f"{strict.url}/v1/completions", json=payload, timeout=aiohttp.ClientTimeout(total=30)
    ) as resp:
        body = await resp.json()
        assert (resp.status, resp.headers["X-Sidecar-Error"]) == (503, reason)
        assert int(resp.headers["Retry-After"]) >= 1
    error = body["error"]
    assert (error["reason"], error["retryable"], error["source"]) == (reason, True, "sidecar")


@pytest.mark.usefixtures("serving")
async def test_an_aborted_stream_ends_as_vllm_sent_it_and_is_counted(
    http: aiohttp.ClientSession, guarded: SidecarProcess, tiny_model: TinyModel
) -> None:
    url = f"{guarded.admin_url}/metrics"
    labels = {"phase": "paused", "route": "/v1/completions", "outcome": "aborted"}
    before = await metric(http, url, "vllm_sidecar_phase_requests_total", **labels)
    payload = completion(tiny_model, max_tokens=LONG_CONTEXT - 8, ignore_eos=True, stream=True)
    async with http.post(f"{guarded.url}/v1/completions", json=payload) as resp:
        first = await sse_data(resp, limit=3)
        pause = asyncio.create_task(control(http, guarded, "/pause?mode=abort"))
        rest = await sse_data(resp)
    await pause
    assert all("choices" in e for e in first)
    *_, last, done = rest
    assert done == DONE
    assert last["choices"][0]["finish_reason"] == "abort"  # unchanged: SkyRL resubmits it
    assert await metric(http, url, "vllm_sidecar_phase_requests_total", **labels) == before + 1


@pytest.mark.usefixtures("serving")
async def test_the_weight_version_changes_across_finish_weight_update(
    http: aiohttp.ClientSession, guarded: SidecarProcess, tiny_model: TinyModel
) -> None:
    version = (await engine(http, guarded))["weight_version"]
    url = f"{guarded.admin_url}/metrics"
    updates = await metric(http, url, "vllm_sidecar_weight_updates_total")
    # A stream frozen by a `keep` pause straddles the update, then an `abort` pause ends it. It
    # is too long to end on its own: a short one could finish before the first pause lands, and
    # resuming it would stream at full speed, which stalls vLLM's API server on CPU for seconds.
    payload = completion(tiny_model, max_tokens=LONG_CONTEXT - 8, ignore_eos=True, stream=True)
    async with http.post(f"{guarded.url}/v1/completions", json=payload) as resp:
        assert resp.headers["X-Weight-Version"] == version
        await sse_data(resp, limit=2)
        await control(http, guarded, "/pause?mode=keep")
        await control(http, guarded, "/start_weight_update")
        assert await phase_gauge(http, guarded) == "weight_sync"
        await control(http, guarded, "/finish_weight_update", json={"weight_version": "e2e-2"})
        assert await phase_gauge(http, guarded) == "paused"
        await control(http, guarded, "/pause?mode=abort")
        text = await resp.text()
    await control(http, guarded, "/resume")
    last = orjson.loads(text.rsplit("data: [DONE]", 1)[0].rsplit("data: ", 1)[1])
    assert last["choices"][0]["finish_reason"] == "abort"  # it ran across the whole update
    assert text.endswith(
        f'data: [DONE]\n\nevent: weight_version\ndata: {{"weight_version":"e2e-2",'
        f'"previous":"{version}"}}\n\n'
    )
    async with http.post(f"{guarded.url}/v1/completions", json=completion(tiny_model)) as resp:
        assert (resp.status, resp.headers["X-Weight-Version"]) == (200, "e2e-2")
    assert await metric(http, url, "vllm_sidecar_weight_updates_total") == updates + 1
    assert await metric(http, url, "vllm_sidecar_weight_version_info", version="e2e-2") == 1


@pytest.mark.usefixtures("serving")
async def test_without_the_control_token_a_control_call_changes_nothing(
    http: aiohttp.ClientSession, guarded: SidecarProcess, vllm: VllmServer
) -> None:
    for headers in ({}, {"Authorization": "Bearer not-the-token"}):
        async with http.post(f"{guarded.url}/pause", headers=headers) as resp:
            assert (resp.status, resp.headers["X-Sidecar-Error"]) == (401, "unauthorized")
            assert (await resp.json())["error"]["reason"] == "unauthorized"
    async with http.get(f"{vllm.url}/is_paused") as resp:
        assert await resp.json() == {"is_paused": False}
    assert await phase_gauge(http, guarded) == "serving"
