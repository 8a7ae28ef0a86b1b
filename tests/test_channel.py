"""The channel between the supervisor and a worker (`proxy/pod/channel.py`) over a real socket
pair: an ask and its answer, and a line that is no message dropped without ending either side."""

from __future__ import annotations

import asyncio
import logging
import socket
from collections.abc import AsyncIterator

import pytest

from proxy.pod.channel import Channel
from proxy.pod.messages import Drain, Drained, Entered, Frame, Leave, Listening, encode


@pytest.fixture
async def pair() -> AsyncIterator[tuple[Channel, Channel]]:
    ours, theirs = socket.socketpair()
    supervisor, worker = await Channel.open(ours), await Channel.open(theirs)
    yield supervisor, worker
    supervisor.close()
    worker.close()


async def answer_drains(channel: Channel, in_flight: int) -> Frame | None:
    """A worker's side, in short: answer the first Drain and return its frame."""
    while (frame := await channel.receive()) is not None:
        if isinstance(frame.message, Drain):
            channel.answer(frame, Drained(in_flight))
            return frame
    return None


async def test_an_ask_gets_its_answer(pair: tuple[Channel, Channel]) -> None:
    supervisor, worker = pair
    answering = asyncio.create_task(answer_drains(worker, 3))
    reading = asyncio.create_task(supervisor.receive())  # an answer arrives through receive
    assert await supervisor.ask(Drain(), Drained, within=5) == Drained(3)
    asked = await answering
    assert asked is not None
    assert asked.ask > 0
    assert await reading == Frame(Drained(3), reply=asked.ask)


async def test_a_frame_that_did_not_ask_gets_no_answer(pair: tuple[Channel, Channel]) -> None:
    supervisor, worker = pair
    worker.send(Leave(1))
    sent = await supervisor.receive()
    assert sent == Frame(Leave(1))
    supervisor.answer(sent, Entered(1))  # nothing: it was sent, not asked
    supervisor.send(Drain())
    assert await worker.receive() == Frame(Drain())


async def test_a_line_that_is_no_message_is_dropped_and_the_next_one_read(
    pair: tuple[Channel, Channel], caplog: pytest.LogCaptureFixture
) -> None:
    supervisor, worker = pair
    worker.write(b'{"miss": true, "ask": 4}\n')  # the old format: no frame, no type
    worker.write(b"\xff not even JSON\n")
    worker.write(encode(Frame(Listening(42))))
    with caplog.at_level(logging.ERROR, logger="proxy.pod.channel"):
        assert await supervisor.receive() == Frame(Listening(42))
    dropped = [r.getMessage() for r in caplog.records]
    assert len(dropped) == 2
    assert dropped[0].startswith("dropped a line that is no message of this pod: message: Field")
    assert "Invalid JSON" in dropped[1]


async def test_an_answer_of_the_wrong_kind_is_no_answer(
    pair: tuple[Channel, Channel], caplog: pytest.LogCaptureFixture
) -> None:
    supervisor, worker = pair

    async def misanswer() -> None:
        frame = await worker.receive()
        assert frame is not None
        worker.answer(frame, Entered(9))

    answering = asyncio.create_task(misanswer())
    reading = asyncio.create_task(supervisor.receive())
    with caplog.at_level(logging.ERROR, logger="proxy.pod.channel"):
        assert await supervisor.ask(Drain(), Drained, within=5) is None
    await answering
    assert (await reading) is not None
    assert [r.getMessage() for r in caplog.records] == ["Drain was answered with Entered"]


async def test_the_other_side_gone_ends_receive(pair: tuple[Channel, Channel]) -> None:
    supervisor, worker = pair
    worker.close()
    assert await supervisor.receive() is None
    assert await supervisor.ask(Drain(), Drained, within=0.2) is None  # a closed peer: no answer
