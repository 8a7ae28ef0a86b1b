"""The lean client's answer body (upstream/lean/body.py): order, the end, errors, backpressure
against a recording connection, and the read timeout."""

from __future__ import annotations

import asyncio

import aiohttp
import pytest

from proxy.upstream.lean.body import HIGH_WATER, Body


class Connection:
    """The connection's side, as the body sees it: what it was told, in order."""

    def __init__(self) -> None:
        self.calls: list[str] = []

    def pause(self) -> None:
        self.calls.append("pause")

    def resume(self) -> None:
        self.calls.append("resume")

    def abort(self) -> None:
        self.calls.append("abort")


async def test_chunks_come_out_in_order_then_the_end() -> None:
    body = Body(Connection(), None)
    body.feed_data(b"a")
    body.feed_data(b"bc")
    assert await body.readany() == b"abc"  # what arrived since the last read, joined
    body.feed_data(b"d")
    body.feed_eof()
    assert body.is_eof()
    assert not body.at_eof()
    assert [c async for c in body.iter_any()] == [b"d"]
    assert body.at_eof()
    assert await body.readany() == b""
    assert body.total_bytes == 4


async def test_a_reader_waits_for_data_and_is_woken() -> None:
    body = Body(Connection(), None)
    reading = asyncio.ensure_future(body.read())
    await asyncio.sleep(0)
    assert not reading.done()
    body.feed_data(b"x" * 10)
    body.feed_eof()
    assert await reading == b"x" * 10


async def test_the_first_error_is_what_every_later_read_raises_before_held_data() -> None:
    body = Body(Connection(), None)
    body.feed_data(b"held")
    first, second = ConnectionResetError("first"), ValueError("second")
    body.set_exception(first)
    body.set_exception(second)
    with pytest.raises(ConnectionResetError):
        body.read_nowait()
    with pytest.raises(ConnectionResetError):
        await body.readany()
    with pytest.raises(ConnectionResetError):
        await body.read()


async def test_past_the_high_water_the_connection_pauses_until_the_reader_takes_it() -> None:
    conn = Connection()
    body = Body(conn, None)
    body.feed_data(b"x" * HIGH_WATER)
    assert conn.calls == []  # at the mark, not past it
    body.feed_data(b"x")
    body.feed_data(b"x")
    assert conn.calls == ["pause"]  # once, however much more arrives
    assert len(body.read_nowait()) == HIGH_WATER + 2
    assert conn.calls == ["pause", "resume"]
    body.feed_data(b"y")
    body.read_nowait()
    assert conn.calls == ["pause", "resume"]  # a read below the mark resumes nothing


async def test_no_byte_within_the_read_timeout_ends_the_connection() -> None:
    conn = Connection()
    body = Body(conn, 0.01)
    with pytest.raises(aiohttp.SocketTimeoutError):
        await body.readany()
    assert conn.calls == ["abort"]
    with pytest.raises(aiohttp.SocketTimeoutError):
        body.read_nowait()


async def test_a_chunk_before_the_timeout_cancels_it() -> None:
    conn = Connection()
    body = Body(conn, 0.05)
    reading = asyncio.ensure_future(body.readany())
    await asyncio.sleep(0)
    body.feed_data(b"in time")
    assert await reading == b"in time"
    body.feed_eof()
    assert await body.readany() == b""
    assert conn.calls == []
