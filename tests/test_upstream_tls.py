"""An upstream on HTTPS, through the real `python -m proxy` on each upstream client.

The fake vLLM serves TLS with a certificate of a throwaway CA (openssl's CLI makes both); the
sidecar trusts it the way a deployment trusts a private CA, through `SSL_CERT_FILE`, since it
verifies as Python's default context does. Discovery, a JSON answer and a stream go over the
TLS hop; a sidecar that does not trust the CA reaches nothing and says why, in an envelope.
"""

from __future__ import annotations

import ssl
import subprocess
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest
from aiohttp import web

from tests.fake_vllm import FakeVLLM
from tests.sidecar import SidecarProcess, StartSidecar, assert_envelope
from tests.support import free_port

CLIENTS = ["lean", "aiohttp"]
MODEL = "tiny-model"


def _openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True)


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A CA, and a server certificate it signed for 127.0.0.1 (with the extensions a strict
    verifier asks for)."""
    where = tmp_path_factory.mktemp("tls")
    ec = ("-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes")
    _openssl(
        "req", "-x509", *ec, "-keyout", "ca.key", "-out", "ca.pem", "-days", "2",
        "-subj", "/CN=sidecar test CA",
        "-addext", "basicConstraints=critical,CA:TRUE",
        "-addext", "keyUsage=critical,keyCertSign,cRLSign",
        cwd=where,
    )  # fmt: skip
    _openssl(
        "req", *ec, "-keyout", "server.key", "-out", "server.csr", "-subj", "/CN=127.0.0.1",
        cwd=where,
    )  # fmt: skip
    (where / "server.ext").write_text(
        "subjectAltName=IP:127.0.0.1\nbasicConstraints=critical,CA:FALSE\n"
        "keyUsage=critical,digitalSignature\nextendedKeyUsage=serverAuth\n"
        "authorityKeyIdentifier=keyid\nsubjectKeyIdentifier=hash\n"
    )
    _openssl(
        "x509", "-req", "-in", "server.csr", "-CA", "ca.pem", "-CAkey", "ca.key",
        "-CAcreateserial", "-out", "server.pem", "-days", "2", "-extfile", "server.ext",
        cwd=where,
    )  # fmt: skip
    return where


@pytest.fixture
async def https_upstream(certs: Path, fake: FakeVLLM) -> AsyncIterator[str]:
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(certs / "server.pem", certs / "server.key")
    runner = web.AppRunner(fake.app(), auto_decompress=False)
    await runner.setup()
    port = free_port()
    await web.TCPSite(runner, "127.0.0.1", port, ssl_context=context).start()
    try:
        yield f"https://127.0.0.1:{port}"
    finally:
        await runner.cleanup()


@pytest.mark.parametrize("client", CLIENTS)
async def test_an_https_upstream_serves_json_and_streams(
    start_sidecar: StartSidecar,
    https_upstream: str,
    certs: Path,
    fake: FakeVLLM,
    monkeypatch: pytest.MonkeyPatch,
    client: str,
) -> None:
    monkeypatch.setenv("SSL_CERT_FILE", str(certs / "ca.pem"))
    sidecar = await start_sidecar(https_upstream, "--upstream-client", client)
    url = sidecar.url
    async with aiohttp.ClientSession() as http:
        for _ in range(2):  # the second on the kept TLS connection
            body = {"model": f"org/{MODEL}", "prompt": "hi", "max_tokens": 4}
            async with http.post(f"{url}/v1/completions", json=body) as resp:
                assert resp.status == 200, await resp.text()
                answer = await resp.json()
            assert answer["choices"][0]["text"]
        body = {"model": MODEL, "prompt": "hi", "max_tokens": 4, "stream": True}
        async with http.post(f"{url}/v1/completions", json=body) as resp:
            assert resp.status == 200
            events = (await resp.read()).decode().split("\n\n")
    assert events[-2:] == ["data: [DONE]", ""]
    assert sum(e.startswith("data: {") for e in events) == fake.stream_events
    # The basename resolved: the model list itself came over TLS.
    assert [r.json()["model"] for r in fake.requests if r.raw_path == "/v1/completions"] == [
        MODEL
    ] * 3


@pytest.mark.parametrize("client", CLIENTS)
async def test_an_untrusted_certificate_is_an_envelope_that_says_so(
    https_upstream: str,
    fake: FakeVLLM,
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
    client: str,
) -> None:
    empty = tmp_path / "no-ca.pem"
    empty.write_text("")
    monkeypatch.setenv("SSL_CERT_FILE", str(empty))
    served = ("--served-model-names", MODEL)  # discovery cannot read it
    args = ("--upstream-client", client, *served)
    sidecar = SidecarProcess.cli(https_upstream, tmp_path, *args)  # never ready: alive is enough
    sidecar.spawn()
    try:
        await sidecar.serving(f"{sidecar.admin_url}/livez", deadline_s=60)
        async with aiohttp.ClientSession() as http:
            async with http.get(f"{sidecar.admin_url}/readyz") as resp:
                assert resp.status == 503
                assert "certificate verify failed" in (await resp.json())["reason"]
            body = {"model": MODEL, "prompt": "hi", "max_tokens": 4}
            async with http.post(f"{sidecar.url}/v1/completions", json=body) as resp:
                error = await assert_envelope(resp, 502, "upstream_unreachable")
    finally:
        sidecar.kill()
    assert "certificate verify failed" in error["message"]
    assert not [r for r in fake.requests if r.raw_path == "/v1/completions"]
