"""SkyRL integration: an inference engine for the sidecar that fails loudly (needs ``[skyrl]``).

Nothing else in ``proxy`` imports this package; it relies only on the sidecar's public error
envelope, not on the sidecar's code.
"""

from proxy.skyrl.engine import SidecarInferenceEngine
from proxy.skyrl.errors import SidecarError
from proxy.skyrl.factory import create_sidecar_engines_from_config

__all__ = ["SidecarError", "SidecarInferenceEngine", "create_sidecar_engines_from_config"]
