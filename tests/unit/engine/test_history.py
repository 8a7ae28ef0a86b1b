"""The pod's version history: bounded, indexed for good, started anew by a restart."""

from __future__ import annotations

from proxy.engine.history import LIMIT, RESTART, SIDECAR, TRAINER, VLLM, History


def test_indexes_go_on_past_the_bound_and_after_a_restart() -> None:
    history = History()
    for n in range(LIMIT + 3):
        history.add(f"v{n}", TRAINER, at=float(n))
    assert [u.index for u in history.updates][:2] == [3, 4]
    history.add("default", RESTART, at=99.0)
    assert [(u.index, u.version, u.by) for u in history.updates] == [
        (LIMIT + 3, "default", RESTART)
    ]
    assert history.position() == {"default": LIMIT + 3}


def test_a_copy_from_a_snapshot_counts_on_from_its_last_index() -> None:
    lead = History()
    lead.add("default", VLLM, at=1.0)
    lead.add("default+1", SIDECAR, at=2.0)
    follower = History(lead.updates)
    follower.add("step-3", TRAINER, at=3.0)
    assert follower.position() == {"default": 0, "default+1": 1, "step-3": 2}
    assert follower.newest == "step-3"
    assert follower.describe()[-1] == {"index": 2, "version": "step-3", "at": 3.0, "by": "trainer"}


def test_a_version_named_twice_is_placed_at_its_latest() -> None:
    history = History()
    for version in ("a", "b", "a"):
        history.add(version, TRAINER)
    assert history.position() == {"a": 2, "b": 1}
