"""A scripted fake vLLM 0.32 server, faithful to the captures in shared/vllm-samples.

It answers like vLLM (model list with `id` and `root`, completions and chat as JSON or SSE, the
exact 404 and 400 bodies, in-stream error events) and can be told, per route, to misbehave:
be slow, hang, drop mid-stream, send garbage. Every request it receives is recorded.

`frontend="rust"` speaks as vLLM's Rust frontend (VLLM_USE_RUST_FRONTEND=1) where its bytes
differ, as captured in tests/samples/rust/: its error bodies (a string `code`), an empty 404 for
an unknown route, `/v1/models` without permissions, `n` above 1 refused, and its stream framing
(tokens without `finish_reason`, then one tokenless event that has it).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import json
import secrets
import socket
import struct
import time
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web
from multidict import CIMultiDict

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
_ids = itertools.count(1)


def dumps(obj: Any) -> bytes:
    """vLLM's compact JSON."""
    return json.dumps(obj, separators=(",", ":")).encode()


def json_response(obj: Any, status: int = 200) -> web.Response:
    return web.Response(status=status, body=dumps(obj), content_type="application/json")


def error_body(message: str, type_: str, param: str | None, code: int | str) -> dict[str, Any]:
    return {"error": {"message": message, "type": type_, "param": param, "code": code}}


def rust_error(
    message: str, param: str | None, code: str = "invalid_request_error"
) -> dict[str, Any]:
    """The Rust frontend's error body: one type, a string code."""
    return error_body(message, "invalid_request_error", param, code)


@dataclass
class Recorded:
    method: str
    raw_path: str
    headers: CIMultiDict[str]
    body: bytes

    def json(self) -> Any:
        return json.loads(self.body)


@dataclass
class FakeVLLM:
    served: list[tuple[str, str]] = field(
        default_factory=lambda: [("tiny-model", "/models/sidecar-test/tiny-model")]
    )
    vocab_size: int = 1000
    max_model_len: int = 512
    stream_events: int = 3
    stream_delay: float = 0.0
    healthy: bool = True
    requests: list[Recorded] = field(default_factory=list)  # each once its body was read
    arriving: list[str] = field(default_factory=list)  # each path once its head was read
    cancelled: list[str] = field(default_factory=list)
    scripts: dict[str, list[Handler]] = field(default_factory=dict)
    engine: DevEngine = field(default_factory=lambda: DevEngine())
    frontend: str = "python"  # or "rust"

    @property
    def rust(self) -> bool:
        return self.frontend == "rust"

    # -- scripting -------------------------------------------------------------------------
    def script(self, key: str, handler: Handler, times: int = 1) -> None:
        """The next `times` requests to `key` ("POST /v1/completions") go to `handler`."""
        self.scripts.setdefault(key, []).extend([handler] * times)

    def forwarded(self, path: str = "/v1/completions") -> int:
        """How many requests for `path` (query aside) reached this fake."""
        return sum(1 for r in self.requests if r.raw_path.split("?")[0] == path)

    def last(self, path: str) -> Recorded:
        return next(r for r in reversed(self.requests) if r.raw_path.split("?")[0] == path)

    @property
    def names(self) -> list[str]:
        return [name for name, _ in self.served]

    # -- the server ------------------------------------------------------------------------
    def app(self) -> web.Application:
        app = web.Application(client_max_size=256 * 1024 * 1024)
        app.router.add_route("*", r"/{tail:[\s\S]*}", self._dispatch)  # %0A too
        return app

    async def _dispatch(self, request: web.Request) -> web.StreamResponse:
        self.arriving.append(request.raw_path)
        body = await request.read()
        self.requests.append(
            Recorded(request.method, request.raw_path, CIMultiDict(request.headers), body)
        )
        key = f"{request.method} {request.path}"
        handler = self.scripts[key].pop(0) if self.scripts.get(key) else self._route(request)
        try:
            return await handler(request)
        except asyncio.CancelledError:
            self.cancelled.append(request.path)
            raise

    def _route(self, request: web.Request) -> Handler:
        routes: dict[str, Handler] = {
            "GET /v1/models": self.models,
            "GET /health": self.health,
            "POST /v1/completions": self.completions,
            "POST /v1/chat/completions": self.completions,
            "POST /tokenize": self.tokenize,
        }
        if (dev := self.engine.routes().get(f"{request.method} {request.path}")) is not None:
            return dev
        if request.path == "/reset_prefix_cache":
            return self.dev_route
        if request.path in (
            "/init_weight_update_communicator",
            "/update_weights",
            "/destroy_weights_update_group",
            "/collective_rpc",
        ):
            return self.dev_route
        return routes.get(f"{request.method} {request.path}", self.not_found)

    async def models(self, request: web.Request) -> web.Response:
        # As vLLM's ModelCard and ModelPermission: each read is stamped with its own time and
        # fresh permission ids, so no two reads are the same bytes.
        now, perms = int(time.time()), secrets.token_hex(4)
        data = [
            {
                "id": name,
                "object": "model",
                "created": now,
                "owned_by": "vllm",
                "root": root,
                "parent": None,
                "max_model_len": self.max_model_len,
                "permission": [
                    {
                        "id": f"modelperm-{perms}{i:08x}",
                        "object": "model_permission",
                        "created": now,
                        "allow_create_engine": False,
                        "allow_sampling": True,
                        "allow_logprobs": True,
                        "allow_search_indices": False,
                        "allow_view": True,
                        "allow_fine_tuning": False,
                        "organization": "*",
                        "group": None,
                        "is_blocking": False,
                    }
                ],
            }
            for i, (name, root) in enumerate(self.served)
        ]
        if self.rust:
            for card in data:
                del card["permission"]
                card["owned_by"] = "vllm-frontend-rs"
        return json_response({"object": "list", "data": data})

    async def health(self, request: web.Request) -> web.Response:
        return web.Response(status=200 if self.healthy else 503)

    async def not_found(self, request: web.Request) -> web.Response:
        if self.rust:
            return web.Response(status=404)
        return json_response({"detail": "Not Found"}, 404)

    async def dev_route(self, request: web.Request) -> web.Response:
        return json_response({"status": request.path.strip("/"), "success": True})

    async def tokenize(self, request: web.Request) -> web.Response:
        payload = json.loads(await request.read())
        if (bad := self._check_model(payload)) is not None:
            return bad
        tokens = [(ord(c) % self.vocab_size) for c in str(payload.get("prompt", ""))]
        return json_response(
            {
                "count": len(tokens),
                "max_model_len": self.max_model_len,
                "tokens": tokens,
                "token_strs": None,
            }
        )

    def _check_model(self, payload: dict[str, Any]) -> web.Response | None:
        model = payload.get("model", self.names[0])
        if self.rust:
            return self._check_rust(model, payload)
        if model not in self.names:
            msg = f"The model `{model}` does not exist. Valid aliases: {', '.join(self.names)}."
            return json_response(error_body(msg, "NotFoundError", "model", 404), 404)
        return None

    def _check_rust(self, model: str, payload: dict[str, Any]) -> web.Response | None:
        if model not in self.names:
            msg = f"The model `{model}` does not exist."
            return json_response(rust_error(msg, "model", "model_not_found"), 404)
        if (payload.get("n") or 1) > 1:
            return json_response(rust_error("Only n=1 is supported.", "n"), 400)
        return None

    async def completions(self, request: web.Request) -> web.StreamResponse:
        try:
            payload = json.loads(await request.read())
        except ValueError:
            return json_response(error_body("JSON decode error", "Bad Request", "body", 400), 400)
        if (bad := self._check_model(payload)) is not None:
            return bad
        if payload.get("max_tokens", 16) < 1:
            value = payload["max_tokens"]
            msg = f"max_tokens must be at least 1, got {value}. "
            msg += f"(parameter=max_tokens, value={value})"  # vLLM 0.32's words (f1)
            return json_response(error_body(msg, "BadRequestError", "max_tokens", 400), 400)
        prompts = payload.get("prompt")
        batch = (
            prompts
            if isinstance(prompts, list) and prompts and isinstance(prompts[0], list)
            else [prompts]
        )
        oov = any(
            isinstance(t, int) and t >= self.vocab_size
            for p in batch
            if isinstance(p, list)
            for t in p
        )
        model = payload.get("model", self.names[0])
        chat = request.path.endswith("chat/completions")
        if payload.get("stream"):
            return await self._stream(request, model, chat, oov)
        await self.engine.admitted()  # vLLM queues new requests while paused or asleep
        with self.engine.running() as run:
            for _ in range(self.stream_events if self.stream_delay else 0):
                await asyncio.sleep(self.stream_delay)
                if run.aborted:
                    return json_response(self._completion(model, chat, batch, "abort"))
                await self.engine.admitted()  # a `keep` pause freezes it here
        if oov:
            msg = "Token id 5000 is out of vocabulary"
            return json_response(error_body(msg, "BadRequestError", None, 400), 400)
        return json_response(self._completion(model, chat, batch, "length"))

    def _completion(
        self,
        model: str,
        chat: bool,
        batch: list[Any],
        finish: str,
        *,
        text: str = " fox",
        request_id: str | None = None,
    ) -> dict[str, Any]:
        return {
            # vLLM adopts the client's X-Request-Id: its own id becomes `cmpl-<X-Request-Id>`.
            "id": f"cmpl-{request_id or f'{next(_ids):016x}'}",
            "object": "chat.completion" if chat else "text_completion",
            "created": 1795982287,
            "model": model,
            "choices": [self._choice(i, chat, finish, text) for i in range(len(batch))],
            "usage": {"prompt_tokens": 3, "total_tokens": 7, "completion_tokens": 4},
        }

    @staticmethod
    def _choice(
        index: int, chat: bool, finish: str = "length", text: str = " fox"
    ) -> dict[str, Any]:
        if chat:
            return {
                "index": index,
                "message": {"role": "assistant", "content": text},
                "logprobs": None,
                "finish_reason": finish,
                "stop_reason": None,
            }
        return {
            "index": index,
            "text": text,
            "logprobs": None,
            "finish_reason": finish,
            "stop_reason": None,
            "token_ids": None,
        }

    async def _stream(
        self, request: web.Request, model: str, chat: bool, oov: bool
    ) -> web.StreamResponse:
        resp = await start_sse(request)  # vLLM sends the 200 headers, then queues while paused
        await self.engine.admitted()
        if oov:
            err = error_body("Token id 5000 is out of vocabulary", "BadRequestError", None, 400)
            await resp.write(b"data: " + json.dumps(err).encode() + b"\n\n")
        else:
            with self.engine.running() as run:
                for i in range(self.stream_events):
                    if run.aborted:
                        await resp.write(sse_chunk(model, i, chat, finish="abort", rust=self.rust))
                        break
                    await self.engine.admitted()  # a `keep` pause freezes it here
                    await resp.write(sse_chunk(model, i, chat, rust=self.rust))
                    if self.stream_delay:
                        await asyncio.sleep(self.stream_delay)
                else:
                    if self.rust:
                        await resp.write(sse_chunk(model, 0, chat, finish="length", rust=True))
        await resp.write(b"data: [DONE]\n\n")
        await resp.write_eof()
        return resp


async def start_sse(request: web.Request) -> web.StreamResponse:
    resp = web.StreamResponse(headers={"Content-Type": "text/event-stream; charset=utf-8"})
    await resp.prepare(request)
    return resp


def sse_chunk(
    model: str,
    i: int,
    chat: bool = False,
    finish: str | None = None,
    *,
    text: str | None = None,
    request_id: str = "0",
    rust: bool = False,
) -> bytes:
    """One completion chunk; `text` defaults to ` t<i>`, the id to vLLM's `cmpl-<request id>`.
    The Rust frontend's: a token has no `finish_reason` key, a `finish` is a tokenless event."""
    words = f" t{i}" if text is None else text
    if rust and finish is not None:
        words = ""
    delta: dict[str, Any] = {"delta": {"content": words}} if chat else {"text": words}
    if rust and chat and finish is not None:
        delta = {"delta": {}}
    choice: dict[str, Any] = {"index": 0, **delta, "logprobs": None, "finish_reason": finish}
    if rust:
        choice = {"index": 0, **delta} | ({} if finish is None else {"finish_reason": finish})
    event = {
        "id": f"cmpl-{request_id}",
        "object": "chat.completion.chunk" if chat else "text_completion",
        "created": 1795982287,
        "model": model,
        "choices": [choice],
    }
    return b"data: " + dumps(event) + b"\n\n"


@dataclass
class Run:
    aborted: bool = False


@dataclass
class DevEngine:
    """vLLM 0.32's dev-mode engine routes (VLLM_SERVER_DEV_MODE=1), as captured in
    shared/vllm-samples/j_*: pause and sleep queue new requests with no bound; `abort` ends the
    running ones (finish_reason "abort") before the call answers, `wait` drains them first,
    `keep` freezes them; /is_paused and /is_sleeping are both true in any pause or sleep."""

    paused: bool = False
    sleeping: bool = False
    weight_version: str = "default"
    updating: bool = False
    woken: set[str] = field(default_factory=set)
    _runs: dict[int, Run] = field(default_factory=dict)
    _go: asyncio.Event | None = None

    def routes(self) -> dict[str, Handler]:
        return {
            "POST /pause": self.pause,
            "POST /resume": self.resume,
            "POST /sleep": self.sleep,
            "POST /wake_up": self.wake_up,
            "GET /is_paused": self.is_busy("is_paused"),
            "GET /is_sleeping": self.is_busy("is_sleeping"),
            "GET /weight_info": self.weight_info,
            "POST /start_weight_update": self.start_update,
            "POST /update_weights": self.message("Weights updated"),
            "POST /finish_weight_update": self.finish_update,
            "POST /update_weight_version": self.update_version,
        }

    @property
    def go(self) -> asyncio.Event:
        if self._go is None:
            self._go = asyncio.Event()
            self._go.set()
        return self._go

    async def admitted(self) -> None:
        await self.go.wait()

    @contextlib.contextmanager
    def running(self) -> Iterator[Run]:
        key, run = next(_ids), Run()
        self._runs[key] = run
        try:
            yield run
        finally:
            del self._runs[key]

    async def _stop(self, mode: str) -> None:
        self.go.clear()
        if mode == "abort":
            for run in self._runs.values():
                run.aborted = True
        if mode in ("abort", "wait"):
            for _ in range(500):  # vLLM answers once the running requests are gone
                if not self._runs:
                    break
                await asyncio.sleep(0.01)

    async def pause(self, request: web.Request) -> web.Response:
        self.paused = True
        await self._stop(request.query.get("mode", "abort"))
        return json_response({"status": "paused"})

    async def resume(self, request: web.Request) -> web.Response:
        self.paused = False
        if not self.sleeping:
            self.go.set()
        return json_response({"status": "resumed"})

    async def sleep(self, request: web.Request) -> web.Response:
        self.sleeping, self.woken = True, set()
        await self._stop(request.query.get("mode", "abort"))
        return json_response({"status": "sleeping", "level": int(request.query.get("level", 1))})

    async def wake_up(self, request: web.Request) -> web.Response:
        tags = request.query.getall("tags", [])
        self.woken |= set(tags) if tags else {"weights", "kv_cache"}
        if {"weights", "kv_cache"} <= self.woken:
            self.sleeping = False
            if not self.paused:
                self.go.set()
        status = "sleeping" if self.sleeping else "awake"
        return json_response({"status": status, "tags": tags or None})

    def is_busy(self, key: str) -> Handler:
        async def handler(request: web.Request) -> web.Response:
            return json_response({key: self.paused or self.sleeping})

        return handler

    async def weight_info(self, request: web.Request) -> web.Response:
        return json_response({"weight_version": self.weight_version})

    def message(self, text: str) -> Handler:
        async def handler(request: web.Request) -> web.Response:
            return json_response({"message": text})

        return handler

    async def start_update(self, request: web.Request) -> web.Response:
        self.updating = True
        return json_response({"message": "Weight update started"})

    async def finish_update(self, request: web.Request) -> web.Response:
        body = json.loads(await request.read() or b"{}")
        self.updating = False
        if body.get("weight_version") is not None:
            self.weight_version = str(body["weight_version"])
        return json_response({"message": "Weight update finished"})

    async def update_version(self, request: web.Request) -> web.Response:
        self.weight_version = str(json.loads(await request.read())["new_version"])
        return json_response({"success": True, "new_version": self.weight_version})


# -- misbehaviours, for FakeVLLM.script ------------------------------------------------------
def respond(
    status: int,
    body: bytes | str,
    content_type: str = "application/json",
    headers: dict[str, str] | None = None,
) -> Handler:
    async def handler(request: web.Request) -> web.Response:
        data = body.encode() if isinstance(body, str) else body
        return web.Response(
            status=status, body=data, headers={"Content-Type": content_type, **(headers or {})}
        )

    return handler


PAUSED_MESSAGE = "Generation is paused. Please retry after it resumes."


def paused_rejection(*, chat: bool = False, stream: bool = False) -> Handler:
    """vLLM 0.33's answer to a request sent during `/pause?mode=abort|wait`: a 503 JSON error,
    or for a stream a 200 whose first event is that error, then `[DONE]`. The completions
    stream's event has spaced JSON; chat's is compact and says InternalServerError."""
    kind = "InternalServerError" if chat else "ServiceUnavailableError"
    error = error_body(PAUSED_MESSAGE, kind, None, 503)
    if not stream:
        return respond(503, dumps(error))
    event = dumps(error) if chat else json.dumps(error).encode()
    sse = "text/event-stream; charset=utf-8"
    return respond(200, b"data: " + event + b"\n\ndata: [DONE]\n\n", sse)


def hang() -> Handler:
    """Never answer; the handler is cancelled when the connection closes."""

    async def handler(request: web.Request) -> web.Response:
        await asyncio.sleep(3600)
        raise AssertionError("unreachable")

    return handler


def slow(delay: float, then: Handler) -> Handler:
    async def handler(request: web.Request) -> web.StreamResponse:
        await asyncio.sleep(delay)
        return await then(request)

    return handler


def raw(data: bytes) -> Handler:
    """Write raw bytes on the socket (not HTTP, or a cut response), then close it."""

    async def handler(request: web.Request) -> web.StreamResponse:
        assert request.transport is not None
        request.transport.write(data)
        request.transport.close()
        await asyncio.sleep(0.05)
        return web.Response()

    return handler


def sse_then_drop(
    events: int, model: str = "tiny-model", delay: float = 0.0, cut: int = 0
) -> Handler:
    """Start a 200 SSE stream, send `events` events, then drop the connection; with `cut`,
    after the first `cut` bytes of one more event (a vLLM killed while writing it)."""

    async def handler(request: web.Request) -> web.StreamResponse:
        resp = await start_sse(request)
        for i in range(events):
            await resp.write(sse_chunk(model, i))
            await asyncio.sleep(delay)
        if cut:
            await resp.write(sse_chunk(model, events)[:cut])
            await asyncio.sleep(0.05)  # its own read: the sidecar relays what it has first
        assert request.transport is not None
        request.transport.close()
        await asyncio.sleep(0.05)
        return resp

    return handler


def sse_forever(model: str = "tiny-model", delay: float = 0.05) -> Handler:
    """A stream that never ends, one event per `delay`; for hang-up and shutdown tests."""

    async def handler(request: web.Request) -> web.StreamResponse:
        resp = await start_sse(request)
        for i in itertools.count():
            await resp.write(sse_chunk(model, i))
            await asyncio.sleep(delay)
        return resp

    return handler


def reset(data: bytes = b"", *, delay: float = 0.0) -> Handler:
    """Write raw bytes, wait `delay`, then abort the connection with a TCP RST (SO_LINGER 0)."""

    async def handler(request: web.Request) -> web.StreamResponse:
        assert request.transport is not None
        if data:
            request.transport.write(data)
        await asyncio.sleep(delay)
        abort(request)
        await asyncio.sleep(0.05)
        return web.Response()

    return handler


def abort(request: web.Request) -> None:
    """Close the request's connection with a TCP RST rather than a FIN."""
    transport = request.transport
    assert transport is not None
    sock = transport.get_extra_info("socket")
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    transport.abort()


def sse_then_reset(events: int, model: str = "tiny-model") -> Handler:
    """Start a 200 SSE stream, send `events` events, then reset the connection."""

    async def handler(request: web.Request) -> web.StreamResponse:
        resp = await start_sse(request)
        for i in range(events):
            await resp.write(sse_chunk(model, i))
        await asyncio.sleep(0.2)  # an RST drops what the peer has not read yet
        abort(request)
        await asyncio.sleep(0.05)
        return resp

    return handler


@dataclass
class Firehose:
    """An SSE stream of `total` bytes written as fast as the peer takes them; counts what left.

    `sent` stops growing when the peer stops reading: what the backpressure tests look at.
    """

    total: int
    chunk: int = 64 * 1024
    sent: int = 0
    finished: bool = False

    def handler(self) -> Handler:
        async def handler(request: web.Request) -> web.StreamResponse:
            resp = await start_sse(request)
            body = b"data: " + b"x" * (self.chunk - 8) + b"\n\n"
            while self.sent < self.total:
                await resp.write(body)
                self.sent += len(body)
            await resp.write(b"data: [DONE]\n\n")
            await resp.write_eof()
            self.finished = True
            return resp

        return handler


@dataclass
class Gate:
    """SSE streams that send one event, then wait at the gate until it opens; counts arrivals.

    Lets a test hold many streams open at once, look at the sidecar, then let them all finish.
    """

    events: int = 3
    arrived: int = 0
    finished: int = 0
    opened: asyncio.Event = field(default_factory=asyncio.Event)

    async def handler(self, request: web.Request) -> web.StreamResponse:
        resp = await start_sse(request)
        await resp.write(sse_chunk("tiny-model", 0))
        self.arrived += 1
        await self.opened.wait()
        for i in range(1, self.events):
            await resp.write(sse_chunk("tiny-model", i))
        await resp.write(b"data: [DONE]\n\n")
        await resp.write_eof()
        self.finished += 1
        return resp


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--served-model-name", nargs="+", default=["tiny-model"])
    parser.add_argument("--root", default="/models/sidecar-test/tiny-model")
    parser.add_argument("--stream-events", type=int, default=3)
    parser.add_argument("--stream-delay", type=float, default=0.0)
    parser.add_argument(
        "--keepalive-timeout", type=float, default=5.0, help="idle keep-alive, as uvicorn's 5 s"
    )
    args = parser.parse_args()
    fake = FakeVLLM(
        served=[(name, args.root) for name in args.served_model_name],
        stream_events=args.stream_events,
        stream_delay=args.stream_delay,
    )
    web.run_app(
        fake.app(),
        host=args.host,
        port=args.port,
        print=None,
        keepalive_timeout=args.keepalive_timeout,
    )


if __name__ == "__main__":
    main()
