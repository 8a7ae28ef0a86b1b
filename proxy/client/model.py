"""The request's model: found in its body a slice at a time, and resolved to the served name."""

from __future__ import annotations

import asyncio

from proxy.core.body import MAX_SLICES, ModelField, Scan, replace_model, step
from proxy.core.errors import InvalidRequest, ModelAmbiguous
from proxy.core.modelkeys import TooComplex
from proxy.core.resolution import ABSENT, AMBIGUOUS, UNRESOLVED, Resolution

from .flow import Flow


async def locate(scan: Scan) -> ModelField | None:
    """Run a body scan on the loop a slice (a millisecond or two) at a time, letting every
    other request and the admin port in between: a hostile body costs a bounded amount of
    CPU time and stalls nothing. (A thread would not do: it holds the GIL for as long as the
    OS leaves it running, tens of ms on a loaded machine.)"""
    slices = 0
    while True:
        try:
            done, field = step(scan, slices)
        except TooComplex:
            raise InvalidRequest(
                f"The request body needs more than {MAX_SLICES} slices of scanning before its "
                "`model` key (millions of values, keys or escapes); send `model` first.",
                param="model",
            ) from None
        if done:
            return field
        slices += 1
        await asyncio.sleep(0)


async def resolved(flow: Flow, body: bytes, field: ModelField | None) -> bytes:
    """`body` with its model (`field`) replaced by the served name, the resolution recorded."""
    rec, discovery, metrics = flow.rec, flow.discovery, flow.metrics
    if field is None or field.value is None:
        metrics.resolutions.labels(ABSENT, "").inc()
        return body
    rec.requested = field.value
    res = discovery.table.resolve(field.value)
    if res.rule == UNRESOLVED:
        await discovery.refresh_on_miss()
        res = discovery.table.resolve(field.value)
    _record(flow, res)
    if res.rule == AMBIGUOUS:
        raise ModelAmbiguous(
            f"The model `{res.requested}` is ambiguous: it matches {' and '.join(res.candidates)}."
            " Ask for one of them by its served name.",
            candidates=res.candidates,
        )
    if res.served is not None and res.changed:
        return replace_model(body, field, res.served)
    return body


def _record(flow: Flow, res: Resolution) -> None:
    rec = flow.rec
    rec.rule, rec.resolved = res.rule, res.served
    flow.metrics.resolutions.labels(res.rule, res.served or "").inc()
