"""The image under test: built by scripts/image.sh, its config read back, and containers run
from it with buildah's chroot isolation, as near to the pod's runtime as this machine allows.

A full container runtime does not start here (crun: cgroups in hybrid mode, setrlimit denied),
so `buildah run --isolation chroot` runs the image: its root filesystem, user, environment and
working directory, in its own mount namespace, sharing the host's network and PID namespaces.
"""

from __future__ import annotations

import contextlib
import json
import re
import subprocess
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import pytest

from tests.processes import ROOT, ManagedProcess
from tests.procfs import children
from tests.tools import tool

PART = "40-image.sh"
_UNITS = {"B": 1, "kB": 10**3, "MB": 10**6, "GB": 10**9}  # buildah's sizes are decimal

P = TypeVar("P", bound=ManagedProcess)


def buildah(*args: str, timeout: float = 120) -> str:
    """Run buildah; its stdout, or the test fails with its stderr."""
    result = subprocess.run(
        [tool("buildah", PART), *args], capture_output=True, text=True, timeout=timeout
    )
    if result.returncode != 0:
        pytest.fail(f"buildah {' '.join(args)}: exit {result.returncode}\n{result.stderr}")
    return result.stdout


@dataclass(frozen=True)
class Image:
    id: str
    base: str  # the local base's name
    seconds: float  # the build, with the base's lookup (or its making, the first time)

    def config(self) -> dict[str, Any]:
        """The image's Docker config: Entrypoint, User, Env, ExposedPorts, Healthcheck."""
        config: dict[str, Any] = json.loads(buildah("inspect", "--type", "image", self.id))[
            "Docker"
        ]["config"]
        return config


def image_size(name: str) -> int:
    """An image's size in bytes, from buildah's "201 MB"."""
    text = buildah("images", "--noheading", "--format", "{{.Size}}", name.removeprefix("sha256:"))
    text = text.strip()
    match = re.fullmatch(r"([\d.]+) ?([kMG]?B)", text)
    assert match, f"not a size: {text!r}"
    return round(float(match[1]) * _UNITS[match[2]])


def build_image() -> Image:
    """`scripts/image.sh build`: the shipped Dockerfile on the local base, layers cached."""
    tool("debootstrap", PART)
    start = time.monotonic()
    result = subprocess.run(
        ["bash", "scripts/image.sh", "build"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=900,
    )
    if result.returncode != 0:
        pytest.fail(f"the image did not build:\n{result.stderr[-8000:]}")
    image_id, base = result.stdout.split()
    return Image(image_id, base, time.monotonic() - start)


class Container:
    """One working container of the image (`buildah from`); `remove()` stops what runs in it
    and deletes it."""

    def __init__(self, image: Image, logs: Path) -> None:
        self.name = buildah("from", "--pull=never", "--quiet", image.id).strip()
        self.logs = logs
        self.processes: list[ManagedProcess] = []
        self._mountpoint: Path | None = None
        self._tmpfs: list[Path] = []

    def __repr__(self) -> str:
        return f"<Container {self.name}>"

    def command(self, argv: Sequence[str], env: Mapping[str, str]) -> list[str]:
        """The `buildah run` command line that runs `argv` in the container with `env`."""
        # --network host: a pod's containers share one network namespace, and the fake vLLM
        # listens on the host's loopback, as vLLM does on the pod's.
        options = [f"--env={key}={value}" for key, value in env.items()]
        return [
            tool("buildah", PART),
            "run",
            "--isolation=chroot",
            "--network=host",
            *options,
            self.name,
            "--",
            *argv,
        ]

    def start(self, process: P) -> P:
        """Start `process`, a `command` of this container, in the background (its own process
        group, log file); `remove` stops it."""
        process.spawn()
        self.processes.append(process)
        return process

    def exec(self, argv: Sequence[str], env: Mapping[str, str]) -> subprocess.CompletedProcess[str]:
        """Run `argv` in the container to its end, as `docker exec` (a HEALTHCHECK) does."""
        return subprocess.run(
            self.command(argv, env), capture_output=True, text=True, timeout=60, check=False
        )

    def read_only(self) -> None:
        """A read-only root filesystem and a fresh writable tmpfs on /tmp, as the pod's
        `readOnlyRootFilesystem: true` with an emptyDir on /tmp (`docker run --read-only
        --tmpfs /tmp`). buildah run has no such option, so its mount of the container is made
        read-only from outside, which every later `buildah run` of it inherits."""
        mountpoint = Path(buildah("mount", self.name).strip())
        self._mountpoint = mountpoint
        # buildah binds its own files over these; it cannot create them once read-only.
        for name in ("etc/hosts", "etc/hostname", "etc/resolv.conf"):
            (mountpoint / name).touch()
        subprocess.run(["mount", "-o", "remount,ro", str(mountpoint)], check=True)
        # /run: buildah creates and, after each run, removes its .containerenv there; a tmpfs
        # owned by root, as the image's /run is, so the sidecar's user cannot write to it.
        for path, mode in (("tmp", "1777"), ("run", "755")):
            target = mountpoint / path
            options = f"mode={mode},nosuid,nodev"
            subprocess.run(
                ["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(target)], check=True
            )
            self._tmpfs.append(target)

    def remove(self) -> None:
        for process in self.processes:
            process.stop()
        for target in reversed(self._tmpfs):
            subprocess.run(["umount", "--lazy", str(target)], check=False)
        if self._mountpoint is not None:
            buildah("umount", self.name)
        buildah("rm", self.name)


def entrypoint_pid(process: ManagedProcess) -> int:
    """The process running the image's entrypoint: in a pod, the container's PID 1, which the
    kubelet sends SIGTERM. buildah's own helpers (buildah-chroot-runtime, buildah-chroot-exec,
    run from memfds) sit between it and `buildah run`; there is no PID namespace, so it is a
    host process: the first descendant whose command is not one of buildah's."""
    assert process.proc is not None
    frontier = [process.proc.pid]
    while frontier:
        for child in children(frontier.pop(0)):
            with contextlib.suppress(OSError):
                argv0 = Path(f"/proc/{child}/cmdline").read_bytes().split(b"\0")[0]
                if not argv0.startswith(b"buildah"):
                    return child
            frontier.append(child)
    raise AssertionError(f"{process!r}: no entrypoint process under it\n{process.log_tail()}")


def real_uid(pid: int) -> int:
    """The process's real user id, from /proc (what the kernel checks, not what it says)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("Uid:"):
            return int(line.split()[1])
    raise AssertionError(f"no Uid line for {pid}")
