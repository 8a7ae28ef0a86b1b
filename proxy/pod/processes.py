"""A worker's process: how one starts, how its exit reads, how long until the next one starts."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import socket
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from .channel import Channel

STEADY = 10.0  # a worker that ran this long before dying is restarted at once
MAX_BACKOFF = 5.0
# Workers run this very package: `-P` keeps the working directory (which may hold another
# `proxy`) off their path, and this package's directory is added after any PYTHONPATH.
PACKAGE_ROOT = str(Path(__file__).resolve().parents[2])  # the directory holding proxy/


@dataclass
class Worker:
    """One worker as the supervisor knows it; `index` stays the same across its restarts."""

    index: int
    proc: asyncio.subprocess.Process
    channel: Channel
    started: float = field(default_factory=time.monotonic)
    listening: bool = False
    tasks: list[asyncio.Task[None]] = field(default_factory=list)


def _worker_env() -> dict[str, str]:
    path = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    return {**os.environ, "PYTHONPATH": os.pathsep.join([*path, PACKAGE_ROOT])}


async def start_process(sock: socket.socket) -> asyncio.subprocess.Process:
    """`python -m proxy.pod.worker FD`, a fresh interpreter talking over `sock` (its end of the
    socket pair, which it inherits as FD)."""
    return await asyncio.create_subprocess_exec(
        sys.executable,
        "-P",
        "-m",
        "proxy.pod.worker",
        str(sock.fileno()),
        pass_fds=(sock.fileno(),),
        stdin=asyncio.subprocess.DEVNULL,
        env=_worker_env(),
    )


def quick_deaths(lived: float, before: int) -> int:
    """How many times in a row a worker died before it ran STEADY seconds, this time included."""
    return 0 if lived >= STEADY else before + 1


def restart_delay(quick: int) -> float:
    """At once after a steady run; else 0.2 s, 0.4 s, ... up to MAX_BACKOFF while it keeps dying
    that fast."""
    return 0.0 if quick == 0 else min(MAX_BACKOFF, 0.1 * 2**quick)


def describe(code: int) -> str:
    """An exit status as a log line says it: the signal's name, or the status."""
    if code < 0:
        with contextlib.suppress(ValueError):
            return signal.Signals(-code).name
    return f"status {code}"
