"""Figures for the abuse bounds: descriptors, /livez and wait times, against real processes.

    .venv/bin/python bench/bounds.py [--source DIR]

`--source` runs the `proxy` package found in DIR (e.g. an export of main) for a before/after
comparison. Loopback only, bounded: about a minute.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

import aiohttp

from tests.support import free_port, wait_http_ok

ROOT = Path(__file__).resolve().parent.parent
MiB = 1 << 20


def fds(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def start(source: Path, upstream: str, *args: str, nofile: int | None = None) -> tuple:
    port, admin = free_port(), free_port()

    def limit() -> None:
        if nofile is not None:
            resource.setrlimit(resource.RLIMIT_NOFILE, (nofile, nofile))

    proc = subprocess.Popen(
        [sys.executable, "-m", "proxy", "--upstream-url", upstream, "--host", "127.0.0.1",
         "--port", str(port), "--admin-port", str(admin), *args],
        cwd=source, preexec_fn=limit, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    return proc, f"http://127.0.0.1:{port}", f"http://127.0.0.1:{admin}"


async def status(url: str, within: float = 5.0) -> str:
    try:
        async with aiohttp.ClientSession() as session:
            async with session.get(url, timeout=aiohttp.ClientTimeout(total=within)) as resp:
                return str(resp.status)
    except Exception as exc:  # a figure, whatever failed
        return type(exc).__name__


async def idle_sockets(source: Path, upstream: str, n: int, nofile: int | None) -> dict:
    proc, url, admin = start(source, upstream, nofile=nofile)
    await wait_http_ok(f"{admin}/livez")
    before = fds(proc.pid)
    host, port = url.removeprefix("http://").split(":")
    socks = []
    for _ in range(n):
        try:
            socks.append(await asyncio.open_connection(host, int(port)))
        except OSError:
            break
    await asyncio.sleep(2)
    out = {
        "clients": n, "fd_limit": nofile, "fds_before": before, "fds_held": fds(proc.pid),
        "livez": await status(f"{admin}/livez"), "request": await status(f"{url}/v1/models"),
    }  # fmt: skip
    for _, writer in socks:
        writer.close()
    proc.kill()
    proc.wait()
    return out


async def pool_wait(source: Path, upstream: str, extra: list[str]) -> dict:
    """One client stalls half way through a streamed body with --max-connections 1."""
    proc, url, admin = start(source, upstream, "--max-connections", "1", *extra)
    await wait_http_ok(f"{admin}/readyz")
    host, port = url.removeprefix("http://").split(":")
    _, writer = await asyncio.open_connection(host, int(port))
    body = b'{"model": "tiny-model", "prompt": "' + b"x" * (2 * MiB) + b'"}'
    head = b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
    writer.write(head + b"Content-Length: %d\r\n\r\n" % len(body) + body[: MiB + 100])
    await asyncio.sleep(0.5)
    t0 = time.monotonic()
    got = await status(f"{url}/v1/models", within=30)
    out = {"settings": extra, "next_request": got, "waited_s": round(time.monotonic() - t0, 2)}
    writer.close()
    proc.kill()
    proc.wait()
    return out


async def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--source", type=Path, default=ROOT)
    args = parser.parse_args()
    up_port = free_port()
    fake = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "tests.fake_vllm", "--port", str(up_port), cwd=ROOT
    )
    upstream = f"http://127.0.0.1:{up_port}"
    try:
        await wait_http_ok(f"{upstream}/health")
        results = [
            await idle_sockets(args.source, upstream, 2000, None),
            await idle_sockets(args.source, upstream, 1100, 1024),
        ]
        new = (ROOT / "proxy" / "connections.py").exists() and args.source == ROOT
        timeouts = ["--client-body-timeout", "5", "--pool-timeout", "30"] if new else []
        results.append(await pool_wait(args.source, upstream, timeouts))
        if new:
            results.append(await pool_wait(args.source, upstream, ["--pool-timeout", "2"]))
        for row in results:
            print(json.dumps(row))
    finally:
        fake.kill()
        await fake.wait()


if __name__ == "__main__":
    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    resource.setrlimit(resource.RLIMIT_NOFILE, (min(8192, hard), hard))
    asyncio.run(main())
