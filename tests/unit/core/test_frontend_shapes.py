"""The pure decisions over vLLM's bodies, on both HTTP frontends' captured bytes (tests/samples/):
the Rust frontend's 404 says `"type": "invalid_request_error", "code": "model_not_found"` (a
string) where the Python server says `"type": "NotFoundError", "code": 404`; its /v1/models
entries carry `root` without `permission`; an unknown route is a 404 with an empty body."""

from __future__ import annotations

import orjson
import pytest

from proxy.core import envelope, upstream_body
from proxy.core.resolution import ServedModel, parse_models_list
from tests.samples import FRONTENDS, sample


def upstream_envelope(frontend: str, name: str) -> dict[str, object]:
    got = sample(frontend, name)
    content_type = got.headers.get("content-type")
    reply = envelope.UpstreamReply(
        status=got.status,
        method="POST",
        path="/v1/completions",
        content_type=content_type,
        body=upstream_body.decode_body(
            got.body, content_type=content_type, content_encoding=None, truncated=False
        ),
        body_truncated=False,
    )
    return envelope.from_upstream_status(reply, request_id="r")["error"]  # type: ignore[return-value]


@pytest.mark.parametrize("frontend", FRONTENDS)
@pytest.mark.parametrize("name", ["c_wrong_model", "e1_stream_wrong_model_chat"])
def test_an_unknown_models_404_keeps_the_status_and_the_original_body(
    frontend: str, name: str
) -> None:
    error = upstream_envelope(frontend, name)
    assert error["code"] == 404  # the HTTP status, whatever the body's own `code`
    assert "`org/nope` does not exist" in str(error["message"])
    assert error["upstream"]["body"] == orjson.loads(sample(frontend, name).body)  # type: ignore[index]


def test_an_unknown_route_without_a_body_is_a_404_envelope() -> None:
    error = upstream_envelope("rust", "g6_unknown_route")
    assert (error["code"], error["type"]) == (404, "NotFoundError")
    assert error["upstream"]["body"] == ""  # type: ignore[index]


@pytest.mark.parametrize("frontend", FRONTENDS)
def test_the_models_list_names_the_served_model_and_its_root(frontend: str) -> None:
    served = parse_models_list(orjson.loads(sample(frontend, "a_models").body))
    assert [m.id for m in served] == ["tiny-llama"]
    root = served[0].root
    assert served[0] == ServedModel("tiny-llama", root)
    assert root is not None
    assert root.endswith("/tiny-llama")
