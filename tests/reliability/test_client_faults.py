"""Clients that misbehave: hang up early, mid-wait, mid-stream, or read slowly."""

from __future__ import annotations

import asyncio
import json

import aiohttp
from aiohttp.test_utils import TestServer

from proxy.engine.lifecycle import LIFECYCLE
from tests.fake_vllm import FakeVLLM, Firehose, hang, sse_forever
from tests.metrics import sample, scrape
from tests.procfs import rss_bytes
from tests.sidecar import COMPLETION, Sidecar, StartSidecar, control
from tests.support import eventually

STREAM = {"model": "org/tiny-model", "prompt": "x", "stream": True}
MiB = 1 << 20


async def wait_metric(sidecar: Sidecar, name: str, value: float, **labels: str) -> None:
    await eventually(lambda: sidecar.metric(name, **labels) == value)


async def test_hang_up_before_the_whole_body(sidecar: Sidecar, fake: FakeVLLM) -> None:
    assert sidecar.client.port is not None
    _, writer = await asyncio.open_connection("127.0.0.1", sidecar.client.port)
    writer.write(
        b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        b"Content-Length: 1000\r\n\r\n" + b'{"model": "tiny-model", "pro'
    )
    await writer.drain()
    await wait_metric(sidecar, "vllm_sidecar_in_flight_requests", 1, route="/v1/completions")
    writer.close()
    await wait_metric(sidecar, "vllm_sidecar_in_flight_requests", 0, route="/v1/completions")
    await wait_metric(sidecar, "vllm_sidecar_client_disconnects_total", 1, route="/v1/completions")
    assert not any(r.raw_path == "/v1/completions" for r in fake.requests)
    assert (
        sidecar.metric(
            "vllm_sidecar_requests_total", route="/v1/completions", method="POST", status="499"
        )
        == 1
    )


async def test_a_held_client_that_leaves_is_never_forwarded(
    sidecar: Sidecar, fake: FakeVLLM
) -> None:
    """A large model-first body sent whole during a pause, then the client hangs up: the hold
    ends with it, and nothing reaches vLLM after /resume."""
    # Guards: inbound._held_whole reading a held body whole, so that the FIN after it is seen
    # (unread, the body hid it: 600 such requests all reached vLLM after /resume).
    lifecycle = sidecar.app[LIFECYCLE]
    await eventually(lambda: lifecycle.version == "default")
    await control(sidecar, "/pause?mode=keep")
    body = b'{"model": "tiny-model", "prompt": ' + json.dumps([[7] * 1_500_000]).encode() + b"}"
    assert sidecar.client.port is not None
    _, writer = await asyncio.open_connection("127.0.0.1", sidecar.client.port)
    writer.write(
        b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        b"Content-Length: %d\r\n\r\n%s" % (len(body), body)
    )
    await eventually(lambda: lifecycle.held == 1, "the request is held")
    writer.close()  # its FIN follows the whole body
    await eventually(lambda: lifecycle.held == 0, "the hold sees its client leave")
    await control(sidecar, "/resume")
    resp = await sidecar.client.post("/v1/completions", json=COMPLETION)
    assert resp.status == 200
    assert fake.forwarded() == 1  # that one only
    await wait_metric(sidecar, "vllm_sidecar_client_disconnects_total", 1, route="/v1/completions")
    labels = {"route": "/v1/completions", "method": "POST", "status": "499"}
    assert sidecar.metric("vllm_sidecar_requests_total", **labels) == 1


async def test_client_hang_up_cancels_the_upstream_request(
    sidecar: Sidecar, fake: FakeVLLM
) -> None:
    fake.script("POST /v1/completions", hang())
    task = asyncio.create_task(
        sidecar.client.post("/v1/completions", json=STREAM | {"stream": False})
    )
    await eventually(lambda: fake.forwarded() == 1)
    task.cancel()
    await eventually(lambda: fake.cancelled == ["/v1/completions"])
    route = "/v1/completions"
    await eventually(lambda: sidecar.metric("vllm_sidecar_client_disconnects_total", route=route))
    assert sidecar.metric("vllm_sidecar_client_disconnects_total", route=route) == 1
    assert sidecar.metric("vllm_sidecar_in_flight_requests", route="/v1/completions") == 0


async def test_hang_up_mid_stream_cancels_the_upstream(sidecar: Sidecar, fake: FakeVLLM) -> None:
    fake.script("POST /v1/completions", sse_forever(delay=0.02))
    resp = await sidecar.client.post("/v1/completions", json=STREAM)
    await resp.content.readuntil(b"\n\n")
    resp.close()
    await eventually(lambda: fake.cancelled == ["/v1/completions"])
    await wait_metric(sidecar, "vllm_sidecar_client_disconnects_total", 1, route="/v1/completions")
    await wait_metric(sidecar, "vllm_sidecar_in_flight_requests", 0, route="/v1/completions")
    # Counted at the status it was already sent, as nginx counts it (README, Metrics): 499 is
    # for a client gone before its status line, or one a failed write found gone.
    for status, count in (("200", 1), ("499", 0)):
        requests = sidecar.metric(
            "vllm_sidecar_requests_total", route="/v1/completions", method="POST", status=status
        )
        assert requests == count, status


async def test_production_hang_up_before_the_body_and_mid_stream(
    upstream: TestServer, fake: FakeVLLM, start_sidecar: StartSidecar
) -> None:
    proc = await start_sidecar(str(upstream.make_url("")))
    url = proc.url
    port = int(url.rsplit(":", 1)[1])
    _, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(
        b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        b"Content-Length: 1000\r\n\r\n" + b'{"model": "tiny-model", "pro'
    )
    await writer.drain()
    admin, route = proc.admin_url, {"route": "/v1/completions"}

    async def in_flight() -> float:
        return sample(await scrape(admin), "vllm_sidecar_in_flight_requests", **route)

    await eventually(lambda: in_flight(), "the sidecar holds the partial request")
    writer.close()
    fake.script("POST /v1/completions", sse_forever(delay=0.02))
    async with aiohttp.ClientSession() as session:
        resp = await session.post(f"{url}/v1/completions", json=STREAM)
        await resp.content.readuntil(b"\n\n")
        resp.close()
    await eventually(lambda: fake.cancelled == ["/v1/completions"])
    assert fake.forwarded() == 1
    # And a client that leaves while vLLM has not answered at all.
    fake.script("POST /v1/completions", hang())
    async with aiohttp.ClientSession() as session:
        waiting = asyncio.create_task(session.post(f"{url}/v1/completions", json=COMPLETION))
        await eventually(lambda: fake.forwarded() == 2)
        waiting.cancel()
    await eventually(lambda: fake.cancelled == ["/v1/completions"] * 2)

    async def all_counted() -> bool:
        metrics = await scrape(admin)
        return sample(metrics, "vllm_sidecar_client_disconnects_total", **route) == 3

    await eventually(all_counted, "the three hang-ups counted")
    assert await in_flight() == 0


async def test_slow_reader_is_not_buffered(
    upstream: TestServer, fake: FakeVLLM, start_sidecar: StartSidecar
) -> None:
    """Backpressure: a client that stops reading stops the upstream too, within socket buffers."""
    proc = await start_sidecar(str(upstream.make_url("")))
    url = proc.url
    fire = Firehose(total=128 * MiB)
    fake.script("POST /v1/completions", fire.handler())
    rss_before = rss_bytes(proc.pid)
    async with aiohttp.ClientSession() as session:
        resp = await session.post(f"{url}/v1/completions", json=STREAM)
        got = len(await resp.content.readexactly(64 * 1024))
        last = [-1]

        def held_back() -> bool:  # the upstream sent nothing more in the last half second
            steady, last[0] = fire.sent == last[0], fire.sent
            return steady

        await eventually(held_back, "the upstream is held back", within=60, every=0.5)
        held, rss_held = fire.sent, rss_bytes(proc.pid)
        print(
            f"held at {held / MiB:.1f} MiB sent, rss {rss_before / MiB:.1f} -> {rss_held / MiB:.1f}"
        )
        async for chunk in resp.content.iter_any():
            got += len(chunk)
    assert fire.finished
    assert got == fire.sent + len(b"data: [DONE]\n\n")
    assert held < 32 * MiB
    assert rss_held - rss_before < 16 * MiB
