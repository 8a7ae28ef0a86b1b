"""The last line: an exception nobody foresaw still gets an envelope, a log line and a metric."""

from __future__ import annotations

import logging

from aiohttp import web

from .discovery import Discovery
from .errors import InternalError
from .exchange import Exchange
from .logs import text_field
from .metrics import Metrics
from .relay import failure_response

log = logging.getLogger(__name__)


def unexpected(
    request: web.Request, ex: Exchange, exc: Exception, metrics: Metrics, discovery: Discovery
) -> web.StreamResponse:
    """Log `exc` with its traceback and answer an `internal_error` envelope, not aiohttp's
    plain-text 500; once the answer's headers are out, cut its framing instead."""
    log.error(
        "internal error on %s %s request_id=%s",
        text_field(ex.method),
        text_field(ex.path),
        ex.request_id,
        exc_info=exc,
    )
    failure = InternalError(
        f"The sidecar failed unexpectedly on {ex.method} {ex.path} ({type(exc).__name__}); "
        "its log has the details under this request id."
    )
    if request.writer.output_size == 0:
        return failure_response(ex, failure, metrics, discovery)
    # The status is sent: an incomplete body makes every HTTP client raise, as for an upstream
    # that breaks mid-body. The response returned is never written (the transport is closed).
    ex.fail_with(metrics, failure)
    if request.transport is not None:
        request.transport.close()
    return web.Response()
