"""tests/e2e/test_e2e_engine_lifecycle.py's tests that read vLLM's bytes, on the Rust frontend:
a stream vLLM aborts, a request held through a phase and released into it."""

from tests.e2e.test_e2e_engine_lifecycle import (
    guarded,
    pytestmark,
    serving,
    strict,
    test_a_new_request_is_held_and_completes_after_the_engine_is_back,
    test_an_aborted_stream_ends_as_vllm_sent_it_and_is_counted,
    test_the_weight_version_changes_across_finish_weight_update,
    vllm,
)

__all__ = [
    "guarded",
    "pytestmark",
    "serving",
    "strict",
    "test_a_new_request_is_held_and_completes_after_the_engine_is_back",
    "test_an_aborted_stream_ends_as_vllm_sent_it_and_is_counted",
    "test_the_weight_version_changes_across_finish_weight_update",
    "vllm",
]
