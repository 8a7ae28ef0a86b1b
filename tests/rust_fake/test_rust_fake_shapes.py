"""The Rust frontend's own shapes through the sidecar (tests/samples/rust/): its 404 for an
unknown model (a string `code`) enveloped with its body and read as a stale model list, its
model list without permissions, its empty 404 for an unknown route, its refusal of `n` above 1,
and its stream framing relayed byte for byte."""

from __future__ import annotations

import pytest

from proxy.upstream.discovery import DISCOVERY
from tests.fake_vllm import FakeVLLM
from tests.sidecar import Sidecar
from tests.test_forward import (
    test_404_for_a_resolved_name_rereads_the_model_list,
    test_each_rule_reaches_the_served_name,
    test_unknown_name_triggers_one_refresh_then_resolves,
)

pytestmark = pytest.mark.usefixtures("upstream")

__all__ = [
    "test_404_for_a_resolved_name_rereads_the_model_list",
    "test_each_rule_reaches_the_served_name",
    "test_unknown_name_triggers_one_refresh_then_resolves",
]

RUST_404 = {
    "error": {
        "message": "The model `other/tiny-modl` does not exist.",
        "type": "invalid_request_error",
        "param": "model",
        "code": "model_not_found",
    }
}


async def test_unknown_model_gets_rusts_404_enveloped(sidecar: Sidecar) -> None:
    resp = await sidecar.client.post(
        "/v1/completions", json={"model": "other/tiny-modl", "prompt": "x"}
    )
    assert resp.status == 404
    assert resp.headers["X-Sidecar-Error"] == "upstream_status"
    err = (await resp.json())["error"]
    assert err["code"] == 404  # the envelope keeps the HTTP status, whatever vLLM's code says
    assert err["upstream"]["body"] == RUST_404
    assert err["model"]["suggestions"] == ["tiny-model"]
    assert sidecar.app[DISCOVERY].table.names == ("tiny-model",)


async def test_an_unknown_route_is_enveloped_with_rusts_empty_404(sidecar: Sidecar) -> None:
    resp = await sidecar.client.get("/v1/nope")
    assert resp.status == 404
    err = (await resp.json())["error"]
    assert err["upstream"]["status"] == 404
    assert not err["upstream"]["body"]


async def test_n_above_1_is_refused_as_rust_refuses_it(sidecar: Sidecar) -> None:
    body = {"model": "org/tiny-model", "prompt": "x", "n": 2}
    resp = await sidecar.client.post("/v1/completions", json=body)
    assert resp.status == 400
    err = (await resp.json())["error"]
    assert err["upstream"]["body"]["error"]["message"] == "Only n=1 is supported."


async def test_rusts_stream_is_relayed_byte_for_byte_and_counted(
    sidecar: Sidecar, fake: FakeVLLM
) -> None:
    body = {"model": "org/tiny-model", "prompt": [1, 2], "max_tokens": 3, "stream": True}
    resp = await sidecar.client.post("/v1/completions", json=body)
    text = await resp.text()
    events = text.split("\n\n")
    assert events[-2:] == ["data: [DONE]", ""]
    assert '"finish_reason"' not in events[0]
    assert events[-3].endswith('"text":"","finish_reason":"length"}]}')
    assert len(events) == 2 + fake.stream_events + 1
    tokens = sidecar.metric("vllm_sidecar_generated_tokens_total", route="/v1/completions", lag="0")
    assert tokens == fake.stream_events
    estimated = sidecar.metric(
        "vllm_sidecar_estimated_generated_tokens_total", route="/v1/completions"
    )
    assert estimated == fake.stream_events  # no usage asked for: counted from the events
