"""The upstream pool: an answer is only ever paired with its own request, and waits are bounded."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator

import pytest

from tests.conftest import MakeSidecar
from tests.test_failures import COMPLETION


def _answer(body: bytes) -> bytes:
    head = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n"
    return head % len(body) + body


class PushyUpstream:
    """A raw HTTP/1.1 server that, after answering, writes one more response nobody asked for.

    It echoes each request's X-Request-Id, so a client can tell whose answer it got.
    """

    def __init__(self) -> None:
        self.connections = 0
        self.server: asyncio.Server | None = None

    async def serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        try:
            while head := await reader.readuntil(b"\r\n\r\n"):
                fields = dict(
                    line.split(b": ", 1) for line in head.split(b"\r\n")[1:] if b": " in line
                )
                await reader.readexactly(int(fields.get(b"Content-Length", b"0")))
                rid = fields.get(b"X-Request-Id", b"none").decode()
                writer.write(_answer(json.dumps({"request_id": rid}).encode()))
                await asyncio.sleep(0.05)  # idle in the pool by now
                writer.write(_answer(b'{"request_id": "unsolicited"}'))
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()

    @property
    def url(self) -> str:
        assert self.server is not None
        return f"http://127.0.0.1:{self.server.sockets[0].getsockname()[1]}"


@pytest.fixture
async def pushy() -> AsyncIterator[PushyUpstream]:
    upstream = PushyUpstream()
    upstream.server = await asyncio.start_server(upstream.serve, "127.0.0.1", 0)
    async with upstream.server:
        yield upstream


async def test_unsolicited_bytes_on_an_idle_connection_never_reach_a_client(
    make_sidecar: MakeSidecar, pushy: PushyUpstream
) -> None:
    sidecar = await make_sidecar(
        pushy.url, ready=False, served_model_names=["tiny-model"], health_interval=3600
    )
    await asyncio.sleep(0.2)  # the first health check's connection is idle, and pushed to
    for i in range(4):
        resp = await sidecar.client.post(
            "/v1/completions", json=COMPLETION, headers={"X-Request-Id": f"client-{i}"}
        )
        assert resp.status == 200, await resp.text()
        assert await resp.json() == {"request_id": f"client-{i}"}
        await asyncio.sleep(0.2)  # the unsolicited answer lands on the idle pooled connection
    # Each connection that received bytes while idle was closed, never handed out again.
    assert pushy.connections >= 4
