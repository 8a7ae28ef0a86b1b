"""The route table: every entry a bounded label with a plane; anything else is `other`."""

from __future__ import annotations

import pytest

from proxy.core.control import plane
from proxy.core.routes import CONTROL, DATA, OTHER, ROUTES, plane_of, route_label, rule


@pytest.mark.parametrize("route", sorted(ROUTES))
def test_every_route_is_its_own_label_with_a_plane(route: str) -> None:
    assert route.startswith("/")
    assert route == route.rstrip("/")  # the table holds normalized paths: `/pause/` is /pause
    row = ROUTES[route]
    assert row.plane in (CONTROL, DATA, OTHER)
    assert route_label(route) == route
    assert rule(route) == rule(route + "/") == row
    assert plane_of(route) == row.plane


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
    assert rule("/nope").plane == OTHER
    assert rule("/nope").step is None


@pytest.mark.parametrize(
    "path", ["/", "", "/x", "/v1/completionsx", "/V1/COMPLETIONS", "/pause/now", "/v1/models/a"]
)
def test_unknown_paths_are_other(path: str) -> None:
    assert route_label(path) == OTHER
    assert plane_of(path) == OTHER
    assert plane("POST", path) is None


def test_responses_ids_share_two_labels() -> None:
    assert route_label("/v1/responses/resp_1") == "/v1/responses/{id}"
    assert route_label("/v1/responses/resp_1/cancel") == "/v1/responses/{id}/cancel"


def test_a_data_route_is_data_only_for_post() -> None:
    assert plane("POST", "/v1/completions") == DATA
    assert plane("GET", "/v1/completions") is None
    assert plane("GET", "/pause") == CONTROL
