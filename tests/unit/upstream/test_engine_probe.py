"""The engine probe: weight versions made fit for a header, and vLLM's flags read from a server."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from pytest_aiohttp.plugin import AiohttpServer
from yarl import URL

from proxy.upstream.engine_probe import MAX_VERSION, Lenient, Probe, ProbeFailed, clean_version


@pytest.mark.parametrize(
    ("reported", "kept"),
    [
        ("step-7", "step-7"),
        ("default", "default"),
        (12, "12"),
        ("a\r\nX-Injected: 1", "a??X-Injected: 1"),
        ("grün", "gr?n"),
        ("v" * 500, "v" * MAX_VERSION),
    ],
)
def test_clean_version(reported: object, kept: str) -> None:
    assert clean_version(reported) == kept


# -- vLLM's flags, read from a tiny server (`Probe.busy`, `Probe.sleeping`, the version) ------

Flags = dict[str, Any]


def vllm(flags: Flags) -> web.Application:
    """A server with the dev-mode routes whose answers `flags` scripts (a missing key: 404)."""

    async def answer(request: web.Request) -> web.StreamResponse:
        key = request.path.strip("/")
        if key not in flags:
            raise web.HTTPNotFound()
        value = flags[key]
        if isinstance(value, bytes):
            return web.Response(body=value, content_type="application/json")
        return web.json_response(value)

    app = web.Application()
    app.router.add_get("/{route}", answer)
    return app


async def probe_of(aiohttp_server: AiohttpServer, flags: Flags) -> AsyncIterator[Probe]:
    server = await aiohttp_server(vllm(flags))
    async with aiohttp.ClientSession() as session:
        yield Probe(session, server.make_url(""), timeout=2.0)


@pytest.mark.parametrize(
    ("flags", "busy"),
    [
        ({"is_paused": {"is_paused": True}, "is_sleeping": {"is_sleeping": False}}, True),
        ({"is_paused": {"is_paused": False}, "is_sleeping": {"is_sleeping": True}}, True),
        ({"is_paused": {"is_paused": False}, "is_sleeping": {"is_sleeping": False}}, False),
        ({"is_paused": {"is_paused": False}}, False),  # one flag known is enough
        ({}, None),  # no dev mode: both 404
        ({"is_paused": b"not json", "is_sleeping": {"is_sleeping": "yes"}}, None),
        ({"is_paused": [True], "is_sleeping": {}}, None),
    ],
)
async def test_busy_reads_both_flags(
    aiohttp_server: AiohttpServer, flags: Flags, busy: bool | None
) -> None:
    async for probe in probe_of(aiohttp_server, flags):
        assert await probe.busy() is busy


async def test_sleeping_and_the_version(aiohttp_server: AiohttpServer) -> None:
    flags = {"is_sleeping": {"is_sleeping": True}, "weight_info": {"weight_version": "a\nb"}}
    async for probe in probe_of(aiohttp_server, flags):
        assert await probe.sleeping() is True
        assert await probe.weight_version() == "a?b"


async def test_an_unreachable_vllm_is_a_failed_probe_not_a_flag() -> None:
    async with aiohttp.ClientSession() as session:
        probe = Probe(session, URL("http://127.0.0.1:9"), timeout=2.0)  # discard: refused
        with pytest.raises(ProbeFailed) as failed:
            await probe.busy()
    assert not failed.value.timed_out


async def test_the_lenient_probe_answers_what_an_unreachable_vllm_leaves_unchanged() -> None:
    """What an answered control call reads afterwards (engine/steps.py): a vLLM it cannot ask
    is taken as awake and naming no version, so the call's own answer stands."""
    async with aiohttp.ClientSession() as session:
        lenient = Lenient(Probe(session, URL("http://127.0.0.1:9"), timeout=2.0))
        assert (await lenient.sleeping(), await lenient.weight_version()) == (False, None)
