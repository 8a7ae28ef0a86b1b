"""Settings: every option a CLI flag and a VLLM_SIDECAR_* environment variable, validated."""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import Annotated, Any, Literal

from aiohttp import web
from pydantic import Field, SecretStr, ValidationError, field_validator, model_validator
from pydantic_settings import BaseSettings, CliApp, NoDecode, SettingsConfigDict
from yarl import URL

MiB = 1024 * 1024


def _split(value: Any) -> Any:
    if isinstance(value, str):
        return [part.strip() for part in value.split(",") if part.strip()]
    return value


class Settings(BaseSettings):
    """vllm-sidecar: a reverse proxy for vLLM that resolves model names and never fails silently."""

    model_config = SettingsConfigDict(
        env_prefix="VLLM_SIDECAR_",
        cli_prog_name="vllm-sidecar",
        cli_kebab_case=True,
        cli_implicit_flags=True,
        cli_enforce_required=False,
        extra="forbid",
    )

    upstream_url: str = Field("http://127.0.0.1:8000", description="the vLLM server")
    upstream_api_key: str | None = Field(
        None, description="bearer token for the sidecar's own /v1/models reads (vLLM --api-key)"
    )
    host: str = Field("0.0.0.0", description="proxy listen address")
    port: int = Field(8080, ge=0, le=65535, description="proxy port")
    admin_port: int = Field(8081, ge=0, le=65535, description="admin port")
    admin_host: str | None = Field(
        None, description="admin listen address (default: the proxy's --host; probes need it)"
    )
    served_model_names: Annotated[list[str] | None, NoDecode] = Field(
        None, description="fix the served names (comma-separated) instead of asking /v1/models"
    )
    aliases: Annotated[dict[str, str], NoDecode] = Field(
        default_factory=dict, description="extra alias=served pairs, comma-separated"
    )
    case_insensitive: bool = Field(True, description="resolve model names ignoring case too")
    discovery_interval: float = Field(30.0, gt=0, description="seconds between /v1/models reads")
    health_interval: float = Field(5.0, gt=0, description="seconds between upstream /health checks")
    miss_refresh_interval: float = Field(
        5.0, ge=0, description="least seconds between refreshes caused by unknown model names"
    )
    connect_timeout: float = Field(10.0, gt=0, description="upstream connect timeout, seconds")
    read_timeout: float | None = Field(
        None, gt=0, description="upstream socket read timeout, seconds (none: no limit)"
    )
    max_body_bytes: int = Field(64 * MiB, gt=0, description="larger request bodies get 413")
    buffer_budget_bytes: int = Field(
        96 * MiB, gt=0, description="request and response bodies held whole, all requests together"
    )
    upstream_client: Literal["lean", "aiohttp"] = Field(
        "lean", description="the proxied requests' upstream client: lean (llhttp) or aiohttp"
    )
    max_connections: int = Field(0, ge=0, description="upstream connection pool size (0: no limit)")
    pool_timeout: float = Field(
        30.0, gt=0, description="longest wait for a free pooled upstream connection, seconds"
    )
    client_header_timeout: float = Field(
        60.0, gt=0, description="a request head must be complete this long after its first byte"
    )
    client_body_timeout: float = Field(
        60.0, gt=0, description="longest pause between two reads of a request body, seconds"
    )
    client_body_min_rate: int = Field(
        1024, ge=0, description="a request body slower than this, bytes/s, is cut (0: no minimum)"
    )
    client_idle_timeout: float = Field(
        30.0, gt=0, description="an idle keep-alive client connection is closed after this"
    )
    client_send_timeout: float = Field(
        60.0, gt=0, description="longest a client may take no byte of its answer, seconds"
    )
    max_client_connections: int = Field(
        4096, gt=0, description="client connections on the proxy port (also capped by descriptors)"
    )
    error_body_bytes: int = Field(
        1 * MiB, gt=0, description="upstream error bodies kept in envelopes, the rest is cut"
    )
    workers: int = Field(
        1, ge=0, description="processes serving the proxy port (SO_REUSEPORT); 0: one per CPU"
    )
    shutdown_grace: float = Field(
        25.0, ge=0, description="seconds in-flight requests get after SIGTERM"
    )
    phase_hold_timeout: float | None = Field(
        None,
        ge=0,
        description="pod-wide deadline, seconds, for a request waiting out a pause, sleep or "
        "weight sync (none: held for as long as the phase lasts; 0: 503 at once)",
    )
    phase_hold_queue: int = Field(
        8192, ge=0, description="most requests held at once; more get 503 at once (0: no limit)"
    )
    phase_long_after: float = Field(
        600.0, gt=0, description="a pause or weight sync lasting longer is logged and alerted on"
    )
    continue_aborted: bool = Field(
        False,
        description="finish a generation an abort-mode pause or sleep cut short, from its exact"
        " tokens, once the engine serves (X-Sidecar-Continue: on|off per request)",
    )
    continue_max: int = Field(
        4, ge=0, description="most times one choice is continued after a cut (then relayed cut)"
    )
    offpolicy_alert_share: float | None = Field(
        None,
        ge=0,
        le=1,
        description="the off-policy token share above which VllmSidecarOffPolicyShareHigh fires,"
        " exported as vllm_sidecar_offpolicy_alert_share (unset: no alert)",
    )
    control_token: SecretStr | None = Field(
        None, description="bearer token every control-plane call (pause, sleep, weights) needs"
    )
    control_token_file: str | None = Field(None, description="a file holding --control-token")
    otlp_traces_endpoint: str | None = Field(
        None,
        description="OTLP/HTTP traces URL (http://collector:4318/v1/traces): a span per request"
        " and per upstream call (or OTEL_EXPORTER_OTLP_TRACES_ENDPOINT; the otel extra)",
    )
    otlp_traces_sample_ratio: float = Field(
        1.0,
        ge=0,
        le=1,
        description="share of new traces sampled; a client's sampled flag is followed",
    )
    access_log: bool = Field(True, description="one INFO line per request (logger proxy.access)")
    log_level: Literal["debug", "info", "warning", "error"] = Field("info")
    log_format: Literal["text", "json"] = Field("text")

    @field_validator("upstream_url")
    @classmethod
    def _check_url(cls, value: str) -> str:
        url = URL(value)
        if url.scheme not in ("http", "https") or not url.host:
            raise ValueError("must be an http:// or https:// URL with a host")
        return value.rstrip("/")

    @field_validator("served_model_names", mode="before")
    @classmethod
    def _names(cls, value: Any) -> Any:
        """Comma-separated names, or a list; none, or an empty list: ask /v1/models."""
        if value is None:
            return None
        return _split(value) or None

    @field_validator("aliases", mode="before")
    @classmethod
    def _aliases(cls, value: Any) -> Any:
        if isinstance(value, str | list):
            pairs = _split(value) if isinstance(value, str) else value
            out = {}
            for pair in pairs:
                alias, sep, served = str(pair).partition("=")
                if not sep or not alias.strip() or not served.strip():
                    raise ValueError(f"expected alias=served, got {pair!r}")
                out[alias.strip()] = served.strip()
            return out
        return value

    @field_validator("read_timeout", mode="before")
    @classmethod
    def _no_read_timeout(cls, value: Any) -> Any:
        """`none`, `0` or nothing: no read timeout, as when the option is absent."""
        if isinstance(value, str) and value.lower() in ("", "none", "0"):
            return None
        return value

    @field_validator("phase_hold_timeout", mode="before")
    @classmethod
    def _no_hold_deadline(cls, value: Any) -> Any:
        """`none` or nothing: no deadline (unlike --read-timeout, `0` means refuse at once)."""
        if isinstance(value, str) and value.lower() in ("", "none"):
            return None
        return value

    @model_validator(mode="after")
    def _token_file(self) -> Settings:
        if self.control_token_file is None:
            return self
        if self.control_token is not None:
            raise ValueError("set --control-token or --control-token-file, not both")
        try:
            with open(self.control_token_file, encoding="utf-8") as file:
                token = file.read().strip()
        except OSError as exc:
            raise ValueError(f"cannot read --control-token-file: {exc}") from None
        if not token:
            raise ValueError("--control-token-file is empty")
        self.control_token = SecretStr(token)
        return self

    def control_secret(self) -> bytes | None:
        token = self.control_token.get_secret_value() if self.control_token else ""
        return token.encode() or None

    def for_worker(self) -> dict[str, Any]:
        """These settings as JSON for a `--workers` process: the token itself (a dump shows a
        SecretStr as `**********`), and no token file (read once, by the supervisor)."""
        data = self.model_dump(mode="json", exclude={"control_token_file"})
        data["control_token"] = (
            self.control_token.get_secret_value() if self.control_token else None
        )
        return data


def _one_line(exc: ValidationError) -> str:
    err = exc.errors()[0]
    more = f" (and {exc.error_count() - 1} more)" if exc.error_count() > 1 else ""
    if not err["loc"]:  # a rule across settings: its message names them
        return f"vllm-sidecar: invalid settings: {err['msg']}{more}"
    name = str(err["loc"][0])
    flag = "--" + name.replace("_", "-")
    env = "VLLM_SIDECAR_" + name.upper()
    return f"vllm-sidecar: invalid {flag} / {env}: {err['msg']} (got {err.get('input')!r}){more}"


def load(argv: Sequence[str] | None = None) -> Settings:
    """Settings from the CLI and the environment; a bad value exits 2 with a one-line message."""
    args = list(sys.argv[1:] if argv is None else argv)
    try:
        return CliApp.run(Settings, cli_args=args)
    except ValidationError as exc:
        print(_one_line(exc), file=sys.stderr)
        raise SystemExit(2) from None


# Its slot on an app (aiohttp's typed key, declared beside what it holds).
SETTINGS = web.AppKey("settings", Settings)
