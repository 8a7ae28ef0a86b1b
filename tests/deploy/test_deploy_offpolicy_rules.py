"""The off-policy share's recording rules and its alert, under promtool's rule unit tests: the
share counts straddled tokens as off-policy and leaves unknown ones out, per pod and per fleet;
the alert fires only where the operator set a threshold, and only past it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from .files import dashboard, dashboard_panels, substitute
from .promtool import annotations, promtool_test

JOB = "vllm-sidecar"
POD_SHARE = "instance:vllm_sidecar_offpolicy_token_share:ratio_rate5m"
FLEET_SHARE = "job:vllm_sidecar_offpolicy_token_share:ratio_rate5m"
ALERT = "VllmSidecarOffPolicyShareHigh"


def tokens(
    instance: str, lag: str, per_minute: int, minutes: int = 40, job: str = JOB
) -> dict[str, str]:
    """A pod's generated-token counter for one lag, growing steadily."""
    return {
        "series": f'vllm_sidecar_generated_tokens_total{{job="{job}",instance="{instance}",'
        f'route="/v1/completions",lag="{lag}"}}',
        "values": f"0+{per_minute}x{minutes}",
    }


def threshold(instance: str, share: float, minutes: int = 40) -> dict[str, str]:
    """The gauge a pod exports only when --offpolicy-alert-share is set."""
    return {
        "series": f'vllm_sidecar_offpolicy_alert_share{{job="{JOB}",instance="{instance}"}}',
        "values": f"{share}x{minutes}",
    }


def firing(instance: str, value: str) -> dict[str, Any]:
    labels = {"job": JOB, "instance": instance}
    return {
        "exp_labels": {**labels, "severity": "warning"},
        "exp_annotations": annotations(ALERT, labels, value),
    }


def test_share_counts_straddled_as_off_policy_and_leaves_unknown_out(tmp_path: Path) -> None:
    promtool_test(
        tmp_path,
        [
            # a: 300 tokens a minute at lag 0, 100 at lag 1, 100 straddled, 500 unknown.
            tokens("a:8081", "0", 300),
            tokens("a:8081", "1", 100),
            tokens("a:8081", "straddled", 100),
            tokens("a:8081", "unknown", 500),
            # b: only lag 0, and no series of any other lag: a share of 0, not none.
            tokens("b:8081", "0", 300),
            # c: versions never known (a vLLM outside dev mode): no share at all.
            tokens("c:8081", "unknown", 300),
            # d: all 3+ behind, and no lag-0 series.
            tokens("d:8081", "3+", 200),
            # Another fleet, all on-policy: a share of 0, not none.
            tokens("e:8081", "0", 300, job="serving"),
        ],
        exprs=[
            # Rounded: rates are per second, and 100/60 is no exact float.
            {
                "eval_time": "10m",
                "expr": f"round({POD_SHARE}, 0.001)",
                "exp_samples": [
                    {"labels": f'{{job="{JOB}",instance="a:8081"}}', "value": 0.4},
                    {"labels": f'{{job="{JOB}",instance="b:8081"}}', "value": 0},
                    {"labels": f'{{job="{JOB}",instance="d:8081"}}', "value": 1},
                    {"labels": '{job="serving",instance="e:8081"}', "value": 0},
                ],
            },
            # The fleet: (200 + 200) off-policy of (500 + 300 + 200) measured.
            {
                "eval_time": "10m",
                "expr": f"round({FLEET_SHARE}, 0.001)",
                "exp_samples": [
                    {"labels": f'{{job="{JOB}"}}', "value": 0.4},
                    {"labels": '{job="serving"}', "value": 0},
                ],
            },
        ],
    )


def test_no_share_without_measured_tokens_in_five_minutes(tmp_path: Path) -> None:
    stopped = tokens("a:8081", "1", 100, minutes=5)
    stopped["values"] += " 500x20"  # traffic stops at 5m
    promtool_test(
        tmp_path,
        [stopped],
        exprs=[
            {
                "eval_time": "4m",
                "expr": POD_SHARE,
                "exp_samples": [
                    {"labels": f'{POD_SHARE}{{job="{JOB}",instance="a:8081"}}', "value": 1}
                ],
            },
            {"eval_time": "15m", "expr": POD_SHARE, "exp_samples": []},
        ],
    )


def test_alert_never_fires_without_a_threshold_even_at_all_tokens_behind(
    tmp_path: Path,
) -> None:
    promtool_test(
        tmp_path,
        [tokens("a:8081", "1", 100), tokens("b:8081", "straddled", 100)],
        [{"eval_time": f"{minute}m", "alertname": ALERT} for minute in (5, 15, 30, 40)],
    )


def test_alert_fires_past_the_threshold_for_ten_minutes_and_only_there(tmp_path: Path) -> None:
    promtool_test(
        tmp_path,
        [
            # a: every token one update behind, threshold 50%: pending from 1m, firing at 11m.
            tokens("a:8081", "1", 100),
            threshold("a:8081", 0.5),
            # b: 25% behind, threshold 50%: never.
            tokens("b:8081", "0", 300),
            tokens("b:8081", "2", 100),
            threshold("b:8081", 0.5),
            # c: all behind, no threshold set on it: never (a's threshold is a's).
            tokens("c:8081", "3+", 100),
        ],
        [
            {"eval_time": "10m", "alertname": ALERT},
            {"eval_time": "11m", "alertname": ALERT, "exp_alerts": [firing("a:8081", "100%")]},
            {"eval_time": "30m", "alertname": ALERT, "exp_alerts": [firing("a:8081", "100%")]},
        ],
    )


def test_alert_resolves_when_the_share_falls_below_the_threshold(tmp_path: Path) -> None:
    behind = tokens("a:8081", "1", 100, minutes=15)
    behind["values"] += " 1500x25"  # no more stale tokens from 15m
    promtool_test(
        tmp_path,
        [behind, tokens("a:8081", "0", 100), threshold("a:8081", 0.6)],
        [
            # Half behind (above a threshold of 50%, below 60%): never.
            {"eval_time": "14m", "alertname": ALERT},
        ],
    )
    promtool_test(
        tmp_path,
        [behind, tokens("a:8081", "0", 100), threshold("a:8081", 0.4)],
        [
            {"eval_time": "14m", "alertname": ALERT, "exp_alerts": [firing("a:8081", "50%")]},
            # From 15m the 5m window fills with lag-0 tokens only: resolved by 20m.
            {"eval_time": "21m", "alertname": ALERT},
        ],
    )


def test_dashboard_share_panel_shows_one_minus_the_recorded_share(tmp_path: Path) -> None:
    [panel] = [p for p in dashboard_panels(dashboard()) if p["title"] == "Tokens at lag 0 (share)"]
    pods, selected, line = (substitute(t["expr"]) for t in panel["targets"])
    promtool_test(
        tmp_path,
        [
            # a: 300 a minute at lag 0, 100 at lag 1, 100 unknown: 75% at lag 0.
            tokens("a:8081", "0", 300),
            tokens("a:8081", "1", 100),
            tokens("a:8081", "unknown", 100),
            threshold("a:8081", 0.5),
            tokens("b:8081", "0", 100),
        ],
        exprs=[
            {
                "eval_time": "10m",
                "expr": f"round({pods}, 0.001)",
                "exp_samples": [
                    {"labels": f'{{job="{JOB}",instance="a:8081"}}', "value": 0.75},
                    {"labels": f'{{job="{JOB}",instance="b:8081"}}', "value": 1},
                ],
            },
            # The selected pods together: 100 behind of 500 measured.
            {
                "eval_time": "10m",
                "expr": f"round({selected}, 0.001)",
                "exp_samples": [{"labels": "{}", "value": 0.8}],
            },
            # The alert's line, where a threshold is set.
            {
                "eval_time": "10m",
                "expr": line,
                "exp_samples": [{"labels": '{instance="a:8081"}', "value": 0.5}],
            },
        ],
    )
