"""Reading vLLM's own view of its phase: /is_paused, /is_sleeping and /weight_info, bounded."""

from __future__ import annotations

import asyncio
from typing import Any

import aiohttp
import orjson
from yarl import URL

from .session import UPSTREAM_ERRORS, target

MAX_VERSION = 200  # characters of a weight version kept (a label value and a header)


def clean_version(value: object) -> str:
    """A weight version fit for a header and a label: printable ASCII, at most 200 characters.

    vLLM takes any string from the trainer; a newline in it would make every answer's
    X-Weight-Version header invalid.
    """
    text = str(value)[:MAX_VERSION]
    return "".join(c if " " <= c <= "~" else "?" for c in text)


class ProbeFailed(Exception):
    """vLLM could not be asked: down or restarting, or (`timed_out`) only too slow to answer.

    Only the first is a sign of a restart: vLLM's API server answers slowly while it takes
    in new weights, and a sync taken for a restart would release held requests into it."""

    def __init__(self, message: str, *, timed_out: bool) -> None:
        super().__init__(message)
        self.timed_out = timed_out


class Probe:
    """GETs of vLLM's dev-mode state routes; each within `timeout` seconds."""

    def __init__(self, session: aiohttp.ClientSession, base: URL, timeout: float) -> None:
        self._session = session
        self._base = base
        self._timeout = aiohttp.ClientTimeout(total=timeout)
        self.missing: set[str] = set()  # the routes vLLM last answered with a 404

    async def _get(self, path: str, key: str) -> Any:
        """The value of `key` in the route's JSON answer; None when vLLM lacks the route
        (no dev mode: VLLM_SERVER_DEV_MODE unset) or answers something else."""
        try:
            raw, status = await self._read(path)
        except UPSTREAM_ERRORS as exc:
            slow = isinstance(exc, asyncio.TimeoutError | aiohttp.ServerTimeoutError)
            message = f"GET {path}: {exc or type(exc).__name__}"
            raise ProbeFailed(message, timed_out=slow) from exc
        if status == 404:
            self.missing.add(path)
        else:
            self.missing.discard(path)
        if status != 200:
            return None
        try:
            body = orjson.loads(raw)
        except orjson.JSONDecodeError:
            return None
        return body.get(key) if isinstance(body, dict) else None

    async def _read(self, path: str) -> tuple[bytes, int]:
        # A pooled connection vLLM closed as it was reused is no outage: aiohttp asks again
        # on a new one by itself (a GET is idempotent).
        url = target(self._base, path)
        async with self._session.get(url, timeout=self._timeout) as resp:
            return await resp.read(), resp.status

    async def busy(self) -> bool | None:
        """True when vLLM says it is paused or asleep, False when neither, None when unknown."""
        paused, sleeping = await asyncio.gather(
            self._get("/is_paused", "is_paused"), self._get("/is_sleeping", "is_sleeping")
        )
        if not isinstance(paused, bool) and not isinstance(sleeping, bool):
            return None
        return paused is True or sleeping is True

    async def sleeping(self) -> bool | None:
        value = await self._get("/is_sleeping", "is_sleeping")
        return value if isinstance(value, bool) else None

    async def weight_version(self) -> str | None:
        value = await self._get("/weight_info", "weight_version")
        return None if value is None else clean_version(value)


class Lenient:
    """A probe whose failures are answers: what an answered control call reads of vLLM
    (engine/steps.py's `Flags`), where a slow or unreachable vLLM changes nothing."""

    def __init__(self, probe: Probe) -> None:
        self.probe = probe

    async def sleeping(self) -> bool | None:
        """As `Probe.sleeping`; False (taken as awake) when vLLM could not be asked."""
        try:
            return await self.probe.sleeping()
        except ProbeFailed:
            return False

    async def weight_version(self) -> str | None:
        try:
            return await self.probe.weight_version()
        except ProbeFailed:
            return None
