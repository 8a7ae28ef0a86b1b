"""What the current request's upstream call was, as both clients mark it for `classify`."""

from __future__ import annotations

from contextvars import ContextVar

# Whether the current request went out on a kept-alive connection that carried one before: set
# by the connection itself when the request is sent.
REUSED: ContextVar[bool] = ContextVar("sent_on_a_reused_connection", default=False)

# Whether the current request is waiting for a pooled connection: set in the request's own task
# (aiohttp's trace signals, or the lean pool), so each request sees its own value.
QUEUED: ContextVar[bool] = ContextVar("queued_for_upstream_pool", default=False)
