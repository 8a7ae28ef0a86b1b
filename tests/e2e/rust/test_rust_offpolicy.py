"""tests/e2e/test_e2e_offpolicy.py on the Rust frontend: counts equal the answers' spans under
pauses and updates (its /inference/v1/generate)."""

from tests.e2e.test_e2e_offpolicy import (
    front,
    pytestmark,
    test_counters_match_the_answers_spans_under_pauses_and_updates,
)

__all__ = ["front", "pytestmark", "test_counters_match_the_answers_spans_under_pauses_and_updates"]
