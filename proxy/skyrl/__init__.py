"""SkyRL companions that fail loudly: 0.2's engine or 0.4's client, whichever skyrl offers.

Nothing else in ``proxy`` imports this package; it relies only on the sidecar's public error
envelope, not on the sidecar's code. Needs ``pip install 'vllm-sidecar[skyrl]'``.
"""

from proxy.skyrl.errors import SidecarError
from proxy.skyrl.generation import CLIENT_MARKER, ENGINE_MODULE, offers, unsupported

__all__ = ["SidecarError"]

if offers(CLIENT_MARKER):  # skyrl 0.4: RemoteInferenceClient
    from proxy.skyrl.client import SidecarInferenceClient
    from proxy.skyrl.client_factory import SidecarClientMixin, create_sidecar_client_from_config
    from proxy.skyrl.retry import RetryPolicy

    __all__ += [
        "RetryPolicy",
        "SidecarClientMixin",
        "SidecarInferenceClient",
        "create_sidecar_client_from_config",
    ]
if offers(ENGINE_MODULE):  # skyrl 0.2: RemoteInferenceEngine
    from proxy.skyrl.engine import SidecarInferenceEngine
    from proxy.skyrl.factory import create_sidecar_engines_from_config

    __all__ += ["SidecarInferenceEngine", "create_sidecar_engines_from_config"]
if len(__all__) == 1:
    raise unsupported()
