"""One HTTP exchange with the sidecar, read whole into an Answer; no failure escapes unexplained."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import aiohttp

from proxy.skyrl.checks import Answer
from proxy.skyrl.errors import SidecarError

CONTROL_TOKEN_ENV = "VLLM_SIDECAR_CONTROL_TOKEN"


async def exchange(
    session: aiohttp.ClientSession,
    method: str,
    url: str,
    *,
    json: Any = None,
    params: Mapping[str, Any] | None = None,
    headers: Mapping[str, str] | None = None,
) -> Answer:
    """Send one request and read its whole answer; a connection failure is a ``SidecarError``."""
    try:
        async with session.request(method, url, json=json, params=params, headers=headers) as resp:
            body = await resp.read()
    except TimeoutError as exc:
        raise unreachable(method, url, "sidecar_timeout", "timed out", exc) from exc
    except aiohttp.ClientConnectorError as exc:
        raise unreachable(method, url, "sidecar_unreachable", "cannot connect", exc) from exc
    except aiohttp.ClientError as exc:
        raise unreachable(method, url, "sidecar_disconnected", "connection lost", exc) from exc
    return Answer(
        method=method,
        url=str(resp.url),
        status=resp.status,
        body=body,
        content_type=resp.content_type,
        request_id=resp.headers.get("X-Request-Id"),
        retry_after=retry_after(resp.headers.get("Retry-After")),
        weight_version=resp.headers.get("X-Weight-Version"),
        weight_version_end=resp.headers.get("X-Weight-Version-End"),
    )


def retry_after(value: str | None) -> float | None:
    """Seconds from a ``Retry-After`` header (RFC 9110 section 10.2.3); the date form is ignored."""
    try:
        return max(0.0, float(value)) if value else None
    except ValueError:
        return None


def bearer(token: str | None) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"} if token else {}


def unreachable(method: str, url: str, reason: str, what: str, exc: BaseException) -> SidecarError:
    return SidecarError(
        f"{what} to the sidecar ({type(exc).__name__}: {exc})",
        reason=reason,
        method=method,
        url=url,
    )
