"""The image built from the shipped Dockerfile, run as the pod runs it: its config, what it
installs, the sidecar inside it in front of a fake vLLM, its HEALTHCHECK, and its shutdown."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import time
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer
from packaging.utils import canonicalize_name

from tests.fake_vllm import FakeVLLM
from tests.manifests import KUBERNETES, kustomize_build
from tests.metrics import sample, scrape
from tests.procfs import children
from tests.sidecar import COMPLETION, assert_envelope
from tests.support import eventually, free_port, refuses_connections

from .buildah import Container, Image, entrypoint_pid, image_size, real_uid
from .lock import RUNTIME_LOCK, pyproject, read_lock
from .pod import Pod, sidecar_env, start_sidecar

pytestmark = pytest.mark.slow

# What the sidecar's own layers may add to the base: its venv is about 72 MB today.
SIDECAR_LAYERS_BUDGET = 100 * 10**6
GRACE = 10  # seconds; the Deployment's 25 would only make a failure slower to show


def test_image_runs_its_console_script_as_the_manifests_numeric_non_root_user(
    image: Image,
) -> None:
    config = image.config()
    assert config["Entrypoint"] == ["vllm-sidecar"]  # exec form: the sidecar itself is PID 1
    assert not config.get("Cmd")
    uid, _, gid = config["User"].partition(":")
    assert uid.isdigit(), config["User"]  # runAsNonRoot can verify a number, not a name
    assert gid.isdigit(), config["User"]
    deployment = next(d for d in kustomize_build(KUBERNETES) if d["kind"] == "Deployment")
    security = deployment["spec"]["template"]["spec"]["initContainers"][0]["securityContext"]
    assert (int(uid), int(gid)) == (security["runAsUser"], security["runAsGroup"])
    assert int(uid) != 0
    assert set(config["ExposedPorts"]) == {"8080/tcp", "8081/tcp"}


def test_image_adds_less_than_its_budget_to_the_base(image: Image) -> None:
    added = image_size(image.id) - image_size(image.base)
    assert 0 < added < SIDECAR_LAYERS_BUDGET, f"the sidecar's layers: {added / 1e6:.0f} MB"


# Run in the image's Python: what is installed, and the values markers are evaluated against.
INSTALLED = """
import importlib.metadata as m, json, os, platform, sys
env = {"python_version": "%d.%d" % sys.version_info[:2], "python_full_version":
       platform.python_version(), "platform_machine": platform.machine(), "sys_platform":
       sys.platform, "platform_system": platform.system(), "os_name": os.name,
       "implementation_name": sys.implementation.name,
       "platform_python_implementation": platform.python_implementation()}
print(json.dumps({"env": env, "installed": {d.metadata["Name"]: d.version
                                            for d in m.distributions()}}))
"""


def test_image_installs_exactly_what_the_lock_pins(image: Image, container: Container) -> None:
    result = container.exec(["python", "-c", INSTALLED], {})
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    installed: dict[str, str] = {
        canonicalize_name(name): version for name, version in report["installed"].items()
    }
    assert installed.pop("vllm-sidecar") == pyproject()["project"]["version"]
    for tool in ("pip", "setuptools"):  # the venv's own installer (3.11's venv adds setuptools)
        installed.pop(tool, None)
    wanted = {
        pin.name: pin.version
        for pin in read_lock(RUNTIME_LOCK)
        if pin.requirement.marker is None or pin.requirement.marker.evaluate(report["env"])
    }
    assert installed == wanted


# -- the pod: the sidecar container as deploy/kubernetes runs it ------------------------------
async def post(url: str, body: dict[str, Any]) -> tuple[aiohttp.ClientResponse, dict[str, Any]]:
    async with aiohttp.ClientSession() as session, session.post(url, json=body) as resp:
        return resp, await resp.json()


async def test_pod_resolves_an_hf_path_to_the_name_vllm_serves(pod: Pod) -> None:
    before = await scrape(pod.sidecar.admin_url)
    url = pod.sidecar.url
    resp, body = await post(f"{url}/v1/completions", COMPLETION)  # model: org/tiny-model
    assert resp.status == 200, body
    assert body["model"] == "tiny-model"  # the fake answers with the name it was sent
    after = await scrape(pod.sidecar.admin_url)
    labels = {"rule": "basename", "served_model": "tiny-model"}
    resolved = "vllm_sidecar_model_resolutions_total"
    assert sample(after, resolved, **labels) == sample(before, resolved, **labels) + 1
    ok = {"route": "/v1/completions", "method": "POST", "status": "200"}
    served = "vllm_sidecar_requests_total"
    assert sample(after, served, **ok) == sample(before, served, **ok) + 1


async def test_pod_answers_an_unknown_model_with_the_error_envelope(pod: Pod) -> None:
    before = await scrape(pod.sidecar.admin_url)
    async with (
        aiohttp.ClientSession() as session,
        session.post(
            f"{pod.sidecar.url}/v1/completions", json={"model": "org/nope", "prompt": "x"}
        ) as r,
    ):
        error = await assert_envelope(r, 404, "upstream_status")
    assert error["source"] == "upstream"
    assert error["model"]["requested"] == "org/nope"
    assert error["model"]["served"] == ["tiny-model"]
    assert error["upstream"]["status"] == 404
    after = await scrape(pod.sidecar.admin_url)
    failed = {"route": "/v1/completions", "source": "upstream", "reason": "upstream_status"}
    counter = "vllm_sidecar_failures_total"
    assert sample(after, counter, **failed, status="404") == (
        sample(before, counter, **failed, status="404") + 1
    )


def test_pod_runs_two_workers_as_the_numeric_user_on_a_read_only_root(pod: Pod) -> None:
    supervisor = entrypoint_pid(pod.sidecar)
    workers = children(supervisor)
    assert len(workers) == int(pod.env["VLLM_SIDECAR_WORKERS"]) == 2
    assert {real_uid(pid) for pid in [supervisor, *workers]} == {65532}
    # The workers' metrics live in /tmp (prometheus_client's multiprocess files): writable.
    write = "import sys; open(sys.argv[1] + '/probe', 'w').close()"
    assert pod.container.exec(["python", "-c", write, "/tmp"], pod.env).returncode == 0
    for path in ("/", "/opt/vllm-sidecar", "/etc"):
        denied = pod.container.exec(["python", "-c", write, path], pod.env)
        assert "Read-only file system" in denied.stderr, (path, denied.stderr)


def test_healthcheck_from_the_image_config_passes_in_the_pod_and_fails_without_a_sidecar(
    image: Image, pod: Pod
) -> None:
    healthcheck = image.config()["Healthcheck"]
    assert healthcheck["Test"][0] == "CMD"  # exec form: no shell needed in the image
    command = healthcheck["Test"][1:]
    passed = pod.container.exec(command, pod.env)
    assert passed.returncode == 0, passed.stderr
    nobody = {**pod.env, "VLLM_SIDECAR_ADMIN_PORT": str(free_port())}
    assert pod.container.exec(command, nobody).returncode != 0


# -- shutdown: what the kubelet's SIGTERM does ----------------------------------------------
@pytest.mark.parametrize("pod_shape", [True, False], ids=["as-the-pod-runs-it", "docker-run"])
async def test_sigterm_to_the_entrypoint_lets_in_flight_work_finish_and_exits_0(
    pod_shape: bool, image: Image, container: Container, upstream: TestServer, fake: FakeVLLM
) -> None:
    if pod_shape:
        container.read_only()
    assert upstream.port is not None
    env = sidecar_env(upstream.port, pod=pod_shape, VLLM_SIDECAR_SHUTDOWN_GRACE=str(GRACE))
    sidecar = start_sidecar(image, container, env)
    url, admin = sidecar.url, sidecar.admin_url
    await sidecar.serving(f"{admin}/readyz", deadline_s=60)
    release = asyncio.Event()

    async def held(request: web.Request) -> web.StreamResponse:
        await release.wait()
        return await fake.completions(request)

    fake.script("POST /v1/completions", held)
    answer = asyncio.create_task(post(f"{url}/v1/completions", COMPLETION))
    await eventually(lambda: fake.forwarded() == 1, "the request is in flight at vLLM")
    # buildah run answers SIGTERM by killing what it runs: the signal goes where the kubelet's
    # goes, to the entrypoint's process.
    os.kill(entrypoint_pid(sidecar), signal.SIGTERM)
    signalled = time.monotonic()
    await eventually(lambda: refuses_connections(url), "the sidecar stops taking connections")
    release.set()
    resp, body = await answer
    assert resp.status == 200, body
    assert body["model"] == "tiny-model"
    assert sidecar.proc is not None
    assert await asyncio.to_thread(sidecar.proc.wait, GRACE) == 0, sidecar.log_tail()
    assert time.monotonic() - signalled < GRACE
