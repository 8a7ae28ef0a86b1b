"""Hop-by-hop removal (RFC 9110 section 7.6.1), X-Forwarded-*, request ids."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from multidict import CIMultiDict

from proxy.core.headers import drop, request_id, response_headers, upstream_request_headers


def test_hop_by_hop_and_connection_named_fields_are_dropped() -> None:
    incoming = CIMultiDict(
        [
            ("Connection", "keep-alive, X-Secret"),
            ("X-Secret", "1"),
            ("Keep-Alive", "5"),
            ("TE", "trailers"),
            ("Transfer-Encoding", "chunked"),
            ("Upgrade", "h2c"),
            ("Proxy-Authorization", "x"),
            ("Host", "client.example"),
            ("Content-Length", "9"),
            ("Authorization", "Bearer t"),
            ("Content-Type", "application/json"),
            ("Accept", "a"),
            ("Accept", "b"),
        ]
    )
    out = upstream_request_headers(
        incoming, rid="r1", client_ip="10.0.0.9", scheme="http", host="client.example"
    )
    for gone in (
        "Connection",
        "X-Secret",
        "Keep-Alive",
        "TE",
        "Transfer-Encoding",
        "Upgrade",
        "Proxy-Authorization",
        "Host",
        "Content-Length",
    ):
        assert gone not in out
    assert out["Authorization"] == "Bearer t"
    assert out.getall("Accept") == ["a", "b"]
    assert out["X-Forwarded-For"] == "10.0.0.9"
    assert out["X-Forwarded-Proto"] == "http"
    assert out["X-Forwarded-Host"] == "client.example"
    assert out["X-Request-Id"] == "r1"


def test_forwarded_for_appends_to_the_chain() -> None:
    out = upstream_request_headers(
        CIMultiDict({"X-Forwarded-For": "1.1.1.1"}),
        rid="r",
        client_ip="2.2.2.2",
        scheme="https",
        host=None,
    )
    assert out["X-Forwarded-For"] == "1.1.1.1, 2.2.2.2"
    assert "X-Forwarded-Host" not in out


def test_response_headers_keep_entity_headers() -> None:
    upstream = CIMultiDict(
        [
            ("Content-Encoding", "gzip"),
            ("Content-Length", "10"),
            ("Transfer-Encoding", "chunked"),
            ("Connection", "close"),
            ("Retry-After", "3"),
        ]
    )
    out = response_headers(upstream, rid="r")
    assert out["Content-Encoding"] == "gzip"
    assert out["Content-Length"] == "10"
    assert out["Retry-After"] == "3"
    assert out["X-Request-Id"] == "r"
    assert "Transfer-Encoding" not in out
    assert "Connection" not in out


def test_request_id_kept_or_made() -> None:
    assert request_id(CIMultiDict({"X-Request-Id": "abc-1"})) == "abc-1"
    made = request_id(CIMultiDict())
    assert len(made) == 32
    assert made != request_id(CIMultiDict())
    assert request_id(CIMultiDict({"X-Request-Id": "x" * 500})) != "x" * 500


def test_client_x_real_ip_is_replaced_and_forwarded_gets_our_element() -> None:
    out = upstream_request_headers(
        CIMultiDict(
            [("X-Real-IP", "6.6.6.6"), ("Forwarded", "for=6.6.6.6"), ("X-Real-Ip", "7.7.7.7")]
        ),
        rid="r",
        client_ip="::1",
        scheme="http",
        host="sidecar:8080",
    )
    assert out.getall("X-Real-IP") == ["::1"]
    assert out.getall("Forwarded") == ['for=6.6.6.6, for="[::1]";proto=http;host="sidecar:8080"']


def test_x_real_ip_is_not_invented_without_a_peer() -> None:
    out = upstream_request_headers(
        CIMultiDict({"X-Real-IP": "6.6.6.6"}), rid="r", client_ip=None, scheme="https", host=None
    )
    assert "X-Real-IP" not in out
    assert out["Forwarded"] == "for=unknown;proto=https"


@pytest.mark.parametrize("given", ["a b", "a\tb", 'a"b', "a\\b", "é", "x" * 201, ""])
def test_request_id_that_is_not_a_token_is_replaced(given: str) -> None:
    # It is logged, handed to vLLM and returned: spaces would forge log fields.
    rid = request_id(CIMultiDict({"X-Request-Id": given}))
    assert rid != given
    assert len(rid) == 32


@pytest.mark.parametrize("given", ["5f0c-9a", "req_01HV:trace/span+1=", "x" * 200, "[a]~!#$%&*"])
def test_request_id_tokens_pass(given: str) -> None:
    assert request_id(CIMultiDict({"X-Request-Id": given})) == given


def test_request_id_length_bounds() -> None:
    for kept in ("x", "x" * 200):
        assert request_id(CIMultiDict({"X-Request-Id": kept})) == kept
    assert len(request_id(CIMultiDict({"X-Request-Id": "x" * 201}))) == 32
    assert len(request_id(CIMultiDict({"X-Request-Id": "a\nb"}))) == 32


def test_connection_tokens_without_spaces_are_each_dropped() -> None:
    incoming = CIMultiDict([("Connection", "X-A,X-B"), ("X-A", "1"), ("X-B", "2"), ("X-C", "3")])
    out = response_headers(incoming, rid="r")
    assert sorted(out) == ["X-C", "X-Request-Id"]


def test_drop_removes_every_value_and_ignores_absent_names() -> None:
    headers = CIMultiDict([("Content-Length", "5"), ("content-length", "6"), ("X-Keep", "1")])
    drop(headers, ["Content-Length", "Content-Encoding"])
    assert list(headers.items()) == [("X-Keep", "1")]


_HOP = ("Connection", "Proxy-Connection", "Keep-Alive", "TE", "Trailer", "Transfer-Encoding")
_HOP_ALSO = ("Upgrade", "Proxy-Authenticate", "Proxy-Authorization")


@pytest.mark.parametrize("spell", [str.lower, str.upper, str.title, str.swapcase])
def test_hop_by_hop_fields_go_in_any_case(spell: Callable[[str], str]) -> None:
    """RFC 9110 section 5.1: field names are case-insensitive; uvicorn writes them in lower case
    and the lean hop keeps what the upstream wrote, so `transfer-encoding` must go too (relayed
    beside a Content-Length over an unchunked body, no client could read the answer)."""
    fields = [(spell(n), "x") for n in (*_HOP, *_HOP_ALSO)]
    fields += [(spell("Connection"), "X-Named"), ("x-NAMED", "1"), ("Content-Type", "a/b")]
    answer = response_headers(CIMultiDict(fields), rid="r")
    assert {k.lower() for k in answer} == {"content-type", "x-request-id"}
    sent = upstream_request_headers(
        CIMultiDict(fields), rid="r", client_ip=None, scheme="http", host=None
    )
    assert {k.lower() for k in sent} == {
        "content-type",
        "x-request-id",
        "forwarded",
        "x-forwarded-proto",
    }


def test_the_sidecars_own_answer_fields_never_come_from_the_upstream() -> None:
    """What the sidecar says about an answer (its error reason, the weight versions, whether it
    continued a generation) is its own: an upstream's forged copy is dropped before they are set."""
    upstream = CIMultiDict(
        [
            ("X-Sidecar-Error", "forged"),
            ("x-sidecar-continued", "3"),
            ("X-Weight-Version", "9"),
            ("x-weight-version-end", "9"),
            ("X-WEIGHT-VERSIONS", "9"),
            ("X-Weights", "kept: not a name of ours"),
        ]
    )
    out = response_headers(upstream, rid="r")
    assert {k.lower() for k in out} == {"x-weights", "x-request-id"}


def test_a_field_repeated_in_other_spellings_keeps_its_first_and_every_value() -> None:
    """One list whatever its spellings (RFC 9110 section 5.3); aiohttp's client keeps only the
    last spelling's values of a name it meets spelt anew, so every value goes out spelt alike."""
    fields = CIMultiDict([("X-Foo", "1"), ("x-foo", "2"), ("X-FOO", "3"), ("Y", "y")])
    sent = upstream_request_headers(fields, rid="r", client_ip=None, scheme="http", host=None)
    assert [(k, v) for k, v in sent.items() if k.lower() in ("x-foo", "y")] == [
        ("X-Foo", "1"),
        ("X-Foo", "2"),
        ("X-Foo", "3"),
        ("Y", "y"),
    ]
    answer = response_headers(CIMultiDict([("set-cookie", "a"), ("Set-Cookie", "b")]), rid="r")
    assert answer.getall("Set-Cookie") == ["a", "b"]
