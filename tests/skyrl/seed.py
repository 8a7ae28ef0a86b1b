"""The seed scenario, reusable by any suite: SkyRL 0.2.0's own classes generating from a URL.

``generate_via_skyrl(url, model_name, tokenizer)`` builds SkyRL's ``InferenceEngineClient`` over
one remote engine (stock ``RemoteInferenceEngine`` unless ``engine_cls`` says otherwise) exactly
as SkyRL's trainer does, and runs one batched ``generate``. Against a vLLM serving
``--served-model-name Qwen2.5-0.5B`` with the HF path as the name it ends in SkyRL's
``IndexError`` (SkyRL issue #1672); through the sidecar it succeeds; with
``SidecarInferenceEngine`` and an unknown name it raises ``SidecarError``.

Importing this module imports skyrl (see ``_import_skyrl`` for Python 3.11).
"""

from __future__ import annotations

import importlib
import sys
import traceback
import typing
from dataclasses import dataclass
from typing import Any

import typing_extensions

SKYRL_MODULES = (
    "skyrl.backends.skyrl_train.inference_engines.base",
    "skyrl.backends.skyrl_train.inference_engines.remote_inference_engine",
    "skyrl.backends.skyrl_train.inference_engines.inference_engine_client",
    "skyrl.backends.skyrl_train.weight_sync",
    "skyrl.train.config",
)


def _import_skyrl() -> None:
    """Import skyrl 0.2.0 on Python 3.11, where it does not import as released.

    skyrl.tinker.types (pulled in by every skyrl.backends import) builds pydantic models over
    ``typing.TypedDict``, which pydantic refuses before Python 3.12 ("use
    typing_extensions.TypedDict"). That is SkyRL's bug, and users on 3.12+ never meet it, so the
    product must not paper over it; the test venv is 3.11, so only here, and only for the
    duration of this import, ``typing.TypedDict`` is swapped for typing_extensions' version.
    """
    if sys.version_info >= (3, 12) or "skyrl.train.config" in sys.modules:
        return
    original = typing.TypedDict
    typing.TypedDict = typing_extensions.TypedDict  # type: ignore[assignment]
    try:
        for module in SKYRL_MODULES:
            importlib.import_module(module)
    finally:
        typing.TypedDict = original  # type: ignore[misc]


_import_skyrl()

from skyrl.backends.skyrl_train.inference_engines.inference_engine_client import (  # noqa: E402
    InferenceEngineClient,
)
from skyrl.backends.skyrl_train.inference_engines.remote_inference_engine import (  # noqa: E402
    RemoteInferenceEngine,
)
from skyrl.train.config import InferenceEngineConfig, SkyRLLoraConfig  # noqa: E402

from proxy.skyrl import SidecarError, SidecarInferenceEngine  # noqa: E402

# Two prompts of token ids: one request, two choices, as SkyRL batches them.
SEED_PROMPTS = [[1, 2, 3], [4, 5]]


def make_client(
    engines: list[Any], tokenizer: Any, model_path: str, **engine_cfg: Any
) -> InferenceEngineClient:
    """SkyRL's client over ``engines``, configured as the trainer's legacy path does."""
    cfg = InferenceEngineConfig(
        run_engines_locally=False,
        remote_urls=[engine.url.removeprefix("http://") for engine in engines],
        **engine_cfg,
    )
    return InferenceEngineClient(engines, tokenizer, model_path, SkyRLLoraConfig(), cfg)


async def generate_via_skyrl(
    url: str,
    model_name: str,
    tokenizer: Any,
    *,
    engine_cls: type[Any] = RemoteInferenceEngine,
    prompts: list[list[int]] | None = None,
    max_tokens: int = 4,
) -> dict[str, Any]:
    """One batched ``InferenceEngineClient.generate`` on ``url`` (``host:port``, SkyRL style)."""
    engine = engine_cls(url=url, model_name=model_name, engine_backend="vllm", tokenizer=tokenizer)
    client = make_client([engine], tokenizer, model_name)
    batch = {
        "prompts": None,
        "prompt_token_ids": prompts or SEED_PROMPTS,
        "sampling_params": {"max_tokens": max_tokens, "temperature": 0.0},
    }
    output: dict[str, Any] = await client.generate(batch)
    return output


@dataclass
class SeedOutcome:
    """What the three runs of :func:`check_seed` gave, for assertions and for the record."""

    index_error: str  # the stock classes asking vLLM directly: the formatted traceback
    through_sidecar: dict[str, Any]  # the stock classes through the sidecar: the output
    sidecar_error: SidecarError  # SidecarInferenceEngine asking for an unserved name


async def check_seed(
    vllm: str, sidecar: str, requested: str, unserved: str, tokenizer: Any, served: list[str]
) -> SeedOutcome:
    """The seed before and after, against any vLLM (``host:port``) and a sidecar in front of it.

    ``requested`` is a name vLLM does not serve but the sidecar resolves (the HF or local path
    the model was loaded from); ``unserved`` resolves to nothing; ``served`` is what vLLM serves.
    Raises AssertionError when any of the three runs ends differently from what this project
    documents: IndexError direct, success through the sidecar, SidecarError with the upstream's
    404 text and the served names from SidecarInferenceEngine (via InferenceEngineClient).
    """
    try:
        output = await generate_via_skyrl(vllm, requested, tokenizer)
    except IndexError:
        index_error = traceback.format_exc()
    else:
        raise AssertionError(f"the seed no longer fails on skyrl 0.2.0: {output}")
    fixed = await generate_via_skyrl(sidecar, requested, tokenizer)
    n = len(SEED_PROMPTS)
    assert len(fixed["responses"]) == len(fixed["response_ids"]) == n, fixed
    assert all(isinstance(text, str) for text in fixed["responses"]), fixed
    try:
        await generate_via_skyrl(sidecar, unserved, tokenizer, engine_cls=SidecarInferenceEngine)
    except SidecarError as exc:
        error = exc
    else:
        raise AssertionError(f"SidecarInferenceEngine accepted the unserved name {unserved!r}")
    text = str(error)
    assert error.status == 404, repr(error)
    assert f"`{unserved}` does not exist" in text, text
    assert all(name in text for name in served), text
    assert "\n" not in text, text
    return SeedOutcome(index_error, fixed, error)
