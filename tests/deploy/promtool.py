"""promtool rule unit tests of the shipped rules; alert annotations as Prometheus renders them."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml

from tests.tools import tool

from .files import ALERTS, alert_rules, run


def annotations(alertname: str, labels: dict[str, str], value: str = "") -> dict[str, str]:
    """The rule's annotations as Prometheus renders them for an alert with these labels (and
    `value`, already formatted as the template formats it)."""
    [rule] = [r for r in alert_rules() if r["alert"] == alertname]
    rendered = {}
    for key, text in rule["annotations"].items():
        for name, label in labels.items():
            text = text.replace(f"{{{{ $labels.{name} }}}}", label)
        for template in ("humanizeDuration", "humanizePercentage"):
            text = text.replace(f"{{{{ $value | {template} }}}}", value)
        assert "{{" not in text, f"{alertname} {key}: a template this test does not render"
        rendered[key] = text
    return rendered


def promtool_test(
    tmp_path: Path,
    input_series: list[dict[str, str]],
    alerts: Sequence[Any] = (),
    exprs: Sequence[Any] = (),
) -> None:
    """Run one promtool rule unit test (one sample a minute) of the shipped rules: `alerts` are
    its alert_rule_test cases, `exprs` its promql_expr_test cases."""
    test: dict[str, Any] = {"interval": "1m", "input_series": input_series}
    if alerts:
        test["alert_rule_test"] = list(alerts)
    if exprs:
        test["promql_expr_test"] = list(exprs)
    tests = {"rule_files": [str(ALERTS)], "evaluation_interval": "1m", "tests": [test]}
    path = tmp_path / "tests.yml"
    path.write_text(yaml.safe_dump(tests))
    result = run(tool("promtool"), "test", "rules", str(path))
    assert result.returncode == 0, result.stdout + result.stderr
