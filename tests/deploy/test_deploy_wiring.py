"""The deployment files agree with each other and with the package: image, compose stack,
Kubernetes objects, the dashboard's shape, and the one-copy rules for dashboard and alerts."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path
from typing import Any

import pytest
import yaml

from proxy.config.settings import Settings
from proxy.core.phase import PHASES, SERVING
from proxy.wiring.tracing import ENV as TRACES_ENDPOINT
from tests.manifests import KUBERNETES, kustomize_build, load_yaml, pod_containers

from .files import (
    COMPOSE,
    DASHBOARD,
    DEPLOY,
    REPO,
    SCRAPE_CONFIG,
    alert_rules,
    dashboard,
    dashboard_panels,
    dashboard_queries,
    dockerfile_instructions,
    recorded_names,
    recording_rules,
    rules,
)

DS = "${DS_PROMETHEUS}"


# -- the image ---------------------------------------------------------------------------------
def test_image_is_multi_stage_and_runs_the_console_script_as_a_numeric_non_root_user() -> None:
    instructions = dockerfile_instructions()
    froms = [i for i, (k, _) in enumerate(instructions) if k == "FROM"]
    assert len(froms) >= 2, "multi-stage: build tools stay out of the final image"
    final = instructions[froms[-1] :]
    assert "slim" in (REPO / "Dockerfile").read_text().split("ARG PYTHON_IMAGE=")[1].split()[0]
    [user] = [v for k, v in final if k == "USER"]
    uid, _, gid = user.partition(":")
    assert uid.isdigit(), user
    assert int(uid) > 0, user
    assert gid.isdigit(), user
    [entrypoint] = [v for k, v in final if k == "ENTRYPOINT"]
    scripts = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["scripts"]
    assert json.loads(entrypoint) == ["vllm-sidecar"]
    assert "vllm-sidecar" in scripts
    [healthcheck] = [v for k, v in final if k == "HEALTHCHECK"]
    command = json.loads(healthcheck[healthcheck.index("CMD") + 3 :])  # exec form: JSON
    assert "/livez" in command[-1]
    assert "curl" not in healthcheck


def _dockerignore_allows(path: str, patterns: list[str]) -> bool:
    """Docker's rule: the last matching pattern wins; `!` re-includes."""
    allowed = True
    for pattern in patterns:
        negate = pattern.startswith("!")
        glob = pattern.lstrip("!").rstrip("/")
        regex = re.escape(glob).replace(r"\*\*/", "(.*/)?").replace(r"\*", "[^/]*")
        if re.fullmatch(regex, path) or re.fullmatch(regex + "/.*", path):
            allowed = negate
    return allowed


def test_build_context_holds_what_the_dockerfile_copies_and_builds_a_working_wheel(
    tmp_path: Path,
) -> None:
    lines = (REPO / ".dockerignore").read_text().splitlines()
    patterns = [line.strip() for line in lines if line.strip() and not line.startswith("#")]
    tracked = subprocess.run(
        ["git", "ls-files"], cwd=REPO, capture_output=True, text=True, check=True
    ).stdout.split()
    context = [path for path in tracked if _dockerignore_allows(path, patterns)]
    assert not any(p.startswith(("tests/", "deploy/", ".venv")) for p in context), context
    for key, args in dockerfile_instructions():
        if key == "COPY" and not args.startswith("--from"):
            *sources, _ = args.split()
            for source in sources:
                assert any(
                    p == source or p.startswith(source.rstrip("/") + "/") for p in context
                ), f"COPY {source}: not in the build context"
    # Build the wheel from exactly that context, as the image's build stage does.
    for path in context:
        (tmp_path / "context" / path).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(REPO / path, tmp_path / "context" / path)
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "-q",
            "-w",
            str(tmp_path / "dist"),
            str(tmp_path / "context"),
        ],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    [wheel] = (tmp_path / "dist").glob("vllm_sidecar-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    assert "proxy/__main__.py" in names
    assert "proxy/py.typed" in names
    entry_points = next(n for n in names if n.endswith("entry_points.txt"))
    assert (
        "vllm-sidecar = proxy.__main__:main" in zipfile.ZipFile(wheel).read(entry_points).decode()
    )


# -- docker compose ----------------------------------------------------------------------------
def _compose() -> dict[str, Any]:
    loaded: dict[str, Any] = load_yaml(COMPOSE)
    return loaded


def test_compose_runs_gpu_or_cpu_vllm_behind_the_sidecar_clients_reach() -> None:
    services = _compose()["services"]
    assert services["vllm"]["profiles"] == ["gpu"]
    assert services["vllm"]["image"].startswith("vllm/vllm-openai:")
    devices = services["vllm"]["deploy"]["resources"]["reservations"]["devices"]
    assert devices[0]["capabilities"] == ["gpu"]
    assert services["vllm-cpu"]["profiles"] == ["cpu"]
    assert "cpu" in services["vllm-cpu"]["image"]
    for name in ("vllm", "vllm-cpu"):
        assert "vllm" in services[name]["networks"]["default"]["aliases"]
        assert "ports" not in services[name], f"{name}: clients must go through the sidecar"
    sidecar = services["sidecar"]
    assert sidecar["build"] == "."
    assert sidecar["environment"]["VLLM_SIDECAR_UPSTREAM_URL"] == "http://vllm:8000"
    [published] = sidecar["ports"]
    assert published.endswith(":" + sidecar["environment"]["VLLM_SIDECAR_PORT"])
    grace = float(sidecar["environment"]["VLLM_SIDECAR_SHUTDOWN_GRACE"])
    assert float(sidecar["stop_grace_period"].removesuffix("s")) > grace
    for name in ("sidecar", "prometheus", "grafana"):
        assert "profiles" not in services[name], f"{name} runs in every profile"


def _bind_mounts(service: dict[str, Any]) -> dict[str, Path]:
    mounts = {}
    for volume in service.get("volumes", []):
        source, target = volume.split(":")[:2]
        if source.startswith("./"):
            mounts[target] = REPO / source
    return mounts


def test_compose_provisions_prometheus_and_grafana_from_deploy_files() -> None:
    services = _compose()["services"]
    prometheus = _bind_mounts(services["prometheus"])
    for source in prometheus.values():
        assert source.exists(), source
    config_path = next(
        a.split("=", 1)[1] for a in services["prometheus"]["command"] if "--config.file" in a
    )
    assert prometheus[config_path] == DEPLOY / "prometheus" / "prometheus.yml"
    [rule_glob] = load_yaml(prometheus[config_path])["rule_files"]
    rule_mounts = [t for t in prometheus if Path(t).match(rule_glob)]
    assert [prometheus[t] for t in rule_mounts] == [DEPLOY / "prometheus" / "alerts.yml"]

    grafana = _bind_mounts(services["grafana"])
    for source in grafana.values():
        assert source.exists(), source
    provisioning = grafana["/etc/grafana/provisioning"]
    [provider] = load_yaml(provisioning / "dashboards" / "vllm-sidecar.yml")["providers"]
    assert grafana[provider["options"]["path"]] == DASHBOARD.parent
    [datasource] = load_yaml(provisioning / "datasources" / "prometheus.yml")["datasources"]
    assert datasource["type"] == "prometheus"
    assert datasource["isDefault"] is True
    assert datasource["url"] == "http://prometheus:9090"
    home = services["grafana"]["environment"]["GF_DASHBOARDS_DEFAULT_HOME_DASHBOARD_PATH"]
    assert home == f"{provider['options']['path']}/{DASHBOARD.name}"


def test_scrape_config_targets_are_what_compose_runs() -> None:
    compose = _compose()
    services = compose["services"]
    hosts = set(services)
    for service in services.values():
        hosts.update(service.get("networks", {}).get("default", {}).get("aliases", []))
    sidecar_env = services["sidecar"]["environment"]
    config = load_yaml(SCRAPE_CONFIG)
    jobs = {job["job_name"]: job for job in config["scrape_configs"]}
    [target] = jobs["vllm-sidecar"]["static_configs"][0]["targets"]
    host, port = target.split(":")
    assert host == "sidecar"
    assert port == sidecar_env["VLLM_SIDECAR_ADMIN_PORT"]
    for job in jobs.values():
        for static in job["static_configs"]:
            for t in static["targets"]:
                assert t.split(":")[0] in hosts, t


# -- Kubernetes --------------------------------------------------------------------------------
def _objects() -> dict[str, dict[str, Any]]:
    return {doc["kind"]: doc for doc in kustomize_build(KUBERNETES)}


def test_sidecar_is_a_native_sidecar_in_front_of_vllm() -> None:
    deployment = _objects()["Deployment"]
    spec = deployment["spec"]["template"]["spec"]
    [sidecar] = spec["initContainers"]
    assert sidecar["restartPolicy"] == "Always"
    assert [c["name"] for c in spec["containers"]] == ["vllm"]
    assert spec["containers"][0]["image"].startswith("vllm/vllm-openai:")
    assert sidecar["startupProbe"]["httpGet"]["path"] == "/livez"
    assert sidecar["livenessProbe"]["httpGet"]["path"] == "/livez"
    assert sidecar["readinessProbe"]["httpGet"]["path"] == "/readyz"
    plain = {e["name"]: e["value"] for e in sidecar["env"] if "value" in e}
    settings = Settings(**{k.removeprefix("VLLM_SIDECAR_").lower(): v for k, v in plain.items()})
    vllm_port = spec["containers"][0]["ports"][0]["containerPort"]
    assert settings.upstream_url == f"http://127.0.0.1:{vllm_port}"
    # vLLM's preStop drains through the sidecar (tests/test_drain.py runs it): its delay and
    # the sidecar's grace, then vLLM's own shutdown, all inside the pod's grace period.
    script = spec["containers"][0]["lifecycle"]["preStop"]["exec"]["command"][-1]
    assert "/drain" in script
    assert f":{settings.admin_port}" in script
    found = re.search(r'"SIDECAR_DRAIN_DELAY", "([\d.]+)"', script)
    assert found is not None
    delay = float(found.group(1))
    assert delay + settings.shutdown_grace + 10 < spec["terminationGracePeriodSeconds"]
    security = sidecar["securityContext"]
    assert security["runAsNonRoot"] is True
    assert security["readOnlyRootFilesystem"] is True
    # The image's numeric user, so runAsNonRoot holds without an /etc/passwd lookup.
    [user] = [v for k, v in dockerfile_instructions() if k == "USER"]
    assert security["runAsUser"] == int(user.split(":")[0])
    resources = sidecar["resources"]
    assert resources["requests"]["cpu"]
    assert resources["requests"]["memory"]
    assert resources["limits"]["memory"]
    assert "cpu" not in resources["limits"]


def test_the_control_token_comes_from_a_secret_in_kubernetes_and_the_environment_in_compose() -> (
    None
):
    [sidecar] = _objects()["Deployment"]["spec"]["template"]["spec"]["initContainers"]
    [token] = [e for e in sidecar["env"] if e["name"] == "VLLM_SIDECAR_CONTROL_TOKEN"]
    assert "value" not in token, "a token in the manifest would be a token in git"
    assert token["valueFrom"]["secretKeyRef"]["name"] == "vllm-sidecar-control"
    assert token["valueFrom"]["secretKeyRef"]["key"] == "token"
    # A pod without the Secret still starts; vLLM's preStop reads the same reference
    # (tests/test_drain.py), so it sends the token exactly when the sidecar has one.
    assert token["valueFrom"]["secretKeyRef"]["optional"] is True
    environment = load_yaml(COMPOSE)["services"]["sidecar"]["environment"]
    assert environment["VLLM_SIDECAR_CONTROL_TOKEN"] == "${VLLM_SIDECAR_CONTROL_TOKEN:-}"


def _commented_env(path: Path, first: str) -> list[dict[str, str]]:
    """The commented-out env entries that start with `- name: <first>`, uncommented."""
    lines = path.read_text().splitlines()
    start = next(i for i, line in enumerate(lines) if line.strip() == f"# - name: {first}")
    block = []
    for line in lines[start:]:
        text = line.strip()
        if not text.startswith("# - name:") and not text.startswith("#   "):
            break
        block.append(text.removeprefix("# "))
    entries: list[dict[str, str]] = yaml.safe_load("\n".join(block))
    return entries


def test_traces_are_commented_in_kubernetes_and_a_profile_in_compose() -> None:
    env = {
        e["name"]: e["value"]
        for e in _commented_env(KUBERNETES / "deployment.yaml", TRACES_ENDPOINT)
    }
    assert set(env) == {TRACES_ENDPOINT, "VLLM_SIDECAR_OTLP_TRACES_SAMPLE_RATIO"}
    assert env[TRACES_ENDPOINT].endswith(":4318/v1/traces")  # OTLP/HTTP, the exporter shipped
    settings = Settings(otlp_traces_sample_ratio=env["VLLM_SIDECAR_OTLP_TRACES_SAMPLE_RATIO"])
    assert 0 < settings.otlp_traces_sample_ratio < 1
    services = _compose()["services"]
    assert services["jaeger"]["profiles"] == ["tracing"]
    sidecar = services["sidecar"]["environment"]
    # Off unless asked for: an empty endpoint turns nothing on.
    assert sidecar[TRACES_ENDPOINT] == f"${{{TRACES_ENDPOINT}:-}}"
    ratio = sidecar["VLLM_SIDECAR_OTLP_TRACES_SAMPLE_RATIO"]
    assert Settings(otlp_traces_sample_ratio=ratio.split(":-")[1].rstrip("}"))
    # The endpoint the compose file's header tells users to set reaches the Jaeger service.
    assert f"{TRACES_ENDPOINT}=http://jaeger:4318/v1/traces" in COMPOSE.read_text()


def test_service_and_podmonitor_name_ports_the_containers_declare() -> None:
    objects = _objects()
    deployment = objects["Deployment"]
    pod_labels = deployment["spec"]["template"]["metadata"]["labels"]
    ports: dict[str, tuple[str, int]] = {}
    for container in pod_containers(deployment):
        for port in container.get("ports", []):
            ports[port["name"]] = (container["name"], port["containerPort"])
    service = objects["Service"]
    assert service["spec"]["selector"].items() <= pod_labels.items()
    [service_port] = service["spec"]["ports"]
    # Clients reach the sidecar's proxy port, never vLLM's.
    assert ports[service_port["targetPort"]] == ("sidecar", Settings().port)
    podmonitor = objects["PodMonitor"]
    assert podmonitor["spec"]["selector"]["matchLabels"].items() <= pod_labels.items()
    [endpoint] = podmonitor["spec"]["podMetricsEndpoints"]
    assert ports[endpoint["port"]] == ("sidecar", Settings().admin_port)
    assert endpoint["path"] == "/metrics"
    # The alert on scrape failures matches the job name the operator gives this PodMonitor.
    [down] = [r for r in alert_rules() if r["alert"] == "VllmSidecarDown"]
    job_regex = re.search(r'job=~"([^"]+)"', down["expr"]).group(1)  # type: ignore[union-attr]
    assert re.fullmatch(job_regex, f"monitoring/{podmonitor['metadata']['name']}")
    assert re.fullmatch(job_regex, "vllm-sidecar")  # compose's job_name


def test_dashboard_configmap_is_the_dashboard_file_labelled_for_grafana() -> None:
    configmap = _objects()["ConfigMap"]
    assert configmap["metadata"]["labels"] == {"grafana_dashboard": "1"}
    assert configmap["data"] == {DASHBOARD.name: DASHBOARD.read_text()}
    # kubectl apply keeps a copy in an annotation limited to 256 KiB.
    assert len(DASHBOARD.read_bytes()) < 200 * 1024


# -- the dashboard -----------------------------------------------------------------------------
def test_dashboard_is_importable_and_every_panel_uses_the_datasource_variable() -> None:
    board = dashboard()
    assert board["id"] is None
    assert board["uid"]
    assert board["title"]
    variables = {v["name"]: v for v in board["templating"]["list"]}
    assert variables["DS_PROMETHEUS"]["type"] == "datasource"
    assert variables["DS_PROMETHEUS"]["query"] == "prometheus"
    instance = variables["instance"]
    assert instance["type"] == "query"
    assert instance["datasource"]["uid"] == DS
    assert "vllm_sidecar_" in instance["definition"]
    panels = dashboard_panels(board)
    assert len({p["id"] for p in board["panels"]}) == len(board["panels"])
    for panel in panels:
        assert panel["datasource"] == {"type": "prometheus", "uid": DS}, panel["title"]
        assert panel["targets"], panel["title"]
        for target in panel["targets"]:
            assert target["datasource"]["uid"] == DS, panel["title"]
            assert 'instance=~"$instance"' in target["expr"], panel["title"]


def test_dashboard_panels_do_not_overlap() -> None:
    taken: set[tuple[int, int]] = set()
    for panel in dashboard()["panels"]:
        pos = panel["gridPos"]
        assert pos["x"] + pos["w"] <= 24, panel["title"]
        cells = {
            (x, y)
            for x in range(pos["x"], pos["x"] + pos["w"])
            for y in range(pos["y"], pos["y"] + pos["h"])
        }
        assert not cells & taken, f"{panel['title']} overlaps another panel"
        taken |= cells


@pytest.mark.parametrize(
    ("what", "pattern"),
    [
        ("request rate by route", r"sum by \(route\) \(rate\(vllm_sidecar_requests_total"),
        ("latency by route", r"histogram_quantile\(.*by \(le, route\).*request_duration_seconds"),
        ("time to first byte", r"histogram_quantile\(.*upstream_time_to_first_byte_seconds"),
        ("failures by source and reason", r"sum by \(source, reason\) \(rate\(vllm_sidecar_fail"),
        ("failures by status", r"sum by \(status, route\) \(rate\(vllm_sidecar_failures_total"),
        ("in-flight", r"vllm_sidecar_in_flight_requests"),
        ("model resolutions by rule", r"sum by \(rule\) \(rate\(vllm_sidecar_model_resolutions"),
        ("upstream up", r"vllm_sidecar_upstream_up"),
        ("in-stream failures", r'reason="upstream_stream_error"'),
        ("engine phase", r"max by \(instance, phase\) \(vllm_sidecar_engine_phase"),
        ("weight version", r"by \(instance, version\) \(vllm_sidecar_weight_version_info"),
        ("phase holds", r"sum by \(phase, outcome\) \(rate\(vllm_sidecar_phase_requests_total"),
        ("phase durations", r"histogram_quantile\(.*engine_phase_duration_seconds_bucket"),
        ("phase by pod", r"max by \(instance\) \(.*vllm_sidecar_engine_phase\{"),
        ("long phases by pod", r"max by \(instance\) \(.*vllm_sidecar_engine_phase_long\{"),
        (
            "weight version by pod",
            r"by \(instance, version\) \(vllm_sidecar_weight_version_changed_timestamp_seconds"
            r".*group_right vllm_sidecar_weight_version_info",
        ),
        ("on-policy share by pod", r"1 - instance:vllm_sidecar_offpolicy_token_share:ratio_rate5m"),
        ("off-policy alert threshold", r"1 - max by \(instance\) \(vllm_sidecar_offpolicy_alert"),
        ("tokens by lag", r"sum by \(lag\) \(rate\(vllm_sidecar_generated_tokens_total"),
        ("straddling by route", r"sum by \(route\) \(increase\(vllm_sidecar_straddling_answers"),
        ("versions by pod", r"max by \(instance, version\) \(vllm_sidecar_weight_version_info"),
    ],
)
def test_dashboard_has_the_panel_for(what: str, pattern: str) -> None:
    assert any(re.search(pattern, expr) for _, expr in dashboard_queries(dashboard())), what


def test_phase_timelines_name_every_phase_the_sidecar_has() -> None:
    # "Phase by pod" and "Long phases" show a pod's phase as a number, one per phase: the query
    # multiplies each phase's series by its number, the value mappings name it back.
    panels = {p["title"]: p for p in dashboard_panels(dashboard())}
    for title in ("Phase by pod", "Long phases"):
        panel = panels[title]
        assert panel["type"] == "state-timeline", title
        [target] = panel["targets"]
        term = r'(\d+) \* vllm_sidecar_engine_phase\w*\{[^}]*phase="(\w+)"'
        codes = {phase: code for code, phase in re.findall(term, target["expr"])}
        [mapping] = panel["fieldConfig"]["defaults"]["mappings"]
        names = {int(code): result["text"] for code, result in mapping["options"].items()}
        assert set(names) == set(range(len(PHASES))), title
        if title == "Phase by pod":
            # Every phase is exported (0 or 1): serving needs no term, the others all 0 make 0.
            assert set(codes) == set(PHASES) - {SERVING}, title
            assert names[0] == SERVING
            assert all(names[int(code)] == phase for phase, code in codes.items()), title
        else:
            # Only the current phase is exported: serving needs its own term, at 0.
            assert set(codes) == set(PHASES), title
            assert codes[SERVING] == "0"
            assert all(
                names[int(code)].startswith(phase)
                for phase, code in codes.items()
                if phase != SERVING
            ), title


def test_alert_rules_say_who_and_why() -> None:
    rules = alert_rules()
    assert {r["alert"] for r in rules} >= {
        "VllmSidecarDown",
        "VllmSidecarUpstreamDown",
        "VllmSidecarFailureRatioHigh",
        "VllmSidecarModelResolutionFailures",
        "VllmSidecarInStreamFailures",
        "VllmSidecarEngineNotServing",
        "VllmSidecarWeightVersionBehind",
        "VllmSidecarOffPolicyShareHigh",
    }
    for rule in rules:
        assert rule["labels"]["severity"] in {"critical", "warning"}, rule["alert"]
        assert rule["annotations"]["summary"]
        assert rule["annotations"]["description"]
    ratio = next(r for r in rules if r["alert"] == "VllmSidecarFailureRatioHigh")
    assert "reason" in ratio["expr"].split("/")[0], "the failure ratio is split by reason"


def test_every_recorded_series_read_is_recorded_by_the_rules_file() -> None:
    recorded = {rule["record"] for rule in recording_rules()}
    assert "instance:vllm_sidecar_offpolicy_token_share:ratio_rate5m" in recorded
    reads = {f"rule {r.get('alert') or r['record']}": r["expr"] for r in rules()}
    reads.update({f"dashboard {where}": expr for where, expr in dashboard_queries(dashboard())})
    missing = {where: recorded_names(expr) - recorded for where, expr in reads.items()}
    assert not {where: names for where, names in missing.items() if names}
    # Recorded names follow level:metric:operations (a colon: never an exported metric's).
    for name in recorded:
        assert re.fullmatch(r"[a-z_]+:vllm_sidecar_[a-z0-9_]+:[a-z0-9_]+", name), name
