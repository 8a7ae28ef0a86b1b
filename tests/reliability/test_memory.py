"""Memory under large bodies, against the real `vllm-sidecar` process with its default settings.

Peak resident memory is the kernel's own high-water mark (VmHWM in /proc/<pid>/status), so a
peak between two samples is not missed. The budget asserted is the pod's: the 512Mi limit in
deploy/kubernetes, with room to spare.
"""

from __future__ import annotations

import asyncio
import gzip
import io
import json
from pathlib import Path

import aiohttp
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from tests.fake_vllm import FakeVLLM
from tests.metrics import sample, scrape
from tests.procfs import rss_bytes
from tests.sidecar import StartSidecar
from tests.support import eventually

pytestmark = pytest.mark.slow

MiB = 1 << 20
POD_LIMIT = 512 * MiB
PEAK_BUDGET = 320 * MiB  # the budget's 96 MiB of bodies, their copies, and the baseline
# Left in RSS once the clients are gone: allocator caches and fragments of streamed chunks,
# 14-37 MiB here (was 83 MiB before the mmap threshold and the trim).
AFTER_TOLERANCE = 64 * MiB
BUDGET = 8 * MiB  # the adversarial round's
SMALL_BUDGET = ("--buffer-budget-bytes", str(BUDGET))
# Above the budget, whatever the bodies' number and size: a body's copy while it is joined, the
# read buffers of the connections sending at once (aiohttp's, up to ~0.5 MiB each: 50 here),
# what the allocator keeps of them. Measured: 6-26 MiB; the bodies held outside it: 159 MiB.
OVERHEAD = 40 * MiB
HELD = "vllm_sidecar_held_requests"
# 1.5 MiB with `model` first: streamed while the engine serves.
HELD_BODY = b'{"model": "tiny-model", "max_tokens": 1, "prompt": [[%s]]}' % b", ".join(
    [b"7"] * 520_000
)


def peak_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    raise AssertionError(f"no VmHWM for pid {pid}")


def figures(**values: float) -> None:
    print("FIGURES", json.dumps({k: round(v / MiB, 1) for k, v in values.items()}))


async def test_four_60mb_bodies_read_whole_stay_within_the_pod_limit(
    upstream: TestServer, fake: FakeVLLM, start_sidecar: StartSidecar
) -> None:
    proc = await start_sidecar(str(upstream.make_url("")))
    url = proc.url
    base = rss_bytes(proc.pid)
    # The model after 60 MB of prompt: the sidecar must read the whole body to find it.
    body = b'{"prompt": "' + b"x" * (60 * 1000 * 1000) + b'", "model": "org/tiny-model"}'
    async with aiohttp.ClientSession() as session:

        async def post() -> int:
            async with session.post(
                f"{url}/v1/completions",
                data=io.BytesIO(body),
                headers={"Content-Type": "application/json"},
            ) as resp:
                if resp.status == 503:
                    assert (await resp.json())["error"]["reason"] == "buffer_budget_exhausted"
                await resp.read()
                return resp.status

        statuses = await asyncio.gather(*(post() for _ in range(4)))
    peak, after = peak_bytes(proc.pid), rss_bytes(proc.pid)
    figures(base=base, peak=peak, after=after)
    assert 200 in statuses
    assert set(statuses) <= {200, 503}  # past the budget: a retryable 503, never the OOM killer
    assert peak < PEAK_BUDGET
    assert after - base < AFTER_TOLERANCE


async def test_clients_that_do_not_read_a_16mb_answer_do_not_hold_its_copies(
    upstream: TestServer, fake: FakeVLLM, start_sidecar: StartSidecar
) -> None:
    proc = await start_sidecar(str(upstream.make_url("")))
    url = proc.url
    answer = json.dumps({"text": "x" * (16 * 1000 * 1000)}).encode()

    async def big(request: web.Request) -> web.Response:
        await request.read()
        return web.Response(body=answer, content_type="application/json")

    fake.script("POST /v1/completions", big, times=20)
    base = rss_bytes(proc.pid)
    host, port = url.removeprefix("http://").split(":")
    request = b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
    payload = b'{"model": "tiny-model", "prompt": "x"}'
    request += b"Content-Length: %d\r\n\r\n%s" % (len(payload), payload)
    clients = [await asyncio.open_connection(host, int(port)) for _ in range(20)]
    for _, writer in clients:
        writer.write(request)  # and then never read
    await asyncio.sleep(3)
    peak = peak_bytes(proc.pid)
    for _, writer in clients:
        writer.close()

    async def released() -> bool:  # every answer has seen its client go
        metrics = await scrape(proc.admin_url)
        held = ("vllm_sidecar_client_connections", "vllm_sidecar_buffered_bytes")
        return sum(sample(metrics, name) for name in held) == 0

    await eventually(released, "every answer sees its client go and lets its bytes go")
    after = rss_bytes(proc.pid)
    figures(base=base, peak=peak, after=after)
    assert peak < PEAK_BUDGET
    assert after - base < AFTER_TOLERANCE


async def test_gzip_bodies_past_the_budget_are_refused_as_they_inflate(
    upstream: TestServer, fake: FakeVLLM, start_sidecar: StartSidecar
) -> None:
    # Guards: inbound.read_counted (an inflated body was read whole before the budget was
    # asked: six of these took 453-477 MiB against an 8 MiB budget).
    proc = await start_sidecar(str(upstream.make_url("")), *SMALL_BUDGET)
    url = proc.url
    base = rss_bytes(proc.pid)
    body = gzip.compress(b'{"model": "tiny-model", "prompt": "' + b"x" * (40 * MiB) + b'"}')
    headers = {"Content-Type": "application/json", "Content-Encoding": "gzip"}
    async with aiohttp.ClientSession() as session:

        async def post() -> str:
            async with session.post(f"{url}/v1/completions", data=body, headers=headers) as resp:
                return f"{resp.status} {resp.headers.get('X-Sidecar-Error')}"

        answers = await asyncio.gather(*(post() for _ in range(6)))
    peak, after = peak_bytes(proc.pid), rss_bytes(proc.pid)
    figures(base=base, peak=peak, after=after)
    assert answers == ["503 buffer_budget_exhausted"] * 6
    assert fake.forwarded() == 0
    assert peak - base < BUDGET + OVERHEAD


async def test_held_bodies_stay_within_the_budget(
    upstream: TestServer, fake: FakeVLLM, start_sidecar: StartSidecar
) -> None:
    """In a pause, 200 clients send 1.5 MiB bodies with `model` first, 50 at a time: as many
    are held as the budget holds, the others get the 503 and leave; what stays in memory while
    they are held is within the budget (plus a fixed overhead: 50 connections' read buffers,
    the allocator's)."""
    # Guards: inbound._read_whole (held streamed bodies were outside the budget: 300 of them
    # added 224 MiB against a 72 MiB bound, the held gauge 300, `buffered_bytes` 0).
    proc = await start_sidecar(str(upstream.make_url("")), *SMALL_BUDGET)
    url = proc.url
    clients = HeldClients(url, proc.admin_url)
    connector = aiohttp.TCPConnector(limit=0, force_close=True)  # a refused client leaves
    async with aiohttp.ClientSession(connector=connector) as clients.session:
        async with clients.session.post(f"{url}/pause?mode=keep") as resp:
            assert resp.status == 200
        base = rss_bytes(proc.pid)
        for _ in range(4):
            await clients.wave(50)
        metrics = await scrape(clients.admin)
        held, buffered = (sample(metrics, name) for name in (HELD, "vllm_sidecar_buffered_bytes"))
        peak, held_rss = peak_bytes(proc.pid), rss_bytes(proc.pid)
        async with clients.session.post(f"{url}/resume") as resp:
            assert resp.status == 200
        statuses = await asyncio.gather(*clients.posts)
    after = rss_bytes(proc.pid)
    figures(base=base, peak=peak, held=held_rss, after=after, buffered=buffered)
    assert set(clients.refused) == {"buffer_budget_exhausted"}
    assert 0 < held == statuses.count(200) == fake.forwarded() <= BUDGET // len(HELD_BODY)
    assert buffered == held * len(HELD_BODY)
    assert held_rss - base < BUDGET + OVERHEAD
    assert peak < PEAK_BUDGET


class HeldClients:
    """Clients that post HELD_BODY during a pause, in waves."""

    session: aiohttp.ClientSession

    def __init__(self, url: str, admin: str) -> None:
        self.url, self.admin = url, admin
        self.posts: list[asyncio.Task[int]] = []
        self.refused: list[str] = []

    async def post(self) -> int:
        async with self.session.post(
            f"{self.url}/v1/completions",
            data=io.BytesIO(HELD_BODY),
            headers={"Content-Type": "application/json"},
        ) as resp:
            await resp.read()
            if resp.status == 503:
                self.refused.append(resp.headers["X-Sidecar-Error"])
            return resp.status

    async def wave(self, size: int) -> None:
        """`size` more clients, each held or refused and gone before this returns."""
        self.posts += [asyncio.create_task(self.post()) for _ in range(size)]

        async def settled() -> bool:
            metrics = await scrape(self.admin)
            held = sample(metrics, HELD)
            left = sample(metrics, "vllm_sidecar_client_connections")
            return held + len(self.refused) == len(self.posts) and left == held

        await eventually(settled, "each request held, or refused and gone", within=60)
