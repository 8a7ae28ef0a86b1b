"""The deployment files pass their linters and schemas: hadolint, yamllint, the compose spec,
Kubernetes' OpenAPI schemas (strict), the Prometheus Operator's CRDs, and promtool."""

from __future__ import annotations

import copy
import json
import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.manifests import KUBERNETES, kustomize_build, load_yaml
from tests.tools import tool

from .files import (
    ALERTS,
    COMPOSE,
    DOCKERFILE,
    REPO,
    SCRAPE_CONFIG,
    dashboard,
    dashboard_queries,
    dashboard_rules_file,
    rules,
    run,
)


def test_hadolint_passes_on_the_dockerfile() -> None:
    result = run(tool("hadolint"), str(DOCKERFILE))
    assert result.returncode == 0, result.stdout + result.stderr


def test_hadolint_rejects_what_the_dockerfile_avoids(tmp_path: Path) -> None:
    bad = tmp_path / "Dockerfile"
    bad.write_text("FROM python:latest\nRUN pip install aiohttp\nENTRYPOINT vllm-sidecar\n")
    result = run(tool("hadolint"), str(bad))
    assert result.returncode != 0
    for rule in ("DL3007", "DL3013", "DL3025"):  # latest tag, unpinned pip, shell-form entrypoint
        assert rule in result.stdout


def test_yamllint_passes_on_every_yaml_file() -> None:
    result = run(tool("yamllint"), "--strict", "--format", "parsable", ".")
    assert result.returncode == 0, result.stdout + result.stderr
    listed = run(tool("yamllint"), "--list-files", ".")
    checked = {Path(line) for line in listed.stdout.split()}
    for expected in ("docker-compose.yml", "deploy/kubernetes/deployment.yaml", ".yamllint"):
        assert Path(expected) in checked, f"yamllint does not look at {expected}"


def test_compose_file_matches_the_compose_spec() -> None:
    result = run(tool("check-jsonschema"), "--builtin-schema", "vendor.compose-spec", str(COMPOSE))
    assert result.returncode == 0, result.stdout + result.stderr


def _kubernetes_validate(docs: list[dict[str, object]], tmp_path: Path) -> str:
    files = []
    for index, doc in enumerate(docs):
        path = tmp_path / f"{index}-{doc['kind']}.yaml"
        path.write_text(yaml.safe_dump(doc))
        files.append(str(path))
    result = run(tool("kubernetes-validate"), "--strict", *files)
    assert result.returncode == 0, result.stdout + result.stderr
    return result.stdout + result.stderr


BUILTIN_KINDS = {"Deployment", "Service", "ConfigMap"}


def test_kustomize_output_validates_strictly_against_kubernetes(tmp_path: Path) -> None:
    docs = kustomize_build(KUBERNETES)
    kinds = {str(doc["kind"]) for doc in docs}
    assert kinds == BUILTIN_KINDS | {"PodMonitor", "PrometheusRule"}
    builtin = [doc for doc in docs if doc["kind"] in BUILTIN_KINDS]
    output = _kubernetes_validate(builtin, tmp_path)
    for kind in BUILTIN_KINDS:
        assert f"passed for resource {kind.lower()}/" in output, output


def test_native_sidecar_validates_against_the_oldest_kubernetes_that_has_it(
    tmp_path: Path,
) -> None:
    # restartPolicy on init containers is beta and on by default from Kubernetes 1.29.
    path = tmp_path / "deployment.yaml"
    path.write_text((KUBERNETES / "deployment.yaml").read_text())
    result = run(tool("kubernetes-validate"), "--strict", "-k", "1.29.0", str(path))
    assert result.returncode == 0, result.stdout + result.stderr


def test_strict_validation_rejects_a_misspelt_field(tmp_path: Path) -> None:
    deployment = next(d for d in kustomize_build(KUBERNETES) if d["kind"] == "Deployment")
    deployment["spec"]["template"]["spec"]["initContainers"][0]["readynessProbe"] = {}
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(deployment))
    result = run(tool("kubernetes-validate"), "--strict", str(path))
    assert result.returncode != 0
    assert "readynessProbe" in result.stdout + result.stderr


# Runs in .venv-deploy (see scripts/test-env.d/30-deploy-tools.sh): validates each document with
# the Prometheus Operator's CRD models and prints whether a dump of it equals the input. The models
# ignore unknown keys, so a round trip that loses nothing proves there were none.
CRD_CHECK = """
import json, sys
from cloudcoil.models.prometheus_operator import v1
for doc in json.load(sys.stdin):
    model = getattr(v1, doc["kind"])
    dumped = model.model_validate(doc).model_dump(by_alias=True, exclude_unset=True, mode="json")
    print(json.dumps(dumped == doc))
"""


def _in_schema_venv(script: str, stdin: Any) -> list[Any]:
    """Run `script` in .venv-deploy with JSON on stdin; one JSON value per output line."""
    python = REPO / ".venv-deploy" / "bin" / "python"
    if not python.exists():
        pytest.fail(".venv-deploy is missing: run `make test-env` (30-deploy-tools.sh)")
    result = run(str(python), "-c", script, stdin=json.dumps(stdin))
    assert result.returncode == 0, result.stdout + result.stderr
    return [json.loads(line) for line in result.stdout.splitlines()]


@pytest.fixture(scope="module")
def crd_round_trips() -> dict[str, bool]:
    """The shipped PodMonitor and PrometheusRule, and a PodMonitor with a misspelt field, in one
    run (importing the models takes seconds)."""
    docs = {d["kind"]: d for d in kustomize_build(KUBERNETES)}
    typo = copy.deepcopy(docs["PodMonitor"])
    typo["spec"]["podMetricsEndpoints"][0]["prot"] = "admin"
    cases = {"PodMonitor": docs["PodMonitor"], "PrometheusRule": docs["PrometheusRule"]}
    cases["misspelt PodMonitor"] = typo
    return dict(zip(cases, _in_schema_venv(CRD_CHECK, list(cases.values())), strict=True))


def test_prometheus_operator_resources_match_their_crds(crd_round_trips: dict[str, bool]) -> None:
    assert crd_round_trips["PodMonitor"] is True
    assert crd_round_trips["PrometheusRule"] is True


def test_crd_check_notices_a_misspelt_field(crd_round_trips: dict[str, bool]) -> None:
    assert crd_round_trips["misspelt PodMonitor"] is False


def test_alert_rules_pass_promtool() -> None:
    result = run(tool("promtool"), "check", "rules", str(ALERTS))
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"SUCCESS: {len(rules())} rules found" in result.stdout


def test_prometheusrule_carries_exactly_the_plain_alert_rules(tmp_path: Path) -> None:
    rule = load_yaml(KUBERNETES / "prometheusrule.yaml")
    assert rule["spec"] == load_yaml(ALERTS)
    # And what the operator hands to Prometheus passes promtool on its own.
    spec = tmp_path / "prometheusrule-spec.yml"
    spec.write_text(yaml.safe_dump(rule["spec"]))
    result = run(tool("promtool"), "check", "rules", str(spec))
    assert result.returncode == 0, result.stdout + result.stderr


def test_every_dashboard_query_is_valid_promql(tmp_path: Path) -> None:
    queries = dashboard_queries(dashboard())
    assert len(queries) >= 10
    rules = tmp_path / "dashboard-rules.yml"
    rules.write_text(dashboard_rules_file(queries))
    result = run(tool("promtool"), "check", "rules", str(rules))
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"SUCCESS: {len(queries)} rules found" in result.stdout


def test_a_broken_dashboard_query_fails_promtool(tmp_path: Path) -> None:
    rules = tmp_path / "dashboard-rules.yml"
    # One closing parenthesis short.
    broken = 'sum by (route) (rate(vllm_sidecar_requests_total{instance=~"$instance"}[1m])'
    rules.write_text(dashboard_rules_file([("broken", broken)]))
    result = run(tool("promtool"), "check", "rules", str(rules))
    assert result.returncode != 0


def test_scrape_config_passes_promtool_with_the_rules_it_loads(tmp_path: Path) -> None:
    config = load_yaml(SCRAPE_CONFIG)
    # Compose mounts alerts.yml into the rule_files directory; point the copy at the real file.
    assert config["rule_files"] == ["/etc/prometheus/rules/*.yml"]
    config["rule_files"] = [str(ALERTS)]
    copy = tmp_path / "prometheus.yml"
    copy.write_text(yaml.safe_dump(config))
    result = run(tool("promtool"), "check", "config", str(copy))
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"SUCCESS: {len(rules())} rules found" in result.stdout


def test_dashboard_json_is_plain_json_with_stable_formatting() -> None:
    text = (REPO / "deploy/grafana/dashboards/vllm-sidecar.json").read_text()
    # One copy, diff-friendly: reformatting would make every review noisy.
    assert text == json.dumps(json.loads(text), indent=2) + "\n"


# Runs in .venv-deploy: decodes the dashboard with the models generated from Grafana's own schema
# (grafana-foundation-sdk, Grafana 11.6) and prints every key the decoding dropped, i.e. every
# key Grafana's schema does not know (panel options and field config included).
DASHBOARD_CHECK = """
import json, sys
from grafana_foundation_sdk.cog.encoder import JSONEncoder
from grafana_foundation_sdk.models.dashboard import Dashboard

def lost(a, b, path=""):
    if isinstance(a, dict) and isinstance(b, dict):
        for key in a:
            if key not in b:
                yield f"{path}/{key}"
            else:
                yield from lost(a[key], b[key], f"{path}/{key}")
    elif isinstance(a, list) and isinstance(b, list):
        for index, (x, y) in enumerate(zip(a, b)):
            yield from lost(x, y, f"{path}[{index}]")

board = json.load(sys.stdin)
decoded = json.loads(json.dumps(Dashboard.from_json(board), cls=JSONEncoder))
for path in lost(board, decoded):
    print(json.dumps(path))
"""

# Dropped by the models but read by Grafana: `id` (null, dropped as unset) and a query
# variable's `definition` (the text its editor shows).
GRAFANA_KEYS_OUTSIDE_THE_SCHEMA = re.compile(r"/id|/templating/list\[\d+\]/definition")


def test_dashboard_matches_grafanas_schema() -> None:
    lost = _in_schema_venv(DASHBOARD_CHECK, dashboard())
    unknown = [p for p in lost if not GRAFANA_KEYS_OUTSIDE_THE_SCHEMA.fullmatch(p)]
    assert not unknown, f"keys Grafana's dashboard schema does not know: {unknown}"


def test_dashboard_schema_check_notices_misspelt_keys() -> None:
    board = dashboard()
    board["panels"][1]["titel"] = "typo"
    board["panels"][1]["fieldConfig"]["defaults"]["unitt"] = "s"
    lost = set(_in_schema_venv(DASHBOARD_CHECK, board))
    assert {"/panels[1]/titel", "/panels[1]/fieldConfig/defaults/unitt"} <= lost
