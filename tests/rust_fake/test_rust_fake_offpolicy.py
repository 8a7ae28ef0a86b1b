"""tests/test_offpolicy.py against the Rust frontend's framing: a token event carries no
`finish_reason`, a choice ends with a tokenless event that has it."""

from tests.test_offpolicy import (
    generator,
    sidecar,
    test_a_continued_answer_counts_its_parts_by_their_versions,
    test_an_answer_under_one_version_counts_every_token_at_lag_0,
    test_tokens_made_across_updates_count_by_their_spans,
    test_without_spans_an_answer_across_an_update_is_straddled,
)

__all__ = [
    "generator",
    "sidecar",
    "test_a_continued_answer_counts_its_parts_by_their_versions",
    "test_an_answer_under_one_version_counts_every_token_at_lag_0",
    "test_tokens_made_across_updates_count_by_their_spans",
    "test_without_spans_an_answer_across_an_update_is_straddled",
]
