"""The route table: every entry a bounded label with a plane; anything else is `other`."""

from __future__ import annotations

import pytest

from proxy.core.control import plane
from proxy.core.routes import CONTROL, DATA, OTHER, ROUTES, plane_of, route_label


@pytest.mark.parametrize("route", sorted(ROUTES))
def test_every_route_is_its_own_label_with_a_plane(route: str) -> None:
    assert route.startswith("/")
    assert route == route.rstrip("/")  # the table holds normalized paths: `/pause/` is /pause
    assert ROUTES[route] in (CONTROL, DATA, OTHER)
    assert route_label(route) == route
    assert plane_of(route) == plane_of(route + "/") == ROUTES[route]


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
