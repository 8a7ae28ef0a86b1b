"""The hops compared, as real processes in front of one raw upstream: the sidecar on the lean hop,
the sidecar on aiohttp's client, and nginx (when installed) as the reference.

The upstream and the clients run on an event loop in a thread of the harness, so that hypothesis,
which drives plain functions, can send each case through every hop with `Peers.call`.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import shutil
import threading
from collections.abc import Awaitable, Callable, Coroutine, Iterator
from pathlib import Path
from typing import TypeVar

from tests.differential.upstream import Upstream
from tests.differential.wire import WAIT
from tests.metrics import scrape
from tests.processes import ManagedProcess
from tests.sidecar import SidecarProcess
from tests.support import eventually, free_port, http_status

T = TypeVar("T")

SIDECARS = ("lean", "aiohttp")

# nginx as it is shipped, but for what a reverse proxy in front of vLLM needs anyway (as
# bench/proxies/nginx-proxy.conf.in): HTTP/1.1 and kept-alive connections to the upstream,
# answers streamed through. Its head bounds (proxy_buffer_size, large_client_header_buffers)
# keep their defaults: those are the reference.
NGINX_CONF = """\
worker_processes 1;
daemon off;
pid {dir}/nginx.pid;
error_log {dir}/nginx.error.log info;
events {{ worker_connections 1024; }}
http {{
    access_log off;
    client_body_temp_path {dir}/body;
    proxy_temp_path {dir}/proxy;
    fastcgi_temp_path {dir}/fastcgi;
    uwsgi_temp_path {dir}/uwsgi;
    scgi_temp_path {dir}/scgi;
    upstream vllm {{
        server 127.0.0.1:{upstream};
        keepalive 16;
    }}
    server {{
        listen 127.0.0.1:{port};
        location / {{
            proxy_pass http://vllm;
            proxy_http_version 1.1;
            proxy_set_header Connection "";
            proxy_buffering off;
            proxy_connect_timeout 2s;
            proxy_read_timeout 5s;
        }}
    }}
}}
"""


def sidecar_hop(client: str, upstream: str, run_dir: Path, source: Path | None) -> SidecarProcess:
    """`python -m proxy` on one upstream client, its background reads as rare as they go: the
    upstream sees the cases' requests and little else. `source` runs another checkout's
    `proxy/` (an older commit's, to see a fixed defect found again)."""
    hop = SidecarProcess.cli(
        upstream,
        run_dir,
        *("--upstream-client", client, "--served-model-names", "tiny-model"),
        *("--health-interval", "3600", "--discovery-interval", "3600"),
        *("--read-timeout", "5", "--shutdown-grace", "1", "--no-access-log"),
        *("--log-level", "warning"),
    )
    hop.name = f"sidecar-{client}"
    if source is not None:  # -P: not the working directory's proxy/, PYTHONPATH's
        hop.argv.insert(1, "-P")
        hop.env["PYTHONPATH"] = str(source)
    return hop


class NginxHop(ManagedProcess):
    def __init__(self, upstream_port: int, run_dir: Path) -> None:
        self.port = free_port()
        conf = run_dir / "nginx.conf"
        conf.write_text(NGINX_CONF.format(dir=run_dir, upstream=upstream_port, port=self.port))
        argv = [
            "nginx",
            "-p",
            str(run_dir),
            "-e",
            str(run_dir / "nginx.error.log"),
            "-c",
            str(conf),
        ]
        super().__init__("nginx", argv, {"PATH": "/usr/sbin:/usr/bin:/bin"}, run_dir / "nginx.log")

    def start(self) -> None:
        self.spawn()
        self.wait_until(f"http://127.0.0.1:{self.port}/health", deadline_s=15)


class Peers:
    """The upstream on a loop thread, and a hop per name in `ports`; stop with `close`."""

    def __init__(self, run_dir: Path, *, source: Path | None = None, nginx: bool = True) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self._thread.start()
        self.upstream = Upstream()
        self._cases = itertools.count()
        self.processes: dict[str, ManagedProcess] = {}
        self.ports: dict[str, int] = {}
        self.call(self.upstream.start())
        url = f"http://127.0.0.1:{self.upstream.port}"
        try:
            for client in SIDECARS:
                self._start(client, sidecar_hop(client, url, run_dir, source))
            if nginx and shutil.which("nginx", path="/usr/sbin:/usr/bin:/bin"):
                self._start("nginx", NginxHop(self.upstream.port, run_dir))
        except BaseException:
            self.close()
            raise

    def _start(self, name: str, process: SidecarProcess | NginxHop) -> None:
        self.processes[name] = process
        process.start()
        self.ports[name] = process.port
        assert http_status(f"http://127.0.0.1:{process.port}/health") == 200, process.log_tail()

    @property
    def hops(self) -> tuple[str, ...]:
        return tuple(self.ports)

    def head_read(self, hop: str) -> Callable[[], Awaitable[None]]:
        """What returns once `hop` has read a request's head: a sidecar's handler is in flight.
        nginx reads a body as it comes, and answers alike however its bytes arrive."""
        process = self.processes[hop]

        async def in_flight() -> bool:
            assert isinstance(process, SidecarProcess)
            metrics = await scrape(process.admin_url)
            return metrics.total("vllm_sidecar_in_flight_requests", {}) > 0

        async def read() -> None:
            if isinstance(process, SidecarProcess):
                await eventually(in_flight, f"{hop} reads the request's head", WAIT)

        return read

    def case(self) -> str:
        """A fresh case id: the upstream keys answers and arrivals by it."""
        return f"c{next(self._cases)}"

    def call(self, coro: Coroutine[object, object, T], timeout: float = 60.0) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def close(self) -> None:
        for process in self.processes.values():
            process.stop(grace_s=5)
        if self.loop.is_running():
            self.call(self.upstream.stop())
            self.loop.call_soon_threadsafe(self.loop.stop)
            self._thread.join(10)
        self.loop.close()


@contextlib.contextmanager
def running(run_dir: Path, *, source: Path | None = None, nginx: bool = True) -> Iterator[Peers]:
    peers = Peers(run_dir, source=source, nginx=nginx)
    try:
        yield peers
    finally:
        peers.close()
