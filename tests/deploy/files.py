"""Shared helpers of the deployment tests: repository paths, YAML, kustomize, dashboards."""

from __future__ import annotations

import json
import re
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[2]
DEPLOY = REPO / "deploy"
DASHBOARD = DEPLOY / "grafana" / "dashboards" / "vllm-sidecar.json"
ALERTS = DEPLOY / "prometheus" / "alerts.yml"
SCRAPE_CONFIG = DEPLOY / "prometheus" / "prometheus.yml"
KUBERNETES = DEPLOY / "kubernetes"
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


def load_yaml(path: Path) -> Any:
    return yaml.safe_load(path.read_text())


def yaml_docs(path: Path) -> list[dict[str, Any]]:
    return [doc for doc in yaml.safe_load_all(path.read_text()) if doc is not None]


def kustomize_build(directory: Path) -> list[dict[str, Any]]:
    """Render a kustomization the way `kubectl kustomize` does, for the features used in deploy/.

    Handles `resources` (files and directories with their own kustomization), `configMapGenerator`
    with `files` and `options`, and `images`. Anything else fails, so a new feature in the
    kustomization is noticed here instead of being silently ignored.
    """
    kustomization = load_yaml(directory / "kustomization.yaml")
    known = {"apiVersion", "kind", "resources", "configMapGenerator", "images"}
    unknown = set(kustomization) - known
    assert not unknown, f"{directory}: kustomize features this test does not render: {unknown}"
    docs: list[dict[str, Any]] = []
    for resource in kustomization.get("resources", []):
        path = (directory / resource).resolve()
        docs.extend(kustomize_build(path) if path.is_dir() else yaml_docs(path))
    for generator in kustomization.get("configMapGenerator", []):
        options = generator.get("options", {})
        assert options.get("disableNameSuffixHash") is True, "name the ConfigMap predictably"
        metadata: dict[str, Any] = {"name": generator["name"]}
        if options.get("labels"):
            metadata["labels"] = dict(options["labels"])
        if options.get("annotations"):
            metadata["annotations"] = dict(options["annotations"])
        data = {}
        for file in generator["files"]:
            source = directory / file
            # kustomize refuses files outside the kustomization's root (LoadRestrictionsRootOnly).
            assert source.resolve().is_relative_to(directory.resolve()), file
            data[source.name] = source.read_text()
        docs.append({"apiVersion": "v1", "kind": "ConfigMap", "metadata": metadata, "data": data})
    images = {image["name"]: image for image in kustomization.get("images", [])}
    for doc in docs:
        for container in pod_containers(doc):
            name, _, _ = container["image"].partition(":")
            if name in images:
                image = images[name]
                container["image"] = f"{image.get('newName', name)}:{image['newTag']}"
    return docs


def pod_containers(doc: dict[str, Any]) -> Iterator[dict[str, Any]]:
    """Every container of a workload, init containers (native sidecars) included."""
    spec = doc.get("spec", {}).get("template", {}).get("spec", {})
    yield from spec.get("initContainers", [])
    yield from spec.get("containers", [])


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
