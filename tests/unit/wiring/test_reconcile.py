"""Reconciling the sidecar's phase with vLLM's own flags (wiring/reconcile.py): one probe's
findings joined to a real EngineState, the probe replaced by what vLLM would answer."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass, field

from prometheus_client import CollectorRegistry

from proxy.core.phase import PAUSED, SERVING
from proxy.engine.state import EngineState
from proxy.observe.engine_metrics import EngineMetrics
from proxy.upstream.engine_probe import ProbeFailed
from proxy.wiring.reconcile import DOWN, NO_DEV, READ, SLOW, lacking, reconcile_once


@dataclass
class Vllm:
    """vLLM's answers to the probe: its flags and version, or a failure to ask it."""

    busy_flag: bool | None = False
    version: str | None = "v1"
    failure: ProbeFailed | None = None
    missing: set[str] = field(default_factory=set)
    during: list[Callable[[], object]] = field(default_factory=list)  # run while the probe is out

    async def busy(self) -> bool | None:
        await asyncio.sleep(0)
        for act in self.during:
            act()
        if self.failure is not None:
            raise self.failure
        return self.busy_flag

    async def weight_version(self) -> str | None:
        return self.version


def state() -> EngineState:
    return EngineState(EngineMetrics(CollectorRegistry()), hold_timeout=None)


async def test_a_pause_made_around_the_sidecar_is_taken_from_vllms_flags() -> None:
    s = state()
    assert await reconcile_once(s, Vllm(busy_flag=True), restarted=False) == READ
    # The phase moved on what this probe read: its version waits for a probe that moves nothing.
    assert (s.phase, s.version) == (PAUSED, None)
    assert await reconcile_once(s, Vllm(busy_flag=True), restarted=False) == READ
    assert (s.phase, s.version) == (PAUSED, "v1")
    assert await reconcile_once(s, Vllm(busy_flag=False), restarted=False) == READ
    assert s.phase == SERVING


async def test_a_control_call_in_flight_wins_over_the_probe() -> None:
    s = state()
    s.enter("/sleep")  # the sidecar relayed a sleep: vLLM's flags may not show it yet
    assert await reconcile_once(s, Vllm(busy_flag=False, version="v2"), restarted=False) == READ
    assert s.phase != SERVING
    assert s.version is None  # nor is the version taken while the call is open


async def test_a_change_while_the_probe_was_out_wins_over_what_it_read() -> None:
    s = state()
    vllm = Vllm(busy_flag=True, version="v2")
    vllm.during.append(lambda: s.leave(s.enter("/pause")))  # answered meanwhile: epoch moved
    assert await reconcile_once(s, vllm, restarted=False) == READ
    assert s.version is None


async def test_a_refused_connection_marks_vllm_down_and_a_timeout_changes_nothing() -> None:
    s = state()
    refused = Vllm(failure=ProbeFailed("GET /is_paused: refused", timed_out=False))
    assert await reconcile_once(s, refused, restarted=False) == DOWN
    assert s.down == "GET /is_paused: refused"
    slow = Vllm(failure=ProbeFailed("GET /is_paused: timeout", timed_out=True))
    assert await reconcile_once(s, slow, restarted=False) == SLOW
    assert s.down == "GET /is_paused: refused"  # slow is not back
    assert await reconcile_once(s, Vllm(), restarted=True) == READ
    assert s.down is None


async def test_no_dev_mode_is_told_apart_from_a_read() -> None:
    s = state()
    assert await reconcile_once(s, Vllm(busy_flag=None, version=None), restarted=False) == NO_DEV
    assert (s.phase, s.version) == (SERVING, None)


def test_the_line_names_each_missing_route_and_what_it_costs() -> None:
    assert lacking(set()) is None
    line = lacking({"/weight_info", "/is_paused"})
    assert line is not None
    assert line.startswith("vLLM answers 404 for /is_paused, /weight_info (")
    assert "pauses made around the sidecar" in line
    assert "weight versions" in line
    assert "sleeps" not in line
