"""Client-sent values cannot forge access-log lines or fields, nor make a line of megabytes."""

from __future__ import annotations

import logging

import pytest

from proxy.observe.logs import JSONFormatter
from tests.sidecar import Sidecar

FIELD_CHARS = 256  # what the log keeps of a client-sent value (proxy.logs.FIELD_CHARS)
FORGED_LINE = "\n2026-11-30 12:00:00,000 INFO proxy.access: POST /v1/completions 200 1.0ms"
TEXT = logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s")  # as `logs.setup`


def access_lines(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [TEXT.format(r) for r in caplog.records if r.name == "proxy.access"]


async def test_newlines_and_spaces_are_escaped_and_long_values_capped(
    sidecar: Sidecar, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, "proxy.access")
    forged_id = "abc rule=exact status=200"
    resp = await sidecar.client.post(
        "/v1/completions",
        json={"model": "tiny" + FORGED_LINE, "prompt": "hi"},
        headers={"X-Request-Id": forged_id},
    )
    assert resp.status == 404
    rid = resp.headers["X-Request-Id"]
    assert rid != forged_id  # refused: not a token
    resp = await sidecar.client.get("/v1/x%0D%09forged%E2%80%A8too")
    assert resp.status == 404
    long_name = "q" * 1000
    resp = await sidecar.client.post("/v1/completions", json={"model": long_name, "prompt": "x"})
    assert resp.status == 404

    lines = access_lines(caplog)
    assert len(lines) == 3
    for line in lines:
        assert len(line.splitlines()) == 1, line
    forged, path, long_line = lines
    assert 'model="tiny\\n2026-11-30 12:00:00,000 INFO proxy.access: POST' in forged
    assert f"request_id={rid} " in forged
    assert forged.endswith(f'client_request_id="{forged_id}"')
    assert ' "/v1/x\\r\\tforged\\u2028too" ' in path
    assert f"model={'q' * FIELD_CHARS}…->None " in long_line

    fields = [r.fields() for r in caplog.records if r.name == "proxy.access"]  # type: ignore[attr-defined]
    assert fields[0]["client_request_id"] == forged_id
    assert fields[2]["model_requested"] == "q" * FIELD_CHARS + "…"
    json_line = JSONFormatter().format(caplog.records[-1])
    assert len(json_line.splitlines()) == 1
    assert len(json_line) < 1000
