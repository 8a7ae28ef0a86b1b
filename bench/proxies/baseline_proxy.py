"""The Python baseline: the smallest honest aiohttp (uvloop) proxy that rewrites `model`.

It parses every JSON body with the stdlib, swaps the model through a fixed alias table,
re-serializes, forwards, and streams the answer back: what a first version of the sidecar
would do. The sidecar must beat it (issue 6).
"""

import argparse
import asyncio
import json
from typing import Any

import aiohttp
import uvloop
from aiohttp import web

HOP_BY_HOP = frozenset(
    h.lower()
    for h in (
        "Connection", "Keep-Alive", "Proxy-Authenticate", "Proxy-Authorization", "TE",
        "Trailer", "Transfer-Encoding", "Upgrade", "Host", "Content-Length",
    )
)  # fmt: skip
SESSION = web.AppKey("session", aiohttp.ClientSession)
UPSTREAM = web.AppKey("upstream", str)
ALIASES = web.AppKey("aliases", dict[str, str])


async def forward(request: web.Request) -> web.StreamResponse:
    return await _forward(request, request.app)


async def _forward(request: web.BaseRequest, app: web.Application) -> web.StreamResponse:
    body = await request.read()
    if body and request.content_type == "application/json":
        payload = json.loads(body)
        model = payload.get("model") if isinstance(payload, dict) else None
        if model in app[ALIASES]:
            payload["model"] = app[ALIASES][model]
            body = json.dumps(payload).encode()
    headers = {k: v for k, v in request.headers.items() if k.lower() not in HOP_BY_HOP}
    url = app[UPSTREAM] + request.path_qs
    async with app[SESSION].request(request.method, url, headers=headers, data=body) as upstream:
        response = web.StreamResponse(status=upstream.status)
        for k, v in upstream.headers.items():
            if k.lower() not in HOP_BY_HOP:
                response.headers[k] = v
        await response.prepare(request)
        async for chunk in upstream.content.iter_any():
            await response.write(chunk)
        await response.write_eof()
        return response


async def _low_level(args: argparse.Namespace, app: web.Application) -> None:
    """--low-level: the same handler under aiohttp's low-level `web_server.Server`: no
    Application, router, middleware chain or signals (measured for issue 21)."""
    from aiohttp import web_server

    async with aiohttp.ClientSession(
        connector=aiohttp.TCPConnector(limit=0),
        timeout=aiohttp.ClientTimeout(total=None, connect=10),
        auto_decompress=False,
    ) as session:
        app[SESSION] = session

        async def handler(request: web.BaseRequest) -> web.StreamResponse:
            return await _forward(request, app)

        loop = asyncio.get_running_loop()

        def request(*parts: Any) -> web.BaseRequest:
            # Server's own factory leaves BaseRequest's 1 MiB body limit (it takes no size).
            return web.BaseRequest(*parts, loop, client_max_size=64 * 1024 * 1024)

        server = web_server.Server(handler, request_factory=request)
        runner = web.ServerRunner(server, access_log=None)
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", args.port).start()
        await asyncio.Event().wait()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--upstream-url", required=True)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--alias", action="append", default=[], help="FROM=TO")
    parser.add_argument(
        "--low-level", action="store_true", help="web_server.Server, no Application"
    )
    args = parser.parse_args()
    app = web.Application(client_max_size=64 * 1024 * 1024)
    app[UPSTREAM] = args.upstream_url.rstrip("/")
    app[ALIASES] = dict(a.split("=", 1) for a in args.alias)

    async def session_ctx(app: web.Application):  # type: ignore[no-untyped-def]
        connector = aiohttp.TCPConnector(limit=0)
        timeout = aiohttp.ClientTimeout(total=None, connect=10)
        app[SESSION] = aiohttp.ClientSession(
            connector=connector, timeout=timeout, auto_decompress=False
        )
        yield
        await app[SESSION].close()

    if args.low_level:
        uvloop.run(_low_level(args, app))
        return
    app.cleanup_ctx.append(session_ctx)
    app.router.add_route("*", "/{tail:.*}", forward)
    loop = uvloop.new_event_loop()
    web.run_app(app, host="127.0.0.1", port=args.port, access_log=None, loop=loop)


if __name__ == "__main__":
    main()
