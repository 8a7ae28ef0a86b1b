"""A real Prometheus, configured by the shipped scrape config and alert rules, scrapes a running
sidecar: the dashboard's queries answer with data after traffic, failures counted by reason, and
the alerts fire on the conditions they describe."""

from __future__ import annotations

import json
import urllib.parse
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest
import yaml

from tests.processes import ManagedProcess, spawn
from tests.support import free_port, http_get, wait_until
from tests.tools import tool

from .files import (
    ALERTS,
    SCRAPE_CONFIG,
    alert_rules,
    dashboard,
    dashboard_queries,
    substitute,
)
from .stack import SERVED, Stack


@dataclass
class Prometheus:
    url: str
    process: ManagedProcess

    def api(self, path: str, **params: str) -> Any:
        query = f"?{urllib.parse.urlencode(params)}" if params else ""
        status, body = http_get(f"{self.url}/api/v1/{path}{query}")
        payload = json.loads(body)
        assert status == 200, payload
        assert payload["status"] == "success", payload
        return payload["data"]

    def query(self, expr: str) -> list[dict[str, Any]]:
        data = self.api("query", query=expr)
        assert data["resultType"] == "vector", data
        result: list[dict[str, Any]] = data["result"]
        return result

    def alerts(self) -> dict[str, str]:
        return {a["labels"]["alertname"]: a["state"] for a in self.api("alerts")["alerts"]}


def scrape_config_for(stack: Stack) -> dict[str, Any]:
    """The shipped scrape config with the test's ports in place of compose's service names."""
    config: dict[str, Any] = yaml.safe_load(SCRAPE_CONFIG.read_text())
    targets = {
        "sidecar:8081": f"127.0.0.1:{stack.sidecar.admin_port}",
        "vllm:8000": f"127.0.0.1:{stack.vllm_port}",
    }
    for job in config["scrape_configs"]:
        for static in job["static_configs"]:
            # A target this test does not know would go unscraped: fail instead.
            static["targets"] = [targets[t] for t in static["targets"]]
    config["global"]["scrape_interval"] = "1s"
    config["global"]["evaluation_interval"] = "1s"
    config["rule_files"] = [str(ALERTS)]
    return config


@pytest.fixture(scope="module")
def prometheus(stack: Stack, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Prometheus]:
    workdir = tmp_path_factory.mktemp("prometheus")
    config = workdir / "prometheus.yml"
    config.write_text(yaml.safe_dump(scrape_config_for(stack)))
    port = free_port()
    process = spawn(
        [
            tool("prometheus"),
            f"--config.file={config}",
            f"--storage.tsdb.path={workdir / 'data'}",
            f"--web.listen-address=127.0.0.1:{port}",
            "--log.level=warn",
        ],
        workdir / "prometheus.log",
    )
    server = Prometheus(f"http://127.0.0.1:{port}", process)
    try:
        process.wait_until(server.url + "/-/ready", deadline_s=60)
        yield server
    finally:
        process.stop()


def post(stack: Stack, path: str, payload: dict[str, Any]) -> tuple[int, bytes]:
    request = urllib.request.Request(
        stack.sidecar.url + path, json.dumps(payload).encode(), {"Content-Type": "application/json"}
    )
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as error:
        return error.code, error.read()


def scraped(prometheus: Prometheus, expr: str, value: float) -> bool:
    """Whether Prometheus' latest sample of `expr` has reached `value`."""
    result = prometheus.query(expr)
    return bool(result) and float(result[0]["value"][1]) >= value


def panel_query(title: str) -> str:
    [expr] = [e for where, e in dashboard_queries(dashboard()) if where.startswith(title + " [")]
    return substitute(expr).replace("[1m]", "[30s]")


def test_prometheus_scrapes_the_sidecar_with_the_shipped_config(prometheus: Prometheus) -> None:
    def sidecar_up() -> bool:
        targets = prometheus.api("targets")["activeTargets"]
        return any(t["labels"]["job"] == "vllm-sidecar" and t["health"] == "up" for t in targets)

    wait_until(sidecar_up, "the sidecar target to be up")
    # The selector of the VllmSidecarDown alert matches the compose job...
    [series] = prometheus.query('up{job=~"(.+/)?vllm-sidecar"}')
    assert series["value"][1] == "1"
    # ...and the upstream is seen up.
    wait_until(lambda: scraped(prometheus, "vllm_sidecar_upstream_up", 1), "upstream_up == 1")


def test_fleet_panels_show_each_pods_phase_and_version(
    stack: Stack, prometheus: Prometheus
) -> None:
    wait_until(
        lambda: bool(prometheus.query("vllm_sidecar_weight_version_info")), "a weight version"
    )
    instance = f"127.0.0.1:{stack.sidecar.admin_port}"
    # One row per pod, its phase as the value mappings' number: 0 is serving, and not long.
    for title in ("Phase by pod", "Long phases"):
        [series] = prometheus.query(panel_query(title))
        assert series["metric"] == {"instance": instance}, title
        assert series["value"][1] == "0", title
    [row] = prometheus.query(panel_query("Weight version by pod"))
    assert row["metric"] == {"instance": instance, "version": "default"}
    # When the sidecar read the version, in milliseconds (Grafana's dateTimeFromNow).
    [changed] = prometheus.query("vllm_sidecar_weight_version_changed_timestamp_seconds")
    assert float(row["value"][1]) == float(changed["value"][1]) * 1000
    # A pod alone is never behind its peers.
    [rule] = [r for r in alert_rules() if r["alert"] == "VllmSidecarWeightVersionBehind"]
    assert prometheus.query(rule["expr"]) == []


def test_every_dashboard_query_runs_on_a_real_prometheus(prometheus: Prometheus) -> None:
    for where, expr in dashboard_queries(dashboard()):
        data = prometheus.api("query", query=substitute(expr))
        assert data["resultType"] == "vector", where


def test_dashboard_shows_traffic_and_failures_by_reason(
    stack: Stack, prometheus: Prometheus
) -> None:
    ok = {"model": "Qwen/Qwen2.5-0.5B-Instruct", "prompt": "hello", "max_tokens": 4}
    wrong_model = {**ok, "model": "no-such-model"}
    # Token ids past the vocabulary: vLLM answers 200 and then an error event in the stream.
    in_stream = {**ok, "prompt": [5000, 5001], "stream": True}

    def traffic() -> None:
        assert post(stack, "/v1/completions", ok)[0] == 200
        status, body = post(stack, "/v1/completions", wrong_model)
        assert status == 404, body
        assert json.loads(body)["error"]["reason"] == "upstream_status"
        status, body = post(stack, "/v1/completions", in_stream)
        assert status == 200
        assert b'data: {"error"' in body, body

    # rate() needs two samples of a series: one round of traffic to make the series and let
    # Prometheus scrape it, then a second to make them grow.
    # Each round makes two failures (the 404, the in-stream error); wait for Prometheus to have
    # scraped all of a round before going on.
    failures = "sum(vllm_sidecar_failures_total)"
    traffic()
    wait_until(lambda: scraped(prometheus, failures, 2), "the first round to be scraped")
    traffic()
    wait_until(lambda: scraped(prometheus, failures, 4), "the second round to be scraped")

    by_reason = prometheus.query(panel_query("Failures by source and reason"))
    rates = {
        (s["metric"]["source"], s["metric"]["reason"]): float(s["value"][1]) for s in by_reason
    }
    assert rates[("upstream", "upstream_status")] > 0, rates
    assert rates[("upstream", "upstream_stream_error")] > 0, rates

    by_route = prometheus.query(panel_query("Request rate by route"))
    assert {s["metric"]["route"] for s in by_route} >= {"/v1/completions"}
    assert all(
        float(s["value"][1]) > 0 for s in by_route if s["metric"]["route"] == "/v1/completions"
    )

    by_rule = prometheus.query(panel_query("Model resolutions by rule"))
    rules = {s["metric"]["rule"]: float(s["value"][1]) for s in by_rule}
    assert rules["unresolved"] > 0, rules
    assert rules["root"] > 0, rules

    by_model = prometheus.query(panel_query("Model resolutions by served model"))
    assert {s["metric"]["served_model"] for s in by_model} == {SERVED}

    latency = prometheus.query(panel_query("Request latency p95 by route"))
    assert any(s["metric"]["route"] == "/v1/completions" for s in latency)

    # The alerts about what just happened fire (they have no `for`), the ratio one is pending.
    def alerting() -> bool:
        alerts = prometheus.alerts()
        return (
            alerts.get("VllmSidecarModelResolutionFailures") == "firing"
            and alerts.get("VllmSidecarInStreamFailures") == "firing"
            and alerts.get("VllmSidecarFailureRatioHigh") == "pending"
        )

    wait_until(alerting, "the failure alerts")
    assert "VllmSidecarUpstreamDown" not in prometheus.alerts()
    # Every rule evaluates cleanly (no many-to-many matching or other runtime error).
    for group in prometheus.api("rules")["groups"]:
        for rule in group["rules"]:
            assert rule["health"] == "ok", rule


def test_upstream_down_alert_goes_pending_when_vllm_stops(
    stack: Stack, prometheus: Prometheus
) -> None:
    stack.vllm.stop()
    wait_until(lambda: not scraped(prometheus, "vllm_sidecar_upstream_up", 1), "upstream_up == 0")
    [series] = prometheus.query(panel_query("Upstream up"))
    assert series["value"][1] == "0"
    wait_until(
        lambda: prometheus.alerts().get("VllmSidecarUpstreamDown") == "pending",
        "VllmSidecarUpstreamDown",
    )
