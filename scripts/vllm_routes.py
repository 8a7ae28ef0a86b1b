"""Print the HTTP routes a vLLM release mounts, as JSON: run it with that release's python.

Two sources, merged, so that a route behind an option or an optional package is not missed:
- the FastAPI app vLLM's own `build_app` makes with every optional router switched on (dev
  mode, scale-out, fault tolerance, runtime LoRA, the profiler, the tokenizer info), for every
  task that needs no model; and the module-level router of each `api_router` module (the
  pooling routers are only mounted for a loaded model);
- the route paths written in vLLM's source (`@router.post("/x")`, `add_api_route("/x", ...)`),
  for the routers mounted inside functions that need a package or a variable (Cohere's).

Building the app needs no engine, no model and no GPU. scripts/vllm-routes.sh writes the output
to tests/unit/core/vllm_routes/<version>.json (it fetches a release that is not installed), and
tests/unit/core/test_vllm_routes.py fails on any route there the table does not name.
"""

from __future__ import annotations

import importlib
import json
import os
import pkgutil
import re
import sys
from pathlib import Path
from typing import Any

# Every optional router on (read by vLLM's envs at import); the CPU platform, so that a GPU
# wheel's source builds its app on a machine without one.
os.environ.update(
    VLLM_SERVER_DEV_MODE="1",
    VLLM_ALLOW_RUNTIME_LORA_UPDATING="1",
    VLLM_ENABLE_COHERE_API="1",
    VLLM_TARGET_DEVICE="cpu",
)

_DECORATED = re.compile(
    r"""(?:\.(get|post|put|patch|delete|websocket|api_route)|add_api_route|add_websocket_route)"""
    r"""\(\s*["'](/[^"']*)["']""",
)
_TASKS = ("generate", "render", "transcription", "realtime")
Routes = dict[str, set[str]]  # path -> methods (WEBSOCKET for a WebSocket, * for a mount or any)


def built() -> Routes:
    from vllm.entrypoints.launchers.app import build_app
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    args = _parser().make_arg_parser(FlexibleArgumentParser()).parse_args([])
    for name in ("enable_scale_out", "enable_fault_tolerance", "enable_tokenizer_info_endpoint"):
        setattr(args, name, True)
    args.profiler_config = _profiler()
    return _of(build_app(args, supported_tasks=_TASKS).routes)


def _parser() -> Any:
    # 0.32 keeps the server's arguments in launchers/, 0.33 in common/.
    try:
        return importlib.import_module("vllm.entrypoints.launchers.cli_args")
    except ModuleNotFoundError:
        return importlib.import_module("vllm.entrypoints.common.cli_args")


def _profiler() -> Any:
    from vllm.config import ProfilerConfig

    # Only its presence mounts the routes; nothing is profiled, nothing written.
    return ProfilerConfig(profiler="torch", torch_profiler_dir="/tmp")


def module_routers() -> Routes:
    import vllm.entrypoints as root
    from fastapi import APIRouter

    found: Routes = {}
    for info in pkgutil.walk_packages(root.__path__, "vllm.entrypoints."):
        if info.name.rsplit(".", 1)[-1] != "api_router":
            continue
        for value in vars(importlib.import_module(info.name)).values():
            if isinstance(value, APIRouter):
                _merge(found, _of(value.routes))
    return found


def _of(routes: Any) -> Routes:
    from starlette.routing import Mount, WebSocketRoute

    found: Routes = {}
    for route in routes:
        if isinstance(route, Mount):
            methods = {"*"}
        elif isinstance(route, WebSocketRoute):
            methods = {"WEBSOCKET"}
        else:
            methods = set(route.methods or ()) - {"HEAD"}  # Starlette adds HEAD to each GET
        found.setdefault(route.path, set()).update(methods)
    return found


def written() -> Routes:
    import vllm.entrypoints as root

    found: Routes = {}
    for folder in root.__path__:
        for source in Path(folder).rglob("*.py"):
            for verb, path in _DECORATED.findall(source.read_text(encoding="utf-8")):
                method = "*" if verb in ("", "api_route") else verb.upper()
                found.setdefault(path, set()).add(method)
    return found


def _merge(into: Routes, more: Routes) -> None:
    for path, methods in more.items():
        into.setdefault(path, set()).update(methods)


def main() -> None:
    import vllm

    routes = built()
    _merge(routes, module_routers())
    for path, methods in written().items():
        routes.setdefault(path, methods)  # the methods an app knows are the better source
    # One route a line, so that a release's diff reads route by route.
    lines = [f"  {json.dumps(p)}: {json.dumps(sorted(m))}" for p, m in sorted(routes.items())]
    version = vllm.__version__.split("+")[0]  # 0.32.0+cpu is 0.32.0's routes
    sys.stdout.write(f'{{"vllm": "{version}", "routes": {{\n' + ",\n".join(lines) + "\n}}\n")


if __name__ == "__main__":
    main()
