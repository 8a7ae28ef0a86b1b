"""The chaos run's vLLM itself (tests/chaos/upstream.py): its crash must be as clean as the run
asks of the sidecar, or the run fails for the harness's own reason."""

from __future__ import annotations

import asyncio
import gc
import socket

import pytest

from tests.chaos.upstream import ChaosVLLM
from tests.support import free_port


async def test_a_connection_accepted_in_the_crashing_turn_is_reset_with_the_rest() -> None:
    """asyncio's Server.close() loses a race to an accept made in the same loop turn: the
    transport cannot attach to the closed server and is left to the garbage collector, which
    closes it with a FIN and an 'unclosed transport' warning (one CI run's chaos test failed on
    it). The crash stops accepting first, so that connection is reset like every other."""
    fake = ChaosVLLM(port=free_port())
    await fake.start()
    wake, poke = socket.socketpair()
    reader, writer = await asyncio.open_connection(sock=wake)
    try:
        # Both ready before the loop looks: the wake-up first in epoll's list, then the accept,
        # so the crash runs in the turn after the accept and before its transport exists.
        poke.send(b"x")
        client = socket.create_connection(("127.0.0.1", fake.port), timeout=5)
        await reader.readexactly(1)
        await fake.stop()
        with client, pytest.raises(ConnectionResetError):
            client.recv(1)
        gc.collect()  # a transport left behind warns here, inside this test
    finally:
        writer.close()
        poke.close()
        await fake.stop()
