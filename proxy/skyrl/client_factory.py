"""The 0.4 client from SkyRL's config, and a BasePPOExp hook that installs it."""

from __future__ import annotations

from typing import Any

from proxy.skyrl.client import SidecarInferenceClient


def create_sidecar_client_from_config(
    cfg: Any, tokenizer: Any = None, **options: Any
) -> SidecarInferenceClient:
    """The client SkyRL's ``build_new_inference_client`` makes for external servers, checked.

    ``generator.inference_engine.external_server_urls`` are the sidecars (the control plane fans
    out to them); the data plane goes to ``external_proxy_url`` when set, else to the one sidecar.
    Several sidecars without a proxy need SkyRL's own router: use ``SidecarClientMixin``, which
    lets SkyRL start it. ``options``: ``control_token``, ``retry``.
    """
    ie = cfg.generator.inference_engine
    servers = list(ie.external_server_urls or [])
    proxy = ie.external_proxy_url or (servers[0] if len(servers) == 1 else None)
    if proxy is None:
        raise ValueError(
            "set generator.inference_engine.external_server_urls to the sidecars' URLs (with "
            "several, also external_proxy_url, or use SidecarClientMixin to start SkyRL's router)"
        )
    return SidecarInferenceClient(
        proxy_url=proxy,
        server_urls=servers or [proxy],
        model_name=ie.served_model_name or cfg.trainer.policy.model.path,
        enable_return_routed_experts=ie.enable_return_routed_experts,
        enable_return_sample_support_set=ie.enable_return_sample_support_set,
        uses_lora_weight_sync=_uses_lora_weight_sync(cfg),
        data_parallel_size=ie.data_parallel_size,
        tokenizer=tokenizer,
        **options,
    )


def _uses_lora_weight_sync(cfg: Any) -> bool:
    # SkyRL's rule (inference_servers/utils.py), kept here: that module imports Ray and vLLM args.
    if cfg.trainer.policy.model.lora.rank <= 0:
        return False
    if cfg.trainer.strategy == "megatron":
        return not cfg.trainer.policy.megatron_config.lora_config.merge_lora
    return True


class SidecarClientMixin:
    """Put before ``BasePPOExp``: SkyRL builds its client (and router) as usual, then it is checked.

    ``class Exp(SidecarClientMixin, BasePPOExp): ...`` keeps every branch of SkyRL's own
    ``get_inference_client`` (external proxy, its vllm-router over several sidecars, colocation)
    and hands the trainer a ``SidecarInferenceClient`` with the same settings.
    """

    sidecar_options: dict[str, Any] = {}  # noqa: RUF012  # read-only; a subclass replaces it

    def get_inference_client(self) -> Any:
        client = super().get_inference_client()  # type: ignore[misc]
        if isinstance(client, SidecarInferenceClient):
            return client
        return SidecarInferenceClient.from_client(client, **self.sidecar_options)
