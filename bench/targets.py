"""What the bench runs: the fake upstream and each proxy under test (install, start)."""

from __future__ import annotations

import functools
import itertools
import json
import shlex
import shutil
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from procs import Child, free_port, http, spawn, wait_until

BENCH = Path(__file__).resolve().parent
ROOT = BENCH.parent
SERVED = "Qwen2.5-0.5B"
HF_PATH = "Qwen/Qwen2.5-0.5B"
NGINX_MODULES = Path("/usr/lib/nginx/modules/ngx_http_lua_module.so")


@dataclass
class Env:
    """Where a run keeps its files and which cores it uses."""

    run_dir: Path
    load_cpus: str | None
    proxy_cpus: str | None
    upstream_url: str = ""


@dataclass
class Running:
    url: str
    child: Child | None  # None: nothing runs for this target (direct)
    version: str


def _render(template: Path, out: Path, **values: str) -> Path:
    text = template.read_text()
    for key, value in values.items():
        text = text.replace(f"@@{key}@@", value)
    out.write_text(text)
    return out


def _completion_ok(url: str, model: str) -> bool:
    body = json.dumps({"model": model, "prompt": [1, 2, 3], "max_tokens": 1}).encode()
    status, _, _ = http("POST", url + "/v1/completions", body, timeout=5)
    return status == 200


def start_upstream(env: Env) -> Child:
    port = free_port()
    conf = _render(
        BENCH / "upstream" / "nginx.conf.in",
        env.run_dir / "upstream.conf",
        DIR=str(env.run_dir),
        LUA_DIR=str(BENCH / "upstream"),
        PORT=str(port),
    )
    child = spawn(
        "upstream",
        ["nginx", "-p", str(env.run_dir), "-c", str(conf)],
        cpus=env.load_cpus,
        log=env.run_dir / "upstream.log",
    )
    env.upstream_url = f"http://127.0.0.1:{port}"
    wait_until(lambda: _completion_ok(env.upstream_url, SERVED), child, 15, "fake upstream")
    return child


def _version(python: Path, dist: str) -> str:
    out = subprocess.run(
        [str(python), "-c", f"import importlib.metadata as m; print(m.version({dist!r}))"],
        capture_output=True,
        text=True,
        check=False,
    )
    return out.stdout.strip() or "?"


def _nginx_version() -> str:
    out = subprocess.run(["nginx", "-v"], capture_output=True, text=True, check=False)
    return out.stderr.strip().rpartition("/")[2] or "?"


def start_direct(env: Env) -> Running:
    return Running(env.upstream_url, None, "-")


def start_nginx(env: Env) -> Running:
    port = free_port()
    conf = _render(
        BENCH / "proxies" / "nginx-proxy.conf.in",
        env.run_dir / "nginx-proxy.conf",
        DIR=str(env.run_dir),
        PORT=str(port),
        UPSTREAM_PORT=env.upstream_url.rpartition(":")[2],
    )
    argv = ["nginx", "-p", str(env.run_dir), "-c", str(conf)]
    child = spawn("nginx", argv, cpus=env.proxy_cpus, log=env.run_dir / "nginx-proxy.log")
    url = f"http://127.0.0.1:{port}"
    wait_until(lambda: _completion_ok(url, SERVED), child, 15, "nginx proxy")
    return Running(url, child, _nginx_version())


def start_baseline(env: Env, *, low_level: bool = False) -> Running:
    port = free_port()
    python = ROOT / ".venv" / "bin" / "python"
    argv = [str(python), str(BENCH / "proxies" / "baseline_proxy.py")]
    argv += ["--upstream-url", env.upstream_url, "--port", str(port)]
    argv += ["--alias", f"{HF_PATH}={SERVED}"]
    name = "baseline-ll" if low_level else "baseline"
    argv += ["--low-level"] if low_level else []
    child = spawn(name, argv, cpus=env.proxy_cpus, log=env.run_dir / f"{name}.log")
    url = f"http://127.0.0.1:{port}"
    wait_until(lambda: _completion_ok(url, HF_PATH), child, 30, "aiohttp baseline")
    return Running(url, child, "aiohttp " + _version(python, "aiohttp"))


def start_raw(env: Env) -> Running:
    """The floor without aiohttp (bench/proxies/raw_proxy.py): the baseline's work on asyncio
    protocols and httptools."""
    port = free_port()
    python = ROOT / ".venv" / "bin" / "python"
    argv = [str(python), str(BENCH / "proxies" / "raw_proxy.py")]
    argv += ["--upstream-url", env.upstream_url, "--port", str(port)]
    argv += ["--alias", f"{HF_PATH}={SERVED}"]
    child = spawn("raw", argv, cpus=env.proxy_cpus, log=env.run_dir / "raw.log")
    url = f"http://127.0.0.1:{port}"
    wait_until(lambda: _completion_ok(url, HF_PATH), child, 30, "raw asyncio proxy")
    return Running(url, child, "httptools " + _version(python, "httptools"))


def start_router(env: Env) -> Running:
    venv = ROOT / ".venv-bench-router"
    port = free_port()
    argv = [str(venv / "bin" / "vllm-router"), "--host", "127.0.0.1", "--port", str(port)]
    argv += ["--worker-urls", env.upstream_url, "--policy", "round_robin"]
    argv += ["--prometheus-port", str(free_port()), "--worker-startup-check-interval", "1"]
    argv += ["--log-level", "warning"]
    child = spawn("router", argv, cpus=env.proxy_cpus, log=env.run_dir / "router.log")
    url = f"http://127.0.0.1:{port}"
    wait_until(lambda: _completion_ok(url, SERVED), child, 60, "vllm-router")
    return Running(url, child, _version(venv / "bin" / "python", "vllm-router"))


def start_litellm(env: Env) -> Running:
    venv = ROOT / ".venv-bench-litellm"
    port = free_port()
    conf = _render(
        BENCH / "proxies" / "litellm.yaml.in",
        env.run_dir / "litellm.yaml",
        UPSTREAM=env.upstream_url,
    )
    argv = [str(venv / "bin" / "litellm"), "--config", str(conf), "--host", "127.0.0.1"]
    argv += ["--port", str(port), "--num_workers", "1"]
    extra = {
        # No master key, like every other target here (no auth work on the hot path).
        "LITELLM_DANGEROUSLY_PERMIT_WEAK_OR_UNSET_MASTER_KEY": "true",
        "LITELLM_LOCAL_MODEL_COST_MAP": "True",  # no network at start
        "LITELLM_LOG": "ERROR",
        "LITELLM_TELEMETRY": "False",
    }
    child = spawn("litellm", argv, cpus=env.proxy_cpus, log=env.run_dir / "litellm.log", env=extra)
    url = f"http://127.0.0.1:{port}"
    wait_until(lambda: _completion_ok(url, HF_PATH), child, 180, "LiteLLM proxy")
    return Running(url, child, _version(venv / "bin" / "python", "litellm"))


def start_sidecar(
    env: Env,
    wrap: tuple[list[str], dict[str, str]] | None = None,
    extra_args: tuple[str, ...] = (),
    extra_env: dict[str, str] | None = None,
    name: str = "sidecar",
    cpus: str | None = None,
) -> Running:
    """The sidecar as users run it; `wrap` runs it under a profiler (python -m pyinstrument).
    `cpus`: its cores, when not the proxy's (several workers)."""
    port, admin = free_port(), free_port()
    python = ROOT / ".venv" / "bin" / "python"
    flags = ["--upstream-url", env.upstream_url, "--host", "127.0.0.1"]
    flags += ["--port", str(port), "--admin-port", str(admin), *extra_args]
    argv = [str(ROOT / ".venv" / "bin" / "vllm-sidecar"), *flags]
    extra_env = dict(extra_env or {})
    if wrap:
        argv = [str(python), *wrap[0], "-m", "proxy", *flags]
        extra_env.update(wrap[1])
    log = env.run_dir / f"{name}.log"
    child = spawn(name, argv, cpus=cpus or env.proxy_cpus, log=log, env=extra_env)
    ready = f"http://127.0.0.1:{admin}/readyz"
    wait_until(lambda: http("GET", ready, timeout=5)[0] == 200, child, 60, f"{name} /readyz")
    return Running(f"http://127.0.0.1:{port}", child, _version(python, "vllm-sidecar"))


@dataclass(frozen=True)
class Target:
    name: str
    label: str
    aliasing: bool  # sent the HF path, must rewrite it to the served name
    start: Callable[[Env], Running]
    missing: Callable[[], str | None]  # why it cannot run here, or None
    install: Callable[[], None] | None = None
    one_round: bool = False  # so slow that a second round would only cost time (LiteLLM)
    workers: int = 0  # the sidecar's --workers, for the scaling table (0: not a scaling target)
    cpus: str | None = None  # its cores, when not the proxy's


def sidecar_variant(label: str, spec: str) -> Target:
    """The sidecar with extra flags (and leading NAME=VALUE environment), timed beside the default.

    `quiet=--log-level warning`; `patched=PYTHONPATH=/tmp/copy` runs a patched copy of proxy/.
    """
    words = shlex.split(spec)
    env = dict(w.split("=", 1) for w in itertools.takewhile(_is_assignment, words))
    flags = tuple(words[len(env) :])
    return Target(
        f"sidecar-{label}",
        f"vllm-sidecar {spec}",
        True,
        lambda e: start_sidecar(e, extra_args=flags, extra_env=env, name=f"sidecar-{label}"),
        _need(ROOT / ".venv" / "bin" / "vllm-sidecar", "bash scripts/test-env.sh"),
    )


def sidecar_workers(count: int, cpus: str) -> Target:
    """The sidecar with `--workers count` on `cpus` (as many cores), for the scaling table."""
    return Target(
        f"sidecar-w{count}",
        f"vllm-sidecar --workers {count} (CPU {cpus})",
        True,
        lambda e: start_sidecar(
            e, extra_args=("--workers", str(count)), name=f"sidecar-w{count}", cpus=cpus
        ),
        _need(ROOT / ".venv" / "bin" / "vllm-sidecar", "bash scripts/test-env.sh"),
        workers=count,
        cpus=cpus,
    )


def _is_assignment(word: str) -> bool:
    name, eq, _ = word.partition("=")
    return bool(eq) and name.isidentifier() and not word.startswith("-")


def _need(path: Path, hint: str) -> Callable[[], str | None]:
    return lambda: None if path.exists() else f"{path.relative_to(ROOT)} missing ({hint})"


def _nginx_missing() -> str | None:
    return None if shutil.which("nginx") else "nginx not installed"


def _peer_installer(venv_name: str, requirement: str) -> Callable[[], None]:
    def install() -> None:
        venv = ROOT / venv_name
        python = shutil.which("python3.11") or sys.executable
        if not (venv / "bin" / "python").exists():
            subprocess.run([python, "-m", "venv", str(venv)], check=True)
        print(f"installing {requirement} into {venv_name} ...", flush=True)
        subprocess.run(
            [str(venv / "bin" / "pip"), "install", "-q", requirement],
            check=True,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )

    return install


def install_chart() -> None:
    """matplotlib for bench/chart.py, in .venv-bench-chart (pinned beside the peers)."""
    _peer_installer(".venv-bench-chart", _pinned("matplotlib"))()


def _pinned(name: str) -> str:
    for line in (BENCH / "proxies" / "requirements-peers.txt").read_text().splitlines():
        if line.startswith(name):
            return line.strip()
    raise KeyError(name)


TARGETS: dict[str, Target] = {
    t.name: t
    for t in (
        Target("direct", "direct to upstream (no proxy)", False, start_direct, lambda: None),
        Target("nginx", "nginx proxy_pass (keepalive)", False, start_nginx, _nginx_missing),
        Target(
            "router",
            "vllm-router (Rust)",
            False,
            start_router,
            _need(ROOT / ".venv-bench-router" / "bin" / "vllm-router", "peer, installed on demand"),
            _peer_installer(".venv-bench-router", _pinned("vllm-router")),
        ),
        Target(
            "litellm",
            "LiteLLM proxy (1 worker)",
            True,
            start_litellm,
            _need(ROOT / ".venv-bench-litellm" / "bin" / "litellm", "peer, installed on demand"),
            _peer_installer(".venv-bench-litellm", _pinned("litellm")),
            one_round=True,
        ),
        Target(
            "baseline",
            "minimal aiohttp proxy (uvloop)",
            True,
            start_baseline,
            _need(ROOT / ".venv" / "bin" / "python", "bash scripts/test-env.sh"),
        ),
        Target(
            "baseline-ll",
            "minimal aiohttp proxy, low-level web_server.Server",
            True,
            functools.partial(start_baseline, low_level=True),
            _need(ROOT / ".venv" / "bin" / "python", "bash scripts/test-env.sh"),
        ),
        Target(
            "raw",
            "minimal asyncio + httptools proxy (no aiohttp)",
            True,
            start_raw,
            _need(ROOT / ".venv" / "bin" / "python", "bash scripts/test-env.sh"),
        ),
        Target(
            "sidecar",
            "vllm-sidecar",
            True,
            start_sidecar,
            _need(ROOT / ".venv" / "bin" / "vllm-sidecar", "bash scripts/test-env.sh"),
        ),
    )
}
