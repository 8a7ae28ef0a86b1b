#!/usr/bin/env python3
"""The RL-shaped load (`rl-512`, `held-2000`): many long paced streams, or many held requests.

Run by bench/streams.py in its own process on the load generator's core, with the sidecar's
.venv (uvloop). wrk cannot see when each event arrives; this client can. Every paced event the
fake upstream writes carries the CLOCK_MONOTONIC time it was written (`"bench_t":<ns>`), and
the client notes, for each, how much later it arrived: the per-token delay a proxy adds is
that delay less direct's.

`rl`: `--streams` connections, each running paced streams back to back for `--seconds`;
events that arrive after `--warmup` count. `held`: the engine is paused (`--pause-url`), each
of `--streams` connections sends one request, and once all are out the client prints `HELD`
and waits for a line on stdin (the runner reads the target's RSS meanwhile), then resumes the
engine and waits for every answer. One JSON line of results on stdout at the end.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import sys
import time
import urllib.request
from typing import Any

MARK = b'"bench_t":'
END = b"\r\n0\r\n\r\n"  # the last chunk of a chunked answer
DONE = b"data: [DONE]"


class Stream(asyncio.Protocol):
    """One client connection: sends a request, reads its answer, notes each event's delay."""

    def __init__(self, load: Load) -> None:
        self.load = load
        self.transport: asyncio.Transport | None = None
        self.carry = b""
        self.head = b""  # the answer's bytes until its status line is complete
        self.done: asyncio.Future[bool] = asyncio.get_running_loop().create_future()
        self.lost = asyncio.get_running_loop().create_future()
        self.last_event: int | None = None
        self.last_stamp = 0
        self.saw_done = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.done.done():
            self.done.set_result(False)
        if not self.lost.done():
            self.lost.set_result(None)

    def send(self, request: bytes) -> asyncio.Future[bool]:
        self.carry, self.head, self.last_event, self.saw_done = b"", b"", None, False
        self.done = asyncio.get_running_loop().create_future()
        assert self.transport is not None
        self.transport.write(request)
        return self.done

    def data_received(self, data: bytes) -> None:
        now = time.monotonic_ns()
        load = self.load
        if len(self.head) < 12:
            self.head += data[:12]
            if len(self.head) >= 12 and self.head[9:12] != b"200":
                load.errors += 1
        buf = self.carry + data if self.carry else data
        pos, pending = 0, None
        while (i := buf.find(MARK, pos)) >= 0:
            j = buf.find(b",", i + len(MARK))
            if j < 0:  # its digits are in the next read
                pending = i
                break
            load.event(now, int(buf[i + len(MARK) : j]), self)
            pos = j
        self.saw_done = self.saw_done or DONE in buf
        if pending is not None:
            self.carry = buf[pending:]
        else:  # enough to find a mark or the end split across two reads
            self.carry = buf[max(pos, len(buf) - len(MARK) - len(DONE)) :]
        if buf.endswith(END) or (not load.streaming and buf.endswith(b"}")):
            if not self.done.done():
                self.done.set_result(True)


class Load:
    """What every connection found: per-event delays and gaps, events, answers, errors."""

    def __init__(self, warm_until: int, streaming: bool) -> None:
        self.warm_until = warm_until
        self.streaming = streaming
        self.delays: list[int] = []
        self.gaps: list[int] = []  # arrival gap less the upstream's own gap between the two
        self.events = 0
        self.answers = 0
        self.errors = 0
        self.latencies: list[int] = []

    def event(self, now: int, stamp: int, stream: Stream) -> None:
        if now >= self.warm_until:
            self.events += 1
            self.delays.append(now - stamp)
            if stream.last_event is not None:
                self.gaps.append((now - stream.last_event) - (stamp - stream.last_stamp))
        stream.last_event, stream.last_stamp = now, stamp


def request_bytes(host: str, port: int, body: bytes) -> bytes:
    head = (
        f"POST /v1/completions HTTP/1.1\r\nHost: {host}:{port}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
    )
    return head.encode() + body


def pct(values: list[int], q: float) -> float | None:
    if not values:
        return None
    values = sorted(values)
    return values[min(len(values) - 1, int(q / 100 * len(values)))] / 1000  # µs


async def connect(host: str, port: int, load: Load) -> Stream:
    loop = asyncio.get_running_loop()
    _, proto = await loop.create_connection(lambda: Stream(load), host, port)
    return proto


async def rl(args: argparse.Namespace, host: str, port: int, body: bytes) -> dict[str, Any]:
    start = time.monotonic_ns()
    end = start + int(args.seconds * 1e9)
    load = Load(start + int(args.warmup * 1e9), streaming=True)
    request = request_bytes(host, port, body)

    async def worker() -> None:
        await asyncio.sleep(random.uniform(0, args.ramp))
        stream = await connect(host, port, load)
        while time.monotonic_ns() < end:
            done = stream.send(request)
            try:
                ok = await asyncio.wait_for(done, (end - time.monotonic_ns()) / 1e9)
            except TimeoutError:
                break
            if ok:
                load.answers += 1
            else:  # the connection closed under it: a close-delimited answer, or a failure
                load.errors += 0 if stream.saw_done else 1
                stream = await connect(host, port, load)
        if stream.transport is not None:
            stream.transport.close()

    await asyncio.gather(*(worker() for _ in range(args.streams)))
    seconds = (time.monotonic_ns() - load.warm_until) / 1e9
    return {
        "events": load.events,
        "events_per_s": load.events / seconds,
        "answers": load.answers,
        "errors": load.errors,
        "window_s": seconds,
        "delay_p50_us": pct(load.delays, 50),
        "delay_p99_us": pct(load.delays, 99),
        "gap_p50_us": pct(load.gaps, 50),
        "gap_p99_us": pct(load.gaps, 99),
    }


def post(url: str) -> None:
    req = urllib.request.Request(url, data=b"{}", method="POST")
    with urllib.request.urlopen(req, timeout=30) as resp:
        resp.read()


async def held(args: argparse.Namespace, host: str, port: int, body: bytes) -> dict[str, Any]:
    load = Load(0, streaming=False)
    request = request_bytes(host, port, body)
    post(args.pause_url)
    streams = []
    for _ in range(args.streams):  # one at a time: a burst of 2,000 connects overflows backlogs
        streams.append(await connect(host, port, load))
    answers = [s.send(request) for s in streams]
    await asyncio.sleep(args.warmup)  # every request read and held
    print("HELD", flush=True)
    await asyncio.get_running_loop().run_in_executor(None, sys.stdin.readline)
    resumed = time.monotonic_ns()
    post(args.resume_url)
    for s, answer in zip(streams, answers, strict=True):
        ok = await asyncio.wait_for(answer, 120)
        load.latencies.append(time.monotonic_ns() - resumed)
        load.answers += ok
        load.errors += not ok
        if s.transport is not None:
            s.transport.close()
    return {
        "answers": load.answers,
        "errors": load.errors,
        "p50_us": pct(load.latencies, 50),
        "p99_us": pct(load.latencies, 99),
        "window_s": (time.monotonic_ns() - resumed) / 1e9,
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("mode", choices=("rl", "held"))
    p.add_argument("--url", required=True, help="http://host:port of the target")
    p.add_argument("--body", required=True)
    p.add_argument("--streams", type=int, default=512)
    p.add_argument("--seconds", type=float, default=12.0)
    p.add_argument("--warmup", type=float, default=3.0)
    p.add_argument("--ramp", type=float, default=1.0, help="streams start within this")
    p.add_argument("--pause-url")
    p.add_argument("--resume-url")
    args = p.parse_args()
    hostport = args.url.split("//", 1)[1].rstrip("/")
    host, port = hostport.rsplit(":", 1)
    with open(args.body, "rb") as f:
        body = f.read()
    try:
        import uvloop

        run = uvloop.run
    except ImportError:
        run = asyncio.run
    job = rl if args.mode == "rl" else held
    result = run(job(args, host, int(port), body))
    print("STREAMS_JSON " + json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
