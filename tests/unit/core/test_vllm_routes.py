"""The route table against the routes vLLM mounts: a release's new route is a red test.

vllm_routes/<version>.json is what scripts/vllm_routes.py read from that release (its FastAPI
app with every optional router on, plus the routes in its source); scripts/vllm-routes.sh
writes it, and tests/e2e/test_e2e_vllm_routes.py checks the installed release's file is current.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from proxy.core.routes import normalized, template

FILES = Path(__file__).with_name("vllm_routes")
RELEASES = sorted(path.stem for path in FILES.glob("*.json"))
_PARAM = re.compile(r"\{[^}]*\}")


def mounted(version: str) -> dict[str, list[str]]:
    data = json.loads((FILES / f"{version}.json").read_text())
    assert data["vllm"] == version
    routes: dict[str, list[str]] = data["routes"]
    return routes


def test_the_releases_the_design_names_are_read() -> None:
    assert {"0.32.0", "0.33.0"} <= set(RELEASES)
    assert len(mounted("0.32.0")) > 50  # the file lists vLLM's routes, not a handful


@pytest.mark.parametrize("version", RELEASES)
def test_every_route_vllm_mounts_is_a_row_of_the_table(version: str) -> None:
    # Guards: core/routes.ROUTES naming each route, so that its plane is a decision, not the
    # default. A path with an id in it (`{response_id}`) is tried with an id in its place.
    unnamed = [
        f"{' '.join(methods)} {path}"
        for path, methods in mounted(version).items()
        if template(normalized(_PARAM.sub("some-id", path))) is None
    ]
    assert not unnamed, (
        f"vLLM {version} mounts routes proxy/core/routes.py does not name: {unnamed}. Give each "
        "a row: CONTROL if vLLM calls it dev-only or operator-only, DATA if it runs on the "
        "engine, OTHER if it only reads."
    )
