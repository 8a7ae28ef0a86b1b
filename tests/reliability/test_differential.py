"""The differential harness's short seeded run: every generated upstream answer reaches a client
the same through the lean hop as through aiohttp's client, or the difference is accepted."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from hypothesis import HealthCheck, given, settings

from tests.reliability.differential import ACCEPTED, Peers, answers, explain, peers


@pytest.fixture(scope="module")
def both() -> Iterator[Peers]:
    with peers() as running:
        yield running


@settings(
    max_examples=150,
    derandomize=True,  # seeded: the same cases every run; `bench/differential.py` runs more
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
    database=None,
)
@given(answer=answers())
def test_both_upstream_clients_relay_an_answer_alike(
    both: Peers, answer: tuple[bytes, bool]
) -> None:
    difference = explain(both.through_both(*answer))
    assert difference is None or difference in ACCEPTED, f"{answer[0][:400]!r}\n{difference}"
