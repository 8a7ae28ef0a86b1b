"""The proxy's hot-path upstream client, chosen by --upstream-client: the lean hop or aiohttp's."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from contextlib import AbstractAsyncContextManager
from typing import Any, Protocol

import aiohttp
from aiohttp import web
from multidict import CIMultiDict
from yarl import URL

from .lean import Answer, LeanClient
from .options import UpstreamOptions


class Hop(Protocol):
    """`async with hop.request(...) as resp`: what exchange.py calls, as aiohttp spells it."""

    def request(
        self,
        method: str,
        url: URL,
        *,
        data: Any = ...,
        headers: CIMultiDict[str],
        allow_redirects: bool = ...,
    ) -> AbstractAsyncContextManager[aiohttp.ClientResponse | Answer]: ...

    async def close(self) -> None: ...


@contextlib.asynccontextmanager
async def hop(
    options: UpstreamOptions, base: URL, session: aiohttp.ClientSession
) -> AsyncIterator[Hop]:
    """The client the proxied requests go through; discovery and checks keep `session`."""
    if options.upstream_client == "lean":
        async with LeanClient(base, options) as client:
            yield client
    else:
        yield session


HOP = web.AppKey("hop", Hop)
