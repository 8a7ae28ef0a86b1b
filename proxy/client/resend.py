"""Sent again, never twice run: what an exchange with vLLM may send once more instead of failing.

Three requests provably did not run: one vLLM 0.33 rejected as paused (client/peek.py: held
until the engine serves, then sent again), one whose connection a vLLM found healthy accepted
too late (nothing was sent), and one that went out on a kept-alive connection vLLM had closed
as idle (its kernel acknowledged none of it: upstream/marks.py). Anything else fails as it
failed, and a request that went out and got no answer says that it was not sent again.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from proxy.core.errors import SidecarFailure, UpstreamDisconnected, UpstreamUnreachable
from proxy.upstream.session import classify, closed_while_idle, never_connected

from .flow import Flow

log = logging.getLogger(__name__)

# A connect to a vLLM its last health check found up that timed out is tried again this many
# times: nothing was sent, and a busy vLLM on a loaded machine may accept late (a client
# talking to it directly would have waited). Past them, or for an upstream seen down, a 504.
RECONNECTS = 2
# A request that met vLLM closing its kept-alive connection is sent again on a new one this many
# times (a new connection is not idle: a second such close is something else).
RESENDS_ON_IDLE_CLOSE = 1


@dataclass(frozen=True, slots=True)
class Allowed:
    """What one send may hand back to be sent again instead of failing the request."""

    again: bool = False  # vLLM's paused rejection is looked for (a data-plane request, whole)
    unconnected: bool = False  # a connect to a healthy vLLM that timed out
    closed_idle: bool = False  # a kept-alive connection vLLM closed as the request went out

    def resend(self, exc: BaseException, *, answered: bool, healthy: bool) -> Exception | None:
        """What to raise for the upstream failure `exc` so that the request goes again, or
        None: it failed."""
        if self.unconnected and healthy and never_connected(exc):
            return Unconnected()
        if self.closed_idle and not answered and closed_while_idle(exc):
            return ClosedIdle()
        return None


ONCE = Allowed()  # sent once: nothing goes again
# Each of the eight, made once: a frozen dataclass is built through object.__setattr__, a
# call per field, and every request asks for one.
_EACH = {
    (again, unconnected, closed_idle): Allowed(again, unconnected, closed_idle)
    for again in (False, True)
    for unconnected in (False, True)
    for closed_idle in (False, True)
}


class Rejected(Exception):
    """vLLM rejected the request as paused: it did not run (core/rejection.py)."""


class Unconnected(Exception):
    """The connect to vLLM timed out: nothing was sent."""


class ClosedIdle(Exception):
    """vLLM closed the kept-alive connection as the request went out on it: it was not read."""


class Resends:
    """One request's sends so far, and what the next may hand back. The loop stays the
    caller's: a coroutine wrapped around the send would add a frame that every await of a
    streamed answer passes through (+3 to 5% CPU per request at 64 connections, measured):

        while True:
            try:
                return await send(resends.allowed())
            except RESENT as exc:
                await resends.after(exc)
    """

    __slots__ = ("again", "attempt", "connects", "flow", "rehold", "replayable", "stale")

    def __init__(self, flow: Flow, *, replayable: bool) -> None:
        self.flow, self.replayable = flow, replayable
        self.rehold = flow.engine.rehold
        self.again = self.rehold is not None and replayable
        self.attempt = self.connects = self.stale = 0

    def allowed(self) -> Allowed:
        idle_close = self.replayable and self.stale < RESENDS_ON_IDLE_CLOSE
        return _EACH[self.again, self.connects < RECONNECTS, idle_close]

    async def after(self, exc: Exception) -> None:
        """Ready to send again after `exc`, or raise what the client is told."""
        rec = self.flow.rec
        if isinstance(exc, Rejected) and self.rehold is not None:
            await self.rehold(self.attempt)
            self.attempt += 1
        elif isinstance(exc, Unconnected):
            self.connects += 1
            log.warning(
                "%s %s: vLLM accepted no connection in time; trying again (nothing was sent)",
                rec.method,
                rec.path,
            )
        elif isinstance(exc, ClosedIdle):
            self.stale += 1
            log.info(
                "%s %s: vLLM closed the kept-alive connection it went out on, as idle; sent "
                "again on a new one (it was not read)",
                rec.method,
                rec.path,
            )
        elif isinstance(exc, UpstreamUnreachable) and self.stale:
            # Sent again after its connection closed unanswered, and now vLLM is not there:
            # it may have gone down with the request, so nothing says it was never sent.
            raise UpstreamDisconnected(
                f"The upstream connection closed before an answer for {rec.method} {rec.path},"
                f" and sent again on a new connection it found no upstream: {exc.message}"
            ) from exc
        else:
            raise exc


def not_sent_again(exc: BaseException, *, answered: bool, where: str) -> SidecarFailure:
    """What the client is told of an upstream failure that does not go again; a connection that
    dropped before any answer says why the request was not sent again: vLLM may have run it."""
    failure = classify(exc, where=where)
    if answered or type(failure) is not UpstreamDisconnected:
        return failure
    return UpstreamDisconnected(
        f"{failure.message}. The request went out and no answer came; vLLM may have read and run"
        " it, so it was not sent again (a retry is the client's call)."
    )


# What a send raises that `Resends.after` judges (an UpstreamUnreachable after a resend is
# reported otherwise; before one it stands).
RESENT = (Rejected, Unconnected, ClosedIdle, UpstreamUnreachable)
