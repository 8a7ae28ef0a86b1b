"""Retries and the control token, against a fake sidecar speaking the lifecycle contract."""

from __future__ import annotations

from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from proxy.skyrl import RetryPolicy, SidecarError
from tests.skyrl04.clients import companion

FAST = RetryPolicy(attempts=4, base_s=0.01)


def refusal(reason: str, status: int = 503, retryable: bool = True) -> web.Response:
    """The sidecar's phase refusal: a 503 envelope, retryable, with Retry-After."""
    error = {
        "message": f"refused: {reason}",
        "type": "ServiceUnavailableError",
        "param": None,
        "code": status,
        "source": "sidecar",
        "reason": reason,
        "retryable": retryable,
        "request_id": "r-1",
    }
    headers = {"Retry-After": "0", "X-Sidecar-Error": reason}
    return web.json_response({"error": error}, status=status, headers=headers)


class FakeSidecar:
    """Answers each route from a list of scripted answers, then with success; records headers."""

    def __init__(self) -> None:
        self.answers: dict[str, list[web.Response]] = {}
        self.seen: list[tuple[str, str | None]] = []

    async def handle(self, request: web.Request) -> web.StreamResponse:
        self.seen.append((request.path, request.headers.get("Authorization")))
        scripted = self.answers.get(request.path)
        if scripted:
            return scripted.pop(0)
        if request.path == "/inference/v1/generate":
            choice = {"index": 0, "token_ids": [5], "finish_reason": "stop"}
            body = {"choices": [choice]}
            return web.json_response(body, headers={"X-Weight-Version": "v7"})
        if request.path == "/detokenize":
            return web.json_response({"prompt": "x"})
        return web.json_response({"status": "ok"})

    def tries(self, path: str) -> int:
        return sum(1 for seen, _ in self.seen if seen == path)


@pytest.fixture
async def side(aiohttp_server: Any) -> tuple[FakeSidecar, str]:
    fake = FakeSidecar()
    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", fake.handle)
    server: TestServer = await aiohttp_server(app)
    return fake, str(server.make_url("")).rstrip("/")


GEN = {"prompt_token_ids": [[1]], "sampling_params": {}}


@pytest.mark.parametrize("reason", ["engine_paused", "engine_sleeping", "weight_sync"])
async def test_a_generation_refused_for_a_phase_is_retried_until_it_succeeds(
    reason: str, side: tuple[FakeSidecar, str]
) -> None:
    fake, base = side
    fake.answers["/inference/v1/generate"] = [refusal(reason), refusal(reason)]
    client = companion(base, retry=FAST)
    out = await client.generate(GEN)
    assert out["response_ids"] == [[5]]
    assert fake.tries("/inference/v1/generate") == 3
    assert client.last_weight_version == "v7"
    await client.teardown()


async def test_retries_stop_at_the_policys_attempts(side: tuple[FakeSidecar, str]) -> None:
    fake, base = side
    fake.answers["/inference/v1/generate"] = [refusal("weight_sync") for _ in range(10)]
    client = companion(base, retry=FAST)
    with pytest.raises(SidecarError) as caught:
        await client.generate(GEN)
    assert (caught.value.reason, caught.value.status) == ("weight_sync", 503)
    assert caught.value.retry_after == 0
    assert fake.tries("/inference/v1/generate") == FAST.attempts
    await client.teardown()


async def test_retries_stop_when_the_time_budget_is_spent(side: tuple[FakeSidecar, str]) -> None:
    fake, base = side
    slow = [refusal("engine_sleeping") for _ in range(10)]
    for answer in slow:
        answer.headers["Retry-After"] = "5"
    fake.answers["/inference/v1/generate"] = slow
    client = companion(base, retry=RetryPolicy(attempts=10, budget_s=1.0))
    with pytest.raises(SidecarError):
        await client.generate(GEN)
    assert fake.tries("/inference/v1/generate") == 1  # a 5 s wait would pass the 1 s budget
    await client.teardown()


async def test_an_error_not_marked_retryable_is_raised_at_once(
    side: tuple[FakeSidecar, str],
) -> None:
    fake, base = side
    fake.answers["/inference/v1/generate"] = [refusal("model_ambiguous", 400, retryable=False)]
    client = companion(base, retry=FAST)
    with pytest.raises(SidecarError, match="model_ambiguous"):
        await client.generate(GEN)
    assert fake.tries("/inference/v1/generate") == 1
    await client.teardown()


@pytest.mark.parametrize(
    ("path", "call"),
    [
        ("/pause", lambda c: c.pause()),
        ("/sleep", lambda c: c.sleep()),
        ("/wake_up", lambda c: c.wake_up()),
        ("/update_weights", lambda c: c.update_named_weights({"names": []})),
        ("/fetch_weights", lambda c: c.fetch_weights(3)),
        ("/skyrl/v1/load_lora_adapter", lambda c: c.load_lora_adapter("a", "/tmp/a")),
    ],
)
async def test_a_call_that_changes_server_state_is_never_retried(
    path: str, call: Any, side: tuple[FakeSidecar, str]
) -> None:
    fake, base = side
    fake.answers[path] = [refusal("weight_sync"), refusal("weight_sync")]
    client = companion(base, retry=FAST)
    with pytest.raises(SidecarError, match="weight_sync"):
        await call(client)
    assert fake.tries(path) == 1
    await client.teardown()


async def test_a_read_of_the_control_plane_is_retried(side: tuple[FakeSidecar, str]) -> None:
    fake, base = side
    fake.answers["/is_sleeping"] = [
        refusal("weight_sync"),
        web.json_response({"is_sleeping": True}),
    ]
    client = companion(base, retry=FAST)
    assert await client.is_sleeping() is True
    assert fake.tries("/is_sleeping") == 2
    await client.teardown()


async def test_the_control_token_goes_with_control_calls_only(
    side: tuple[FakeSidecar, str],
) -> None:
    fake, base = side
    client = companion(base, control_token="s3cret")
    await client.generate(GEN)
    await client.pause()
    await client.load_lora_adapter("a", "/tmp/a")
    auth = dict(fake.seen)
    assert auth["/inference/v1/generate"] is None
    assert auth["/detokenize"] is None
    assert auth["/pause"] == auth["/skyrl/v1/load_lora_adapter"] == "Bearer s3cret"
    await client.teardown()


async def test_an_unauthorized_control_call_says_so(side: tuple[FakeSidecar, str]) -> None:
    fake, base = side
    fake.answers["/pause"] = [refusal("unauthorized", 401, retryable=False)]
    client = companion(base)
    with pytest.raises(SidecarError) as caught:
        await client.pause()
    assert (caught.value.status, caught.value.reason) == (401, "unauthorized")
    assert caught.value.envelope["error"]["retryable"] is False
    await client.teardown()
