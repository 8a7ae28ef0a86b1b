"""The upstream side's guards that no single request shows: the idle-connection bound, and
the one shared /v1/models re-read when many requests ask for a name not known yet."""

from __future__ import annotations

import asyncio
from typing import Any

from aiohttp import web
from aiohttp.test_utils import TestServer

from tests.fake_vllm import FakeVLLM
from tests.sidecar import MakeSidecar, Sidecar
from tests.support import eventually

QUIET = {"health_interval": 3600, "discovery_interval": 3600}  # no background traffic
PEERS = web.AppKey("peers", list[object])


@web.middleware
async def _note_peer(request: web.Request, handler: Any) -> web.StreamResponse:
    assert request.transport is not None
    request.app[PEERS].append(request.transport.get_extra_info("peername"))
    response: web.StreamResponse = await handler(request)
    return response


async def test_an_idle_upstream_connection_is_dropped_before_uvicorns_5_s(
    fake: FakeVLLM, aiohttp_server: Any, make_sidecar: MakeSidecar
) -> None:
    # uvicorn (vLLM's server) closes a keep-alive connection idle for 5 s; a POST sent on it
    # while it closes is lost with a 502 (see proxy/upstream/session.py). So the sidecar must not
    # reuse a connection idle that long: its bound is 4 s. After 4.5 s idle (a window no scheduling
    # delay can shrink) the next request must come on a new connection; with aiohttp's default
    # of 15 s, or any bound of 4.5 s or more, it would reuse the old one.
    app = fake.app()
    app[PEERS] = peers = []
    app.middlewares.append(_note_peer)
    server: TestServer = await aiohttp_server(app)
    sidecar = await make_sidecar(str(server.make_url("")), **QUIET)
    completion = {"model": "tiny-model", "prompt": "x"}

    async def send() -> Any:
        resp = await sidecar.client.post("/v1/completions", json=completion)
        assert resp.status == 200
        await resp.read()
        return peers[-1]

    await send()
    # Control: a connection in use is kept and reused (the pool may hold several: the sidecar's
    # own start-up probes open some, and aiohttp takes any idle one).
    assert await send() in peers[:-1]
    await asyncio.sleep(4.5)  # the scenario: idle past the sidecar's bound, short of uvicorn's
    assert await send() not in peers[:-1]


def models_reads(fake: FakeVLLM) -> int:
    return fake.forwarded("/v1/models")


async def test_concurrent_misses_share_one_models_read_and_all_resolve(
    upstream: TestServer, make_sidecar: MakeSidecar, fake: FakeVLLM
) -> None:
    # An unhealthy upstream gets no discovery: the sidecar starts knowing no name, and the
    # first request for one is a miss. With the re-read held open, n requests pile up on it.
    fake.healthy = False
    sidecar: Sidecar = await make_sidecar(
        str(upstream.make_url("")), ready=False, miss_refresh_interval=3600, **QUIET
    )
    assert models_reads(fake) == 0
    opened, n = asyncio.Event(), 8

    async def held_models(request: web.Request) -> web.StreamResponse:
        await opened.wait()
        return await fake.models(request)

    fake.script("GET /v1/models", held_models, times=n)
    body = {"model": "org/tiny-model", "prompt": "x"}
    tasks = [
        asyncio.create_task(sidecar.client.post("/v1/completions", json=body)) for _ in range(n)
    ]

    def all_arrived() -> bool:  # each request is waiting in the sidecar, or already answered
        done = sum(t.done() for t in tasks)
        waiting = sidecar.metric("vllm_sidecar_in_flight_requests", route="/v1/completions")
        return waiting + done == n and (models_reads(fake) >= 1 or done == n)

    await eventually(all_arrived, "every request is in the sidecar and /v1/models is being read")
    opened.set()
    statuses = [resp.status for resp in await asyncio.gather(*tasks)]
    # Single-flight: one read for all n; each waited for it, so each resolved (a rate limit
    # alone would turn away the n-1 that came while the read was out, with a 404).
    assert statuses == [200] * n
    assert models_reads(fake) == 1
    # Rate-limited: a later miss within the interval does not read again.
    resp = await sidecar.client.post("/v1/completions", json={"model": "nope", "prompt": "x"})
    assert resp.status == 404
    assert models_reads(fake) == 1
