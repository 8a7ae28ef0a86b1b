"""A redirect vLLM answers names vLLM's own address; relayed as it is, it leads clients around the
sidecar: past its control token, its holds and its model rewrite, to an address they should not
learn. Starlette answers `POST /pause/` and `POST /v1/completions/` with a 307 to the same path
without the slash, on the Host the sidecar sent: the upstream's."""

from __future__ import annotations

from aiohttp import web
from yarl import URL

from proxy.upstream.session import UPSTREAM


def own_origin(location: str, upstream: URL, origin: str) -> str | None:
    """A `Location` on the upstream's origin (and under its base path), moved to `origin`, the
    request's own, as nginx's `proxy_redirect default` does; None when it names elsewhere."""
    try:  # yarl raises for what is no URL, and `origin()` for what has no scheme or a bad port
        url = URL(location, encoded=True)
        if not url.absolute or not url.scheme or url.origin() != upstream.origin():
            return None
    except ValueError:  # "//evil.example/x", "http://a:99999/": not the upstream's, left alone
        return None
    base = upstream.raw_path.rstrip("/")
    path = url.raw_path
    if base and not (path == base or path.startswith(base + "/")):
        return None
    rest = path[len(base) :] or "/"
    query = f"?{url.raw_query_string}" if url.raw_query_string else ""
    fragment = f"#{url.raw_fragment}" if url.raw_fragment else ""
    return f"{origin}{rest}{query}{fragment}"


def redirect_here(request: web.Request, response: web.StreamResponse) -> None:
    """At a response's prepare: a redirect to the upstream becomes one to the sidecar itself."""
    location = response.headers.get("Location")
    if location is None:
        return
    moved = own_origin(location, request.app[UPSTREAM], f"{request.scheme}://{request.host}")
    if moved is not None:
        response.headers["Location"] = moved
