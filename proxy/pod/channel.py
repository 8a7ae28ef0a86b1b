"""The channel between the supervisor and one worker: frames both ways, asks and their answers."""

from __future__ import annotations

import asyncio
import itertools
import logging
import socket
from typing import TypeVar

from .messages import Frame, Message, decode, encode

log = logging.getLogger(__name__)

LINE_LIMIT = 16 << 20  # the served list and aliases of one upstream; far below this
Answer = TypeVar("Answer")


class Channel:
    """Frames both ways over one connected socket; EOF means the other process is gone.

    A frame with `ask` wants an answer: the other side sends one with `reply` set to it."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._reader, self._writer = reader, writer
        self._ids = itertools.count(1)
        self._waiting: dict[int, asyncio.Future[Message]] = {}

    @classmethod
    async def open(cls, sock: socket.socket) -> Channel:
        reader, writer = await asyncio.open_unix_connection(sock=sock, limit=LINE_LIMIT)
        return cls(reader, writer)

    def send(self, message: Message) -> None:
        self.write(encode(Frame(message)))

    def write(self, line: bytes) -> None:
        """An encoded frame: a message for every worker is encoded once (`encode`)."""
        if not self._writer.is_closing():
            self._writer.write(line)

    def answer(self, asked: Frame, message: Message) -> None:
        """Answer `asked`; nothing when it did not ask (a step sent without waiting)."""
        if asked.ask:
            self.write(encode(Frame(message, reply=asked.ask)))

    async def receive(self) -> Frame | None:
        """The next frame, None once the other side is gone; an answer also goes to the one
        waiting for it. A line that is no frame is logged and skipped: it ends neither process."""
        while True:
            try:
                line = await self._reader.readline()
                if not line:
                    return None
                frame = decode(line)
            except ValueError as exc:  # a MessageError, or a line over LINE_LIMIT
                log.error("dropped a line that is no message of this pod: %s", exc)
                continue
            waiter = self._waiting.pop(frame.reply, None) if frame.reply else None
            if waiter is not None and not waiter.done():
                waiter.set_result(frame.message)
            return frame

    async def ask(self, message: Message, answer: type[Answer], *, within: float) -> Answer | None:
        """Send `message` and wait for its answer, an `answer`; None when none came `within`
        seconds, or another message did (logged)."""
        ask_id = next(self._ids)
        answered = self._waiting[ask_id] = asyncio.get_running_loop().create_future()
        self.write(encode(Frame(message, ask=ask_id)))
        try:
            reply = await asyncio.wait_for(answered, within)
        except TimeoutError:
            return None
        finally:
            self._waiting.pop(ask_id, None)
        if isinstance(reply, answer):
            return reply
        log.error("%s was answered with %s", type(message).__name__, type(reply).__name__)
        return None

    def close(self) -> None:
        self._writer.close()
