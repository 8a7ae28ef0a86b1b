"""The chaos run's clients, one kind each: JSON, chat, SSE, megabyte bodies, slow readers,
vLLM's 400, and three hang-ups (mid-body, waiting for the answer, mid-stream). Each writes its
request and what came back into the ledger; none judges it (checks.py does)."""

from __future__ import annotations

import asyncio
import contextlib
import io
import json
import random
import socket
import struct
from collections.abc import Awaitable, Callable
from typing import Any

import aiohttp

from .ledger import ANSWERED, HUNG_UP, LOST, Entry, Ledger

# Client kinds and their weights in the mix.
KINDS = {
    "json": 24,
    "chat": 10,
    "sse": 24,
    "large": 6,
    "slow": 6,
    "bad": 6,
    "hangup_body": 8,
    "hangup_wait": 8,
    "hangup_stream": 8,
}
HEADERS_KEPT = ("X-Request-Id", "X-Sidecar-Error", "Content-Type", "X-Weight-Version")
LIMIT = 180.0  # no request of the run may take longer: a hang becomes a ledger failure
MiB = 1 << 20
_PAD = "x" * (4 * MiB)


class Clients:
    def __init__(self, url: str, ledger: Ledger, rng: random.Random) -> None:
        self.url, self.ledger, self.rng = url, ledger, rng
        host, port = url.removeprefix("http://").split(":")
        self.address = (host, int(port))
        # A connection per request: the kernel spreads them over the workers, and a request
        # lost with a killed worker is told apart by its time alone (no stale keep-alive).
        self.http = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(force_close=True, limit=0),
            timeout=aiohttp.ClientTimeout(total=LIMIT),
            auto_decompress=False,
        )
        self.kinds: dict[str, Callable[[Entry, bytes], Awaitable[None]]] = {
            "json": self._whole,
            "chat": self._whole,
            "sse": self._whole,
            "large": self._whole,
            "bad": self._whole,
            "slow": self._slow,
            "hangup_body": self._hangup_body,
            "hangup_wait": self._hangup_wait,
            "hangup_stream": self._hangup_stream,
        }

    async def close(self) -> None:
        await self.http.close()

    async def one(self, kind: str | None = None) -> Entry:
        """Send one request of `kind` (a random one by default) and write down how it went."""
        rng = self.rng
        kind = kind or rng.choices(list(KINDS), weights=list(KINDS.values()))[0]
        seq = len(self.ledger.entries)
        nonce = f"{kind}-{seq:06d}"
        chat = kind == "chat" or (kind == "sse" and rng.random() < 0.3)
        stream = kind in ("sse", "slow", "hangup_stream")
        stream = stream or (kind == "large" and rng.random() < 0.5)
        tokens = rng.randint(40, 80) if kind == "slow" else rng.randint(1, 12)
        if kind == "bad":
            tokens = -rng.randint(1, 10**6)  # vLLM's 400 names the value: it must be this one
        pad = _PAD[: rng.randint(2 * MiB, 4 * MiB)] if kind == "large" else ""
        if kind == "hangup_body" and rng.random() < 0.5:
            pad = _PAD[: 2 * MiB]  # large enough to stream through to vLLM before it is whole
        text = f"chaos {nonce} {pad}"
        model = rng.choice(["tiny-model", "org/tiny-model", "/data/ckpt/tiny-model"])
        payload: dict[str, Any] = {"model": model, "max_tokens": tokens, "stream": stream}
        if chat:
            payload["messages"] = [{"role": "user", "content": text}]
        else:
            payload["prompt"] = text
        body = json.dumps(payload).encode()
        path = "/v1/chat/completions" if chat else "/v1/completions"
        rid = f"{seq:06d}-{rng.getrandbits(40):010x}"
        entry = self.ledger.open(
            kind=kind,
            rid=rid,
            nonce=nonce,
            method="POST",
            path=path,
            stream=stream,
            tokens=tokens,
            body_bytes=len(body),
        )
        await self.kinds[kind](entry, body)
        return entry

    async def control(self, path: str, note: str, payload: Any = None) -> Entry:
        """A control call through the proxy port, as the trainer makes it; ledgered too."""
        rid = f"ctl-{len(self.ledger.entries):06d}-{self.rng.getrandbits(24):06x}"
        entry = self.ledger.open(
            kind="control",
            rid=rid,
            nonce="",
            method="POST",
            path=path,
            stream=False,
            tokens=0,
            body_bytes=0,
            note=note,
        )
        body = b"" if payload is None else json.dumps(payload).encode()
        await self._whole(entry, body)
        return entry

    # -- kinds read through aiohttp ------------------------------------------------------------
    def _headers(self, entry: Entry) -> dict[str, str]:
        return {"X-Request-Id": entry.rid, "Content-Type": "application/json"}

    async def _whole(self, entry: Entry, body: bytes) -> None:
        await self._read(entry, body, None)

    async def _slow(self, entry: Entry, body: bytes) -> None:
        await self._read(entry, body, 512)

    async def _read(self, entry: Entry, body: bytes, slow: int | None) -> None:
        got = b""
        try:
            async with self.http.post(
                self.url + entry.path.split("?")[0] + _query(entry.path),
                data=io.BytesIO(body),  # aiohttp warns of megabytes given as bytes
                headers=self._headers(entry),
            ) as resp:
                entry.status = resp.status
                entry.headers = {k: resp.headers[k] for k in HEADERS_KEPT if k in resp.headers}
                if slow is None:
                    got = await resp.read()
                else:  # a slow reader: a little at a time, as a busy client takes a stream
                    while chunk := await resp.content.read(slow):
                        got += chunk
                        await asyncio.sleep(0.002)
        except (aiohttp.ClientError, OSError, TimeoutError) as exc:
            entry.error = f"{type(exc).__name__}: {exc}"
            entry.body = got[-2000:].decode(errors="replace")
            self.ledger.close(entry, LOST)
            return
        parse(entry, got)
        self.ledger.close(entry, ANSWERED)

    # -- hang-ups, on raw sockets --------------------------------------------------------------
    def _head(self, entry: Entry, length: int) -> bytes:
        return (
            f"POST {entry.path} HTTP/1.1\r\nHost: {self.address[0]}\r\n"
            f"X-Request-Id: {entry.rid}\r\nContent-Type: application/json\r\n"
            f"Content-Length: {length}\r\n\r\n"
        ).encode()

    async def _hangup_body(self, entry: Entry, body: bytes) -> None:
        """Half the body, then away: nothing may have been answered, or run."""

        async def then(reader: asyncio.StreamReader) -> None:
            await asyncio.sleep(self.rng.uniform(0.0, 0.3))

        await self._raw(entry, self._head(entry, len(body)) + body[: len(body) // 2], then)

    async def _hangup_wait(self, entry: Entry, body: bytes) -> None:
        """The whole request, then away before the answer (the fake holds it until then)."""

        async def then(reader: asyncio.StreamReader) -> None:
            await asyncio.sleep(self.rng.uniform(0.05, 0.6))

        await self._raw(entry, self._head(entry, len(body)) + body, then)

    async def _hangup_stream(self, entry: Entry, body: bytes) -> None:
        """The first event of a stream, then away (the fake sends no more until then)."""

        async def then(reader: asyncio.StreamReader) -> None:
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), LIMIT)
            entry.status = int(head.split(b" ", 2)[1])
            entry.headers = _headers(head)
            if entry.status == 200:
                first = await asyncio.wait_for(reader.readuntil(b"\n\n"), LIMIT)
                entry.events = [first.decode(errors="replace")[-300:]]
            else:  # an envelope instead of a stream: read whole, as any client would
                length = int(entry.headers.get("Content-Length", "0"))
                parse(entry, await asyncio.wait_for(reader.readexactly(length), LIMIT))
                entry.outcome = ANSWERED

        await self._raw(entry, self._head(entry, len(body)) + body, then)

    async def _raw(
        self,
        entry: Entry,
        data: bytes,
        then: Callable[[asyncio.StreamReader], Awaitable[None]],
    ) -> None:
        """Send `data` on a connection of its own, do `then`, and leave (FIN, or a reset)."""
        writer = None
        try:
            reader, writer = await asyncio.open_connection(*self.address)
            writer.write(data)
            await writer.drain()
            await then(reader)
        except (OSError, asyncio.IncompleteReadError, TimeoutError) as exc:
            entry.error = f"{type(exc).__name__}: {exc}"
            outcome = LOST
        else:
            outcome = entry.outcome or HUNG_UP
        finally:
            if writer is not None:
                if self.rng.random() < 0.3:  # some leave with a reset rather than a FIN
                    with contextlib.suppress(OSError):
                        sock = writer.get_extra_info("socket")
                        linger = struct.pack("ii", 1, 0)
                        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, linger)
                writer.close()
        self.ledger.close(entry, outcome)


def _headers(head: bytes) -> dict[str, str]:
    """The kept headers of a raw response head (names as HEADERS_KEPT spells them)."""
    kept = {name.lower(): name for name in (*HEADERS_KEPT, "Content-Length")}
    found = {}
    for line in head.decode(errors="replace").split("\r\n")[1:]:
        name, _, value = line.partition(":")
        if name.lower() in kept:
            found[kept[name.lower()]] = value.strip()
    return found


def _query(path: str) -> str:
    return "?" + path.split("?", 1)[1] if "?" in path else ""


def parse(entry: Entry, data: bytes) -> None:
    """The body as the checks read it: a JSON value, or a stream's events, or else text."""
    if entry.headers.get("Content-Type", "").startswith("text/event-stream"):
        entry.events = [_event(raw) for raw in data.split(b"\n\n") if raw]
        entry.body = None if data.endswith(b"\n\n") else data[-300:].decode(errors="replace")
        return
    try:
        entry.body = json.loads(data)
    except ValueError:
        entry.body = data[-2000:].decode(errors="replace")
        return
    if isinstance(entry.body, dict) and isinstance(entry.body.get("choices"), list):
        entry.body = _summary(entry.body)


def _event(raw: bytes) -> Any:
    text = raw.decode(errors="replace")
    if text.startswith("event: "):
        return {"named": text}
    if not text.startswith("data: "):
        return "!" + text[:300]
    data = text[6:]
    if data == "[DONE]":
        return data
    try:
        event = json.loads(data)
    except ValueError:
        return "!" + text[:300]
    return _summary(event) if isinstance(event, dict) and "choices" in event else event


def _summary(answer: dict[str, Any]) -> dict[str, Any]:
    """A completion or chunk, cut to what the checks read: its id and each choice's text."""
    choices = []
    for choice in answer["choices"]:
        message = choice.get("message") or choice.get("delta")
        text = message.get("content", "") if message is not None else choice.get("text")
        choices.append(
            {"index": choice.get("index"), "text": text, "finish": choice.get("finish_reason")}
        )
    return {"id": answer.get("id"), "choices": choices}
