"""SidecarInferenceClient: skyrl 0.4's RemoteInferenceClient with every HTTP answer checked.

The parent funnels its calls through three seams: ``_post`` (the data plane), the generate
client's ``_post`` (``/inference/v1/generate``, ``/skyrl/v1/generate``) and ``_call_server``
(the control-plane fan-out). Overriding those three, plus the two LoRA calls that open their own
requests, puts every data- and control-plane call through one checked exchange while the
parent keeps its payloads, fan-out and result shapes. ``finish_session`` stays the parent's:
SkyRL calls it from cleanup paths and documents that it never raises.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass, field, fields
from typing import Any, Literal

from skyrl.backends.skyrl_train.inference_servers.generate_wire import load_packed_body
from skyrl.backends.skyrl_train.inference_servers.remote_inference_client import (
    RemoteGenerateClient,
    RemoteInferenceClient,
)
from yarl import URL

from proxy.skyrl import versions
from proxy.skyrl.checks import Answer, check_json_object
from proxy.skyrl.retry import NEVER, RetryPolicy, retrying
from proxy.skyrl.shapes import body_required, check_shape
from proxy.skyrl.transport import CONTROL_TOKEN_ENV, bearer, exchange

log = logging.getLogger(__name__)

Parse = Literal["json", "packed", "text"]


@dataclass
class SidecarInferenceClient(RemoteInferenceClient):
    """A ``RemoteInferenceClient`` whose calls raise ``SidecarError`` instead of passing junk on.

    ``proxy_url`` and ``server_urls`` are sidecars (or a router in front of them). Data-plane
    calls (generation, tokenize, render) are retried when the sidecar marks a refusal
    ``retryable`` (a pause, sleep or weight sync), within ``retry``; calls that change the
    server's state never are. ``control_token`` (default ``$VLLM_SIDECAR_CONTROL_TOKEN``) is sent
    as a bearer token on control-plane calls only. ``last_weight_version`` is the
    ``X-Weight-Version`` of the latest data-plane answer that carried one.
    """

    control_token: str | None = field(default=None, repr=False)
    retry: RetryPolicy = field(default_factory=RetryPolicy)
    last_weight_version: str | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.control_token is None:
            self.control_token = os.environ.get(CONTROL_TOKEN_ENV) or None

    @classmethod
    def from_client(cls, client: RemoteInferenceClient, **options: Any) -> SidecarInferenceClient:
        """The same client (URLs, model, LoRA, replay settings), checked; ``options`` add ours."""
        public = {f.name: getattr(client, f.name) for f in fields(RemoteInferenceClient)}
        kept = {k: v for k, v in public.items() if not k.startswith("_")}
        checked = cls(**kept, **options)
        checked._weight_version = client._weight_version
        return checked

    # -- the data plane ----------------------------------------------------------------------
    def _get_generate_client(self) -> RemoteGenerateClient:
        if self._generate_client is None:  # type: ignore[has-type]  # the parent is untyped
            self._generate_client = _CheckedGenerateClient(proxy_url=self.proxy_url, owner=self)
        return self._generate_client

    async def _post(self, url: str, json: Any, headers: dict[str, str] | None = None) -> Any:
        return await self._checked("POST", url, json=json, headers=headers, policy=self.retry)

    async def generate(self, input_batch: Any, model: str | None = None) -> Any:
        """The parent's result, plus, per response: ``weight_versions``, vLLM's spans
        ``{"version", "start", "end"}`` over its tokens (None where vLLM sent none), and
        ``weight_lags``, how many updates behind the newest version this batch saw its oldest
        tokens were (None where no version is known; lags.py says how it is counted)."""
        found: dict[str, Any] = {}
        with versions.batch_spans(input_batch.get("prompt_token_ids") or (), found):
            out = await super().generate(input_batch, model)
        out["weight_versions"] = found["weight_versions"]
        out["weight_lags"] = found["weight_lags"]
        return out

    async def _generate_single(self, **kwargs: Any) -> dict[str, Any]:
        with versions.collecting(kwargs.get("prompt_token_ids")):
            result: dict[str, Any] = await super()._generate_single(**kwargs)
        return result

    # -- the control plane -------------------------------------------------------------------
    async def _call_server(
        self,
        server_url: str,
        endpoint: str,
        json: dict[str, Any] | None = None,
        method: str = "POST",
        params: dict[str, Any] | None = None,
    ) -> tuple[str, dict[str, Any]]:
        # Reads (GET) may be retried; a POST here pauses, sleeps or loads weights: never.
        policy = self.retry if method == "GET" else NEVER
        body = await self._checked(
            method, f"{server_url}{endpoint}", json=json, params=params, policy=policy, control=True
        )
        return server_url, {"status": 200, "body": body}

    async def load_lora_adapter(
        self, lora_name: str, lora_path: str | None = None, *, in_memory: bool = False
    ) -> dict[str, Any]:
        if in_memory == (lora_path is not None):
            raise ValueError("load_lora_adapter takes exactly one of lora_path or in_memory=True")
        payload: dict[str, Any] = {"lora_name": lora_name}
        payload.update({"in_memory": True} if in_memory else {"lora_path": lora_path})
        return await self._lora("/skyrl/v1/load_lora_adapter", payload)

    async def unload_lora_adapter(self, lora_name: str) -> dict[str, Any]:
        results = await self._lora("/v1/unload_lora_adapter", {"lora_name": lora_name})
        try:  # the parent's best-effort release of tensors staged for in-memory adapters
            await self._call_all_servers(
                "/collective_rpc",
                {"method": "skyrl_discard_in_memory_lora", "kwargs": {"lora_name": lora_name}},
            )
        except Exception as exc:  # best effort, as in the parent
            log.debug("could not discard staged LoRA tensors for %r: %s", lora_name, exc)
        return results

    async def _lora(self, endpoint: str, payload: dict[str, Any]) -> dict[str, Any]:
        # vLLM answers these with plain text on success, a JSON error otherwise.
        results = {}
        for url in self.server_urls:
            text = await self._checked(
                "POST", f"{url}{endpoint}", json=payload, policy=NEVER, control=True, parse="text"
            )
            results[url] = {"status": 200, "body": text}
        return results

    # -- one checked exchange ----------------------------------------------------------------
    async def _checked(
        self,
        method: str,
        url: str,
        *,
        json: Any = None,
        params: dict[str, Any] | None = None,
        headers: dict[str, str] | None = None,
        policy: RetryPolicy,
        control: bool = False,
        parse: Parse = "json",
    ) -> Any:
        sent = {**(headers or {}), **(bearer(self.control_token) if control else {})}
        path = URL(url).path

        async def once() -> Any:
            session = await self._get_session()
            # The parent's session: its connection limit, and no total timeout (generations
            # and weight syncs can be long).
            answer = await exchange(session, method, url, json=json, params=params, headers=sent)
            if not control:
                if answer.weight_version is not None:
                    self.last_weight_version = answer.weight_version
                versions.heard(answer.weight_version, answer.weight_version_end)
            return _parse(answer, path, json, parse)

        return await retrying(policy, once)


def _parse(answer: Answer, path: str, request: Any, parse: Parse) -> Any:
    """The answer's body as the parent would read it, or ``SidecarError``."""
    empty = answer.status < 300 and not answer.body.strip()
    if parse == "text" and answer.status < 300:
        return answer.body.decode("utf-8", "replace")
    if empty and parse == "json" and not body_required(path):
        return None  # a control-plane success without a body (the parent reads it as None)
    if parse == "packed" and answer.status < 300:
        try:
            body = load_packed_body(answer.body)
        except ValueError as exc:  # orjson's decode error is a ValueError too
            raise answer.fail(f"unreadable packed body ({exc}): {answer.text()}") from None
        if not isinstance(body, dict):
            raise answer.fail(f"expected a JSON object: {answer.text()}")
        if "error" in body:
            check_json_object(answer)  # an error envelope in a 2xx answer
    else:
        body = check_json_object(answer)
    check_shape(answer, path, request, body)
    return body


@dataclass
class _CheckedGenerateClient(RemoteGenerateClient):
    """The parent's raw-token generate client, its one request sent through ``owner``."""

    owner: SidecarInferenceClient | None = field(default=None, repr=False)

    async def _post(
        self,
        url: str,
        json: dict[str, Any],
        headers: dict[str, str] | None = None,
        *,
        packed_side_channels: bool = False,
    ) -> Any:
        assert self.owner is not None
        parse: Parse = "packed" if packed_side_channels else "json"
        owner = self.owner
        body = await owner._checked(
            "POST", url, json=json, headers=headers, policy=owner.retry, parse=parse
        )
        versions.seen(body)
        return body
