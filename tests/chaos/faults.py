"""The chaos itself: the trainer's engine phases through the sidecar (pause, sleep, weight sync,
as SkyRL makes them), vLLM restarts, and SIGKILLed workers; each written into the ledger."""

from __future__ import annotations

import asyncio
import os
import random
import signal
from dataclasses import dataclass, field

from tests.metrics import scrape
from tests.procfs import children
from tests.support import eventually

from .clients import Clients
from .ledger import Ledger
from .resources import usage
from .upstream import ChaosVLLM

# Engine actions and their weights; each ends with the engine serving again.
ACTIONS = {"pause": 3, "sleep": 2, "sync": 3, "restart": 2}
ATTEMPTS = 40  # a resume or wake-up that fails (its worker killed, vLLM down) is sent again


@dataclass
class Chaos:
    rng: random.Random
    ledger: Ledger
    fake: ChaosVLLM
    clients: Clients
    supervisor: int
    admin: str
    kill_every: tuple[float, float] = (6.0, 12.0)
    start_usage: dict[int, tuple[int, int]] = field(default_factory=dict)  # by pid
    versions: int = 0

    # -- the engine, as the trainer drives it ----------------------------------------------
    async def engine(self, stop: asyncio.Event) -> None:
        """One action after another, drawn from a shuffled deck (each action as often as its
        weight says, every one in each deck): a short run still sees each of them."""
        deck: list[str] = []
        while not stop.is_set():
            await self._pause_for(self.rng.uniform(0.5, 2.0), stop)
            if stop.is_set():
                break
            if not deck:
                deck = [action for action, weight in ACTIONS.items() for _ in range(weight)]
                self.rng.shuffle(deck)
            action = deck.pop()
            self.ledger.happened(action)
            await getattr(self, action)()

    async def pause(self) -> None:
        mode = self.rng.choice(["abort", "wait", "keep"])
        await self.clients.control(f"/pause?mode={mode}", "pause")
        await asyncio.sleep(self.rng.uniform(0.2, 1.5))  # the trainer's step
        await self.until_ok("/resume", "resume")

    async def sleep(self) -> None:
        mode = self.rng.choice(["abort", "wait"])
        await self.clients.control(f"/sleep?level=1&mode={mode}", "sleep")
        await asyncio.sleep(self.rng.uniform(0.2, 1.5))
        if self.rng.random() < 0.5:
            await self.until_ok("/wake_up?tags=weights", "wake weights")
            await self.until_ok("/wake_up?tags=kv_cache", "wake kv_cache")
        else:
            await self.until_ok("/wake_up", "wake_up")

    async def sync(self) -> None:
        """SkyRL 0.4's weight sync: a `keep` pause, start, update, finish, resume."""
        await self.clients.control("/pause?mode=keep", "sync pause")
        await self.clients.control("/start_weight_update", "sync start", {})
        await asyncio.sleep(self.rng.uniform(0.1, 1.0))
        await self.clients.control("/update_weights", "sync update", {})
        self.versions += 1
        named = {"weight_version": f"step-{self.versions}"} if self.rng.random() < 0.5 else {}
        await self.until_ok("/finish_weight_update", "sync finish", named)
        await self.until_ok("/resume", "sync resume")

    async def restart(self) -> None:
        await self.fake.restart(self.rng.uniform(0.2, 1.5))
        self.ledger.happened("restarted")

    async def until_ok(self, path: str, note: str, payload: object = None) -> None:
        """A call that must land (leaving a phase): sent again until vLLM takes it. A finish
        that vLLM restarted away answers 4xx or 2xx; either settles it."""
        for _ in range(ATTEMPTS):
            entry = await self.clients.control(path, note, payload)
            if entry.status is not None and entry.status < 500:
                return
            await asyncio.sleep(0.25)  # a backoff between tries, as a trainer's
        raise AssertionError(f"{path} never landed in {ATTEMPTS} tries")

    async def serving(self) -> None:
        """The end of the run: whatever happened, the engine serves again."""
        await self.until_ok("/resume", "final resume")
        await self.until_ok("/wake_up", "final wake_up")

    async def _pause_for(self, seconds: float, stop: asyncio.Event) -> None:
        try:
            await asyncio.wait_for(stop.wait(), seconds)
        except TimeoutError:
            pass

    # -- workers -----------------------------------------------------------------------------
    async def killer(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            await self._pause_for(self.rng.uniform(*self.kill_every), stop)
            if stop.is_set():
                break
            await self.kill_one()

    async def kill_one(self) -> None:
        workers = children(self.supervisor)
        victim = self.rng.choice(workers)
        self.ledger.happened("kill", pid=victim)
        os.kill(victim, signal.SIGKILL)
        # Until it is gone its listener may still take a connection (and reset it): the kill
        # lasts from the signal until the supervisor has reaped it. Not until it is a zombie:
        # the leader of a thread group is one while its other threads still hold its files.
        await eventually(lambda: not os.path.exists(f"/proc/{victim}"), "the worker is reaped", 60)
        self.ledger.happened("dead", pid=victim)
        await eventually(
            lambda: len(children(self.supervisor)) == 2, "the supervisor starts another", 60
        )
        await eventually(self.both_listen, "both workers listen", within=60, every=0.1)
        [new] = set(children(self.supervisor)) - set(workers)
        self.start_usage[new] = usage(new)  # a restarted worker is compared with its own start
        self.ledger.happened("replaced", pid=victim, by=new)

    async def both_listen(self) -> bool:
        samples = await scrape(self.admin)
        return samples.value("vllm_sidecar_workers", {}) == 2
