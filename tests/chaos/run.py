"""One chaos run, from start to checks: the fake vLLM, the sidecar with `--workers 2`, a warm-up,
the chaos for a while, the settling, then every check over the ledger. `main` is its CLI
(bench/chaos.py); tests/reliability/test_chaos.py runs a short one."""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import sys
import tempfile
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from tests.metrics import Samples, scrape
from tests.procfs import children
from tests.sidecar import SidecarProcess
from tests.support import eventually, free_port

from . import checks, counts
from .clients import KINDS, Clients
from .faults import Chaos
from .ledger import Ledger
from .resources import resources_check, returned, usage
from .upstream import ChaosVLLM

SETTLE = 120.0  # seconds the pod may take to settle after the chaos; asserts no speed


@dataclass
class Config:
    seed: int
    seconds: float
    lanes: int = 8
    out: Path | None = None
    kill_every: tuple[float, float] = (6.0, 12.0)


@dataclass
class Report:
    checks: list[checks.Check]
    summary: dict[str, Any]
    out: Path
    failed: list[checks.Check] = field(init=False)

    def __post_init__(self) -> None:
        self.failed = [c for c in self.checks if not c.passed]

    def describe(self) -> str:
        lines = [f"chaos run: ledger and logs in {self.out}"]
        for c in self.checks:
            count = f" ({len(c.problems)} problems)" if c.problems else ""
            lines.append(f"{'ok  ' if c.passed else 'FAIL'} {c.name} {c.detail}{count}")
            lines += [f"       {p}" for p in c.problems[:20]]
        return "\n".join(lines)


# Two workers to kill; vLLM's comings and goings seen within 0.2 s; every unknown name re-reads.
POD_ARGS = "--workers 2 --health-interval 0.2 --miss-refresh-interval 0 --log-level warning".split()


def keep_record(fake: ChaosVLLM, path: Path) -> None:
    """The fake's own record, by request id, beside the ledger."""
    with path.open("w") as record:
        for rid, sent in fake.sent.items():
            record.write(json.dumps({"rid": rid, **asdict(sent)}, default=str) + "\n")


async def run(config: Config) -> Report:
    out = config.out or Path(tempfile.mkdtemp(prefix="chaos-"))
    out.mkdir(parents=True, exist_ok=True)
    rng = random.Random(config.seed)
    ledger = Ledger(out / "ledger.jsonl")
    fake = ChaosVLLM(seed=config.seed, port=free_port())
    await fake.start()
    pod = SidecarProcess.cli(f"http://127.0.0.1:{fake.port}", out, *POD_ARGS)
    clients = Clients(pod.url, ledger, random.Random(rng.random()))
    try:
        await pod.start_serving()
        assert pod.proc is not None
        supervisor = pod.proc.pid
        chaos = Chaos(
            random.Random(rng.random()),
            ledger,
            fake,
            clients,
            supervisor,
            pod.admin_url,
            kill_every=config.kill_every,
        )
        await eventually(chaos.both_listen, "both workers listen", within=60, every=0.1)
        await warm_up(clients, fake, config.lanes)
        await settle(pod.admin_url)
        pids = [supervisor, *children(supervisor)]
        chaos.start_usage.update({pid: usage(pid) for pid in pids})
        ledger.happened("chaos begins", pids=pids)
        await chaotic(config, clients, chaos)
        ledger.happened("chaos ends")
        await settle(pod.admin_url)
        samples = await scrape(pod.admin_url)
        resources = await returned(chaos)
        return Report(
            judge(ledger, fake, samples, resources), summary(ledger, fake, resources), out
        )
    finally:
        ledger.finish()
        keep_record(fake, out / "vllm.jsonl")
        await clients.close()
        await asyncio.to_thread(pod.stop)
        await fake.stop()


async def warm_up(clients: Clients, fake: ChaosVLLM, lanes: int) -> None:
    """Every kind a few times with a calm vLLM: the start of the resource figures is warm."""
    fake.calm = True
    todo = [kind for kind in KINDS for _ in range(3)]
    queue: asyncio.Queue[str] = asyncio.Queue()
    for kind in todo:
        queue.put_nowait(kind)

    async def lane() -> None:
        while not queue.empty():
            await clients.one(queue.get_nowait())

    await asyncio.gather(*(lane() for _ in range(lanes)))
    fake.calm = False


async def chaotic(config: Config, clients: Clients, chaos: Chaos) -> None:
    """Clients on every lane, the engine's phases and restarts, and worker kills, for a while;
    then every lane finishes its request and the engine serves again."""
    stop = asyncio.Event()

    async def lane() -> None:
        while not stop.is_set():
            await clients.one()

    tasks = [asyncio.create_task(lane()) for _ in range(config.lanes)]
    tasks += [asyncio.create_task(chaos.engine(stop)), asyncio.create_task(chaos.killer(stop))]
    await asyncio.sleep(config.seconds)  # the run's length: the scenario, not a wait
    stop.set()
    # The lanes' last requests may be held in a pause: the engine must serve for them to end.
    await asyncio.gather(*tasks[-2:])
    await chaos.serving()
    await asyncio.gather(*tasks[:-2])


async def settle(admin: str) -> None:
    async def quiet() -> bool:
        samples = await scrape(admin)
        busy = ("vllm_sidecar_in_flight_requests", "vllm_sidecar_held_requests")
        return all(_sum(samples, name) == 0 for name in busy)

    await eventually(quiet, "nothing in flight or held in the pod", within=SETTLE, every=0.2)


def _sum(samples: Samples, name: str) -> float:
    return sum(v for (n, _), v in samples.values.items() if n == name)


def judge(
    ledger: Ledger, fake: ChaosVLLM, samples: Samples, resources: dict[int, dict[str, int]]
) -> list[checks.Check]:
    entries = ledger.entries
    kills = _spans(ledger, "kill", "dead")
    restarts = _spans(ledger, "restart", "restarted")
    return [
        checks.own_answers(entries, fake.sent),
        checks.failures_are_envelopes(entries),
        checks.streams_end_properly(entries),
        checks.ran_what_was_answered(entries, fake.sent, fake.duplicates),
        checks.lost_only_to_kills(entries, kills),
        counts.counters_match(entries, samples, kills, restarts),
        counts.settled(samples, len(kills)),
        resources_check(resources),
    ]


def _spans(ledger: Ledger, begins: str, ends: str) -> list[checks.Span]:
    """When each kill (signal to gone) or vLLM outage (down to up) lasted."""
    starts = [e["at"] for e in ledger.events if e["what"] == begins]
    stops = [e["at"] for e in ledger.events if e["what"] == ends]
    return list(zip(starts, stops, strict=True))


def summary(
    ledger: Ledger, fake: ChaosVLLM, resources: dict[int, dict[str, int]]
) -> dict[str, Any]:
    entries = ledger.entries
    reasons: Counter[str] = Counter()
    for e in entries:
        if (err := checks.error_of(e)) is not None:
            reasons[f"{err.get('reason', 'vllm_stream_error')} {err.get('code')}"] += 1
    return {
        "requests": len(entries),
        "by_kind": dict(Counter(e.kind for e in entries)),
        "by_outcome": dict(Counter(e.outcome for e in entries)),
        "by_status": dict(Counter(str(e.status) for e in entries)),
        "failures": dict(reasons),
        "upstream_faults": dict(Counter(s.fault for s in fake.sent.values())),
        "chaos": dict(Counter(e["what"] for e in ledger.events)),
        "resources": resources,
        "seconds": round(ledger.now(), 1),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--seed", type=int, default=20)
    parser.add_argument("--seconds", type=float, default=300.0)
    parser.add_argument("--lanes", type=int, default=8, help="clients at once")
    parser.add_argument("--out", type=Path, default=None, help="ledger, summary, sidecar log")
    parser.add_argument("--kill-every", default="6,12", help="seconds between kills: MIN,MAX")
    args = parser.parse_args(argv)
    low, high = (float(x) for x in args.kill_every.split(","))
    config = Config(args.seed, args.seconds, args.lanes, args.out, kill_every=(low, high))
    report = asyncio.run(run(config))
    verdicts = {
        c.name: {"passed": c.passed, "detail": c.detail, "problems": c.problems}
        for c in report.checks
    }
    (report.out / "summary.json").write_text(
        json.dumps({**report.summary, "checks": verdicts}, indent=1)
    )
    print(json.dumps(report.summary, indent=1))
    print(report.describe())
    return 1 if report.failed else 0


if __name__ == "__main__":
    sys.exit(main())
