"""The upstream connection: client session settings, URL building, client errors -> failures."""

from __future__ import annotations

import asyncio

import aiohttp
from yarl import URL

from .errors import (
    SidecarFailure,
    UpstreamDisconnected,
    UpstreamInvalidResponse,
    UpstreamTimeout,
    UpstreamUnreachable,
)
from .settings import Settings


def make_session(settings: Settings) -> aiohttp.ClientSession:
    """A session tuned for LLM traffic; each default below breaks it when left alone."""
    connector = aiohttp.TCPConnector(
        limit=settings.max_connections,  # 0: SkyRL sends 512 concurrent requests per engine
        limit_per_host=0,
        enable_cleanup_closed=False,
        ttl_dns_cache=60,
        # Idle connections are dropped before vLLM drops them (uvicorn's keep-alive timeout,
        # VLLM_HTTP_TIMEOUT_KEEP_ALIVE, is 5 s; aiohttp's default here is 15 s). Otherwise a
        # request can go out on a connection the upstream is closing that very moment, and a
        # POST is not retried: the client would get a 502 for a request vLLM never saw.
        keepalive_timeout=4.0,
    )
    timeout = aiohttp.ClientTimeout(
        total=None,  # generations can run for many minutes
        sock_connect=settings.connect_timeout,
        sock_read=settings.read_timeout,
    )
    return aiohttp.ClientSession(
        connector=connector,
        timeout=timeout,
        auto_decompress=False,  # relay Content-Encoding together with the bytes it describes
        # Relay the client's headers, not aiohttp's: add none of its defaults.
        skip_auto_headers=("User-Agent", "Accept", "Accept-Encoding", "Content-Type"),
        cookie_jar=aiohttp.DummyCookieJar(),
        trust_env=False,
    )


def base_url(settings: Settings) -> URL:
    return URL(settings.upstream_url)


def target(base: URL, raw_path_qs: str) -> URL:
    """The upstream URL for a request's raw path and query, passed byte for byte.

    Built from raw parts with `encoded=True`: yarl's `join()` would drop a base path and
    `with_query()` would encode the query a second time.
    """
    return URL(str(base).rstrip("/") + raw_path_qs, encoded=True)


class Interrupted(aiohttp.ClientPayloadError):
    """An upstream read the sidecar ended itself (a stream stuck in an engine phase); it carries
    the failure the client is told."""

    def __init__(self, failure: SidecarFailure) -> None:
        super().__init__(failure.message)
        self.failure = failure


def classify(exc: BaseException, *, where: str) -> SidecarFailure:
    """A client-side exception from talking to the upstream -> the failure the client is told."""
    if isinstance(exc, Interrupted):
        return exc.failure
    if isinstance(exc, aiohttp.ServerTimeoutError | asyncio.TimeoutError):
        return UpstreamTimeout(f"The upstream timed out {where}: {exc or type(exc).__name__}")
    if isinstance(exc, aiohttp.ClientConnectorError):
        return UpstreamUnreachable(f"Could not connect to the upstream {where}: {exc.os_error}")
    if isinstance(exc, aiohttp.ClientResponseError):
        return UpstreamInvalidResponse(
            f"The upstream sent an invalid HTTP response {where}: {exc.message}"
        )
    detail = str(exc) or type(exc).__name__
    return UpstreamDisconnected(f"The upstream connection dropped {where}: {detail}")


# What `classify` understands: raised while sending to or reading from the upstream.
UPSTREAM_ERRORS = (aiohttp.ClientError, asyncio.TimeoutError, ConnectionError)
