"""What the current request's upstream call was, as both clients mark it for `classify`."""

from __future__ import annotations

import asyncio
import errno
import socket
import struct
from contextvars import ContextVar

# Linux's struct tcp_info: tcpi_bytes_acked (RFC 4898 tcpEStatsAppHCThruOctetsAcked), a u64 at
# byte 120, since Linux 4.1. Elsewhere there is no such count, and nothing is proven unread.
_TCP_INFO = getattr(socket, "TCP_INFO", None)
_ACKED = struct.Struct("=Q")
_ACKED_AT, _INFO_SIZE = 120, 128


class Wire:
    """One upstream connection's account of the request on it: whether it is the connection's
    first, and whether vLLM's kernel ever acknowledged a byte of it.

    A request may go again only when vLLM's application provably never read it. The proof is
    TCP's own: the peer's kernel acknowledges what it received in every segment it sends after,
    its FIN included, and an application reads only what its kernel received. uvicorn's idle
    close crossing the request on the wire is a FIN sent before the request arrived: it
    acknowledges none of it (the closed socket then answers the request with a reset, which a
    socket that had the FIN reports as EPIPE). A vLLM that read the request and then closed had
    acknowledged it in its FIN. A reset with no FIN before it (ECONNRESET) proves nothing: a
    reset carries no acknowledgement, and a peer may read and reset before its delayed ACK.
    """

    __slots__ = ("_acked", "_sock", "reused", "sent", "unread")

    def __init__(self, transport: asyncio.BaseTransport) -> None:
        sock = transport.get_extra_info("socket")
        tcp = sock is not None and sock.family in (socket.AF_INET, socket.AF_INET6)
        self._sock = sock if tcp and _TCP_INFO is not None else None
        self._acked: int | None = None
        self.reused = False  # the request went out on a kept-alive connection that carried one
        self.unread = False  # the connection was lost with no byte of the request acknowledged
        self.sent = 0  # requests written on this connection

    def sending(self) -> None:
        """A request is about to be written: what vLLM's kernel acknowledged so far is noted."""
        self.reused, self.unread = self.sent > 0, False
        self.sent += 1
        self._acked = self._acked_now()
        WIRE.set(self)

    def lost(self, exc: BaseException | None) -> None:
        """The connection is gone (the socket is still open), by a FIN (`exc` None, or EPIPE:
        a reset after a FIN): did that FIN acknowledge any of the request?"""
        fin = exc is None or (isinstance(exc, OSError) and exc.errno == errno.EPIPE)
        before, now = self._acked, self._acked_now()
        self.unread = fin and before is not None and now is not None and now <= before

    def _acked_now(self) -> int | None:
        if self._sock is None:
            return None
        try:
            info = self._sock.getsockopt(socket.IPPROTO_TCP, _TCP_INFO, _INFO_SIZE)
        except OSError:  # closed already, or not TCP after all
            return None
        if len(info) < _INFO_SIZE:  # a kernel before 4.1
            return None
        count: int = _ACKED.unpack_from(info, _ACKED_AT)[0]
        return count


# The current request's connection, as it was when the request was written: set by the
# connection itself (in the request's own task), read by `closed_while_idle` when it failed.
WIRE: ContextVar[Wire | None] = ContextVar("upstream_wire", default=None)

# Whether the current request is waiting for a pooled connection: set in the request's own task
# (aiohttp's trace signals, or the lean pool), so each request sees its own value.
QUEUED: ContextVar[bool] = ContextVar("queued_for_upstream_pool", default=False)
