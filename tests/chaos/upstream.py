"""The chaos run's vLLM: tests/fake_vllm.py's FakeVLLM, answering each request with the nonce of
its prompt and `cmpl-<X-Request-Id>`, misbehaving per request as a seed decides, restartable.

What it did with each request is written down (`Sent`), so that the checks can tell an answer
the fake gave from one the sidecar made up, and a generation that ran from one that never did.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import random
import socket
import struct
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

from tests.fake_vllm import (
    DevEngine,
    FakeVLLM,
    abort,
    dumps,
    error_body,
    json_response,
    sse_chunk,
    start_sse,
)

MODEL = "tiny-model"
HOLD_LIMIT = 120.0  # a hang-up client's generation waits at most this long for the hang-up

# Per-request faults and their weights; which apply depends on the answer's kind.
JSON_FAULTS = {"ok": 70, "slow": 8, "error": 9, "reset_head": 5, "reset_body": 8}
SSE_FAULTS = {
    "ok": 62,
    "slow": 8,
    "error": 7,
    "reset_head": 4,
    "reset_body": 7,
    "cut_event": 6,
    "stream_error": 6,
}
# vLLM 0.32's own error bodies (shared/vllm-samples, j_dev_endpoints and f*): status, type.
ERRORS = [
    (500, "InternalServerError", "EngineCore encountered an issue. See stack trace for details."),
    (400, "BadRequestError", "This model's maximum context length is 512 tokens."),
    (503, "ServiceUnavailableError", "The engine is not ready to serve requests."),
]


def nonce_of(payload: dict[str, Any]) -> str:
    """The nonce a chaos client put first in its prompt (completions) or message (chat)."""
    text = payload.get("prompt")
    if text is None:
        text = payload["messages"][0]["content"]
    return str(text).split(" ", 2)[1]


def kind_of(nonce: str) -> str:
    """`json-000042` is a JSON client's: the client kind is the nonce's first part."""
    return nonce.rsplit("-", 1)[0]


@dataclass
class Sent:
    """What the fake did with one request: `state` ends as one of refused (an error answer, not
    run), reset_head (dropped before any answer), done, aborted (a pause or sleep ended it),
    cut (dropped or failed part way), cancelled (the sidecar went away: a hang-up, a restart)."""

    nonce: str
    fault: str
    state: str = "arrived"
    status: int | None = None
    body: Any = None
    events: int = 0


@dataclass
class ChaosVLLM(FakeVLLM):
    seed: int = 0
    port: int = 0
    sent: dict[str, Sent] = field(default_factory=dict)  # by X-Request-Id
    duplicates: list[str] = field(default_factory=list)  # requests that came twice
    restarts: int = 0
    calm: bool = False  # the warm-up: no fault of its own
    _runner: web.AppRunner | None = None
    _listener: socket.socket = field(init=False)

    def __post_init__(self) -> None:
        self.served = [(MODEL, "/models/sidecar-test/tiny-model")]

    # -- the server, and its restarts --------------------------------------------------------
    async def start(self) -> None:
        self.engine = DevEngine()  # a restarted vLLM serves, with its default weights
        runner = web.AppRunner(
            self.app(),
            handler_cancellation=True,
            keepalive_timeout=5.0,
            shutdown_timeout=0.5,
            access_log=None,
        )
        await runner.setup()
        self._listener = socket.create_server(("127.0.0.1", self.port))  # SO_REUSEADDR
        await web.SockSite(runner, self._listener).start()
        self._runner = runner

    async def stop(self) -> None:
        """As a crash: the listener closed, every connection reset, every handler cancelled."""
        runner, self._runner = self._runner, None
        if runner is None:
            return
        # asyncio's Server.close() races an accept made in the same loop turn: that transport
        # cannot attach to the closed server and is left, unclosed, to the garbage collector
        # (CPython 3.11-3.13, selector_events._accept_connection2). So accepting stops first,
        # and what was accepted reaches aiohttp (one turn for the transport, one for
        # connection_made) before every connection is reset.
        asyncio.get_running_loop().remove_reader(self._listener.fileno())
        for _ in range(2):
            await asyncio.sleep(0)
        assert runner.server is not None
        for handler in runner.server.connections:
            transport = handler.transport
            if transport is not None and not transport.is_closing():
                _rst(transport)
        await runner.cleanup()

    async def restart(self, down: float) -> None:
        await self.stop()
        self.restarts += 1
        await asyncio.sleep(down)  # the scenario: how long vLLM stays down
        await self.start()

    # -- requests --------------------------------------------------------------------------------
    async def _dispatch(self, request: web.Request) -> web.StreamResponse:
        # FakeVLLM records every body; megabytes a second for minutes would be the harness's
        # own leak, so only what the checks need is kept.
        handler = self._route(request)
        try:
            return await handler(request)
        except asyncio.CancelledError:
            self._gone(request)
            raise
        except ConnectionResetError:  # the sidecar closed it while an event was being written
            self._gone(request)
            return web.Response()  # aiohttp drops it quietly: the connection is closing

    def _gone(self, request: web.Request) -> None:
        """The sidecar went away (a hang-up it passed on, a restart): the generation ends."""
        rid = request.headers.get("X-Request-Id", "")
        if (sent := self.sent.get(rid)) is not None and sent.state in ("arrived", "running"):
            sent.state = "cancelled"

    async def completions(self, request: web.Request) -> web.StreamResponse:
        rid = request.headers.get("X-Request-Id", "")
        payload = json.loads(await request.read())
        nonce = nonce_of(payload)
        stream = bool(payload.get("stream"))
        fault = self._fault(nonce, stream)
        if (first := self.sent.get(rid)) is not None:
            self.duplicates.append(f"{rid} (first time: fault {first.fault}, {first.state})")
        sent = self.sent[rid] = Sent(nonce, fault)
        if (bad := self._check_model(payload)) is not None or payload["max_tokens"] < 1:
            return self._refuse(sent, bad or await FakeVLLM.completions(self, request))
        if fault == "error":
            status, kind, message = ERRORS[random.Random(nonce).randrange(len(ERRORS))]
            error = json_response(error_body(message, kind, None, status), status)
            return self._refuse(sent, error)
        if fault == "reset_head":
            sent.state = "reset_head"
            abort(request)
            return web.Response()
        chat = request.path.endswith("chat/completions")
        if stream:
            return await self._stream(request, sent, rid, chat, payload["max_tokens"])
        return await self._json(request, sent, rid, chat, payload["max_tokens"])

    def _fault(self, nonce: str, stream: bool) -> str:
        kind = kind_of(nonce)
        if self.calm or kind.startswith("hangup") or kind == "bad":
            return "ok"  # their ends are the client's; an upstream fault would race them
        faults = SSE_FAULTS if stream else JSON_FAULTS
        rng = random.Random(f"{self.seed}/{nonce}")
        return rng.choices(list(faults), weights=list(faults.values()))[0]

    def _refuse(self, sent: Sent, resp: web.StreamResponse) -> web.StreamResponse:
        sent.state, sent.status = "refused", resp.status
        assert isinstance(resp, web.Response)
        assert resp.body is not None
        sent.body = json.loads(bytes(resp.body))  # type: ignore[arg-type]
        return resp

    def _delay(self, sent: Sent) -> float:
        return 0.05 if sent.fault == "slow" else 0.005

    async def _json(
        self, request: web.Request, sent: Sent, rid: str, chat: bool, tokens: int
    ) -> web.StreamResponse:
        await self.engine.admitted()  # vLLM queues new requests while paused or asleep
        sent.state = "running"
        finish = "length"
        with self.engine.running() as run:
            if kind_of(sent.nonce) == "hangup_wait":
                await self._until_cancelled()
            for _ in range(tokens):
                await asyncio.sleep(self._delay(sent))
                if run.aborted:
                    finish = "abort"
                    break
                await self.engine.admitted()  # a `keep` pause freezes it here
        body = self._completion(MODEL, chat, [None], finish, text=f" {sent.nonce}", request_id=rid)
        if sent.fault == "reset_body":
            data = dumps(body)
            head = b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n"
            head += b"content-length: %d\r\n\r\n" % len(data)
            assert request.transport is not None
            request.transport.write(head + data[: len(data) // 2])
            sent.state = "cut"
            await asyncio.sleep(0.05)  # its own read: the half body reaches the sidecar first
            abort(request)
            return web.Response()
        sent.state, sent.status = ("done" if finish == "length" else "aborted"), 200
        return json_response(body)

    async def _stream(
        self, request: web.Request, sent: Sent, rid: str, chat: bool, tokens: int
    ) -> web.StreamResponse:
        resp = await start_sse(request)  # vLLM sends the 200 headers, then queues while paused
        sent.status = 200
        await self.engine.admitted()
        sent.state = "running"
        finish = "length"
        text = f" {sent.nonce}"
        with self.engine.running() as run:
            for i in range(tokens):
                if run.aborted:
                    finish = "abort"
                    break
                await self.engine.admitted()  # a `keep` pause freezes it here
                last = "length" if i == tokens - 1 else None
                await resp.write(sse_chunk(MODEL, i, chat, last, text=text, request_id=rid))
                sent.events += 1
                if i == 0 and kind_of(sent.nonce) == "hangup_stream":
                    await self._until_cancelled()
                if i == tokens // 2 and await self._misbehave(request, resp, sent, rid, chat):
                    return resp
                await asyncio.sleep(self._delay(sent))
            if finish == "abort":
                await resp.write(
                    sse_chunk(MODEL, sent.events, chat, "abort", text="", request_id=rid)
                )
        sent.state = "done" if finish == "length" else "aborted"
        await resp.write(b"data: [DONE]\n\n")
        await resp.write_eof()
        return resp

    async def _misbehave(
        self, request: web.Request, resp: web.StreamResponse, sent: Sent, rid: str, chat: bool
    ) -> bool:
        """Half way through a stream: reset, cut inside an event, or vLLM's own error event."""
        if sent.fault not in ("reset_body", "cut_event", "stream_error"):
            return False
        sent.state = "cut"
        if sent.fault == "stream_error":
            err = error_body("EngineCore encountered an issue.", "InternalServerError", None, 500)
            await resp.write(b"data: " + json.dumps(err).encode() + b"\n\n")
            await resp.write(b"data: [DONE]\n\n")
            await resp.write_eof()
            return True
        if sent.fault == "cut_event":
            event = sse_chunk(MODEL, sent.events, chat, text=f" {sent.nonce}", request_id=rid)
            await resp.write(event[: len(event) // 2])
        await asyncio.sleep(0.05)  # what was written reaches the sidecar before the reset
        abort(request)
        return True

    async def _until_cancelled(self) -> None:
        """A hang-up client's generation: it runs until the sidecar cancels it (the client
        left), so that the client's hang-up, not the answer, decides how the request ends."""
        await asyncio.sleep(HOLD_LIMIT)


def _rst(transport: asyncio.BaseTransport) -> None:
    sock = transport.get_extra_info("socket")
    with contextlib.suppress(OSError):
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    transport.abort()  # type: ignore[attr-defined]
