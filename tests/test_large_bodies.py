"""Large JSON bodies: the model rewritten in the head, the rest streamed to the upstream."""

from __future__ import annotations

import asyncio
import io
import json
from collections.abc import AsyncIterator
from typing import Any

from aiohttp import web

from proxy.client.inbound import HEAD_BYTES, STREAM_FROM
from tests.fake_vllm import FakeVLLM, json_response
from tests.sidecar import MakeSidecar, Sidecar

IDS = json.dumps([[i % 50000 for i in range(200_000)]]).encode()  # ~1.3 MB of token ids


class RecordingUpstream:
    """An upstream that tells when the first bytes of a body arrived, before the rest."""

    def __init__(self, fake: FakeVLLM) -> None:
        self.fake = fake
        self.head_seen = asyncio.Event()
        self.bodies: list[tuple[bytes, dict[str, str]]] = []

    async def handle(self, request: web.Request) -> web.StreamResponse:
        if request.path != "/v1/completions":
            return await self.fake._route(request)(request)
        head = await request.content.readexactly(HEAD_BYTES)
        self.head_seen.set()
        body = head + await request.content.read()
        self.bodies.append((body, dict(request.headers)))
        return json_response({"choices": [{"index": 0, "text": "ok"}]})

    def app(self) -> web.Application:
        app = web.Application(client_max_size=1 << 30)
        app.router.add_route("*", "/{tail:.*}", self.handle)
        return app


async def start(aiohttp_server: Any, make_sidecar: MakeSidecar, fake: FakeVLLM) -> Any:
    upstream = RecordingUpstream(fake)
    server = await aiohttp_server(upstream.app())
    return upstream, await make_sidecar(str(server.make_url("")))


async def test_model_first_streams_the_rest(
    aiohttp_server: Any, make_sidecar: MakeSidecar, fake: FakeVLLM
) -> None:
    upstream, sidecar = await start(aiohttp_server, make_sidecar, fake)
    body = b'{"model": "org/tiny-model", "max_tokens": 8, "prompt": ' + IDS + b"}"
    assert len(body) > STREAM_FROM
    split = len(body) // 2

    async def slow_client() -> AsyncIterator[bytes]:
        yield body[:split]
        # The rest is sent only once the upstream holds the head: a sidecar that stored the
        # whole body before forwarding would never get here.
        await asyncio.wait_for(upstream.head_seen.wait(), 10)
        yield body[split:]

    resp = await sidecar.client.post(
        "/v1/completions",
        data=slow_client(),
        headers={"Content-Type": "application/json", "Content-Length": str(len(body))},
    )
    assert resp.status == 200
    ((sent, headers),) = upstream.bodies
    assert sent == body.replace(b'"org/tiny-model"', b'"tiny-model"', 1)
    assert headers["Content-Length"] == str(len(sent))
    assert "Transfer-Encoding" not in headers
    assert (
        sidecar.metric(
            "vllm_sidecar_model_resolutions_total", rule="basename", served_model="tiny-model"
        )
        == 1
    )


async def test_model_after_the_ids_is_read_whole_and_rewritten(
    aiohttp_server: Any, make_sidecar: MakeSidecar, fake: FakeVLLM
) -> None:
    upstream, sidecar = await start(aiohttp_server, make_sidecar, fake)
    body = b'{"prompt": ' + IDS + b', "model": "Org/Tiny-Model"}'
    resp = await sidecar.client.post(
        "/v1/completions", data=io.BytesIO(body), headers={"Content-Type": "application/json"}
    )
    assert resp.status == 200
    ((sent, _),) = upstream.bodies
    assert sent == body.replace(b'"Org/Tiny-Model"', b'"tiny-model"')


async def test_duplicate_model_after_the_ids_is_still_refused(
    aiohttp_server: Any, make_sidecar: MakeSidecar, fake: FakeVLLM
) -> None:
    upstream, sidecar = await start(aiohttp_server, make_sidecar, fake)
    body = b'{"prompt": ' + IDS + b', "model": "a", "model": "b"}'
    resp = await sidecar.client.post(
        "/v1/completions", data=io.BytesIO(body), headers={"Content-Type": "application/json"}
    )
    assert resp.status == 400
    assert resp.headers["X-Sidecar-Error"] == "invalid_request"
    assert upstream.bodies == []


async def test_streamed_body_with_an_unknown_model_gets_the_404_envelope(
    sidecar: Sidecar, fake: FakeVLLM
) -> None:
    body = b'{"model": "org/unknown", "prompt": ' + IDS + b"}"
    resp = await sidecar.client.post(
        "/v1/completions", data=io.BytesIO(body), headers={"Content-Type": "application/json"}
    )
    assert resp.status == 404
    err = (await resp.json())["error"]
    assert err["upstream"]["body"]["error"]["message"].startswith("The model `org/unknown`")
    assert err["model"]["served"] == ["tiny-model"]
    assert fake.last("/v1/completions").body == body
