"""Cross-references between the deployment files and the running sidecar: metric names, probe
paths and ports, settings, and the image's healthcheck, all checked against the real process."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import urllib.request
from pathlib import Path
from typing import Any

import yaml
from prometheus_client.parser import text_string_to_metric_families

from proxy.config.settings import Settings
from tests.manifests import KUBERNETES, kustomize_build
from tests.support import free_port, http_get
from tests.tools import tool

from .files import (
    DOCKERFILE,
    REPO,
    dashboard,
    dashboard_queries,
    dockerfile_instructions,
    metric_names,
    rules,
    run,
)
from .stack import Stack, start_sidecar

# Series Prometheus adds to every scrape itself; not the app's to export.
PROMETHEUS_SERIES = {"up"}
# Series a pod exports only where the operator set the flag (the stack runs on the defaults):
# the alert joins on it, so that without the flag it never fires.
CONFIGURED_SERIES = {"vllm_sidecar_offpolicy_alert_share": "--offpolicy-alert-share"}

SAMPLE_SUFFIXES = {
    "counter": ("_total", "_created"),
    "histogram": ("_bucket", "_sum", "_count", "_created"),
    "gauge": ("",),
    "summary": ("", "_sum", "_count", "_created"),
}


def exported_series(stack: Stack) -> set[str]:
    """Every series name the live /metrics can carry, from its metric families (HELP/TYPE lines
    are written even for a labelled metric that has no sample yet)."""
    status, body = http_get(stack.sidecar.admin_url + "/metrics")
    assert status == 200
    names = set()
    for family in text_string_to_metric_families(body.decode()):
        names.update(family.name + suffix for suffix in SAMPLE_SUFFIXES[family.type])
    return names


def test_every_metric_in_the_dashboard_and_alerts_is_exported(stack: Stack) -> None:
    exported = exported_series(stack)
    assert "vllm_sidecar_requests_total" in exported
    used = {
        f"dashboard {where}": metric_names(expr) for where, expr in dashboard_queries(dashboard())
    }
    used.update(
        {
            f"rule {rule.get('alert') or rule['record']}": metric_names(rule["expr"])
            for rule in rules()
        }
    )
    elsewhere = PROMETHEUS_SERIES | set(CONFIGURED_SERIES)
    missing = {
        where: sorted(names - exported - elsewhere)
        for where, names in used.items()
        if names - exported - elsewhere
    }
    assert not missing, f"not exported by the sidecar: {missing}"
    # And the dashboard shows every metric DESIGN.md promises.
    on_dashboard = set().union(*(metric_names(e) for _, e in dashboard_queries(dashboard())))
    for name in (
        "vllm_sidecar_requests_total",
        "vllm_sidecar_request_duration_seconds_bucket",
        "vllm_sidecar_upstream_time_to_first_byte_seconds_bucket",
        "vllm_sidecar_failures_total",
        "vllm_sidecar_model_resolutions_total",
        "vllm_sidecar_in_flight_requests",
        "vllm_sidecar_client_disconnects_total",
        "vllm_sidecar_upstream_up",
        "vllm_sidecar_engine_phase",
        "vllm_sidecar_weight_version_info",
        "vllm_sidecar_weight_updates_total",
        "vllm_sidecar_phase_requests_total",
        "vllm_sidecar_held_requests",
        "vllm_sidecar_engine_phase_duration_seconds_bucket",
        "vllm_sidecar_engine_phase_long",
        "vllm_sidecar_weight_version_changed_timestamp_seconds",
        "vllm_sidecar_generated_tokens_total",
        "vllm_sidecar_straddling_answers_total",
    ):
        assert name in on_dashboard, name


def test_metric_name_check_would_catch_a_typo(stack: Stack) -> None:
    exported = exported_series(stack)
    assert metric_names("rate(vllm_sidecar_request_total[5m])") - exported == {
        "vllm_sidecar_request_total"
    }


def test_live_metrics_pass_promtool_check_metrics(stack: Stack) -> None:
    # Traffic first, so that labelled metrics have samples for promtool to read.
    request = b'{"model": "Qwen/Qwen2.5-0.5B-Instruct", "prompt": "hi", "max_tokens": 2}'
    with urllib.request.urlopen(
        urllib.request.Request(
            stack.sidecar.url + "/v1/completions", request, {"Content-Type": "application/json"}
        ),
        timeout=10,
    ) as response:
        assert response.status == 200
    status, body = http_get(stack.sidecar.admin_url + "/metrics")
    assert status == 200
    assert (
        b'vllm_sidecar_requests_total{method="POST",route="/v1/completions",status="200"}' in body
    )
    result = run(tool("promtool"), "check", "metrics", stdin=body.decode())
    assert result.returncode == 0, result.stdout + result.stderr


def _sidecar_container() -> dict[str, Any]:
    deployment = next(d for d in kustomize_build(KUBERNETES) if d["kind"] == "Deployment")
    [container] = deployment["spec"]["template"]["spec"]["initContainers"]
    assert container["name"] == "sidecar"
    return container  # type: ignore[no-any-return]


def as_settings(env: dict[str, str]) -> Settings:
    """Settings from VLLM_SIDECAR_* variables, compose's `${NAME:-default}` read as its default;
    extra="forbid" rejects a misspelt name. OTEL_* are OpenTelemetry's own variables, which the
    SDK reads (and Settings reads OTEL_EXPORTER_OTLP_TRACES_ENDPOINT itself)."""
    prefix = "VLLM_SIDECAR_"
    ours = {n.removeprefix(prefix).lower(): v for n, v in env.items() if n.startswith(prefix)}
    return Settings(**{name: _default(value) for name, value in ours.items()})


def _default(value: str) -> str:
    found = re.fullmatch(r"\$\{\w+:-(.*)\}", str(value))
    return found.group(1) if found else value


def test_probes_name_admin_endpoints_the_running_sidecar_serves(stack: Stack) -> None:
    sidecar = _sidecar_container()
    ports = {p["name"]: p["containerPort"] for p in sidecar["ports"]}
    settings = as_settings({e["name"]: e["value"] for e in sidecar["env"] if "value" in e})
    for probe in ("startupProbe", "livenessProbe", "readinessProbe"):
        action = sidecar[probe]["httpGet"]
        # The probe's port is the admin port the sidecar's own settings give it.
        assert ports[action["port"]] == settings.admin_port, probe
        status, _ = http_get(stack.sidecar.admin_url + action["path"])
        assert status == 200, f"{probe} {action['path']} answered {status}"
    assert ports["http"] == settings.port


def test_manifest_and_compose_environment_are_valid_settings() -> None:
    compose = yaml.safe_load((REPO / "docker-compose.yml").read_text())
    sources = {
        "deployment": {e["name"]: e["value"] for e in _sidecar_container()["env"] if "value" in e},
        "compose": compose["services"]["sidecar"]["environment"],
    }
    for source, env in sources.items():
        settings = as_settings(env)
        assert settings.upstream_url.endswith(":8000"), source
        assert settings.shutdown_grace == 25.0, source
        assert settings.log_format == "json", source


def test_liveness_never_depends_on_vllm(tmp_path: Path) -> None:
    # No vLLM at all: /livez (liveness and startup probes, the image's HEALTHCHECK) must hold,
    # /readyz must not.
    sidecar, env = start_sidecar(free_port(), tmp_path)
    try:
        admin = sidecar.admin_url
        assert http_get(admin + "/livez")[0] == 200
        status, body = http_get(admin + "/readyz")
        assert status == 503, body
        assert healthcheck(env["VLLM_SIDECAR_ADMIN_PORT"]).returncode == 0
    finally:
        sidecar.stop()


def healthcheck(admin_port: str) -> subprocess.CompletedProcess[str]:
    """The image's HEALTHCHECK command, run as Docker would (exec form) with this Python."""
    args = dict(dockerfile_instructions())["HEALTHCHECK"]
    command = json.loads(args[args.index("CMD") + len("CMD") :].strip())
    assert command[0] == "python"
    env = {**os.environ, "VLLM_SIDECAR_ADMIN_PORT": admin_port}
    return subprocess.run(
        [sys.executable, *command[1:]], env=env, capture_output=True, text=True, timeout=30
    )


def test_image_healthcheck_passes_on_a_live_sidecar_and_fails_without_one(stack: Stack) -> None:
    assert healthcheck(str(stack.sidecar.admin_port)).returncode == 0
    assert healthcheck(str(free_port())).returncode != 0


def test_image_defaults_match_the_settings() -> None:
    instructions = dockerfile_instructions(DOCKERFILE)
    final = instructions[max(i for i, (k, _) in enumerate(instructions) if k == "FROM") :]
    env_line = " ".join(v for k, v in final if k == "ENV")
    env = dict(part.split("=", 1) for part in env_line.split() if "=" in part)
    image_settings = {
        k.removeprefix("VLLM_SIDECAR_").lower(): v
        for k, v in env.items()
        if k.startswith("VLLM_SIDECAR_")
    }
    settings = Settings(**image_settings)
    exposed = {int(p) for k, v in final if k == "EXPOSE" for p in v.split()}
    assert exposed == {settings.port, settings.admin_port}
    # And the image's ports are the sidecar's documented defaults.
    defaults = Settings()
    assert (settings.port, settings.admin_port) == (defaults.port, defaults.admin_port)
