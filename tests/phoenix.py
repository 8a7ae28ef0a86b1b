"""Arize Phoenix, an OTLP receiver users run (scripts/test-env.d/35-phoenix.sh builds its venv),
started on free ports; what it received is read back through its own REST API."""

from __future__ import annotations

import json
import os
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.processes import ROOT, ManagedProcess
from tests.support import free_port

PHOENIX_VENV = Path(os.environ.get("PHOENIX_VENV", ROOT / ".venv-phoenix"))

Span = dict[str, Any]


class Phoenix(ManagedProcess):
    """`phoenix serve`: OTLP/HTTP on `traces_url`, spans back from /v1/projects/default/spans."""

    def __init__(self, workdir: Path) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.traces_url = f"{self.url}/v1/traces"
        env = {
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
            "PHOENIX_HOST": "127.0.0.1",
            "PHOENIX_PORT": str(self.port),
            "PHOENIX_GRPC_PORT": str(free_port()),
            "PHOENIX_WORKING_DIR": str(workdir),
            "PHOENIX_TELEMETRY_ENABLED": "false",
        }
        argv = [str(PHOENIX_VENV / "bin/python"), "-m", "phoenix.server.main", "serve"]
        super().__init__("phoenix", argv, env, workdir / "phoenix.log")

    def start(self) -> None:
        self.spawn()
        self.wait_until(f"{self.url}/healthz", deadline_s=120.0)

    def spans(self, trace_id: str) -> list[Span]:
        """Every span of one trace (32 hex digits) that Phoenix has stored."""
        found: list[Span] = []
        cursor = ""
        while True:
            query = f"?limit=1000{cursor}"
            url = f"{self.url}/v1/projects/default/spans{query}"
            with urllib.request.urlopen(url, timeout=10) as resp:
                page = json.load(resp)
            found += [s for s in page["data"] if s["context"]["trace_id"] == trace_id]
            if not page.get("next_cursor"):
                return found
            cursor = f"&cursor={page['next_cursor']}"


def running_phoenix(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Phoenix]:
    """The session's Phoenix (tests/conftest.py's `phoenix` fixture)."""
    if not (PHOENIX_VENV / "bin/python").exists():
        pytest.fail(f"{PHOENIX_VENV} is missing: make test-env builds it (35-phoenix.sh)")
    server = Phoenix(tmp_path_factory.mktemp("phoenix"))
    server.start()
    yield server
    server.stop()


def attribute(span: Span, name: str) -> Any:
    """A span's attribute by its dotted name; Phoenix nests them by their dots."""
    value: Any = span["attributes"]
    if name in value:
        return value[name]
    for part in name.split("."):
        if not isinstance(value, dict) or part not in value:
            return None
        value = value[part]
    return value
