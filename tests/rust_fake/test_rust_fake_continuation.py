"""tests/test_continuation.py against the Rust frontend's framing: the cut detected from its
tokenless closing event, the parts joined, the spans naming both versions. All but two: `n` = 2,
which the Rust frontend refuses (tests/rust_fake/test_rust_fake_shapes.py), and a stop string
across the cut, whose held-back text the Python server sends with the abort (the sidecar keeps
it back and checks it) and no capture shows how the Rust frontend sends (docs/vllm-versions.md)."""

from tests.test_continuation import (
    generator,
    sidecar,
    test_a_chat_that_cannot_be_continued_exactly_is_relayed_cut,
    test_a_client_that_leaves_while_held_ends_it,
    test_a_continued_stream_that_breaks_off_ends_with_the_error_event,
    test_a_cut_chat_answer_is_finished_from_its_token_ids,
    test_a_cut_chat_stream_goes_on_as_chat_deltas,
    test_a_cut_completion_is_finished_from_its_exact_tokens,
    test_a_cut_stream_just_goes_on,
    test_a_generate_stream_goes_on_and_ends_with_the_joined_spans,
    test_a_part_vllm_refuses_leaves_the_cut_answer,
    test_an_abort_someone_asked_for_is_relayed,
    test_an_answer_past_the_memory_budget_is_relayed_as_it_comes,
    test_continuations_are_bounded,
    test_generate_is_continued_with_vllms_spans_joined,
    test_logprobs_are_joined_with_their_offsets,
    test_off_by_default_and_on_per_request,
    test_two_cuts_in_one_answer,
)

__all__ = [
    "generator",
    "sidecar",
    "test_a_chat_that_cannot_be_continued_exactly_is_relayed_cut",
    "test_a_client_that_leaves_while_held_ends_it",
    "test_a_continued_stream_that_breaks_off_ends_with_the_error_event",
    "test_a_cut_chat_answer_is_finished_from_its_token_ids",
    "test_a_cut_chat_stream_goes_on_as_chat_deltas",
    "test_a_cut_completion_is_finished_from_its_exact_tokens",
    "test_a_cut_stream_just_goes_on",
    "test_a_generate_stream_goes_on_and_ends_with_the_joined_spans",
    "test_a_part_vllm_refuses_leaves_the_cut_answer",
    "test_an_abort_someone_asked_for_is_relayed",
    "test_an_answer_past_the_memory_budget_is_relayed_as_it_comes",
    "test_continuations_are_bounded",
    "test_generate_is_continued_with_vllms_spans_joined",
    "test_logprobs_are_joined_with_their_offsets",
    "test_off_by_default_and_on_per_request",
    "test_two_cuts_in_one_answer",
]
