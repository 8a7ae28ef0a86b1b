"""The image's lock files (requirements/, written by `make lock`) read back as requirements."""

from __future__ import annotations

import tomllib
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from packaging.requirements import Requirement
from packaging.utils import NormalizedName, canonicalize_name

REPO = Path(__file__).resolve().parents[2]
RUNTIME_LOCK = REPO / "requirements" / "runtime.txt"
BUILD_LOCK = REPO / "requirements" / "build.txt"

# Where the image runs: python:3.12-slim on amd64 and arm64, and the local base's 3.11.
TARGETS: list[dict[str, str]] = [
    {
        "python_version": version,
        "python_full_version": f"{version}.0",
        "platform_machine": machine,
        "sys_platform": "linux",
        "platform_system": "Linux",
        "os_name": "posix",
        "implementation_name": "cpython",
        "platform_python_implementation": "CPython",
    }
    for version in ("3.11", "3.12")
    for machine in ("x86_64", "aarch64")
]


@dataclass(frozen=True)
class Pin:
    """One locked line: `name==version ; marker`, and the hashes pip will insist on."""

    requirement: Requirement
    hashes: tuple[str, ...]

    @property
    def name(self) -> NormalizedName:
        return canonicalize_name(self.requirement.name)

    @property
    def version(self) -> str:
        [spec] = self.requirement.specifier
        assert spec.operator == "==", f"{self.requirement}: a lock pins with =="
        return spec.version


def read_lock(path: Path) -> list[Pin]:
    """Every requirement of a pip requirements file, continuation lines joined, comments
    dropped; `--hash=` options are kept apart from the requirement they follow."""
    pins = []
    logical = path.read_text().replace("\\\n", " ")
    for line in logical.splitlines():
        line = line.partition("#")[0].strip()  # a `# via` line, or a header, is all comment
        if not line:
            continue
        words = line.split()
        hashes = tuple(w.removeprefix("--hash=") for w in words if w.startswith("--hash="))
        text = " ".join(w for w in words if not w.startswith("--hash="))
        assert not text.startswith("-"), f"{path.name}: an option the image must not take: {text}"
        pins.append(Pin(Requirement(text), hashes))
    return pins


def pyproject() -> dict[str, Any]:
    loaded: dict[str, Any] = tomllib.loads((REPO / "pyproject.toml").read_text())
    return loaded


def _where(environment: Mapping[str, str]) -> str:
    return f"Python {environment['python_version']} on {environment['platform_machine']}"


def disagreements(
    wanted: Iterable[str], pins: Sequence[Pin], environments: Sequence[Mapping[str, str]]
) -> list[str]:
    """What keeps `pins` from meeting the PEP 508 requirements `wanted` in each environment: a
    requirement with no pin there, a name pinned twice there, or a pin its specifier refuses.
    Empty when they agree."""
    problems: set[str] = set()
    for text in wanted:
        requirement = Requirement(text)
        name = canonicalize_name(requirement.name)
        for environment in environments:
            env = dict(environment)
            if requirement.marker is not None and not requirement.marker.evaluate(env):
                continue
            here = [
                pin
                for pin in pins
                if pin.name == name
                and (pin.requirement.marker is None or pin.requirement.marker.evaluate(env))
            ]
            if len(here) != 1:
                problems.add(f"{requirement}: {len(here)} pins for {_where(environment)}")
            for pin in here:
                if not requirement.specifier.contains(pin.version, prereleases=True):
                    problems.add(f"{pin.requirement} is outside {requirement}")
    return sorted(problems)
