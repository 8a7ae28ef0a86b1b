"""SkyRL 0.4's own vllm-router over given servers, as `external_server_urls` starts it.

Run as `python -m tests.skyrl04.router URL_FILE SERVER_URL...`: SkyRL's `build_router_args` and
`VLLMRouter` (skyrl/backends/skyrl_train/inference_servers/setup.py does the same), the
router's URL written to URL_FILE once its /health answers, then serving until SIGTERM.

Two things stand between SkyRL 0.4.0 as released and a router that starts, neither in skyrl's
files (docs/skyrl.md gives users the same fix):
- `VLLMRouter.start()` reads `RouterArgs.pd_disaggregation`, which vllm-router dropped in 0.1.15
  (0.1.17 is the newest): defined on the class, not the instance, since every instance
  attribute is handed to the router's Rust constructor, which refuses unknown ones.
- SkyRL imports `ray` only to learn the node's address for the router's URL; this test venv has
  no ray, so a stand-in answers loopback (nothing here may talk to another address).
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import types


def _loopback_ray() -> None:
    try:
        import ray
    except ImportError:
        ray = types.ModuleType("ray")
        util = types.ModuleType("ray.util")
        util.get_node_ip_address = lambda: "127.0.0.1"  # type: ignore[attr-defined]
        ray.util = util  # type: ignore[attr-defined]
        sys.modules["ray"], sys.modules["ray.util"] = ray, util


def fix_router_args() -> None:
    """SkyRL 0.4.0 with vllm-router >= 0.1.15: the attribute `VLLMRouter.start()` reads."""
    from vllm_router.router_args import RouterArgs

    if not hasattr(RouterArgs, "pd_disaggregation"):
        RouterArgs.pd_disaggregation = False  # type: ignore[attr-defined]


def main(url_file: str, server_urls: list[str]) -> int:
    _loopback_ray()
    fix_router_args()
    from skyrl.backends.skyrl_train.inference_servers.utils import build_router_args
    from skyrl.backends.skyrl_train.inference_servers.vllm_router import VLLMRouter
    from skyrl.train.config import InferenceEngineConfig

    config = InferenceEngineConfig(run_engines_locally=False, external_server_urls=server_urls)
    router = VLLMRouter(build_router_args(config, server_urls=server_urls))
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    try:
        url = router.start()  # returns once the router's /health answers 200
        with open(url_file + ".tmp", "w") as out:
            out.write(url)
        os.replace(url_file + ".tmp", url_file)
        while not stop.wait(1.0):
            if router._process is None or not router._process.is_alive():
                return 1
        return 0
    finally:
        router.shutdown()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2:]))
