"""A redirect to the upstream's origin becomes one to the sidecar's (client/redirects.py)."""

from __future__ import annotations

import pytest
from yarl import URL

from proxy.client.redirects import own_origin

UPSTREAM = URL("http://127.0.0.1:8000")
HERE = "http://sidecar.pod:8080"


@pytest.mark.parametrize(
    ("location", "moved"),
    [
        ("http://127.0.0.1:8000/pause", f"{HERE}/pause"),
        ("http://127.0.0.1:8000/v1/completions?x=1#f", f"{HERE}/v1/completions?x=1#f"),
        ("http://127.0.0.1:8000", f"{HERE}/"),
        ("HTTP://127.0.0.1:8000/pause", f"{HERE}/pause"),  # the scheme is case-insensitive
    ],
)
def test_the_upstreams_origin_is_moved_to_the_requests(location: str, moved: str) -> None:
    assert own_origin(location, UPSTREAM, HERE) == moved


@pytest.mark.parametrize(
    "location",
    [
        "/pause",  # relative: it already names the sidecar
        "http://127.0.0.1:8001/pause",  # another port
        "https://127.0.0.1:8000/pause",  # another scheme
        "http://example.com/pause",
        "http://[::1/x",  # not a URL
        "//evil.example/x",  # scheme-relative: yarl's origin() raises for it
        "//127.0.0.1:8000/pause",  # the upstream's host, but no scheme: not its origin
        "http://127.0.0.1:99999/pause",  # a port out of range
        "http:///pause",
        "mailto:ops@example.com",
    ],
)
def test_anything_else_is_left_as_it_is(location: str) -> None:
    assert own_origin(location, UPSTREAM, HERE) is None


def test_an_upstream_under_a_base_path_moves_only_what_is_under_it() -> None:
    base = URL("http://vllm:8000/engine-a")
    assert own_origin("http://vllm:8000/engine-a/pause", base, HERE) == f"{HERE}/pause"
    assert own_origin("http://vllm:8000/engine-b/pause", base, HERE) is None
