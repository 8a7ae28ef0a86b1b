"""The envelope builder: shape, status types, what it says of an upstream's answer."""

from __future__ import annotations

import json

import pytest

from proxy.core import envelope, upstream_body
from proxy.core.envelope import ModelInfo, UpstreamReply
from proxy.core.errors import BodyTooLarge, ModelAmbiguous, UpstreamTimeout, UpstreamUnreachable

VLLM_404 = (
    b'{"error":{"message":"The model `X` does not exist. Valid aliases: Y.",'
    b'"type":"NotFoundError","param":"model","code":404}}'
)
REQUIRED = {"message", "type", "param", "code", "source", "reason", "retryable", "request_id"}


@pytest.mark.parametrize(
    ("status", "name"),
    [
        (400, "BadRequestError"),
        (404, "NotFoundError"),
        (413, "RequestEntityTooLargeError"),
        (502, "BadGatewayError"),
        (500, "InternalServerError"),
        (504, "GatewayTimeoutError"),
        (599, "Error"),
    ],
)
def test_status_type(status: int, name: str) -> None:
    assert envelope.status_type(status) == name


def test_upstream_404_keeps_everything() -> None:
    body = upstream_body.decode_body(
        VLLM_404, content_type="application/json", content_encoding=None, truncated=False
    )
    reply = UpstreamReply(404, "POST", "/v1/completions", "application/json", body)
    model = ModelInfo("X", None, ("Y",), ("Y",))
    env = envelope.from_upstream_status(reply, request_id="rid", model=model)
    err = env["error"]
    assert REQUIRED <= err.keys()
    assert err["code"] == 404
    assert err["type"] == "NotFoundError"
    assert err["param"] == "model"
    assert (err["source"], err["reason"], err["retryable"]) == (
        "upstream",
        "upstream_status",
        False,
    )
    assert err["message"].startswith(
        "Upstream returned 404 for POST /v1/completions: The model `X`"
    )
    assert "Served: Y" in err["message"]
    assert err["upstream"]["body"] == json.loads(VLLM_404)
    assert err["model"] == {
        "requested": "X",
        "resolved": None,
        "served": ["Y"],
        "suggestions": ["Y"],
    }
    assert json.loads(envelope.encode(env)) == env


def test_5xx_from_upstream_is_retryable_and_typed_from_status() -> None:
    reply = UpstreamReply(503, "GET", "/v1/models", None, "")
    err = envelope.from_upstream_status(reply, request_id="r")["error"]
    assert (err["code"], err["type"], err["retryable"]) == (503, "ServiceUnavailableError", True)
    assert err["message"].endswith("(empty body)")
    assert "model" not in err


@pytest.mark.parametrize(
    ("failure", "status", "retryable"),
    [
        (UpstreamUnreachable("refused"), 502, True),
        (UpstreamTimeout("slow"), 504, True),
        (BodyTooLarge("big"), 413, False),
        (ModelAmbiguous("two"), 400, False),
    ],
)
def test_sidecar_failures(failure: object, status: int, retryable: bool) -> None:
    env = envelope.from_failure(failure, request_id="r")  # type: ignore[arg-type]
    err = env["error"]
    assert REQUIRED <= err.keys()
    assert (err["code"], err["source"], err["retryable"]) == (status, "sidecar", retryable)
    assert err["reason"] == failure.reason  # type: ignore[attr-defined]


def test_sse_event_is_one_event_then_done() -> None:
    env = envelope.from_failure(UpstreamTimeout("slow"), request_id="r")
    data = envelope.sse_event(env)
    first, second, rest = data.split(b"\n\n")
    assert json.loads(first.removeprefix(b"data: ")) == env
    assert (second, rest) == (b"data: [DONE]", b"")


def test_failure_envelope_whole() -> None:
    reply = UpstreamReply(500, "POST", "/v1/completions", "text/plain", "E" * 10, True)
    model = ModelInfo("org/x", None, ("a", "b"), ("a",))
    env = envelope.from_failure(
        ModelAmbiguous("The model is ambiguous."), request_id="rid", model=model, upstream=reply
    )
    assert env == {
        "error": {
            "message": "The model is ambiguous.",
            "type": "BadRequestError",
            "param": "model",
            "code": 400,
            "source": "sidecar",
            "reason": "model_ambiguous",
            "retryable": False,
            "request_id": "rid",
            "model": {
                "requested": "org/x",
                "resolved": None,
                "served": ["a", "b"],
                "suggestions": ["a"],
            },
            "upstream": {
                "status": 500,
                "method": "POST",
                "path": "/v1/completions",
                "content_type": "text/plain",
                "body": "E" * 10,
                "body_truncated": True,
            },
        }
    }


def test_upstream_status_envelope_whole() -> None:
    body = {"error": {"message": "no", "type": "CustomError", "param": 5}}
    reply = UpstreamReply(404, "POST", "/v1/chat/completions", "application/json", body)
    model = ModelInfo("org/x", None, ("a", "b"), ("a", "b"))
    env = envelope.from_upstream_status(reply, request_id="rid", model=model)
    assert env["error"] == {
        "message": "Upstream returned 404 for POST /v1/chat/completions: no Served: a, b."
        " Did you mean: a, b?",
        "type": "CustomError",  # vLLM's own type is kept
        "param": None,  # a param that is not a string is not passed on
        "code": 404,
        "source": "upstream",
        "reason": "upstream_status",
        "retryable": False,
        "request_id": "rid",
        "model": model.as_dict(),
        "upstream": reply.as_dict(),
    }


@pytest.mark.parametrize("model", [None, ModelInfo("x", "x", ("x",))])
def test_a_404_names_the_served_models_only_for_an_unresolved_name(
    model: ModelInfo | None,
) -> None:
    reply = UpstreamReply(404, "GET", "/v1/models/x", None, "")
    err = envelope.from_upstream_status(reply, request_id="r", model=model)["error"]
    assert err["message"] == "Upstream returned 404 for GET /v1/models/x: (empty body)"


@pytest.mark.parametrize(
    ("status", "retryable"),
    [(400, False), (408, True), (409, False), (429, True), (430, False), (499, False),
     (500, True), (501, True)],
)  # fmt: skip
def test_which_upstream_statuses_are_retryable(status: int, retryable: bool) -> None:
    reply = UpstreamReply(status, "POST", "/v1/completions", None, "")
    assert envelope.from_upstream_status(reply, request_id="r")["error"]["retryable"] is retryable


def test_status_type_of_a_hyphenated_phrase() -> None:
    assert envelope.status_type(207) == "MultiStatusError"
    assert envelope.status_type(203) == "NonAuthoritativeInformationError"


def test_lone_surrogates_are_replaced_not_fatal() -> None:
    # aiohttp decodes a peer's non-UTF-8 header bytes with surrogateescape.
    bad = "text/\udcff"
    env = {"error": {"upstream": {"content_type": bad}, bad: [bad, 1]}}
    assert json.loads(envelope.encode(env)) == {
        "error": {"upstream": {"content_type": "text/?"}, "text/?": ["text/?", 1]}
    }


def test_ambiguous_model_suggests_its_candidates() -> None:
    failure = ModelAmbiguous("two match", candidates=("a/tiny", "b/tiny"))
    model = ModelInfo("tiny", None, ("a/tiny", "b/tiny"))
    err = envelope.from_failure(failure, request_id="r", model=model)["error"]
    assert err["model"]["suggestions"] == ["a/tiny", "b/tiny"]
    assert err["param"] == "model"


def test_wire_order_of_the_envelope_keys() -> None:
    reply = UpstreamReply(404, "POST", "/v1/completions", "application/json", {"x": 1})
    env = envelope.from_upstream_status(reply, request_id="r", model=ModelInfo("X", None))
    assert envelope.encode(env) == (
        b'{"error":{"message":"Upstream returned 404 for POST /v1/completions: {\\"x\\":1}",'
        b'"type":"NotFoundError","param":null,"code":404,"source":"upstream",'
        b'"reason":"upstream_status","retryable":false,"request_id":"r",'
        b'"model":{"requested":"X","resolved":null,"served":[],"suggestions":[]},'
        b'"upstream":{"status":404,"method":"POST","path":"/v1/completions",'
        b'"content_type":"application/json","body":{"x":1},"body_truncated":false}}}'
    )
