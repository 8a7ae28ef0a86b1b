"""The envelope builder: shape, status types, upstream bodies of every kind."""

from __future__ import annotations

import gzip
import json

import pytest

from proxy import envelope
from proxy.envelope import ModelInfo, UpstreamReply
from proxy.errors import BodyTooLarge, ModelAmbiguous, UpstreamTimeout, UpstreamUnreachable

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
    body = envelope.decode_body(
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


def test_html_error_page_is_text_and_readable() -> None:
    html = b"<html><body><h1>500 Internal Server Error</h1>\n</body></html>"
    body = envelope.decode_body(
        html, content_type="text/html", content_encoding=None, truncated=False
    )
    assert body == html.decode()
    assert "500 Internal Server Error" in envelope.upstream_message(body)


def test_gzip_body_is_decoded() -> None:
    raw = gzip.compress(VLLM_404)
    body = envelope.decode_body(
        raw, content_type="application/json", content_encoding="gzip", truncated=False
    )
    assert body == json.loads(VLLM_404)


def test_truncated_json_becomes_text() -> None:
    body = envelope.decode_body(
        VLLM_404[:40], content_type="application/json", content_encoding=None, truncated=True
    )
    assert body == VLLM_404[:40].decode()


def test_invalid_json_with_json_type_becomes_text() -> None:
    body = envelope.decode_body(
        b"{oops", content_type="application/json", content_encoding=None, truncated=False
    )
    assert body == "{oops"


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ({"detail": "Not Found"}, "Not Found"),
        ({"error": "boom"}, "boom"),
        (None, "(empty body)"),
        ({"x": 1}, '{"x":1}'),
    ],
)
def test_upstream_message_shapes(body: object, message: str) -> None:
    assert envelope.upstream_message(body) == message


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
