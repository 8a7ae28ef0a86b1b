"""tests/e2e/test_e2e_continuation.py on the Rust frontend: a cut completion and a cut stream,
joined across the cut (`--continue-aborted`)."""

from tests.e2e.test_e2e_continuation import (
    continuing,
    pytestmark,
    sdk,
    test_a_cut_completion_comes_back_whole_to_the_openai_sdk,
    test_a_cut_stream_goes_on_for_the_openai_sdk,
    vllm,
)

__all__ = [
    "continuing",
    "pytestmark",
    "sdk",
    "test_a_cut_completion_comes_back_whole_to_the_openai_sdk",
    "test_a_cut_stream_goes_on_for_the_openai_sdk",
    "vllm",
]
