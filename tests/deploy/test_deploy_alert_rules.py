"""Alert rules exercised with promtool's rule unit tests: they fire when they should, only then."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from .promtool import annotations, promtool_test

LABELS = 'job="vllm-sidecar",instance="pod:8081"'


def _series(phase: str, values: str) -> dict[str, str]:
    return {"series": f'vllm_sidecar_engine_phase{{{LABELS},phase="{phase}"}}', "values": values}


def test_engine_not_serving_fires_for_a_long_pause_and_never_for_sleep(tmp_path: Path) -> None:
    # The sidecar's own flag (--phase-long-after) says when a phase has lasted long; it is
    # labelled with the current phase. Paused for 20 minutes, long from the 10th; in a weight
    # sync, long from the 5th; asleep, and long, for 20 minutes; serving, never long.
    def long(instance: str, phase: str, values: str) -> dict[str, str]:
        return {
            "series": f'vllm_sidecar_engine_phase_long{{job="vllm-sidecar",'
            f'instance="{instance}",phase="{phase}"}}',
            "values": values,
        }

    def alert(instance: str, phase: str) -> dict[str, Any]:
        labels = {"job": "vllm-sidecar", "instance": instance, "phase": phase}
        return {
            "exp_labels": {**labels, "severity": "warning"},
            "exp_annotations": annotations("VllmSidecarEngineNotServing", labels),
        }

    name = "VllmSidecarEngineNotServing"
    promtool_test(
        tmp_path,
        [
            long("pod:8081", "paused", "0x9 1x10"),
            long("sync:8081", "weight_sync", "0x4 1x15"),
            long("asleep:8081", "sleeping", "1x20"),
            long("serving:8081", "serving", "0x20"),
            # The phase gauge alone (paused for 20 minutes) no longer fires anything.
            _series("paused", "1x20"),
        ],
        [
            {"eval_time": "4m", "alertname": name},
            # Long since 5m, for 1m: firing at 6m.
            {
                "eval_time": "6m",
                "alertname": name,
                "exp_alerts": [alert("sync:8081", "weight_sync")],
            },
            {
                "eval_time": "11m",
                "alertname": name,
                "exp_alerts": [alert("pod:8081", "paused"), alert("sync:8081", "weight_sync")],
            },
            {
                "eval_time": "20m",
                "alertname": name,
                "exp_alerts": [alert("pod:8081", "paused"), alert("sync:8081", "weight_sync")],
            },
        ],
    )


def test_engine_not_serving_ends_with_the_phase(tmp_path: Path) -> None:
    # Paused and long, then resumed: the series goes (the flag is labelled with the current phase)
    # and serving's is 0.
    promtool_test(
        tmp_path,
        [
            {
                "series": f'vllm_sidecar_engine_phase_long{{{LABELS},phase="paused"}}',
                "values": "1x5 stale",
            },
            {
                "series": f'vllm_sidecar_engine_phase_long{{{LABELS},phase="serving"}}',
                "values": "_x6 0x10",
            },
        ],
        [
            {
                "eval_time": "5m",
                "alertname": "VllmSidecarEngineNotServing",
                "exp_alerts": [
                    {
                        "exp_labels": {
                            "job": "vllm-sidecar",
                            "instance": "pod:8081",
                            "phase": "paused",
                            "severity": "warning",
                        },
                        "exp_annotations": annotations(
                            "VllmSidecarEngineNotServing",
                            {"job": "vllm-sidecar", "instance": "pod:8081", "phase": "paused"},
                        ),
                    }
                ],
            },
            {"eval_time": "7m", "alertname": "VllmSidecarEngineNotServing"},
        ],
    )


def _pod(
    instance: str, versions: list[tuple[str, str]], changed: str, namespace: str = "rl"
) -> list[dict[str, str]]:
    """A pod's weight version series (one per version, with its samples) and change timestamp."""
    labels = f'job="rl/vllm-sidecar",namespace="{namespace}",instance="{instance}"'
    series = [
        {"series": f'vllm_sidecar_weight_version_info{{{labels},version="{version}"}}', "values": v}
        for version, v in versions
    ]
    series.append(
        {
            "series": f"vllm_sidecar_weight_version_changed_timestamp_seconds{{{labels}}}",
            "values": changed,
        }
    )
    return series


def _synced(instance: str, at: int, namespace: str = "rl") -> list[dict[str, str]]:
    """A pod on step-1 from start-up (t=0) that moves to step-2 at 5m, its change stamped `at`."""
    return _pod(
        instance,
        [("step-1", "1x4 stale"), ("step-2", "_x5 1x25")],
        f"0x4 {at}x25",
        namespace,
    )


BEHIND = "VllmSidecarWeightVersionBehind"


def test_weight_version_behind_fires_for_a_pod_that_missed_a_sync(tmp_path: Path) -> None:
    labels = {
        "job": "rl/vllm-sidecar",
        "namespace": "rl",
        "instance": "c:8081",
        "version": "step-1",
    }
    expected = {
        "exp_labels": {**labels, "severity": "warning"},
        # The newest change (b's, at 303 s) is 303 s after c's (at start-up).
        "exp_annotations": annotations(BEHIND, labels, "5m 3s"),
    }
    promtool_test(
        tmp_path,
        [
            # a and b sync to step-2 at 5m, seconds apart; c stays on step-1.
            *_synced("a:8081", 300),
            *_synced("b:8081", 303),
            *_pod("c:8081", [("step-1", "1x30")], "0x30"),
            # Alone in its namespace, an old version is no one's business but its own.
            *_pod("d:8081", [("step-0", "1x30")], "0x30", namespace="other"),
        ],
        [
            {"eval_time": "4m", "alertname": BEHIND},
            # Behind from 5m; pending for 10 minutes.
            {"eval_time": "14m", "alertname": BEHIND},
            {"eval_time": "15m", "alertname": BEHIND, "exp_alerts": [expected]},
            {"eval_time": "25m", "alertname": BEHIND, "exp_alerts": [expected]},
        ],
    )


def test_weight_version_behind_resolves_when_the_pod_catches_up(tmp_path: Path) -> None:
    promtool_test(
        tmp_path,
        [
            *_synced("a:8081", 300),
            *_synced("b:8081", 303),
            # c misses the sync at 5m, and gets its own at 20m.
            *_pod("c:8081", [("step-1", "1x19 stale"), ("step-2", "_x20 1x10")], "0x19 1200x10"),
        ],
        [
            {
                "eval_time": "19m",
                "alertname": BEHIND,
                "exp_alerts": [
                    {
                        "exp_labels": {
                            "job": "rl/vllm-sidecar",
                            "namespace": "rl",
                            "instance": "c:8081",
                            "version": "step-1",
                            "severity": "warning",
                        },
                        "exp_annotations": annotations(
                            BEHIND,
                            {"job": "rl/vllm-sidecar", "instance": "c:8081", "version": "step-1"},
                            "5m 3s",
                        ),
                    }
                ],
            },
            {"eval_time": "20m", "alertname": BEHIND},
            {"eval_time": "30m", "alertname": BEHIND},
        ],
    )


def test_weight_version_behind_is_quiet_for_pods_that_synced_together(tmp_path: Path) -> None:
    # Three pods reach step-2 within 100 s of each other (a slow fan-out, under 2 minutes).
    promtool_test(
        tmp_path,
        [*_synced("a:8081", 300), *_synced("b:8081", 330), *_synced("c:8081", 400)],
        [{"eval_time": f"{minute}m", "alertname": BEHIND} for minute in (4, 15, 25, 30)],
    )


def test_weight_version_behind_is_quiet_for_a_sync_that_names_versions_per_pod(
    tmp_path: Path,
) -> None:
    # A trainer that names no version (SkyRL 0.4) leaves vLLM counting its own updates: a pod
    # restarted earlier counts fewer. The same sync, 100 s apart, is no pod left behind.
    promtool_test(
        tmp_path,
        [
            *_pod("a:8081", [("default+2", "1x4 stale"), ("default+3", "_x5 1x25")], "0x4 300x25"),
            *_pod("b:8081", [("default+2", "1x4 stale"), ("default+3", "_x5 1x25")], "0x4 330x25"),
            *_pod("c:8081", [("default", "1x4 stale"), ("default+1", "_x5 1x25")], "0x4 400x25"),
        ],
        [{"eval_time": f"{minute}m", "alertname": BEHIND} for minute in (4, 15, 25, 30)],
    )


def test_weight_version_behind_is_quiet_when_a_pod_restarts(tmp_path: Path) -> None:
    # All three on step-2 since 5m; c is replaced at 10m by c2, whose sidecar reads step-2 afresh
    # and stamps its start-up (600 s): the newest change, and the same version as its peers'.
    c_before = _synced("c:8081", 300)
    c_before[1]["values"] = "_x5 1x4 stale"
    c_before[2]["values"] = "0x4 300x4 stale"
    promtool_test(
        tmp_path,
        [
            *_synced("a:8081", 300),
            *_synced("b:8081", 300),
            *c_before,
            *_pod("c2:8081", [("step-2", "_x10 1x20")], "_x10 600x20"),
        ],
        [{"eval_time": f"{minute}m", "alertname": BEHIND} for minute in (9, 12, 21, 30)],
    )
