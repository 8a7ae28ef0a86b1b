"""The handlers in flight and the draining flag, on bare asyncio tasks; no sockets."""

from __future__ import annotations

import asyncio

from proxy.client.drain import InFlight


async def in_flight(tracked: InFlight, release: asyncio.Event) -> None:
    task = tracked.add()
    try:
        await release.wait()
    finally:
        tracked.discard(task)


async def test_a_handler_is_in_flight_until_it_ends() -> None:
    tracked, release = InFlight(), asyncio.Event()
    task = asyncio.create_task(in_flight(tracked, release))
    await asyncio.sleep(0)
    assert tracked.tasks == {task}
    release.set()
    await task
    assert tracked.tasks == set()


def test_draining_begins_once_and_stays() -> None:
    tracked = InFlight()
    assert not tracked.draining
    tracked.begin_draining()
    tracked.begin_draining()
    assert tracked.draining


async def test_settle_begins_draining_and_waits_for_what_is_in_flight() -> None:
    tracked, release = InFlight(), asyncio.Event()
    task = asyncio.create_task(in_flight(tracked, release))
    await asyncio.sleep(0)
    settling = asyncio.create_task(tracked.settle(30.0))
    await asyncio.sleep(0)
    assert tracked.draining
    assert not settling.done()
    release.set()
    assert await settling == 0
    await task


async def test_settle_says_how_many_are_left_when_the_grace_is_over() -> None:
    tracked, release = InFlight(), asyncio.Event()
    task = asyncio.create_task(in_flight(tracked, release))
    await asyncio.sleep(0)
    assert await tracked.settle(0.01) == 1
    release.set()
    await task


async def test_drain_cancels_what_the_grace_did_not_see_end() -> None:
    tracked = InFlight()
    task = asyncio.create_task(in_flight(tracked, asyncio.Event()))
    await asyncio.sleep(0)
    await tracked.drain(0.01)
    assert task.cancelled()
    assert tracked.tasks == set()


async def test_only_the_drains_deadline_is_a_cut_not_a_hang_up() -> None:
    tracked, release = InFlight(), asyncio.Event()
    verdicts: list[bool] = []

    async def handler() -> None:
        task = tracked.add()
        try:
            await release.wait()
        except asyncio.CancelledError:
            verdicts.append(tracked.cut(task))
            raise
        finally:
            tracked.discard(task)

    hung_up = asyncio.create_task(handler())
    await asyncio.sleep(0)
    tracked.begin_draining()
    hung_up.cancel()  # its client left while the sidecar drained: still a hang-up
    await asyncio.gather(hung_up, return_exceptions=True)
    cut = asyncio.create_task(handler())
    await asyncio.sleep(0)
    await tracked.drain(0.01)
    assert cut.cancelled()
    assert verdicts == [False, True]
    assert not tracked.cut(cut)  # forgotten once it ended
