"""Weight versions as vLLM may report them, made fit for a header and a label."""

from __future__ import annotations

import pytest

from proxy.upstream.engine_probe import MAX_VERSION, clean_version


@pytest.mark.parametrize(
    ("reported", "kept"),
    [
        ("step-7", "step-7"),
        ("default", "default"),
        (12, "12"),
        ("a\r\nX-Injected: 1", "a??X-Injected: 1"),
        ("grün", "gr?n"),
        ("v" * 500, "v" * MAX_VERSION),
    ],
)
def test_clean_version(reported: object, kept: str) -> None:
    assert clean_version(reported) == kept
