"""`--workers 2` with the real CLI: traffic through both workers, one pod-wide /metrics summed
exactly, one discovery and one engine phase for the pod, a drain on SIGTERM and on the admin
port's /drain, a killed worker replaced and counted."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp.test_utils import TestServer
from prometheus_client.multiprocess import MultiProcessCollector
from prometheus_client.parser import text_string_to_metric_families

from tests.fake_vllm import FakeVLLM, hang
from tests.procfs import children
from tests.sidecar import SidecarProcess
from tests.support import eventually, refuses_connections, wait_http_ok

COMPLETIONS = ("vllm_sidecar_requests_total", "POST", "/v1/completions", "200")


class Pod(SidecarProcess):
    """The sidecar with `--workers 2`: a supervisor and its workers."""

    def workers(self) -> list[int]:
        """The supervisor's live children, from /proc."""
        return children(self.pid)

    def metrics_dir(self) -> str:
        worker = self.workers()[0]
        environ = Path(f"/proc/{worker}/environ").read_bytes().split(b"\0")
        [entry] = [e for e in environ if e.startswith(b"PROMETHEUS_MULTIPROC_DIR=")]
        return entry.split(b"=", 1)[1].decode()

    async def metric(self, name: str, **labels: str) -> float | None:
        async with aiohttp.ClientSession() as session:
            async with session.get(self.admin_url + "/metrics") as resp:
                text = await resp.text()
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                if sample.name == name and sample.labels == labels:
                    return sample.value
        return None


def start_pod(upstream: str, run_dir: Path, *extra: str) -> Pod:
    pod = Pod.cli(
        upstream, run_dir,
        "--health-interval", "0.1", "--miss-refresh-interval", "0", "--workers", "2",
        "--shutdown-grace", "10", *extra,
    )  # fmt: skip
    pod.spawn()
    return pod


def running(pids: list[int]) -> list[int]:
    return [pid for pid in pids if os.path.exists(f"/proc/{pid}")]


@pytest.fixture
async def pod(upstream: TestServer, tmp_path: Path) -> AsyncIterator[Pod]:
    async with running_pod(upstream, tmp_path) as pod:
        yield pod


@contextlib.asynccontextmanager
async def running_pod(upstream: TestServer, tmp_path: Path, *extra: str) -> AsyncIterator[Pod]:
    pod = start_pod(str(upstream.make_url("")), tmp_path, *extra)
    try:
        await wait_http_ok(pod.admin_url + "/readyz")
        await eventually(lambda: len(pod.workers()) == 2)
        await eventually_metric(pod, "vllm_sidecar_workers", 2)  # both listen
        yield pod
    finally:
        if pod.running:
            pod.send_signal(signal.SIGTERM)
        try:
            await asyncio.to_thread(pod.wait, 20)
        finally:
            pod.kill()


async def complete(url: str, model: str = "tiny-model", **extra: object) -> aiohttp.ClientResponse:
    """One request on a connection of its own, so that the kernel picks a worker for each."""
    connector = aiohttp.TCPConnector(force_close=True)
    async with aiohttp.ClientSession(connector=connector) as session:
        async with session.post(
            url + "/v1/completions", json={"model": model, "prompt": "x", **extra}
        ) as resp:
            await resp.read()
            return resp


def held_in(pod: Pod, pid: int) -> float:
    """One worker's own count of held requests, from its file alone."""
    db = os.path.join(pod.metrics_dir(), f"gauge_livesum_{pid}.db")
    if not os.path.exists(db):
        return 0
    merged = MultiProcessCollector.merge([db])  # type: ignore[no-untyped-call]
    return sum(s.value for f in merged if f.name == "vllm_sidecar_held_requests" for s in f.samples)


async def control(pod: Pod, path: str, **kwargs: Any) -> aiohttp.ClientResponse:
    """A control call through the proxy port, on a connection of its own (either worker)."""
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(force_close=True)) as http:
        async with http.post(pod.url + path, **kwargs) as resp:
            await resp.read()
            return resp


async def held_on_every_worker(pod: Pod, count: int) -> list[asyncio.Task[aiohttp.ClientResponse]]:
    """`count` completions on connections of their own, all held, some by each worker."""
    workers = pod.workers()
    sent = [asyncio.create_task(complete(pod.url)) for _ in range(count)]
    await eventually(lambda: sum(held_in(pod, pid) for pid in workers) == count)
    assert all(held_in(pod, pid) > 0 for pid in workers), [held_in(pod, p) for p in workers]
    assert await pod.metric("vllm_sidecar_held_requests") == count
    return sent


@contextlib.asynccontextmanager
async def a_stream(
    pod: Pod, fake: FakeVLLM, session: aiohttp.ClientSession
) -> AsyncIterator[aiohttp.ClientResponse]:
    """A stream of ten events, one a tenth of a second, open past its first event."""
    fake.stream_events, fake.stream_delay = 10, 0.1
    stream = {"model": "tiny-model", "prompt": "x", "stream": True}
    async with session.post(pod.url + "/v1/completions", json=stream) as resp:
        await resp.content.readuntil(b"\n\n")
        yield resp


def requests_in(db: str) -> float:
    """One process's own count of answered completions, from its file alone."""
    [family] = [
        f
        for f in MultiProcessCollector.merge([db])  # type: ignore[no-untyped-call]
        if f.name == "vllm_sidecar_requests"
    ]
    return sum(s.value for s in family.samples if s.labels.get("route") == "/v1/completions")


async def test_traffic_reaches_both_workers_and_metrics_sum_exactly(pod: Pod) -> None:
    workers = pod.workers()
    assert len(workers) == 2
    assert pod.pid not in workers
    k = 40
    statuses = [(await complete(pod.url)).status for _ in range(k)]
    assert statuses == [200] * k
    labels = dict(zip(("method", "route", "status"), COMPLETIONS[1:], strict=True))
    assert await pod.metric(COMPLETIONS[0], **labels) == k
    # Per process: each worker answered some, and the two add up to the pod's figure.
    path = pod.metrics_dir()
    counts = {pid: requests_in(os.path.join(path, f"counter_{pid}.db")) for pid in workers}
    assert all(n > 0 for n in counts.values()), counts
    assert sum(counts.values()) == k
    assert await pod.metric("vllm_sidecar_in_flight_requests", route="/v1/completions") == 0
    assert await pod.metric("vllm_sidecar_workers") == 2


async def test_an_unknown_name_is_looked_up_once_for_the_whole_pod(
    pod: Pod, fake: FakeVLLM
) -> None:
    reads = fake.forwarded("/v1/models")
    assert reads == 1  # at start, by the supervisor; the workers read nothing themselves
    fake.served.append(("new-model", "/models/new-model"))
    # Resolvable only through the new root: every worker must learn the refreshed table.
    statuses = [(await complete(pod.url, "/models/new-model")).status for _ in range(10)]
    assert statuses == [200] * 10
    assert [r.json()["model"] for r in fake.requests if r.method == "POST"] == ["new-model"] * 10
    assert fake.forwarded("/v1/models") == reads + 1
    async with aiohttp.ClientSession() as session:
        async with session.get(pod.admin_url + "/models") as resp:
            served = [m["id"] for m in (await resp.json())["served"]]
    assert served == ["tiny-model", "new-model"]


async def test_sigterm_drains_every_worker(pod: Pod, fake: FakeVLLM) -> None:
    async with aiohttp.ClientSession() as session:
        async with a_stream(pod, fake, session) as resp:
            workers = pod.workers()
            pod.send_signal(signal.SIGTERM)
            await eventually(lambda: refuses_connections(pod.url), "no worker listens")
            for _ in range(4):  # whichever worker the kernel would pick: none listens
                with pytest.raises(aiohttp.ClientConnectorError):
                    await complete(pod.url)
            async with session.get(pod.admin_url + "/readyz") as ready:
                assert ready.status == 503
                assert (await ready.json())["reason"] == "draining"
            events = [e for e in (await resp.text()).split("\n\n") if e]
    assert events[-1] == "data: [DONE]"
    assert len(events) == 10  # nine after the first, then [DONE]
    assert await asyncio.to_thread(pod.wait, 20) == 0
    assert running(workers) == []


async def test_a_killed_worker_is_replaced_counted_and_logged(pod: Pod) -> None:
    victim, survivor = pod.workers()
    os.kill(victim, signal.SIGKILL)
    await eventually(lambda: len(pod.workers()) == 2 and victim not in pod.workers())
    assert survivor in pod.workers()
    assert await pod.metric("vllm_sidecar_worker_restarts_total") == 1

    await eventually_metric(pod, "vllm_sidecar_workers", 2)  # it binds a moment after it starts
    statuses = [(await complete(pod.url)).status for _ in range(10)]
    assert statuses == [200] * 10
    assert f"(pid {victim}) exited with SIGKILL" in pod.log_path.read_text()


async def test_workers_stop_when_their_supervisor_is_killed(pod: Pod) -> None:
    workers = pod.workers()
    os.kill(pod.pid, signal.SIGKILL)
    await asyncio.to_thread(pod.wait, 10)
    # No orphan keeps the port: each worker sees its socket to the supervisor close, and drains.
    await eventually(lambda: running(workers) == [])
    with pytest.raises(aiohttp.ClientConnectorError):
        await complete(pod.url)


async def test_a_pause_through_one_worker_holds_requests_on_every_worker(
    pod: Pod, fake: FakeVLLM
) -> None:
    assert (await control(pod, "/pause?mode=keep")).status == 200
    # Fresh connections, so the kernel spreads them: every worker must hold its share, the
    # one that did not relay the pause too; none reaches vLLM.
    held = await held_on_every_worker(pod, 12)
    assert fake.forwarded() == 0
    assert await pod.metric("vllm_sidecar_engine_phase", phase="paused") == 1
    assert (await control(pod, "/resume")).status == 200
    assert [(await task).status for task in held] == [200] * 12
    assert fake.forwarded() == 12
    assert await pod.metric("vllm_sidecar_engine_phase", phase="serving") == 1
    assert await pod.metric("vllm_sidecar_held_requests") == 0


async def test_a_weight_update_holds_every_worker_and_one_version_is_stamped(
    pod: Pod, fake: FakeVLLM
) -> None:
    await eventually_metric(pod, "vllm_sidecar_weight_version_info", 1, version="default")
    assert (await control(pod, "/start_weight_update")).status == 200
    held = await held_on_every_worker(pod, 12)
    assert fake.forwarded() == 0  # nothing runs into the update, whichever worker it reached
    finish = await control(pod, "/finish_weight_update", json={"weight_version": "v2"})
    assert finish.status == 200
    answers = [await task for task in held]
    assert [r.status for r in answers] == [200] * 12
    # Every worker knew the new version when it released its requests.
    assert {r.headers["X-Weight-Version"] for r in answers} == {"v2"}
    after = [await complete(pod.url) for _ in range(8)]
    assert {r.headers["X-Weight-Version"] for r in after} == {"v2"}
    assert await pod.metric("vllm_sidecar_weight_updates_total") == 1
    # One pod, one phase and one version: the supervisor's, with no per-process series.
    text = await admin_text(pod, "/metrics")
    families = {f.name: f for f in text_string_to_metric_families(text)}
    phases = families["vllm_sidecar_engine_phase"].samples
    assert all(set(s.labels) == {"phase"} for s in phases)
    assert {s.labels["phase"]: s.value for s in phases} == {
        "serving": 1,
        "paused": 0,
        "sleeping": 0,
        "weight_sync": 0,
    }
    assert len(phases) == 4
    versions = families["vllm_sidecar_weight_version_info"].samples
    assert [(s.labels, s.value) for s in versions] == [({"version": "v2"}, 1.0)]
    durations = families["vllm_sidecar_engine_phase_duration_seconds"].samples
    counts = {s.labels["phase"]: s.value for s in durations if s.name.endswith("_count")}
    assert counts == {"serving": 1, "weight_sync": 1}  # observed once for the pod, not per worker


async def test_admin_drain_drains_every_worker(pod: Pod, fake: FakeVLLM) -> None:
    async with aiohttp.ClientSession() as session:
        async with a_stream(pod, fake, session) as resp:
            drain = asyncio.create_task(session.post(pod.admin_url + "/drain"))

            async def unready() -> bool:
                async with session.get(pod.admin_url + "/readyz") as ready:
                    return ready.status == 503

            await eventually(unready, "the drain began")
            assert not drain.done()  # it answers once the stream has ended
            # Whichever worker the kernel picks: it takes no new request.
            refused = [await complete(pod.url) for _ in range(8)]
            assert {r.status for r in refused} == {503}
            async with session.get(pod.admin_url + "/readyz") as ready:
                assert ready.status == 503
            events = [e for e in (await resp.text()).split("\n\n") if e]
        answer = await drain
        assert answer.status == 200
        assert await answer.json() == {"draining": True, "in_flight": 0}
    assert events[-1] == "data: [DONE]"
    assert len(events) == 10
    assert pod.running  # drained, not stopped: SIGTERM comes later


async def admin_text(pod: Pod, path: str) -> str:
    async with aiohttp.ClientSession() as session:
        async with session.get(pod.admin_url + path) as resp:
            return await resp.text()


async def eventually_metric(pod: Pod, name: str, value: float, **labels: str) -> None:
    async def reached() -> bool:
        return await pod.metric(name, **labels) == value

    await eventually(reached, f"{name}{labels} becomes {value}")


@pytest.mark.parametrize("flag", ["--control-token", "--control-token-file"])
async def test_every_worker_takes_the_control_token(
    upstream: TestServer, tmp_path: Path, flag: str
) -> None:
    # Workers get their settings from the supervisor; a dump masks a secret as "**********",
    # and would hand a worker both the token and its file.
    token_file = tmp_path / "token"
    token_file.write_text("s3cret\n")
    value = "s3cret" if flag == "--control-token" else str(token_file)
    async with running_pod(upstream, tmp_path, flag, value) as pod:
        for _ in range(6):  # connections of their own: both workers answer some
            ok = await control(
                pod, "/reset_prefix_cache", headers={"Authorization": "Bearer s3cret"}
            )
            masked = await control(
                pod, "/reset_prefix_cache", headers={"Authorization": "Bearer **********"}
            )
            assert (ok.status, masked.status) == (200, 401)
        assert len(pod.workers()) == 2


async def test_a_health_check_that_hangs_turns_every_worker_down(pod: Pod, fake: FakeVLLM) -> None:
    # The supervisor checks; each worker reports what it was told, and the pod's gauge is the
    # highest of all processes': every one of them must have heard of the failure.
    assert await pod.metric("vllm_sidecar_upstream_up") == 1
    fake.script("GET /health", hang(), times=1000)

    async def down() -> bool:
        return await pod.metric("vllm_sidecar_upstream_up") == 0

    # Three checks in a row time out before a serving upstream counts as down (SLOW_CHECKS).
    await eventually(down, "the pod's upstream_up falls to 0", within=60)
