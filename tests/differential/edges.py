"""The HTTP/1 edges of issue 33, each sent through every hop and judged as a generated case is:
a chunked request body its parser gives up on after its head, a stream without a length to an
HTTP/1.0 client that asked to keep its connection, and an expectation no hop knows."""

from __future__ import annotations

from tests.differential.answers import Answer
from tests.differential.client_requests import Ask
from tests.differential.peers import Peers
from tests.differential.run import Outcome, answer_case, request_case

_HEAD = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"
_EVENTS = b'data: {"x": 1}\n\ndata: [DONE]\n\n'


def _bad_chunks(payload: bytes) -> Ask:
    fields = (("Content-Type", "application/json"), ("Transfer-Encoding", "chunked"))
    return Ask("POST", fields, b"", "chunked", payload)


def _unknown_expectation() -> Ask:
    body = b'{"x":1}'
    fields = (
        ("Expect", "x-unknown"),
        ("Content-Type", "application/json"),
        ("Content-Length", str(len(body))),
    )
    return Ask("POST", fields, body, "length", body)


def _stream() -> Answer:
    fields = (("Content-Type", "text/event-stream"), ("Transfer-Encoding", "chunked"))
    data = _HEAD + b"%x\r\n%s\r\n0\r\n\r\n" % (len(_EVENTS), _EVENTS)
    return Answer(data, "GET", 200, fields, "chunked", _EVENTS, 0, b"", "")


def edge_outcomes(peers: Peers) -> list[Outcome]:
    """Each edge case's outcome (nginx answers: 400 and a close for the bad chunks, wherever
    they arrive; the stream ended by the close; the request served)."""
    return [
        request_case(peers, _bad_chunks(b"zz\r\n"), split=True),
        request_case(peers, _bad_chunks(b'4\r\n{"x": 1}\r\n0\r\n\r\n'), split=True),
        answer_case(peers, _stream(), version=b"1.0"),
        request_case(peers, _unknown_expectation()),
    ]
