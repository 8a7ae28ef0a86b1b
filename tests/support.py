"""Small helpers shared by every test package: free ports, and waiting for a condition."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Callable


def free_port() -> int:
    """A loopback port nobody listens on right now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


async def eventually(predicate: Callable[[], object], within: float = 10.0) -> None:
    """Poll `predicate` until it holds; the deadline only turns a hang into a clear failure."""
    for _ in range(int(within / 0.02)):
        if predicate():
            return
        await asyncio.sleep(0.02)
    raise AssertionError(f"condition not reached within {within} s")
