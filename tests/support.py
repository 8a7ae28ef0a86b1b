"""Small helpers shared by every test package: free ports, and waiting for a condition."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Callable

import aiohttp


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


async def wait_http_ok(url: str, within: float = 15.0) -> None:
    """Poll `url` until it answers 200 (a server process that is still starting)."""
    async with aiohttp.ClientSession() as session:
        for _ in range(int(within / 0.05)):
            try:
                async with session.get(url) as resp:
                    if resp.status == 200:
                        return
            except aiohttp.ClientError:
                pass
            await asyncio.sleep(0.05)
    raise AssertionError(f"{url} did not answer 200 within {within} s")
