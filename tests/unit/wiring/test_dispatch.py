"""The proxy port's dispatch (wiring/dispatch.py): a request with a path reaches the one route
without the router or the middlewares; `Expect` and one without a path keep aiohttp's own path."""

from __future__ import annotations

from typing import Any

from aiohttp import web
from aiohttp.test_utils import TestClient
from aiohttp.typedefs import Handler

from proxy.wiring import dispatch


def app_with_one_route() -> tuple[web.Application, list[str]]:
    """One route for every method at `/`, a middleware that notes each request it sees, and a
    prepare signal that marks each answer: what the dispatch must keep or skip."""
    seen: list[str] = []

    @web.middleware
    async def noting(request: web.Request, handler: Handler) -> web.StreamResponse:
        seen.append(request.method)
        return await handler(request)

    async def answer(request: web.Request) -> web.Response:
        body = await request.read()
        same_app = request.app is app and request.match_info.route.resource is not None
        return web.json_response({"read": len(body), "same_app": same_app})

    async def marked(request: web.Request, response: web.StreamResponse) -> None:
        response.headers["X-Prepared"] = "1"

    app = web.Application(middlewares=[noting])
    app.router.add_route("*", "/", answer)
    app.on_response_prepare.append(marked)
    return app, seen


async def serving(aiohttp_client: Any, app: web.Application) -> TestClient[Any, Any]:
    client: TestClient[Any, Any] = await aiohttp_client(app)
    dispatch.install(client.server.runner, app)
    return client


async def test_a_request_with_a_path_skips_the_router_and_middlewares(aiohttp_client: Any) -> None:
    app, seen = app_with_one_route()
    client = await serving(aiohttp_client, app)
    for _ in range(2):
        response = await client.post("/", data=b"abc")
        assert response.status == 200
        assert await response.json() == {"read": 3, "same_app": True}
        assert response.headers["X-Prepared"] == "1"  # the app's signals still run
    assert seen == []


async def test_expect_takes_aiohttps_own_path(aiohttp_client: Any) -> None:
    app, seen = app_with_one_route()
    client = await serving(aiohttp_client, app)
    response = await client.post("/", data=b"abcd", headers={"Expect": "100-continue"})
    assert response.status == 200
    assert await response.json() == {"read": 4, "same_app": True}
    assert seen == ["POST"]


async def test_the_full_path_without_install(aiohttp_client: Any) -> None:
    """The middleware does see a request when the lean path is not installed: the first test's
    `seen == []` is the dispatch's doing."""
    app, seen = app_with_one_route()
    client = await aiohttp_client(app)
    assert (await client.get("/")).status == 200
    assert seen == ["GET"]
