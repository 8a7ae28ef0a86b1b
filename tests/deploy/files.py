"""Shared helpers of the deployment tests: the shipped files' paths, running a tool on them, the
rules, the dashboard and its PromQL, the Dockerfile's instructions."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path
from typing import Any

import yaml

from tests.manifests import load_yaml

REPO = Path(__file__).resolve().parents[2]
DEPLOY = REPO / "deploy"
DASHBOARD = DEPLOY / "grafana" / "dashboards" / "vllm-sidecar.json"
ALERTS = DEPLOY / "prometheus" / "alerts.yml"
SCRAPE_CONFIG = DEPLOY / "prometheus" / "prometheus.yml"
COMPOSE = REPO / "docker-compose.yml"
DOCKERFILE = REPO / "Dockerfile"

# What Grafana's variables stand for when a dashboard query is checked outside Grafana.
GRAFANA_VARIABLES = {
    "$__rate_interval": "1m",
    "$__interval": "1m",
    "$__range": "1h",
    "${instance}": ".*",
    "$instance": ".*",
}


def run(*args: str, stdin: str | None = None, cwd: Path = REPO) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        args, input=stdin, cwd=cwd, capture_output=True, text=True, timeout=120, check=False
    )


def dashboard() -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads(DASHBOARD.read_text())
    return loaded


def dashboard_panels(board: dict[str, Any]) -> list[dict[str, Any]]:
    """Every panel that shows data (rows are containers, and collapsed rows nest their panels)."""
    panels: list[dict[str, Any]] = []
    for panel in board["panels"]:
        if panel["type"] == "row":
            panels.extend(panel.get("panels", []))
        else:
            panels.append(panel)
    return panels


def dashboard_queries(board: dict[str, Any]) -> list[tuple[str, str]]:
    """(panel title and refId, PromQL expression) for every query of every panel."""
    return [
        (f"{panel['title']} [{target['refId']}]", target["expr"])
        for panel in dashboard_panels(board)
        for target in panel["targets"]
    ]


def substitute(expr: str) -> str:
    """A dashboard expression as Prometheus would receive it from Grafana."""
    for variable, value in sorted(GRAFANA_VARIABLES.items(), key=lambda kv: -len(kv[0])):
        expr = expr.replace(variable, value)
    leftover = re.findall(r"\$\{?\w+", expr)
    assert not leftover, f"unknown Grafana variables {leftover} in {expr}"
    return expr


def dashboard_rules_file(queries: list[tuple[str, str]]) -> str:
    """A Prometheus rules file with one recording rule per dashboard query, for promtool."""
    rules = [
        {"record": f"dashboard:query_{index}", "expr": substitute(expr)}
        for index, (_, expr) in enumerate(queries)
    ]
    return yaml.safe_dump({"groups": [{"name": "dashboard", "rules": rules}]}, sort_keys=False)


def rules() -> list[dict[str, Any]]:
    """Every rule of the shipped rules file: alerts and the records they read."""
    return [rule for group in load_yaml(ALERTS)["groups"] for rule in group["rules"]]


def alert_rules() -> list[dict[str, Any]]:
    return [rule for rule in rules() if "alert" in rule]


def recording_rules() -> list[dict[str, Any]]:
    return [rule for rule in rules() if "record" in rule]


def _without_strings(expr: str) -> str:
    # Label matchers' values and quoted strings can look like names.
    return re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)


# Metric names in PromQL: identifiers that are not functions, keywords, labels or durations. A
# recorded name (`level:metric:operations`) holds a colon: it is no exported metric.
_METRIC = re.compile(r"(?<![\w:])(vllm_sidecar_[a-zA-Z0-9_]+|up)(?![\w:])")
_RECORDED = re.compile(r"(?<![\w:])([a-zA-Z_][a-zA-Z0-9_]*:[a-zA-Z0-9_:]*)")


def metric_names(expr: str) -> set[str]:
    """The sidecar's metric names (and Prometheus' own `up`) used in a PromQL expression."""
    return set(_METRIC.findall(_without_strings(expr)))


def recorded_names(expr: str) -> set[str]:
    """The recording rules' names (they hold a colon) used in a PromQL expression."""
    return set(_RECORDED.findall(_without_strings(expr)))


def dockerfile_instructions(path: Path = DOCKERFILE) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) pairs, continuation lines joined, comments dropped."""
    instructions: list[tuple[str, str]] = []
    current = ""
    for line in path.read_text().splitlines():
        stripped = line.strip()
        if not current and (not stripped or stripped.startswith("#")):
            continue
        if stripped.startswith("#"):
            continue
        current += " " + stripped
        if current.endswith("\\"):
            current = current[:-1]
            continue
        keyword, _, rest = current.strip().partition(" ")
        instructions.append((keyword.upper(), rest.strip()))
        current = ""
    return instructions
