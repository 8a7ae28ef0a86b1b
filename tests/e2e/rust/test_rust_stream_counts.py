"""tests/e2e/test_e2e_stream_counts.py on the Rust frontend."""

from tests.e2e.test_e2e_stream_counts import (
    counting,
    pytestmark,
    test_a_streams_tokens_are_counted_exactly_with_usage_and_estimated_without,
)

__all__ = [
    "counting",
    "pytestmark",
    "test_a_streams_tokens_are_counted_exactly_with_usage_and_estimated_without",
]
