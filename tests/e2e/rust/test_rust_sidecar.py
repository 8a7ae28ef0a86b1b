"""tests/e2e/test_e2e_sidecar.py's tests that read vLLM's bytes, on the Rust frontend: its 404
and 400 bodies, its SSE framing, an error inside a stream."""

from tests.e2e.test_e2e_sidecar import (
    pytestmark,
    test_hf_path_streams_like_vllm_itself,
    test_out_of_vocabulary_stream_error_is_delivered_and_counted,
    test_unknown_name_gets_vllms_404_in_the_envelope,
    test_vllms_400s_come_back_enveloped_with_their_body,
)

__all__ = [
    "pytestmark",
    "test_hf_path_streams_like_vllm_itself",
    "test_out_of_vocabulary_stream_error_is_delivered_and_counted",
    "test_unknown_name_gets_vllms_404_in_the_envelope",
    "test_vllms_400s_come_back_enveloped_with_their_body",
]
