"""tests/skyrl04/test_client_vllm.py on the Rust frontend: SkyRL 0.4's companion and stock
clients through the sidecar, data plane (generate, tokenize, detokenize, completions), an
unknown model, and the control plane."""

from tests.skyrl04.test_client_vllm import (
    client,
    front,
    pytestmark,
    test_an_unknown_model_names_the_served_one,
    test_control_plane_round_trip,
    test_every_data_plane_route_works_with_the_hf_path,
    test_sleep_level_reaches_vllm_as_a_query_parameter,
    test_the_stock_client_works_through_the_sidecar,
    vllm,
)

__all__ = [
    "client",
    "front",
    "pytestmark",
    "test_an_unknown_model_names_the_served_one",
    "test_control_plane_round_trip",
    "test_every_data_plane_route_works_with_the_hf_path",
    "test_sleep_level_reaches_vllm_as_a_query_parameter",
    "test_the_stock_client_works_through_the_sidecar",
    "vllm",
]
