"""One connection's guard, on a clock and a transport of the test's own: no sockets, no loop."""

from __future__ import annotations

import asyncio
from collections import deque
from typing import cast

from aiohttp import StreamReader, web
from aiohttp.http_exceptions import TransferEncodingError
from aiohttp.web_protocol import _ErrInfo

from proxy.client.guard import Guard, Limits

LIMITS = Limits(header=1.0, body=2.0, idle=5.0, send=3.0, max_connections=10, min_body_rate=100)


class Keeper:
    def __init__(self) -> None:
        self.time = 100.0
        self.guards: set[Guard] = set()

    def now(self) -> float:
        return self.time

    def add(self, guard: Guard) -> None:
        self.guards.add(guard)

    def discard(self, guard: Guard) -> None:
        self.guards.discard(guard)


class Transport:
    def __init__(self) -> None:
        self.reading, self.buffered, self.aborted = True, 0, False

    def is_reading(self) -> bool:
        return self.reading

    def get_write_buffer_size(self) -> int:
        return self.buffered

    def abort(self) -> None:
        self.aborted = True


class Body:
    def __init__(self) -> None:
        self.eof = False
        self.error: BaseException | None = None

    def is_eof(self) -> bool:
        return self.eof

    def exception(self) -> BaseException | None:
        return self.error

    def set_exception(self, exc: BaseException) -> None:
        self.error = exc

    def feed_eof(self) -> None:
        self.eof = True


class Handler(asyncio.Protocol):
    """aiohttp's request handler as its C parser leaves it after a body's framing error: the
    error queued as the next message (web_protocol.py's `data_received`), the body unended."""

    def __init__(self) -> None:
        self._messages: deque[tuple[object, object]] = deque()

    def data_received(self, data: bytes) -> None:
        error = TransferEncodingError("Invalid character in chunk size")
        self._messages.append((_ErrInfo(status=400, exc=error, message=error.message), None))


def connected() -> tuple[Guard, Keeper, Transport]:
    keeper, transport = Keeper(), Transport()
    guard = Guard(keeper, asyncio.Protocol())
    guard.connection_made(cast(asyncio.Transport, transport))
    return guard, keeper, transport


def reading_body(guard: Guard) -> Body:
    body = Body()
    guard.started(cast(StreamReader, body))
    return body


def test_a_connection_is_kept_by_its_keeper_while_open() -> None:
    guard, keeper, _ = connected()
    assert keeper.guards == {guard}
    guard.connection_lost(None)
    assert keeper.guards == set()


def test_no_transport_is_never_due() -> None:
    guard = Guard(Keeper(), asyncio.Protocol())
    assert guard.sweep(1e9, LIMITS) is None


def test_an_idle_connection_is_closed_after_the_idle_timeout() -> None:
    guard, keeper, _ = connected()
    assert guard.idle()
    assert guard.sweep(keeper.time + 4.9, LIMITS) is None
    assert guard.sweep(keeper.time + 5.1, LIMITS) == "idle_timeout"


def test_an_answer_still_going_out_is_not_idle_time() -> None:
    guard, keeper, transport = connected()
    transport.buffered = 1
    assert not guard.idle()
    assert guard.sweep(keeper.time + 4.0, LIMITS) is None
    transport.buffered = 0
    # The idle clock restarted when the sweep saw the answer still on its way out.
    assert guard.sweep(keeper.time + 8.9, LIMITS) is None
    assert guard.sweep(keeper.time + 9.1, LIMITS) == "idle_timeout"


def test_a_head_not_complete_in_time_is_a_header_timeout() -> None:
    guard, keeper, _ = connected()
    guard.data_received(b"GET / HTTP/1.1\r\n")
    assert not guard.idle()
    assert guard.sweep(keeper.time + 0.9, LIMITS) is None
    assert guard.sweep(keeper.time + 1.1, LIMITS) == "header_timeout"


def test_a_client_that_takes_no_byte_of_the_answer_is_a_send_timeout() -> None:
    guard, keeper, _ = connected()
    reading_body(guard)
    guard.pause_writing()
    assert guard.sweep(keeper.time + 2.9, LIMITS) is None
    assert guard.sweep(keeper.time + 3.1, LIMITS) == "send_timeout"
    guard.resume_writing()
    assert guard.paused_since is None


def test_a_body_with_no_byte_in_time_is_a_body_timeout() -> None:
    guard, keeper, _ = connected()
    reading_body(guard)
    assert guard.sweep(keeper.time + 1.9, LIMITS) is None
    assert guard.sweep(keeper.time + 2.1, LIMITS) == "body_timeout"


def test_a_body_read_to_its_end_is_not_timed() -> None:
    guard, keeper, _ = connected()
    reading_body(guard).eof = True
    assert guard.sweep(keeper.time + 60.0, LIMITS) is None


def test_a_trickled_body_is_too_slow_and_the_rate_window_starts_again() -> None:
    guard, keeper, _ = connected()
    reading_body(guard)
    keeper.time += 1.5
    guard.data_received(b"x" * 10)  # 10 bytes in 2 s: under 100 a second
    assert guard.sweep(keeper.time + 0.6, LIMITS) == "body_too_slow"
    assert guard.window_bytes == 0  # the sweep that judged the window began the next one


def test_a_body_at_the_minimum_rate_is_not_too_slow() -> None:
    guard, keeper, _ = connected()
    reading_body(guard)
    keeper.time += 1.5
    guard.data_received(b"x" * 200)
    assert guard.sweep(keeper.time + 0.5, LIMITS) is None


def test_time_the_sidecar_held_the_body_back_restarts_its_clocks() -> None:
    guard, keeper, transport = connected()
    reading_body(guard)
    transport.reading = False  # a full buffer: the sidecar stopped reading, not the client
    later = keeper.time + 10.0
    assert guard.sweep(later, LIMITS) is None
    assert (guard.last_rx, guard.window_start, guard.window_bytes) == (later, later, 0)
    transport.reading = True
    assert guard.sweep(later + 1.9, LIMITS) is None
    assert guard.sweep(later + 2.1, LIMITS) == "body_timeout"


def test_a_hang_up_mid_request_aborts_the_connection() -> None:
    guard, _, transport = connected()
    reading_body(guard)
    guard.eof_received()
    assert transport.aborted


def test_a_hang_up_between_requests_does_not_abort() -> None:
    guard, _, transport = connected()
    guard.eof_received()
    assert not transport.aborted


def test_the_sweep_runs_often_enough_for_the_shortest_timeout() -> None:
    assert LIMITS.tick == 0.25
    assert Limits(60, 60, 60, 60, 1).tick == 1.0
    assert Limits(0.01, 60, 60, 60, 1).tick == 0.02


def test_a_body_the_parser_gave_up_on_ends_with_its_error() -> None:
    keeper, handler = Keeper(), Handler()
    guard = Guard(keeper, handler)
    guard.connection_made(cast(asyncio.Transport, Transport()))
    body = reading_body(guard)
    assert (body.eof, body.error) == (False, None)
    guard.data_received(b"zz\r\n")
    assert body.eof  # nothing read after its answer: the connection closes
    assert isinstance(body.error, web.RequestPayloadError)
    assert isinstance(body.error.__cause__, TransferEncodingError)


def test_a_body_the_parser_gave_up_on_before_its_handler_started_ends_too() -> None:
    keeper, handler = Keeper(), Handler()
    guard = Guard(keeper, handler)
    guard.connection_made(cast(asyncio.Transport, Transport()))
    guard.data_received(b"zz\r\n")  # its head's message still queued, its handler not started
    body = reading_body(guard)
    assert body.eof
    assert isinstance(body.error, web.RequestPayloadError)
