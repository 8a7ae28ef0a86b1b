"""The socket pair between the supervisor and one worker: JSON lines both ways, asks and answers."""

from __future__ import annotations

import asyncio
import itertools
import socket
from typing import Any

import orjson

Message = dict[str, Any]
LINE_LIMIT = 16 << 20  # the served list and aliases of one upstream; far below this


class Channel:
    """JSON lines both ways over one connected socket; EOF means the other process is gone.

    A message with `ask` wants an answer: the other side sends one with `reply` set to it."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._reader, self._writer = reader, writer
        self._ids = itertools.count(1)
        self._waiting: dict[int, asyncio.Future[Message]] = {}

    @classmethod
    async def open(cls, sock: socket.socket) -> Channel:
        reader, writer = await asyncio.open_unix_connection(sock=sock, limit=LINE_LIMIT)
        return cls(reader, writer)

    def send(self, message: Message) -> None:
        if not self._writer.is_closing():
            self._writer.write(orjson.dumps(message) + b"\n")

    async def receive(self) -> Message | None:
        """The next message; an answer to `ask` also goes to the one waiting for it."""
        line = await self._reader.readline()
        if not line:
            return None
        message: Message = orjson.loads(line)
        waiter = self._waiting.pop(message.get("reply", 0), None)
        if waiter is not None and not waiter.done():
            waiter.set_result(message)
        return message

    async def ask(self, message: Message, *, within: float) -> Message | None:
        """Send `message` and wait for its answer; None when none came `within` seconds."""
        ask_id = next(self._ids)
        answered = self._waiting[ask_id] = asyncio.get_running_loop().create_future()
        self.send({**message, "ask": ask_id})
        try:
            return await asyncio.wait_for(answered, within)
        except TimeoutError:
            return None
        finally:
            self._waiting.pop(ask_id, None)

    def close(self) -> None:
        self._writer.close()
