"""Small helpers shared by every test package: free ports, and waiting for a condition."""

from __future__ import annotations

import asyncio
import inspect
import random
import socket
import time
import urllib.error
import urllib.request
from collections.abc import Awaitable, Callable, Generator
from pathlib import Path
from typing import TypeVar

import aiohttp


def _listening_ports() -> list[int]:
    """Ports outside the kernel's ephemeral range (the ones bind(0) and outgoing connections
    take); empty where that range is everything, and then bind(0) it is."""
    try:
        text = Path("/proc/sys/net/ipv4/ip_local_port_range").read_text()
        low, high = map(int, text.split())
    except (OSError, ValueError):
        low, high = 32768, 60999  # Linux's default
    return [p for p in range(10_000, 32_000) if not low <= p <= high]


_LISTENING = _listening_ports()
_PORTS = random.Random()  # its own: a test's seeded `random` does not pick the same ports


def free_port() -> int:
    """A loopback port nobody listens on right now, for a process a test starts to listen on.

    Drawn outside the kernel's ephemeral range: a port from bind(0) is free the moment it is
    returned, but a process starts listening seconds later (vLLM: 20-50 s), and meanwhile any
    outgoing connection on the machine may take the same number as its local port, or another
    test's server bind(0) may get it: then the process cannot bind, or a client reaches the
    wrong server (seen: a sidecar in front of a fake vLLM meant for another test run)."""
    for _ in range(100):
        port = _PORTS.choice(_LISTENING) if _LISTENING else 0
        with socket.socket() as sock:
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                continue
            bound: int = sock.getsockname()[1]
            return bound
    raise RuntimeError("no free loopback port outside the ephemeral range")


Check = Callable[[], object]


def own_address() -> str:
    """This machine's address on its outgoing route (no packet is sent): a peer there is not
    loopback, as a pod's IP is not to its sidecar."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        sock.connect(("203.0.113.1", 9))  # TEST-NET-3: never reached
        address: str = sock.getsockname()[0]
    assert not address.startswith("127."), "this machine has no address but loopback"
    return address


async def eventually(
    check: Callable[[], object | Awaitable[object]],
    what: str = "the condition",
    within: float = 10.0,
    every: float = 0.02,
) -> None:
    """Poll `check` (plain or async) until it holds.

    The deadline only turns a hang into a clear failure; it asserts no speed. An OSError from
    `check` counts as "not yet" (a server still starting); any other exception propagates at
    once (a process that died).
    """
    end = time.monotonic() + within
    while True:
        try:
            result = check()
            if inspect.isawaitable(result):
                result = await result
        except OSError:
            result = False
        if result:
            return
        if time.monotonic() > end:
            raise AssertionError(f"not reached within {within} s: {what}")
        await asyncio.sleep(every)


def wait_until(check: Check, what: str = "the condition", within: float = 30.0) -> None:
    """`eventually` for code outside an event loop (process fixtures, the deployment tests)."""
    end = time.monotonic() + within
    while not _holds(check):
        if time.monotonic() > end:
            raise AssertionError(f"not reached within {within} s: {what}")
        time.sleep(0.1)


def _holds(check: Check) -> bool:
    try:
        return bool(check())
    except OSError:
        return False


def http_status(url: str, timeout: float = 2.0) -> int | None:
    """The status `url` answers with, or None when nothing answers."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as resp:
            return int(resp.status)
    except urllib.error.HTTPError as exc:
        return exc.code
    except (OSError, ValueError):
        return None


def http_get(url: str, timeout: float = 5.0) -> tuple[int, bytes]:
    """A GET's status and body, an error status's included."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as error:
        return error.code, error.read()


async def refuses_connections(url: str) -> bool:
    """Whether nothing listens at `url` any more (a server that closed its listener)."""
    try:
        async with aiohttp.ClientSession() as session, session.get(url):
            return False
    except aiohttp.ClientConnectorError:
        return True


async def wait_http_ok(url: str, within: float = 15.0, alive: Check = lambda: True) -> None:
    """Poll `url` until it answers 200 (a server process that is still starting).

    `alive` is asked first each round; it raises to end the wait early (the process exited).
    """
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=2)) as session:

        async def ok() -> bool:
            alive()
            try:
                async with session.get(url) as resp:
                    return resp.status == 200
            except (aiohttp.ClientError, TimeoutError):
                return False

        await eventually(ok, f"{url} answers 200", within, every=0.05)


T = TypeVar("T")


def exhaust(gen: Generator[None, None, T]) -> tuple[T, int]:
    """A generator that works in slices (core/jsonskip.py): its answer, its slices run back to
    back, and how many times it yielded on the way."""
    yields = 0
    while True:
        try:
            next(gen)
        except StopIteration as done:
            answer: T = done.value
            return answer, yields
        yields += 1
