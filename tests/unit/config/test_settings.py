"""Settings from flags and environment; bad values exit 2 with one line naming the setting."""

from __future__ import annotations

import logging
import subprocess
import sys
from pathlib import Path

import pytest

from proxy.config.settings import load
from proxy.observe import logs


def test_defaults_match_the_design() -> None:
    s = load([])
    assert s.upstream_url == "http://127.0.0.1:8000"
    assert (s.host, s.port, s.admin_port) == ("0.0.0.0", 8080, 8081)
    assert s.served_model_names is None
    assert s.aliases == {}
    assert s.case_insensitive is True
    assert s.discovery_interval == 30
    assert s.connect_timeout == 10
    assert s.read_timeout is None
    assert s.max_body_bytes == 64 * 1024 * 1024
    assert s.max_connections == 0
    assert s.shutdown_grace == 25
    assert (s.log_level, s.log_format) == ("info", "text")


def test_flags() -> None:
    s = load(
        [
            "--upstream-url",
            "http://vllm:8000/",
            "--aliases",
            "policy=Qwen2.5-0.5B,ref=x",
            "--served-model-names",
            "a,b",
            "--no-case-insensitive",
            "--read-timeout",
            "30",
            "--max-body-bytes",
            "1024",
            "--log-format",
            "json",
        ]
    )
    assert s.upstream_url == "http://vllm:8000"
    assert s.aliases == {"policy": "Qwen2.5-0.5B", "ref": "x"}
    assert s.served_model_names == ["a", "b"]
    assert s.case_insensitive is False
    assert s.read_timeout == 30
    assert s.max_body_bytes == 1024


def test_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("VLLM_SIDECAR_UPSTREAM_URL", "https://h:1")
    monkeypatch.setenv("VLLM_SIDECAR_ALIASES", "a=b")
    monkeypatch.setenv("VLLM_SIDECAR_SERVED_MODEL_NAMES", "m")
    monkeypatch.setenv("VLLM_SIDECAR_CASE_INSENSITIVE", "false")
    monkeypatch.setenv("VLLM_SIDECAR_READ_TIMEOUT", "none")
    s = load([])
    assert (s.upstream_url, s.aliases, s.served_model_names) == ("https://h:1", {"a": "b"}, ["m"])
    assert s.case_insensitive is False
    assert s.read_timeout is None


def test_access_log_switch() -> None:
    access = logging.getLogger("proxy.access")
    try:
        logs.setup("info", "text", access_log=False)
        assert not access.isEnabledFor(logging.INFO)
        assert logging.getLogger("proxy.upstream.discovery").isEnabledFor(logging.INFO)
        logs.setup("info", "text", access_log=True)
        assert access.isEnabledFor(logging.INFO)
    finally:
        logs.setup("info", "text")


def test_flag_beats_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("VLLM_SIDECAR_PORT", "1")
    assert load(["--port", "2"]).port == 2


def _cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "proxy", *args],
        capture_output=True,
        text=True,
        timeout=60,
        env={"PATH": "/usr/bin:/bin", **(env or {})},
    )


@pytest.mark.parametrize(
    ("args", "env", "named"),
    [
        (["--port", "abc"], None, "--port / VLLM_SIDECAR_PORT"),
        ([], {"VLLM_SIDECAR_ADMIN_PORT": "70000"}, "--admin-port / VLLM_SIDECAR_ADMIN_PORT"),
        (["--upstream-url", "ftp://x"], None, "--upstream-url"),
        (["--aliases", "novalue"], None, "--aliases"),
        (["--connect-timeout", "-1"], None, "--connect-timeout"),
        (["--log-format", "xml"], None, "--log-format"),
    ],
)
def test_bad_values_exit_2_with_one_line(
    args: list[str], env: dict[str, str] | None, named: str
) -> None:
    proc = _cli(*args, env=env)
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert named in lines[-1], proc.stderr


def test_unknown_flag_exits_2() -> None:
    proc = _cli("--no-such-flag")
    assert proc.returncode == 2
    assert "unrecognized arguments: --no-such-flag" in proc.stderr


def test_help_lists_every_setting() -> None:
    out = _cli("--help").stdout
    for flag in (
        "--upstream-url",
        "--served-model-names",
        "--aliases",
        "--case-insensitive",
        "--discovery-interval",
        "--read-timeout",
        "--max-body-bytes",
        "--max-connections",
        "--shutdown-grace",
        "--log-format",
        "--phase-hold-timeout",
        "--phase-hold-queue",
        "--phase-long-after",
        "--continue-aborted",
        "--continue-max",
        "--control-token",
        "--control-token-file",
    ):
        assert flag in out


def test_lifecycle_defaults_and_the_control_token(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    s = load([])
    # Planned phases are waited out: no deadline unless one is asked for.
    assert (s.phase_hold_timeout, s.phase_hold_queue, s.phase_long_after) == (None, 8192, 600)
    assert s.control_secret() is None
    assert load(["--phase-hold-timeout", "0"]).phase_hold_timeout == 0
    assert load(["--phase-hold-timeout", "45"]).phase_hold_timeout == 45
    monkeypatch.setenv("VLLM_SIDECAR_PHASE_HOLD_TIMEOUT", "none")
    assert load([]).phase_hold_timeout is None
    monkeypatch.delenv("VLLM_SIDECAR_PHASE_HOLD_TIMEOUT")
    monkeypatch.setenv("VLLM_SIDECAR_CONTROL_TOKEN", "from-env")
    token = load([])
    assert token.control_secret() == b"from-env"
    assert "from-env" not in repr(token)  # a secret stays out of logs and tracebacks
    monkeypatch.delenv("VLLM_SIDECAR_CONTROL_TOKEN")
    path = tmp_path / "token"
    path.write_text("from-file\n")
    assert load(["--control-token-file", str(path)]).control_secret() == b"from-file"


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["--control-token", "a", "--control-token-file", "/etc/hostname"], "not both"),
        (["--control-token-file", "/no/such/file"], "cannot read --control-token-file"),
        (["--phase-hold-timeout", "-1"], "--phase-hold-timeout"),
    ],
)
def test_bad_lifecycle_settings_exit_2(args: list[str], says: str) -> None:
    proc = _cli(*args)
    assert proc.returncode == 2
    assert says in proc.stderr.strip().splitlines()[-1], proc.stderr


def test_upstream_client_choice() -> None:
    assert load([]).upstream_client == "lean"
    assert load(["--upstream-client", "aiohttp"]).upstream_client == "aiohttp"
    proc = subprocess.run(
        [sys.executable, "-m", "proxy", "--upstream-client", "curl"], capture_output=True
    )
    assert proc.returncode == 2
    assert b"upstream" in proc.stderr
