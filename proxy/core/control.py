"""Which plane a request is on (the table is routes.py), and the control token's check."""

from __future__ import annotations

import hmac

from .routes import CONTROL, DATA, plane_of


def plane(method: str, path: str) -> str | None:
    """`control`, `data`, or None for everything else (reads, health, metrics, tokenize)."""
    kind = plane_of(path)
    if kind == CONTROL or (kind == DATA and method == "POST"):
        return kind
    return None


def authorized(header: str | None, token: bytes) -> bool:
    """Whether an Authorization header carries `Bearer <token>`, compared in constant time."""
    scheme, _, given = (header or "").strip().partition(" ")
    # RFC 9110 section 11.1: the scheme is case-insensitive.
    if scheme.lower() != "bearer":
        return False
    return hmac.compare_digest(given.strip().encode("utf-8", "surrogateescape"), token)
