"""SidecarError's one-line message and the pure answer checks, without sockets."""

from __future__ import annotations

import json
from typing import Any

import pytest

from proxy.skyrl import SidecarError
from proxy.skyrl.checks import Answer, check_choices, check_json_object

pytestmark = pytest.mark.skyrl

URL = "http://sidecar:8080/v1/completions"

# The envelope DESIGN.md fixes, as the sidecar sends it for an unserved name.
ENVELOPE_404 = {
    "error": {
        "message": "Upstream returned 404 for POST /v1/completions: The model `Qwen/Qwen2.5-0.5B`"
        " does not exist.",
        "type": "NotFoundError",
        "param": "model",
        "code": 404,
        "source": "upstream",
        "reason": "upstream_status",
        "retryable": False,
        "request_id": "req-1",
        "model": {
            "requested": "Qwen/Qwen2.5-0.5B",
            "resolved": None,
            "served": ["Qwen2.5-0.5B", "other"],
            "suggestions": ["Qwen2.5-0.5B"],
        },
        "upstream": {
            "status": 404,
            "method": "POST",
            "path": "/v1/completions",
            "content_type": "application/json",
            "body": {
                "error": {
                    "message": "The model `Qwen/Qwen2.5-0.5B` does not exist.",
                    "type": "NotFoundError",
                    "param": "model",
                    "code": 404,
                }
            },
            "body_truncated": False,
        },
    }
}


def answer(body: Any, status: int = 200, **kw: Any) -> Answer:
    raw = body if isinstance(body, bytes) else json.dumps(body).encode()
    return Answer(method="POST", url=URL, status=status, body=raw, **kw)


def rejected(checked: Answer) -> SidecarError:
    with pytest.raises(SidecarError) as caught:
        check_json_object(checked)
    return caught.value


def test_envelope_becomes_error_with_every_field() -> None:
    err = rejected(answer(ENVELOPE_404, 404, request_id="from-header"))
    assert (err.status, err.reason, err.request_id) == (404, "upstream_status", "req-1")
    assert err.envelope == ENVELOPE_404
    assert err.served == ["Qwen2.5-0.5B", "other"]
    assert err.upstream_message == "The model `Qwen/Qwen2.5-0.5B` does not exist."
    text = str(err)
    assert "\n" not in text
    assert text.startswith(f"POST {URL} -> 404 upstream_status: Upstream returned 404")
    assert "served models: Qwen2.5-0.5B, other" in text
    assert text.endswith("[request id req-1]")


def test_upstream_text_is_added_when_the_message_lacks_it() -> None:
    envelope = {"error": {**ENVELOPE_404["error"], "message": "the upstream refused"}}
    text = str(rejected(answer(envelope, 404)))
    assert "(upstream said: The model `Qwen/Qwen2.5-0.5B` does not exist.)" in text


def test_served_names_already_in_the_message_are_not_repeated() -> None:
    envelope = {
        "error": {**ENVELOPE_404["error"], "message": "no such model; served: Qwen2.5-0.5B, other"}
    }
    text = str(rejected(answer(envelope, 404)))
    assert "served models:" not in text
    assert text.count("Qwen2.5-0.5B, other") == 1


def test_plain_vllm_error_body_is_an_envelope_too() -> None:
    body = {
        "error": {
            "message": "max_tokens must be at least 1",
            "type": "BadRequestError",
            "param": "max_tokens",
            "code": 400,
        }
    }
    err = rejected(answer(body, 400, request_id="r9"))
    assert (err.status, err.reason, err.request_id) == (400, "http_error", "r9")
    assert (
        str(err) == f"POST {URL} -> 400 http_error: max_tokens must be at least 1 [request id r9]"
    )


def test_error_envelope_in_a_200_still_raises() -> None:
    body = {"error": {"message": "stream broke", "reason": "upstream_stream_error", "code": 502}}
    err = rejected(answer(body, 200))
    assert (err.status, err.reason, err.message) == (200, "upstream_stream_error", "stream broke")


@pytest.mark.parametrize(
    ("status", "body", "reason", "expected"),
    [
        (
            500,
            b"Internal Server Error",
            "http_error",
            "HTTP 500 without an error envelope: Internal",
        ),
        (404, b"", "http_error", "HTTP 404 without an error envelope: an empty body"),
        (200, b"<html>ok</html>", "malformed_response", "got non-JSON text/html: <html>ok</html>"),
        (200, b"", "malformed_response", "got non-JSON text/html: an empty body"),
        (200, b"[1, 2]", "malformed_response", "expected a JSON object, got JSON list: [1, 2]"),
        (200, b"null", "malformed_response", "expected a JSON object, got JSON NoneType: null"),
    ],
)
def test_non_envelope_failures(status: int, body: bytes, reason: str, expected: str) -> None:
    err = rejected(answer(body, status, content_type="text/html"))
    assert (err.status, err.reason, err.envelope) == (status, reason, None)
    assert expected in str(err)


def test_long_foreign_bodies_are_clipped_to_one_line() -> None:
    body = ("line\n" * 500).encode()
    text = str(rejected(answer(body, 503)))
    assert "\n" not in text
    assert len(text) < 500
    assert text.endswith("...")


def test_json_object_passes() -> None:
    assert check_json_object(answer({"status": "ok"})) == {"status": "ok"}


def choice(index: Any, text: Any = "x") -> dict[str, Any]:
    return {"index": index, "text": text, "finish_reason": "length"}


def test_choices_are_returned_in_prompt_order() -> None:
    body = {"choices": [choice(1, "b"), choice(0, "a"), choice(2, "c")]}
    assert [c["text"] for c in check_choices(answer(body), body, 3)] == ["a", "b", "c"]


@pytest.mark.parametrize(
    ("choices", "expected"),
    [
        (None, "no 'choices' list"),
        ([choice(0)], "1 choices came back for 2 prompts"),
        ([], "0 choices came back for 2 prompts"),
        ([choice(0), choice(0)], "two choices have index 0"),
        ([choice(0), choice(2)], "no index in 0..1"),
        ([choice(0), choice(True)], "no index in 0..1"),
        ([choice(0), "junk"], "no index in 0..1"),
        ([choice(0), choice(1, None)], "choice 1 has no 'text' string"),
    ],
)
def test_wrong_choices_are_malformed(choices: Any, expected: str) -> None:
    body = {"choices": choices}
    with pytest.raises(SidecarError) as caught:
        check_choices(answer(body), body, 2)
    err = caught.value
    assert err.reason == "malformed_response"
    assert expected in str(err)
