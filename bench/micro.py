#!/usr/bin/env python3
"""The sidecar's own per-request pieces, timed alone: `.venv/bin/python bench/micro.py`.

Effects of a few microseconds are below what wrk can resolve on a shared box; timed in
isolation they are steady. Compare two trees with `PYTHONPATH=/copy/of/tree` (run from outside
the checkout, so that the working directory does not shadow it).
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import tempfile
import timeit
from collections.abc import Callable

N = 20_000
EVENT = (
    b'data: {"id":"cmpl-b4ccefe7603a02d4","object":"text_completion","created":1795982287,'
    b'"model":"Qwen2.5-0.5B","choices":[{"index":0,"text":" tok5","logprobs":null,'
    b'"finish_reason":null,"prompt_token_ids":null,"token_ids":null}]}\n\n'
)


def best_us(fn: Callable[[], object], number: int = N) -> float:
    return min(timeit.repeat(fn, number=number, repeat=5)) / number * 1e6


def pieces() -> dict[str, float]:
    from multidict import CIMultiDict, CIMultiDictProxy
    from prometheus_client import CollectorRegistry

    from proxy.core import headers
    from proxy.core.sse import ErrorWatcher
    from proxy.observe import logs
    from proxy.observe.metrics import Metrics
    from proxy.observe.record import RequestRecord

    metrics = Metrics(CollectorRegistry())

    def record() -> None:
        ex = RequestRecord("POST", "/v1/completions", "id")
        ex.status = 200
        ex.finish(metrics)

    out: dict[str, float] = {}
    for fmt in ("text", "json"):
        logs.setup("info", fmt, access_log=True)
        with_line = best_us(record)
        logs.setup("info", fmt, access_log=False)
        out[f"access line ({fmt})"] = with_line - best_us(record)
    out["request metrics (RequestRecord.finish, no log line)"] = best_us(record)
    gauge, hist = metrics.in_flight.labels("/v1/completions"), metrics.ttfb.labels("/x")
    out["in-flight gauge inc + dec"] = best_us(lambda: (gauge.inc(), gauge.dec()))
    out["histogram observe"] = best_us(lambda: hist.observe(0.003))
    request = CIMultiDictProxy(
        CIMultiDict({"Host": "h:8080", "Content-Type": "application/json", "Content-Length": "9"})
    )
    out["upstream request headers"] = best_us(
        lambda: headers.upstream_request_headers(
            request, rid="id", client_ip="127.0.0.1", scheme="http", host="h:8080"
        )
    )
    out["response headers"] = best_us(lambda: headers.response_headers(request, rid="id"))
    watcher = ErrorWatcher()
    out["SSE watcher, one event"] = best_us(lambda: watcher.feed(EVENT))
    out["SSE watcher, 8 events in a chunk"] = best_us(lambda: watcher.feed(EVENT * 8))
    return out


def main() -> None:
    if "--child" in sys.argv:
        os.dup2(os.open(os.devnull, os.O_WRONLY), 2)  # the access lines
        print(json.dumps(pieces()))
        return
    rows: dict[str, dict[str, float]] = {}
    with tempfile.TemporaryDirectory() as path:
        modes = (("one process", {}), ("--workers N", {"PROMETHEUS_MULTIPROC_DIR": path}))
        for mode, extra in modes:
            env = {**os.environ, **extra}
            out = subprocess.run(
                [sys.executable, __file__, "--child"], env=env, capture_output=True, check=True
            )
            rows[mode] = json.loads(out.stdout)
    logging.getLogger().handlers.clear()
    print("| piece | one process (µs) | --workers N: multiprocess metrics (µs) |")
    print("|---|---|---|")
    for name, value in rows["one process"].items():
        print(f"| {name} | {value:.2f} | {rows['--workers N'][name]:.2f} |")


if __name__ == "__main__":
    main()
