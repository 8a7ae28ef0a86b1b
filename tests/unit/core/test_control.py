"""Control and data planes, and the control token, without sockets."""

from __future__ import annotations

import pytest

from proxy.core.control import CONTROL, DATA, authorized, plane


@pytest.mark.parametrize(
    ("method", "path", "expected"),
    [
        ("POST", "/pause", CONTROL),
        ("POST", "/pause/", CONTROL),
        ("GET", "/start_weight_update", CONTROL),  # any method: the route is the control
        ("POST", "/v1/load_lora_adapter", CONTROL),
        ("POST", "/v1/completions", DATA),
        ("POST", "/inference/v1/generate", DATA),
        ("GET", "/v1/completions", None),
        ("GET", "/is_paused", None),
        ("GET", "/weight_info", None),
        ("POST", "/tokenize", None),
        ("GET", "/health", None),
    ],
)
def test_plane(method: str, path: str, expected: str | None) -> None:
    assert plane(method, path) == expected


@pytest.mark.parametrize(
    ("header", "ok"),
    [
        ("Bearer s3cret", True),
        ("bearer s3cret", True),
        ("Bearer  s3cret ", True),
        ("Bearer s3cre", False),
        ("Bearer s3cret2", False),
        ("Basic s3cret", False),
        ("s3cret", False),
        ("", False),
        (None, False),
        ("Bearer \udcff", False),  # undecodable header bytes, as aiohttp hands them over
    ],
)
def test_authorized(header: str | None, ok: bool) -> None:
    assert authorized(header, b"s3cret") is ok
