"""A control call's steps taken on the local state, reading vLLM through a probe (`steps.py`)."""

from __future__ import annotations

import aiohttp
from aiohttp import web
from prometheus_client import CollectorRegistry
from pytest_aiohttp.plugin import AiohttpServer

from proxy.core.phase import PAUSED, SERVING, SLEEPING
from proxy.engine.state import EngineState
from proxy.engine.steps import LocalSteps
from proxy.observe.engine_metrics import EngineMetrics
from proxy.upstream.engine_probe import Lenient, Probe


def fresh() -> EngineState:
    return EngineState(EngineMetrics(CollectorRegistry()), hold_timeout=None)


async def test_without_a_probe_an_answer_takes_the_phase_rules_alone() -> None:
    state = fresh()
    steps = LocalSteps(state, lambda: None)
    call = await steps.enter("/sleep")
    await steps.answered(call, "/sleep", "")
    call = await steps.enter("/wake_up")
    await steps.answered(call, "/wake_up", "tags=weights")  # unknown: taken as awake
    assert (state.phase, state.version) == (SERVING, None)
    call = await steps.enter("/pause")
    await steps.failed(call, "/pause")
    assert state.phase == SERVING
    steps.leave(await steps.enter("/pause"))
    assert (state.phase, state.calls) == (PAUSED, 0)


async def test_an_answer_reads_the_version_and_a_partial_wake_up(
    aiohttp_server: AiohttpServer,
) -> None:
    async def sleeping(_: web.Request) -> web.Response:
        return web.json_response({"is_sleeping": True})

    async def weight_info(_: web.Request) -> web.Response:
        return web.json_response({"weight_version": "step-9"})

    app = web.Application()
    app.router.add_get("/is_sleeping", sleeping)
    app.router.add_get("/weight_info", weight_info)
    server = await aiohttp_server(app)
    async with aiohttp.ClientSession() as session:
        probe = Probe(session, server.make_url(""), timeout=2.0)
        state = fresh()
        steps = LocalSteps(state, lambda: Lenient(probe))
        await steps.answered(await steps.enter("/sleep"), "/sleep", "")
        await steps.answered(await steps.enter("/wake_up"), "/wake_up", "tags=weights")
        assert state.phase == SLEEPING  # vLLM says it still sleeps
        call = await steps.enter("/update_weight_version")
        await steps.answered(call, "/update_weight_version", "")
        assert state.version == "step-9"
