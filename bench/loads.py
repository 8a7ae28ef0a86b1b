"""The requests the bench sends: scenarios, their bodies, the pre-flight check, and the wrk run."""

from __future__ import annotations

import json
import math
import random
import subprocess
from dataclasses import dataclass
from pathlib import Path

from procs import http

BENCH = Path(__file__).resolve().parent
SSE_EVENTS = 20
LONG_SSE_EVENTS = 500
RL_TOKENS = 200


@dataclass(frozen=True)
class Scenario:
    name: str
    label: str
    body: str  # "small" or "ids8mb"
    stream: bool
    connections: int
    # SSE events per answer. More than the fake upstream's usual 20 are asked for as vLLM
    # would be: `max_tokens` with `ignore_eos`, so every proxy passes the request on unchanged.
    events: int = SSE_EVENTS
    # "wrk": timed by wrk; "rl" and "held": the RL-shaped cells of streams.py.
    kind: str = "wrk"
    pace: str | None = None  # "LO-HI": the fake writes a token every LO to HI ms
    default: bool = True  # run unless --scenarios names others; False: only when named


def body_key(scen: Scenario, model: str) -> tuple[str, str, bool, int, str | None]:
    """What makes one body differ from another: scenarios that agree on it share a file."""
    return (scen.body, model, scen.stream, scen.events, scen.pace)


SCENARIOS: dict[str, Scenario] = {
    s.name: s
    for s in (
        Scenario("json-c1", "non-streaming, 1 connection", "small", False, 1),
        Scenario("json-c64", "non-streaming, 64 connections", "small", False, 64),
        Scenario("sse-c1", f"SSE ({SSE_EVENTS} events), 1 connection", "small", True, 1),
        Scenario("sse-c64", f"SSE ({SSE_EVENTS} events), 64 connections", "small", True, 64),
        Scenario("ids8mb-c1", "8 MB token-id prompt, 1 connection", "ids8mb", False, 1),
        # The cost of one relayed event: against sse-c64, the same requests with 25x the events.
        Scenario(
            "sse500-c64",
            f"SSE ({LONG_SSE_EVENTS} events), 64 connections",
            "small",
            True,
            64,
            LONG_SSE_EVENTS,
        ),
        # RL rollouts: SkyRL keeps up to 512 generations open per engine, each a few hundred
        # tokens at the engine's pace (bench/streams.py).
        Scenario(
            "rl-512",
            f"RL-shaped: 512 open streams, a token every 20-50 ms, {RL_TOKENS} tokens each",
            "small",
            True,
            512,
            RL_TOKENS,
            kind="rl",
            pace="20-50",
        ),
        # The same at 2,000 open streams: what each holds per stream, and per event, at scale.
        Scenario(
            "rl-2000",
            f"RL-shaped: 2,000 open streams, a token every 20-50 ms, {RL_TOKENS} tokens each",
            "small",
            True,
            2000,
            RL_TOKENS,
            kind="rl",
            pace="20-50",
            default=False,  # 2,000 streams a target: `--scenarios rl-2000`
        ),
        Scenario(
            "held-2000",
            "2,000 requests held through a pause",
            "small",
            False,
            2000,
            kind="held",
        ),
    )
}


def make_body(
    kind: str,
    model: str,
    stream: bool,
    big_bytes: int,
    events: int = SSE_EVENTS,
    pace: str | None = None,
) -> bytes:
    """A SkyRL-like /v1/completions body: `model` first, a token-id prompt, sampling params."""
    rng = random.Random(0)
    ids: list[int] = []
    target = 1150 if kind == "small" else big_bytes
    size = 0
    while size < target:
        ids.append(rng.randrange(151_936))  # Qwen2.5's vocabulary
        size += len(str(ids[-1])) + 1
    body = {
        "model": model,
        "prompt": ids,
        "max_tokens": 64,
        "temperature": 1.0,
        "top_p": 1.0,
        "logprobs": 0,
        "stream": stream,
        "return_token_ids": True,
    }
    if events != SSE_EVENTS:
        body.update(max_tokens=events, ignore_eos=True)
    if pace is not None:
        body["bench_pace_ms"] = pace
    return json.dumps(body, separators=(",", ":")).encode()


class CheckFailed(Exception):
    """A target answered a pre-flight request wrongly: it is not timed."""


def check(url: str, body: bytes, stream: bool, expected_events: int = SSE_EVENTS) -> str:
    """Send one request and prove it reached the upstream with the served model.

    The fake upstream answers 404 to any model but the served one, so a 200 here means the
    target forwarded (and, for HF-path bodies, rewrote) the model.
    """
    status, headers, data = http("POST", url + "/v1/completions", body, timeout=120)
    if status != 200:
        raise CheckFailed(f"status {status}: {data[:300]!r}")
    ctype = headers.get("content-type", "")
    if stream:
        events = [e for e in data.split(b"\n\n") if e.startswith(b"data: ")]
        if not ctype.startswith("text/event-stream") or events[-1:] != [b"data: [DONE]"]:
            raise CheckFailed(f"not an SSE stream ending in [DONE]: {ctype} {data[-200:]!r}")
        if len(events) != expected_events + 1:
            raise CheckFailed(f"{len(events)} SSE events, expected {expected_events} + [DONE]")
        return f"200, {len(events) - 1} events + [DONE]"
    payload = json.loads(data)
    if payload.get("object") != "text_completion" or not payload.get("choices"):
        raise CheckFailed(f"not a completion: {data[:300]!r}")
    return f"200, model {payload.get('model')!r} in the answer"


def wrk(
    url: str,
    body_file: Path,
    connections: int,
    seconds: float,
    cpus: str | None,
    timeout_s: int = 30,
) -> dict[str, object]:
    duration = max(1, math.ceil(seconds))  # wrk takes whole seconds
    argv = ["wrk", "-t1", f"-c{connections}", f"-d{duration}s", "--latency"]
    argv += [f"--timeout={timeout_s}s", "-s", str(BENCH / "wrk" / "post.lua")]
    argv += [url + "/v1/completions", "--", str(body_file)]
    if cpus:
        argv = ["taskset", "-c", cpus, *argv]
    out = subprocess.run(argv, capture_output=True, text=True, check=False, timeout=duration + 120)
    for line in out.stdout.splitlines():
        if line.startswith("BENCH_JSON "):
            result: dict[str, object] = json.loads(line.removeprefix("BENCH_JSON "))
            return result
    raise RuntimeError(f"wrk gave no result (rc {out.returncode}): {out.stderr or out.stdout}")
