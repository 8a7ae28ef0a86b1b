"""Every error answer the sidecar sends: an envelope response, or an SSE error event mid-stream."""

from __future__ import annotations

import logging

import aiohttp
from aiohttp import web
from multidict import CIMultiDict

from proxy.core import envelope, upstream_body
from proxy.core.envelope import Envelope, ModelInfo
from proxy.core.errors import InternalError, SidecarFailure
from proxy.core.headers import SIDECAR_ERROR, drop, response_headers
from proxy.observe.logs import text_field

from .flow import Flow

log = logging.getLogger(__name__)

_ENTITY = ("Content-Length", "Content-Type", "Content-Encoding")


def model_info(flow: Flow, *, suggest: bool) -> ModelInfo | None:
    """The envelope's `model` block; suggestions only for names that matched nothing."""
    rec, table = flow.rec, flow.discovery.table
    if rec.requested is None:
        return None
    suggestions = table.suggestions(rec.requested) if suggest and rec.resolved is None else ()
    return ModelInfo(rec.requested, rec.resolved, table.names, suggestions)


def envelope_response(
    flow: Flow, status: int, env: Envelope, headers: CIMultiDict[str] | None = None
) -> web.Response:
    rec = flow.rec
    out = headers if headers is not None else CIMultiDict()
    drop(out, _ENTITY)
    out[SIDECAR_ERROR] = env["error"]["reason"]
    out["X-Request-Id"] = rec.request_id
    rec.status = status
    return web.Response(
        status=status, body=envelope.encode(env), content_type="application/json", headers=out
    )


def failure_response(flow: Flow, failure: SidecarFailure) -> web.Response:
    """A failure the sidecar detected before any byte of the answer went out."""
    rec = flow.rec
    rec.fail_with(flow.metrics, failure)
    info = model_info(flow, suggest=False)
    env = envelope.from_failure(failure, request_id=rec.request_id, model=info)
    return envelope_response(flow, failure.status, env)


def sse_error(flow: Flow, failure: SidecarFailure, info: ModelInfo | None) -> bytes:
    """A failure after a 200 stream began: one SSE error event and [DONE], as vLLM does."""
    rid = flow.rec.request_id
    return envelope.sse_event(envelope.from_failure(failure, request_id=rid, model=info))


def error_reply(
    flow: Flow, resp: aiohttp.ClientResponse, raw: bytes, truncated: bool
) -> web.Response:
    """An upstream 4xx/5xx: its status kept, its body (`raw`, read up to the error body limit;
    `truncated` if there was more) parsed and attached to the envelope. No I/O: the caller has
    read the body, and refreshed the model table where a 404 calls for it."""
    rec = flow.rec
    content_type = resp.headers.get("Content-Type")
    reply = envelope.UpstreamReply(
        status=resp.status,
        method=rec.method,
        path=rec.path,
        content_type=content_type,
        body=upstream_body.decode_body(
            raw,
            content_type=content_type,
            content_encoding=resp.headers.get("Content-Encoding"),
            truncated=truncated,
        ),
        body_truncated=truncated,
    )
    info = model_info(flow, suggest=resp.status == 404)
    env = envelope.from_upstream_status(reply, request_id=rec.request_id, model=info)
    rec.fail(flow.metrics, "upstream", "upstream_status", resp.status)
    headers = response_headers(resp.headers, rid=rec.request_id)
    return envelope_response(flow, resp.status, env, headers)


def unexpected(flow: Flow, exc: Exception) -> web.StreamResponse:
    """The last line: log `exc` with its traceback and answer an `internal_error` envelope, not
    aiohttp's plain-text 500; once the answer's headers are out, cut its framing instead."""
    request, rec = flow.request, flow.rec
    log.error(
        "internal error on %s %s request_id=%s",
        text_field(rec.method),
        text_field(rec.path),
        rec.request_id,
        exc_info=exc,
    )
    failure = InternalError(
        f"The sidecar failed unexpectedly on {rec.method} {rec.path} ({type(exc).__name__}); "
        "its log has the details under this request id."
    )
    if request.writer.output_size == 0:
        return failure_response(flow, failure)
    # The status is sent: an incomplete body makes every HTTP client raise, as for an upstream
    # that breaks mid-body. The response returned is never written (the transport is closed).
    rec.fail_with(flow.metrics, failure)
    if request.transport is not None:
        request.transport.close()
    return web.Response()
