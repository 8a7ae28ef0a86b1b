"""SidecarInferenceEngine: SkyRL's RemoteInferenceEngine with every HTTP answer checked.

Why the parent's HTTP methods are rewritten rather than wrapped: each of them opens its own
``aiohttp.ClientSession`` inline and calls ``resp.json()`` before anything could look at the
status, so there is no per-instance seam (no session, hook or response parser to hand in). The
only way to reach those calls would be replacing the ``aiohttp`` global of SkyRL's module, which
would change every stock engine in the process. So each method below sends the parent's request
(same route and payload) through one checked ``_request``, and keeps the parent's results; two
differ on purpose: ``sleep`` and ``wake_up`` put ``level``/``mode``/``tags`` in the query, where
vLLM 0.32 reads them, and control calls carry the control token. What the parent's structure
does allow is reused as is: its constructor and ``url``/``model_name``/``tokenizer`` attributes,
its ``init_weight_update_communicator``, ``update_named_weights`` and ``teardown`` (which
delegate to the swappable ``_weight_loader``), and the base class's ``sample`` (which calls
``generate``).
"""

from __future__ import annotations

import os
from dataclasses import asdict
from typing import Any

import aiohttp
from skyrl.backends.skyrl_train.inference_engines.base import InferenceEngineOutput
from skyrl.backends.skyrl_train.inference_engines.remote_inference_engine import (
    RemoteInferenceEngine,
    RemoteWeightLoader,
)

from proxy.skyrl.checks import Answer, check_choices, check_json_object
from proxy.skyrl.transport import CONTROL_TOKEN_ENV, bearer, exchange


class SidecarInferenceEngine(RemoteInferenceEngine):
    """A remote engine (``url`` = the sidecar's ``host:port``) that raises ``SidecarError``.

    Any error envelope, status >= 400, non-JSON or wrongly shaped body, and any failure to reach
    the sidecar becomes ``SidecarError``; nothing comes back empty.
    """

    # No total limit (generations and weight syncs can be long; the parent sets none for
    # generation either), but a refused or black-holed sidecar fails fast.
    timeout = aiohttp.ClientTimeout(total=None, sock_connect=30)

    def __init__(self, *args: Any, control_token: str | None = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.control_token = control_token or os.environ.get(CONTROL_TOKEN_ENV) or None
        self._weight_loader = _SidecarWeightLoader(self)

    async def generate(self, input_batch: Any) -> Any:
        prompt_token_ids = input_batch.get("prompt_token_ids")
        if input_batch.get("prompts") is not None or prompt_token_ids is None:
            raise ValueError("the remote engine takes `prompt_token_ids`, not `prompts`")
        sampling_params = dict(input_batch.get("sampling_params") or {})
        if sampling_params.get("n", 1) > 1:
            raise ValueError(
                "n is not supported yet for remote inference engines. "
                "You can set `config.generator.n_samples_per_prompt` instead."
            )
        self._require_vllm()
        # The parent's payload: the sampling params, the model, the token-id prompts, batched.
        payload = {**sampling_params, "model": self.model_name, "prompt": prompt_token_ids}
        answer = await self._request("POST", "/v1/completions", json=payload)
        choices = check_choices(answer, check_json_object(answer), len(prompt_token_ids))
        texts = [choice["text"] for choice in choices]
        return InferenceEngineOutput(
            responses=texts,
            stop_reasons=[choice.get("finish_reason") for choice in choices],
            # As the parent: vLLM's HTTP completions give text, so the ids are re-encoded.
            response_ids=[self.tokenizer.encode(t, add_special_tokens=False) for t in texts],
            response_logprobs=None,
        )

    async def chat_completion(self, request_payload: dict[str, Any]) -> dict[str, Any]:
        return await self._completion("/v1/chat/completions", request_payload.get("json", {}))

    async def completion(self, request_payload: dict[str, Any]) -> dict[str, Any]:
        return await self._completion("/v1/completions", request_payload.get("json", {}))

    async def wake_up(self, *args: Any, **kwargs: Any) -> dict[str, Any]:
        # vLLM 0.32 reads `tags` from the query only (repeated), never from a body.
        tags = kwargs.get("tags") or []
        return await self._control("/wake_up", params=[("tags", str(tag)) for tag in tags])

    async def sleep(self, *args: Any, **kwargs: Any) -> dict[str, Any]:
        # vLLM 0.32 reads `level` and `mode` from the query; a body would be ignored (level 1).
        params = {"level": str(kwargs.get("level", 1))}
        if kwargs.get("mode"):
            params["mode"] = str(kwargs["mode"])
        return await self._control("/sleep", params=params)

    async def reset_prefix_cache(self) -> dict[str, Any]:
        self._require_vllm()
        return await self._control("/reset_prefix_cache")

    async def pause_generation(self) -> None:
        await self._control("/pause", params={"mode": "keep"})

    async def resume_generation(self) -> None:
        await self._control("/resume")

    async def _completion(self, path: str, body: Any) -> dict[str, Any]:
        answer = await self._request("POST", path, json=body)
        result = check_json_object(answer)
        if not isinstance(result.get("choices"), list):
            raise answer.fail(f"the response has no 'choices' list: {answer.text()}")
        return result

    async def _control(self, path: str, *, json: Any = None, params: Any = None) -> dict[str, Any]:
        """A control-plane call: the sidecar's control token goes with it (and only with it)."""
        answer = await self._request("POST", path, json=json, params=params, control=True)
        return check_json_object(answer)

    async def _request(
        self, method: str, path: str, *, json: Any = None, params: Any = None, control: bool = False
    ) -> Answer:
        headers = bearer(self.control_token) if control else None
        async with aiohttp.ClientSession(timeout=self.timeout) as session:
            return await exchange(
                session, method, f"{self.url}{path}", json=json, params=params, headers=headers
            )

    def _require_vllm(self) -> None:
        if self.engine_backend != "vllm":
            raise ValueError(f"Invalid engine backend: {self.engine_backend}")


class _SidecarWeightLoader(RemoteWeightLoader):
    """The parent's weight loader, its three calls sent through the engine's checked request."""

    def __init__(self, engine: SidecarInferenceEngine) -> None:
        super().__init__(engine.url, engine.engine_backend)
        self._engine = engine

    async def init_communicator(self, init_info: Any) -> dict[str, Any]:
        from skyrl.backends.skyrl_train.weight_sync import BroadcastTransferStrategy

        if init_info.strategy_type() is not BroadcastTransferStrategy:
            raise ValueError(
                "Remote inference engines only support BroadcastTransferStrategy, "
                f"got: {init_info.strategy_type().__name__}"
            )
        self._engine._require_vllm()
        return await self._engine._control(
            "/init_weight_update_communicator", json=asdict(init_info)
        )

    async def load_weights(self, request: Any) -> dict[str, Any]:
        self._engine._require_vllm()
        return await self._engine._control("/update_weights_skyrl", json=asdict(request))

    async def destroy_group(self) -> dict[str, Any]:
        # The parent posts no body, which SkyRL's own server answers with a 500 (its handler
        # reads a JSON body); an empty object is what that handler can parse.
        return await self._engine._control("/destroy_weights_update_group", json={})
