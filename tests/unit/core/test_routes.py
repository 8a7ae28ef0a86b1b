"""The route table: every entry a bounded label with a plane; any other path is labelled `other`
and, posted, is treated as a generation."""

from __future__ import annotations

import pytest

from proxy.core.control import plane
from proxy.core.routes import (
    CONTROL,
    DATA,
    OTHER,
    ROUTES,
    labelled,
    plane_of,
    route_label,
    rule,
    template,
)


@pytest.mark.parametrize("route", sorted(ROUTES))
def test_every_route_is_its_own_label_with_a_plane(route: str) -> None:
    assert route.startswith("/")
    assert route == route.rstrip("/")  # the table holds normalized paths: `/pause/` is /pause
    row = ROUTES[route]
    assert row.plane in (CONTROL, DATA, OTHER)
    assert route_label(route) == route
    assert rule(route) == rule(route + "/") == row
    assert plane_of(route) == row.plane
    named = route.replace("{id}", "resp_1").replace("{name}", "sql-lora")
    assert (template(named), route_label(named), rule(named)) == (route, route, row)


@pytest.mark.parametrize("route", sorted(ROUTES))
def test_only_control_calls_steer_the_engine_and_only_data_routes_generate(route: str) -> None:
    row = ROUTES[route]
    if row.step is not None or row.versions:
        assert row.plane == CONTROL
    if row.choices:
        assert row.plane == DATA


def test_the_rules_of_the_routes_the_lifecycle_knows() -> None:
    steps = {path: row.step for path, row in ROUTES.items() if row.step}
    assert steps == {
        "/pause": "pause",
        "/resume": "resume",
        "/sleep": "sleep",
        "/wake_up": "wake_up",
        "/start_weight_update": "sync_start",
        "/start_draft_weight_update": "sync_start",
        "/finish_weight_update": "sync_end",
    }
    assert {p for p, row in ROUTES.items() if row.versions} == {
        "/finish_weight_update",
        "/update_weight_version",
    }
    assert [p for p, row in ROUTES.items() if row.own_health] == ["/health"]
    assert rule("/pause/").step == "pause"
    assert rule("/nope") == rule("/v1/models/x") == rule("other")
    assert rule("/nope").step is None


@pytest.mark.parametrize(
    "path",
    [
        "/",
        "",
        "/x",
        "/v1/completionsx",
        "/V1/COMPLETIONS",
        "/pause/now",
        "/v1/models/a",
        "/cohere/v3/chat",
        "/v1/responses//cancel",
        "/v1/responses/a/b/cancel",
    ],
)
def test_a_path_the_table_does_not_name_is_labelled_other_and_posted_is_data(path: str) -> None:
    # Guards: no closed world (routes.rule): a release's new generation route, posted during a
    # weight sync, is held and stamped; a read of it passes untouched.
    assert route_label(path) == OTHER
    assert template(path) is None
    assert plane_of(path) == DATA
    assert rule(path).choices is rule(path).own_health is False
    assert (rule(path).step, rule(path).continues) == (None, None)
    assert plane("POST", path) == DATA
    for method in ("GET", "HEAD", "OPTIONS"):
        assert plane(method, path) is None


@pytest.mark.parametrize(
    "path",
    [
        "/inference/v1/abort_requests",
        "/abort_requests",
        "/start_profile",
        "/stop_profile",
        "/fault_tolerance/apply",
        "/adapters",
        "/adapters/sql-lora",
        "/v1/load_lora_adapter",
        "/collective_rpc",
    ],
)
def test_what_vllm_calls_dev_or_operator_only_needs_the_token(path: str) -> None:
    # Guards: the rows of issue 33 item 1 (vLLM aborts, profiles and reconfigures on these).
    for method in ("POST", "GET", "DELETE"):
        assert plane(method, path) == CONTROL


@pytest.mark.parametrize(
    "path", ["/cohere/v2/chat", "/v1/systemone", "/v1/decisions", "/v2/embed", "/v2/rerank"]
)
def test_generation_routes_vllm_added_are_data_by_name(path: str) -> None:
    assert (route_label(path), plane("POST", path)) == (path, DATA)


@pytest.mark.parametrize(
    "path",
    ["/tokenize", "/v1/messages/count_tokens", "/v1/completions/render", "/v1/responses/r/cancel"],
)
def test_known_reads_pass_untouched_posted(path: str) -> None:
    assert plane("POST", path) is None


def test_responses_ids_share_two_labels() -> None:
    assert route_label("/v1/responses/resp_1") == "/v1/responses/{id}"
    assert route_label("/v1/responses/resp_1/cancel") == "/v1/responses/{id}/cancel"


def test_a_data_route_is_data_only_for_post() -> None:
    assert plane("POST", "/v1/completions") == DATA
    assert plane("GET", "/v1/completions") is None
    assert plane("GET", "/pause") == CONTROL


@pytest.mark.parametrize(
    "path",
    [*ROUTES, "/v1/responses/resp_1", "/v1/completions/", "/pause/", "/nowhere", "", "//", "*"],
)
def test_the_record_gets_the_label_and_the_row_that_label_names(path: str) -> None:
    label, row = labelled(path)
    assert label == route_label(path)
    assert row is rule(label)
