"""Alert rules exercised with promtool's rule unit tests: they fire when they should, only then."""

from __future__ import annotations

from pathlib import Path

import yaml

from ._support import ALERTS, alert_rules, run, tool

LABELS = 'job="vllm-sidecar",instance="pod:8081"'


def _series(phase: str, values: str) -> dict[str, str]:
    return {"series": f'vllm_sidecar_engine_phase{{{LABELS},phase="{phase}"}}', "values": values}


def test_engine_not_serving_fires_for_a_long_pause_and_never_for_sleep(tmp_path: Path) -> None:
    [rule] = [r for r in alert_rules() if r["alert"] == "VllmSidecarEngineNotServing"]
    summary = rule["annotations"]["summary"]
    summary = summary.replace("{{ $labels.instance }}", "pod:8081")
    summary = summary.replace("{{ $labels.phase }}", "paused")
    # One sample a minute: paused for 20 minutes; asleep for 20 minutes on another instance.
    tests = {
        "rule_files": [str(ALERTS)],
        "evaluation_interval": "1m",
        "tests": [
            {
                "interval": "1m",
                "input_series": [
                    _series("paused", "1x20"),
                    {
                        "series": 'vllm_sidecar_engine_phase{job="vllm-sidecar",'
                        'instance="other:8081",phase="sleeping"}',
                        "values": "1x20",
                    },
                ],
                "alert_rule_test": [
                    {"eval_time": "10m", "alertname": "VllmSidecarEngineNotServing"},
                    {
                        "eval_time": "16m",
                        "alertname": "VllmSidecarEngineNotServing",
                        "exp_alerts": [
                            {
                                "exp_labels": {
                                    "job": "vllm-sidecar",
                                    "instance": "pod:8081",
                                    "phase": "paused",
                                    "severity": "warning",
                                },
                                "exp_annotations": {
                                    "summary": summary,
                                    "description": rule["annotations"]["description"],
                                },
                            }
                        ],
                    },
                ],
            }
        ],
    }
    path = tmp_path / "tests.yml"
    path.write_text(yaml.safe_dump(tests))
    result = run(tool("promtool"), "test", "rules", str(path))
    assert result.returncode == 0, result.stdout + result.stderr
