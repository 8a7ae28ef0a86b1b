"""Every HTTP call of SidecarInferenceEngine: the parent's request on success, SidecarError else."""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
from aiohttp.test_utils import unused_port
from skyrl.backends.skyrl_train.inference_engines.remote_inference_engine import (
    RemoteInferenceEngine,
)
from skyrl.backends.skyrl_train.weight_sync import BroadcastInitInfo, BroadcastWeightUpdateRequest

from proxy.skyrl import SidecarError, SidecarInferenceEngine
from tests.fake_vllm import FakeVLLM, error_body, respond
from tests.sidecar import MakeSidecar, Sidecar
from tests.skyrl.seed import SEED_PROMPTS
from tests.skyrl_deployment import HF_PATH, SERVED, hostport

pytestmark = pytest.mark.skyrl

Call = Callable[[Any], Awaitable[Any]]

# name -> (the upstream route it reaches, how to make the call). The first three are the data
# plane; the rest, the control plane SkyRL drives between training steps.
CALLS: dict[str, tuple[str, Call]] = {
    "generate": (
        "POST /v1/completions",
        lambda e: e.generate(
            {"prompts": None, "prompt_token_ids": SEED_PROMPTS, "sampling_params": None}
        ),
    ),
    "completion": (
        "POST /v1/completions",
        lambda e: e.completion(
            {"json": {"model": HF_PATH, "prompt": "the quick", "max_tokens": 2}}
        ),
    ),
    "chat_completion": (
        "POST /v1/chat/completions",
        lambda e: e.chat_completion(
            {"json": {"model": HF_PATH, "messages": [{"role": "user", "content": "hi"}]}}
        ),
    ),
    "sleep": ("POST /sleep", lambda e: e.sleep(level=2)),
    "wake_up": ("POST /wake_up", lambda e: e.wake_up(tags=["weights"])),
    "reset_prefix_cache": ("POST /reset_prefix_cache", lambda e: e.reset_prefix_cache()),
    "pause_generation": ("POST /pause", lambda e: e.pause_generation()),
    "resume_generation": ("POST /resume", lambda e: e.resume_generation()),
    "init_weight_update_communicator": (
        "POST /init_weight_update_communicator",
        lambda e: e.init_weight_update_communicator(
            BroadcastInitInfo(
                master_addr="10.0.0.1",
                master_port=29500,
                rank_offset=1,
                world_size=2,
                group_name="skyrl",
                backend="nccl",
                model_dtype_str="bfloat16",
                override_existing_receiver=False,
            )
        ),
    ),
    "update_named_weights": (
        "POST /update_weights_skyrl",
        lambda e: e.update_named_weights(
            BroadcastWeightUpdateRequest(
                names=["lm_head.weight"], dtypes=["bfloat16"], shapes=[[8, 4]]
            )
        ),
    ),
    "teardown": ("POST /destroy_weights_update_group", lambda e: e.teardown()),
}
CONTROL_PLANE = [
    name for name in CALLS if name not in ("generate", "completion", "chat_completion")
]


def engine(url: str, tokenizer: Any, cls: type[Any] = SidecarInferenceEngine) -> Any:
    return cls(url=url, model_name=HF_PATH, engine_backend="vllm", tokenizer=tokenizer)


# The parent's request and ours, where they differ on purpose.
QUERY_NOT_BODY = {
    "sleep": (("/sleep", {"level": 2}), ("/sleep?level=2", None)),
    "wake_up": (("/wake_up", {"tags": ["weights"]}), ("/wake_up?tags=weights", None)),
}
# What the fake (like vLLM) did with each, stock engine then ours: only ours was understood.
QUERY_ANSWERS = {
    "sleep": ({"status": "sleeping", "level": 1}, {"status": "sleeping", "level": 2}),
    "wake_up": ({"status": "awake", "tags": None}, {"status": "awake", "tags": ["weights"]}),
}


def ok() -> Any:
    """What SkyRL's own vLLM server answers on its control routes."""
    return respond(200, json.dumps({"status": "ok"}))


@pytest.fixture
def fake(fake: FakeVLLM) -> FakeVLLM:
    # The fake serves vLLM's routes; SkyRL's weight-update route is SkyRL's own server's.
    fake.script("POST /update_weights_skyrl", ok(), times=2)
    return fake


def sent(fake: FakeVLLM, route: str) -> tuple[str, Any]:
    method, path = route.split(" ")
    recorded = fake.last(path)
    assert recorded.method == method
    return recorded.raw_path, json.loads(recorded.body) if recorded.body else None


@pytest.mark.parametrize("name", list(CALLS))
async def test_every_call_sends_the_parents_request_and_returns_what_the_parent_returns(
    name: str, fake: FakeVLLM, sidecar: Sidecar, tokenizer: Any
) -> None:
    route, call = CALLS[name]
    url = hostport(sidecar.client)
    stock_result = await call(engine(url, tokenizer, RemoteInferenceEngine))
    stock = sent(fake, route)
    result = await call(engine(url, tokenizer))
    ours = sent(fake, route)
    if name == "teardown":
        # Deliberate: the parent posts no body, which SkyRL's server cannot parse.
        assert (stock, ours) == (("/destroy_weights_update_group", None), (stock[0], {}))
    elif name in QUERY_NOT_BODY:
        # Deliberate: vLLM 0.32 reads these from the query and ignores the parent's body.
        assert (stock, ours) == QUERY_NOT_BODY[name]
    else:
        assert ours == stock
    if isinstance(result, dict):
        for answer in (result, stock_result):
            answer.pop("id", None)  # the fake numbers its answers
        assert result  # not an empty stand-in
    if name in QUERY_ANSWERS:
        assert (stock_result, result) == QUERY_ANSWERS[name]
    else:
        assert result == stock_result
    assert (result is None) == (name in ("pause_generation", "resume_generation", "teardown"))


@pytest.mark.parametrize("name", ["completion", "chat_completion"])
async def test_openai_calls_return_the_upstream_json(
    name: str, fake: FakeVLLM, sidecar: Sidecar, tokenizer: Any
) -> None:
    route, call = CALLS[name]
    result = await call(engine(hostport(sidecar.client), tokenizer))
    assert result["model"] == SERVED
    assert len(result["choices"]) == 1
    assert sent(fake, route)[1]["model"] == SERVED


STATUSES = [
    (400, "BadRequestError", "Missing 'method' in request body"),
    (404, "NotFoundError", "Not Found"),
    (409, "ConflictError", "the engine is sleeping"),
    (500, "InternalServerError", "Call to collective_rpc method failed: Worker failed"),
    (503, "ServiceUnavailableError", "The engine is shutting down"),
]


@pytest.mark.parametrize("name", list(CALLS))
@pytest.mark.parametrize(("status", "kind", "text"), STATUSES, ids=[str(s[0]) for s in STATUSES])
async def test_every_call_raises_on_an_upstream_error_envelope(
    name: str, status: int, kind: str, text: str, fake: FakeVLLM, sidecar: Sidecar, tokenizer: Any
) -> None:
    route, call = CALLS[name]
    fake.scripts.clear()
    fake.script(route, respond(status, json.dumps(error_body(text, kind, None, status))))
    with pytest.raises(SidecarError) as caught:
        await call(engine(hostport(sidecar.client), tokenizer))
    err = caught.value
    assert (err.status, err.reason) == (status, "upstream_status")
    assert err.error["upstream"]["status"] == status
    assert err.request_id
    assert text in str(err)
    assert route.split(" ")[1] in str(err)


@pytest.mark.parametrize("name", list(CALLS))
async def test_every_call_raises_when_the_upstream_is_dead(
    name: str, make_sidecar: MakeSidecar, tokenizer: Any
) -> None:
    sidecar = await make_sidecar(f"http://127.0.0.1:{unused_port()}", ready=False)
    _, call = CALLS[name]
    with pytest.raises(SidecarError) as caught:
        await call(engine(hostport(sidecar.client), tokenizer))
    err = caught.value
    assert (err.status, err.reason) == (502, "upstream_unreachable")
    assert err.error["source"] == "sidecar"
    assert "502 upstream_unreachable" in str(err)


@pytest.mark.parametrize("name", list(CALLS))
async def test_every_call_raises_when_the_sidecar_cannot_be_reached(
    name: str, tokenizer: Any
) -> None:
    url = f"127.0.0.1:{unused_port()}"
    route, call = CALLS[name]
    with pytest.raises(SidecarError) as caught:
        await call(engine(url, tokenizer))
    err = caught.value
    assert (err.status, err.reason, err.envelope) == (None, "sidecar_unreachable", None)
    assert err.url == f"http://{url}{route.split(' ')[1]}"
    assert str(err).startswith(f"POST http://{url}")
    assert "cannot connect to the sidecar" in str(err)


async def test_the_control_token_goes_with_control_calls_only(
    fake: FakeVLLM, sidecar: Sidecar, tokenizer: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("VLLM_SIDECAR_CONTROL_TOKEN", "from-env")
    ours = engine(hostport(sidecar.client), tokenizer)
    await CALLS["generate"][1](ours)
    await ours.pause_generation()
    await ours.sleep(level=1)
    await CALLS["init_weight_update_communicator"][1](ours)
    auth = {r.raw_path.split("?")[0]: r.headers.get("Authorization") for r in fake.requests}
    assert auth["/v1/completions"] is None
    assert auth["/pause"] == auth["/sleep"] == "Bearer from-env"
    assert auth["/init_weight_update_communicator"] == "Bearer from-env"
    given = SidecarInferenceEngine(
        url="h:1", model_name="m", engine_backend="vllm", tokenizer=tokenizer, control_token="t"
    )
    assert given.control_token == "t"
