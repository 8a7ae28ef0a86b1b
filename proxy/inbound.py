"""The client's side of a request: its body, read within limits, and its model, resolved."""

from __future__ import annotations

from aiohttp import web

from .body import find_model, replace_model
from .discovery import Discovery
from .envelope import ModelInfo
from .errors import BodyTooLarge, ModelAmbiguous
from .exchange import Exchange
from .metrics import Metrics
from .resolution import ABSENT, AMBIGUOUS, UNRESOLVED, Resolution

_BODY_METHODS = frozenset(("POST", "PUT", "PATCH"))


async def read_body(request: web.Request, limit: int) -> bytes:
    """The whole request body; a declared or actual size over `limit` is refused unread."""
    if request.content_length is not None and request.content_length > limit:
        raise BodyTooLarge(
            f"The request body of {request.content_length} bytes exceeds the limit of {limit} "
            "bytes (--max-body-bytes)."
        )
    try:
        return await request.read()
    except web.HTTPRequestEntityTooLarge:
        raise BodyTooLarge(
            f"The request body exceeds the limit of {limit} bytes (--max-body-bytes)."
        ) from None


def _wants_model(request: web.Request, body: bytes) -> bool:
    return (
        bool(body)
        and request.method in _BODY_METHODS
        and request.content_type.endswith("json")
        # A compressed body is relayed as sent; its model cannot be read without inflating it.
        and request.headers.get("Content-Encoding", "identity").lower() == "identity"
    )


async def resolve_model(
    request: web.Request, body: bytes, ex: Exchange, discovery: Discovery, metrics: Metrics
) -> bytes:
    """The body to forward, with only its `model` value replaced by the served name."""
    field = find_model(body) if _wants_model(request, body) else None
    if field is None or field.value is None:
        metrics.resolutions.labels(ABSENT, "").inc()
        return body
    ex.requested = field.value
    res = discovery.table.resolve(field.value)
    if res.rule == UNRESOLVED:
        await discovery.refresh_on_miss()
        res = discovery.table.resolve(field.value)
    _record(res, ex, metrics)
    if res.rule == AMBIGUOUS:
        raise ModelAmbiguous(
            f"The model `{res.requested}` is ambiguous: it matches {' and '.join(res.candidates)}."
            " Ask for one of them by its served name.",
            candidates=list(res.candidates),
        )
    if res.served is not None and res.changed:
        return replace_model(body, field, res.served)
    return body


def _record(res: Resolution, ex: Exchange, metrics: Metrics) -> None:
    ex.rule, ex.resolved = res.rule, res.served
    metrics.resolutions.labels(res.rule, res.served or "").inc()


def model_info(ex: Exchange, discovery: Discovery, *, suggest: bool) -> ModelInfo | None:
    """The envelope's `model` block; suggestions only for names that matched nothing."""
    if ex.requested is None:
        return None
    table = discovery.table
    suggestions = table.suggestions(ex.requested) if suggest and ex.resolved is None else ()
    return ModelInfo(ex.requested, ex.resolved, table.names, suggestions)
