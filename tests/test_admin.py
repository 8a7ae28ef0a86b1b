"""The admin port: /livez, /readyz, /models, /metrics; discovery failure and recovery."""

from __future__ import annotations

import aiohttp
from aiohttp.test_utils import TestServer
from prometheus_client.parser import text_string_to_metric_families

from proxy.client.drain import IN_FLIGHT
from proxy.upstream.discovery import DISCOVERY
from tests.fake_vllm import FakeVLLM, respond
from tests.sidecar import COMPLETION, MakeSidecar, Sidecar, StartSidecar
from tests.support import eventually, free_port, own_address


async def test_ready_when_healthy_and_names_known(sidecar: Sidecar) -> None:
    resp = await sidecar.admin.get("/readyz")
    assert resp.status == 200
    body = await resp.json()
    assert body["ready"] is True
    assert body["served"] == ["tiny-model"]
    assert sidecar.metric("vllm_sidecar_upstream_up") == 1


async def test_not_ready_while_draining(sidecar: Sidecar) -> None:
    await sidecar.app[IN_FLIGHT].drain(grace=0)  # what SIGTERM starts; nothing is in flight
    resp = await sidecar.admin.get("/readyz")
    assert resp.status == 503
    assert (await resp.json())["reason"] == "draining"
    assert (await sidecar.admin.get("/livez")).status == 200


async def test_livez_never_depends_on_the_upstream(make_sidecar: MakeSidecar) -> None:
    sidecar = await make_sidecar(f"http://127.0.0.1:{free_port()}", ready=False)
    assert (await sidecar.admin.get("/livez")).status == 200
    resp = await sidecar.admin.get("/readyz")
    assert resp.status == 503
    body = await resp.json()
    assert body["ready"] is False
    assert "/health failed" in body["reason"]
    assert sidecar.metric("vllm_sidecar_upstream_up") == 0


async def test_readiness_follows_the_upstream(sidecar: Sidecar, fake: FakeVLLM) -> None:
    fake.healthy = False
    await eventually(lambda: sidecar.metric("vllm_sidecar_upstream_up") == 0)
    resp = await sidecar.admin.get("/readyz")
    assert resp.status == 503
    assert "503" in (await resp.json())["reason"]
    fake.healthy = True
    await eventually(lambda: sidecar.metric("vllm_sidecar_upstream_up") == 1)
    assert (await sidecar.admin.get("/readyz")).status == 200


async def test_starts_with_upstream_down_then_learns_names(
    aiohttp_server: object, make_sidecar: MakeSidecar
) -> None:
    port = free_port()
    sidecar = await make_sidecar(f"http://127.0.0.1:{port}", ready=False)
    assert (await sidecar.admin.get("/readyz")).status == 503
    fake = FakeVLLM(served=[("late-model", "/m/org/late-model")])
    await aiohttp_server(fake.app(), port=port)  # type: ignore[operator]
    await sidecar.wait_ready()
    resp = await sidecar.client.post("/v1/completions", json={"model": "org/late-model"})
    assert resp.status == 200
    assert fake.last("/v1/completions").json()["model"] == "late-model"


async def test_discovery_failure_keeps_the_last_table_and_counts(
    upstream: TestServer, make_sidecar: MakeSidecar, fake: FakeVLLM
) -> None:
    sidecar = await make_sidecar(str(upstream.make_url("")), discovery_interval=0.05)
    fake.script("GET /v1/models", respond(500, b"oops"), times=3)
    await eventually(lambda: sidecar.metric("vllm_sidecar_discoveries_total", outcome="error") >= 1)
    assert (await sidecar.admin.get("/readyz")).status == 200
    resp = await sidecar.client.post("/v1/completions", json={"model": "x/tiny-model"})
    assert resp.status == 200
    fake.served = [("renamed", "/m/renamed")]  # vLLM restarted under another name
    await eventually(lambda: sidecar.app[DISCOVERY].table.names == ("renamed",))
    body = await (await sidecar.admin.get("/models")).json()
    assert [m["id"] for m in body["served"]] == ["renamed"]
    resp = await sidecar.client.post("/v1/completions", json={"model": "x/renamed"})
    assert resp.status == 200
    assert fake.last("/v1/completions").json()["model"] == "renamed"


async def test_discovery_sends_the_upstream_api_key(
    upstream: TestServer, make_sidecar: MakeSidecar, fake: FakeVLLM
) -> None:
    await make_sidecar(str(upstream.make_url("")), upstream_api_key="sk-test")
    assert fake.last("/v1/models").headers["Authorization"] == "Bearer sk-test"


async def test_fixed_served_names_skip_discovery(
    upstream: TestServer, make_sidecar: MakeSidecar, fake: FakeVLLM
) -> None:
    sidecar = await make_sidecar(str(upstream.make_url("")), served_model_names=["tiny-model"])
    assert not any(r.raw_path == "/v1/models" for r in fake.requests)
    resp = await sidecar.client.post("/v1/completions", json={"model": "a/tiny-model"})
    assert resp.status == 200
    assert fake.last("/v1/completions").json()["model"] == "tiny-model"


async def test_models_endpoint_shows_the_table(
    upstream: TestServer, make_sidecar: MakeSidecar
) -> None:
    sidecar = await make_sidecar(str(upstream.make_url("")), aliases={"policy": "tiny-model"})
    body = await (await sidecar.admin.get("/models")).json()
    (model,) = body["served"]
    assert model["id"] == "tiny-model"
    assert model["root"] == "/models/sidecar-test/tiny-model"
    assert {"alias": "policy", "rule": "alias"} in model["aliases"]
    assert {"alias": "/models/sidecar-test/tiny-model", "rule": "root"} in model["aliases"]
    assert body["case_insensitive"] is True


async def test_metrics_endpoint_is_prometheus_text(sidecar: Sidecar) -> None:
    await sidecar.client.get("/v1/models")
    resp = await sidecar.admin.get("/metrics")
    assert resp.headers["Content-Type"].startswith("text/plain; version=")
    names = {f.name for f in text_string_to_metric_families(await resp.text())}
    for name in (
        "vllm_sidecar_requests",
        "vllm_sidecar_request_duration_seconds",
        "vllm_sidecar_upstream_time_to_first_byte_seconds",
        "vllm_sidecar_failures",
        "vllm_sidecar_model_resolutions",
        "vllm_sidecar_in_flight_requests",
        "vllm_sidecar_client_disconnects",
        "vllm_sidecar_upstream_up",
    ):
        assert name in names


async def test_two_apps_share_no_metrics(upstream: TestServer, make_sidecar: MakeSidecar) -> None:
    a = await make_sidecar(str(upstream.make_url("")))
    b = await make_sidecar(str(upstream.make_url("")))
    await a.client.get("/v1/models")
    assert (
        a.metric("vllm_sidecar_requests_total", route="/v1/models", method="GET", status="200") == 1
    )
    assert (
        b.metric("vllm_sidecar_requests_total", route="/v1/models", method="GET", status="200") == 0
    )


async def test_with_a_token_drain_from_outside_needs_it(
    upstream: TestServer, start_sidecar: StartSidecar
) -> None:
    """The admin port listens on the pod's IP (for Prometheus): one POST from anyone who reaches
    it would otherwise take the pod out of service until it restarts."""
    proc = await start_sidecar(
        str(upstream.make_url("")), "--admin-host", "0.0.0.0", "--control-token", "T0KEN"
    )
    url = proc.url
    port = proc.admin_url.rsplit(":", 1)[1]
    outside = f"http://{own_address()}:{port}"
    async with aiohttp.ClientSession() as session:
        for auth in (None, "Bearer wrong", "T0KEN", "Basic T0KEN"):
            headers = {"Authorization": auth} if auth else {}
            async with session.post(outside + "/drain", headers=headers) as resp:
                assert resp.status == 401
                assert resp.headers["WWW-Authenticate"].startswith("Bearer")
                error = (await resp.json())["error"]
                assert error["reason"] == "unauthorized"
                assert "Nothing was drained" in error["message"]
        async with session.get(outside + "/readyz") as ready:
            assert ready.status == 200  # readiness is open to every prober, and still ready
        async with session.post(url + "/v1/completions", json=COMPLETION) as resp:
            assert resp.status == 200
        async with session.post(
            outside + "/drain", headers={"Authorization": "Bearer T0KEN"}
        ) as resp:
            assert resp.status == 200
            assert await resp.json() == {"draining": True, "in_flight": 0}
        async with session.get(outside + "/readyz") as ready:
            assert ready.status == 503


async def test_with_a_token_a_loopback_peer_needs_it_too(
    upstream: TestServer, start_sidecar: StartSidecar
) -> None:
    """Behind a service mesh every inbound connection comes from loopback (Linkerd's proxy
    connects from 127.0.0.1, Istio's from 127.0.0.6): there loopback is anyone who reaches the
    pod, so the token is what counts. The pod's preStop sends it (tests/test_drain.py)."""
    proc = await start_sidecar(
        str(upstream.make_url("")), "--admin-host", "0.0.0.0", "--control-token", "T0KEN"
    )
    admin = proc.admin_url
    peers = ["127.0.0.1", "127.0.0.6"]
    for peer in peers:
        async with aiohttp.ClientSession(connector=_from(peer)) as session:
            for auth in (None, "Bearer wrong"):
                headers = {"Authorization": auth} if auth else {}
                async with session.post(admin + "/drain", headers=headers) as resp:
                    assert resp.status == 401, peer
                    error = (await resp.json())["error"]
                    assert error["reason"] == "unauthorized"
                    assert "loopback included" in error["message"]
            async with session.get(admin + "/readyz") as ready:
                assert ready.status == 200  # nothing was drained
    async with aiohttp.ClientSession(connector=_from(peers[-1])) as session:
        auth = {"Authorization": "Bearer T0KEN"}
        async with session.post(admin + "/drain", headers=auth) as resp:
            assert resp.status == 200
            assert await resp.json() == {"draining": True, "in_flight": 0}
        async with session.get(admin + "/readyz") as ready:
            assert ready.status == 503


def _from(peer: str) -> aiohttp.TCPConnector:
    """Connections from this loopback address (all of 127/8 is this machine's, as on a pod)."""
    return aiohttp.TCPConnector(local_addr=(peer, 0))


async def test_without_a_token_drain_is_taken_from_loopback_only(
    upstream: TestServer, start_sidecar: StartSidecar
) -> None:
    """No token configured: the pod's preStop (127.0.0.1, deploy/kubernetes/deployment.yaml)
    drains with none; a peer at the pod's IP is refused, whatever it sends."""
    proc = await start_sidecar(str(upstream.make_url("")), "--admin-host", "0.0.0.0")
    port = proc.admin_url.rsplit(":", 1)[1]
    async with aiohttp.ClientSession() as session:
        async with session.post(
            f"http://{own_address()}:{port}/drain", headers={"Authorization": "Bearer T0KEN"}
        ) as resp:
            assert resp.status == 401
            error = (await resp.json())["error"]
            assert "only from a loopback peer" in error["message"]
        async with session.get(proc.admin_url + "/readyz") as ready:
            assert ready.status == 200
        async with session.post(proc.admin_url + "/drain") as resp:
            assert resp.status == 200
            assert await resp.json() == {"draining": True, "in_flight": 0}
        async with session.get(proc.admin_url + "/readyz") as ready:
            assert ready.status == 503
