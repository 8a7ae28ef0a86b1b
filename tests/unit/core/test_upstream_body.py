"""An upstream's error body, decoded and its message found, whatever its shape."""

from __future__ import annotations

import gzip
import json
import zlib

import pytest

from proxy.core import upstream_body

VLLM_404 = (
    b'{"error":{"message":"The model `X` does not exist. Valid aliases: Y.",'
    b'"type":"NotFoundError","param":"model","code":404}}'
)


def test_html_error_page_is_text_and_readable() -> None:
    html = b"<html><body><h1>500 Internal Server Error</h1>\n</body></html>"
    body = upstream_body.decode_body(
        html, content_type="text/html", content_encoding=None, truncated=False
    )
    assert body == html.decode()
    assert "500 Internal Server Error" in upstream_body.upstream_message(body)


def test_gzip_body_is_decoded() -> None:
    raw = gzip.compress(VLLM_404)
    body = upstream_body.decode_body(
        raw, content_type="application/json", content_encoding="gzip", truncated=False
    )
    assert body == json.loads(VLLM_404)


def test_truncated_json_becomes_text() -> None:
    body = upstream_body.decode_body(
        VLLM_404[:40], content_type="application/json", content_encoding=None, truncated=True
    )
    assert body == VLLM_404[:40].decode()


def test_invalid_json_with_json_type_becomes_text() -> None:
    body = upstream_body.decode_body(
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
    assert upstream_body.upstream_message(body) == message


@pytest.mark.parametrize("encoding", ["x-gzip", "deflate", "GZIP"])
def test_compressed_bodies_are_decoded(encoding: str) -> None:
    raw = zlib.compress(b'{"detail": "x"}') if encoding == "deflate" else gzip.compress(b'"x"')
    body = upstream_body.decode_body(
        raw, content_type=None, content_encoding=encoding, truncated=False
    )
    assert body in ({"detail": "x"}, "x")


@pytest.mark.parametrize(
    ("raw", "content_type", "encoding", "truncated", "decoded"),
    [
        (b"not gzip \xff", None, "gzip", False, "not gzip \ufffd"),  # bad framing: raw text
        (b'{"a": 1}', None, None, False, {"a": 1}),  # no type: JSON if it parses
        (b'{"a": 1}', "application/json", None, True, '{"a": 1}'),  # cut: never parsed
        (b"42", "text/plain", None, False, "42"),  # not JSON by type: stays text
        (b"\xff oops", "text/html", None, False, "\ufffd oops"),
        (b"", "application/json", None, False, ""),
    ],
)
def test_decode_body_cases(
    raw: bytes, content_type: str | None, encoding: str | None, truncated: bool, decoded: object
) -> None:
    body = upstream_body.decode_body(
        raw, content_type=content_type, content_encoding=encoding, truncated=truncated
    )
    assert body == decoded


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ({"message": "top-level"}, "top-level"),
        ({"x": "y" * 600}, ('{"x":"' + "y" * 600)[:500]),
        ("a  b\n c" + "z" * 600, ("a b c" + "z" * 600)[:500]),
        ("  \n", "(empty body)"),
        ([1, 2], "[1, 2]"),
        (list(range(300)), str(list(range(300)))[:500]),
    ],
)
def test_upstream_message_more_shapes(body: object, message: str) -> None:
    assert upstream_body.upstream_message(body) == message


def test_no_choices_is_the_first_choices_key_holding_an_empty_list() -> None:
    assert upstream_body.no_choices(b'{"id":"x","choices":[],"usage":{}}')
    assert upstream_body.no_choices(b'{"choices": [ ]}')
    assert not upstream_body.no_choices(b'{"choices":[{"index":0,"text":"\\"choices\\":[]"}]}')
    assert not upstream_body.no_choices(b'{"object":"list","data":[]}')
