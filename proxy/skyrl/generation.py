"""Which SkyRL generation is installed, asked of the modules themselves, not a version string."""

from __future__ import annotations

import importlib.util
from importlib import metadata

ENGINE_MODULE = "skyrl.backends.skyrl_train.inference_engines.remote_inference_engine"
# 0.2 has an early RemoteInferenceClient of another shape; 0.4's has this module beside it.
CLIENT_MARKER = "skyrl.backends.skyrl_train.inference_servers.generate_wire"
SUPPORTED = (
    "skyrl 0.2.x (RemoteInferenceEngine, proxy.skyrl.SidecarInferenceEngine) or "
    "skyrl 0.4.x (RemoteInferenceClient, proxy.skyrl.SidecarInferenceClient)"
)


def offers(module: str) -> bool:
    """``module`` exists in the installed skyrl; a dependency it lacks is raised, not hidden."""
    try:
        return importlib.util.find_spec(module) is not None
    except ModuleNotFoundError as exc:
        # A missing parent package of `module` means "not this generation"; any other missing
        # module (torch, say) is a broken install, and its own error says which.
        if exc.name and module.startswith(exc.name + "."):
            return False
        raise


def unsupported() -> ImportError:
    try:
        found = f"skyrl {metadata.version('skyrl')} is installed"
    except metadata.PackageNotFoundError:
        found = "skyrl is not installed (pip install 'vllm-sidecar[skyrl]')"
    return ImportError(f"proxy.skyrl needs {SUPPORTED}; {found}")
