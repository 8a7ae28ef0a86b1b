#!/usr/bin/env python3
"""The walk of one request through `proxy/`: which modules it visits, in what order.

A reader following one request through the code moves from module to module; the fewer the
moves, and the fewer moves back to a module already left, the easier the house is to change.
This counts them for real: one `POST /v1/chat/completions` (and, with `--stream`, a streamed
one) through an in-process sidecar in front of the test suite's fake vLLM, every Python call
into a `proxy` module recorded (`sys.setprofile`), runs of calls in one module collapsed:

    PYTHONPATH=$PWD .venv/bin/python bench/walk.py            # this tree
    PYTHONPATH=/tmp/before .venv/bin/python bench/walk.py     # another checkout's proxy/

prints the modules visited, the moves between them, the moves back to a module already left,
and how often each module was entered (`--path` prints the walk itself). Calls made by the
loop's other tasks (health checks, discovery) are kept out by reading again an hour on.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import sys
from collections import Counter
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.append(str(ROOT))  # tests/ (the fake vLLM); proxy/ from PYTHONPATH when given


def _module_of(frame: Any) -> str | None:
    name = frame.f_globals.get("__name__", "")
    if not name.startswith("proxy.") or name.startswith("proxy.skyrl"):
        return None
    return name.removeprefix("proxy.")


async def walk(stream: bool) -> list[str]:
    from aiohttp.test_utils import TestClient, TestServer
    from prometheus_client import CollectorRegistry

    from proxy.config.settings import Settings
    from proxy.wiring.app import create_app
    from tests.fake_vllm import FakeVLLM

    upstream = TestServer(FakeVLLM().app())
    await upstream.start_server()
    # The checks and discovery read again an hour on: only the request's own calls are seen.
    settings = Settings(
        upstream_url=str(upstream.make_url("")), health_interval=3600, discovery_interval=3600
    )
    app = create_app(settings, registry=CollectorRegistry())
    client = TestClient(TestServer(app))
    await client.start_server()
    body = {"model": "org/tiny-model", "messages": [{"role": "user", "content": "hi"}]}
    await client.post("/v1/chat/completions", json=body)  # warm: discovery, lazy tables
    seen: list[str] = []

    def profile(frame: Any, event: str, _arg: Any) -> None:
        if event != "call":
            return
        module = _module_of(frame)
        if module is not None and (not seen or seen[-1] != module):
            seen.append(module)

    async def one() -> None:
        resp = await client.post("/v1/chat/completions", json={**body, "stream": stream})
        await resp.read()

    sys.setprofile(profile)
    try:
        await one()
    finally:
        sys.setprofile(None)
    await client.close()
    await upstream.close()
    return seen


def report(seen: list[str], show_path: bool) -> None:
    moves = len(seen) - 1
    left: set[str] = set()
    back = 0
    for before, now in itertools.pairwise(seen):
        left.add(before)
        back += now in left
    print(f"modules visited {len(set(seen))}, moves {moves}, moves back {back}")
    for module, count in Counter(seen).most_common():
        print(f"  {count:3}  {module}")
    if show_path:
        print(" -> ".join(seen))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--stream", action="store_true", help="a streamed request")
    parser.add_argument("--path", action="store_true", help="print the walk itself")
    args = parser.parse_args()
    report(asyncio.run(walk(args.stream)), args.path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
