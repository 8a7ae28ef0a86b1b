"""The differential harness's short seeded run (issue 25): generated upstream answers and client
requests through the sidecar on the lean hop, on aiohttp's client, and through nginx; every
difference is accepted (`accepted.ACCEPTED`) or the test fails listing it with its reproducer.

`DIFFERENTIAL_SIDECAR_SOURCE=/path/to/a/checkout` runs the sidecars from that checkout's
`proxy/` instead (an older commit's, to see a fixed defect found again);
`bench/differential.py` runs the long one.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.differential.accepted import ACCEPTED
from tests.differential.edges import edge_outcomes
from tests.differential.peers import Peers, running
from tests.differential.run import sweep

SHOWN = 12  # open outcomes printed in full; the rest counted
SEED = 25  # the same cases each run: `bench/differential.py --seed 25` runs them again


@pytest.fixture(scope="module")
def peers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Peers]:
    source = os.environ.get("DIFFERENTIAL_SIDECAR_SOURCE")
    run_dir = tmp_path_factory.mktemp("differential")
    with running(run_dir, source=Path(source) if source else None) as hops:
        yield hops


@pytest.mark.parametrize(("kind", "examples"), [("answers", 200), ("requests", 150)])
def test_every_hop_relays_a_generated_case_alike(peers: Peers, kind: str, examples: int) -> None:
    tally = sweep(peers, kind, examples, seed=SEED)
    if tally.open:
        shown = "\n".join(outcome.report() for outcome in tally.open[:SHOWN])
        pytest.fail(
            f"{len(tally.open)} of {tally.cases} {kind} differ between {', '.join(peers.hops)} "
            f"beyond the accepted differences:\n{shown}",
            pytrace=False,
        )


def test_the_accepted_differences_are_the_documented_ones() -> None:
    docs = (Path(__file__).resolve().parents[2] / "docs" / "hardening.md").read_text()
    table = docs.split("| Accepted difference | Why |", 1)[1].split("\n\n", 1)[0]
    assert re.findall(r"^\| `([^`]+)` \|", table, re.MULTILINE) == list(ACCEPTED)


def test_the_http1_edges_are_answered_as_nginx_answers_them(peers: Peers) -> None:
    """Issue 33's items 6-8, with nginx's answer as the reference (`edges.py`)."""
    outcomes = edge_outcomes(peers)
    assert not [o.report(accepted=True) for o in outcomes if o.open]
