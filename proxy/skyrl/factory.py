"""create_sidecar_engines_from_config: SkyRL's remote-engine factory with served_model_name."""

from __future__ import annotations

from typing import Any

from proxy.skyrl.engine import SidecarInferenceEngine


def create_sidecar_engines_from_config(cfg: Any, tokenizer: Any) -> list[SidecarInferenceEngine]:
    """One engine per ``generator.inference_engine.remote_urls`` entry (a sidecar's host:port).

    The model name sent is ``generator.inference_engine.served_model_name`` when set, else
    ``trainer.policy.model.path`` (which the sidecar resolves to the name vLLM serves). SkyRL's
    own ``create_remote_inference_engines`` cannot be reused because it hard-codes its class,
    and its ``..._from_config`` sits in ``skyrl.train.entrypoints.main_base``, whose import starts
    Ray machinery and forces the ``spawn`` start method process-wide. ``cfg`` may be SkyRL's
    ``SkyRLTrainConfig`` or an OmegaConf config with the same fields.
    """
    ie_cfg = cfg.generator.inference_engine
    model_name = ie_cfg.served_model_name or cfg.trainer.policy.model.path
    return [
        SidecarInferenceEngine(
            url=url,
            model_name=model_name,
            engine_backend=ie_cfg.backend,
            tokenizer=tokenizer,
            tp_size=ie_cfg.tensor_parallel_size,
            pp_size=ie_cfg.pipeline_parallel_size,
            dp_size=ie_cfg.data_parallel_size,
            ep_size=ie_cfg.expert_parallel_size,
        )
        for url in ie_cfg.remote_urls
    ]
