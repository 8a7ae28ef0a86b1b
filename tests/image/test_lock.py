"""The locks the image installs (requirements/, `make lock`) agree with pyproject.toml: every
dependency pinned, once, at a version its specifier allows, on every platform the image ships;
every pin hashed, so pip's --require-hashes takes nothing else."""

from __future__ import annotations

import re
from dataclasses import replace
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet

from .lock import BUILD_LOCK, REPO, RUNTIME_LOCK, TARGETS, disagreements, pyproject, read_lock


def test_runtime_lock_pins_every_dependency_of_pyproject_for_every_target() -> None:
    dependencies = pyproject()["project"]["dependencies"]
    assert disagreements(dependencies, read_lock(RUNTIME_LOCK), TARGETS) == []


def test_runtime_lock_pins_the_otel_extra_too() -> None:
    # Tracing is turned on by an environment variable alone: the image carries its packages.
    otel = pyproject()["project"]["optional-dependencies"]["otel"]
    assert disagreements(otel, read_lock(RUNTIME_LOCK), TARGETS) == []


def test_build_lock_pins_the_build_backend_pyproject_names() -> None:
    requires = pyproject()["build-system"]["requires"]
    assert disagreements(requires, read_lock(BUILD_LOCK), TARGETS) == []


@pytest.mark.parametrize("lock", [RUNTIME_LOCK, BUILD_LOCK], ids=lambda p: p.name)
def test_every_locked_package_is_pinned_exactly_and_hashed(lock: Path) -> None:
    pins = read_lock(lock)
    assert pins
    for pin in pins:
        assert pin.version, pin.requirement  # `==` and nothing else (read by the property)
        assert pin.hashes, f"{pin.requirement}: no hash, so --require-hashes refuses the file"
        assert all(re.fullmatch(r"sha256:[0-9a-f]{64}", h) for h in pin.hashes), pin.hashes


def test_a_pin_outside_a_specifier_or_missing_for_a_platform_is_reported() -> None:
    pins = read_lock(RUNTIME_LOCK)
    [aiohttp] = [pin for pin in pins if pin.name == "aiohttp"]
    too_old = replace(aiohttp, requirement=Requirement("aiohttp==3.9.5"))
    arm_missing = replace(
        aiohttp,
        requirement=Requirement(f"aiohttp=={aiohttp.version} ; platform_machine != 'aarch64'"),
    )
    others = [pin for pin in pins if pin.name != "aiohttp"]
    assert disagreements(["aiohttp>=3.10,<4"], [*others, too_old], TARGETS) == [
        "aiohttp==3.9.5 is outside aiohttp<4,>=3.10"
    ]
    missing = disagreements(["aiohttp>=3.10"], [*others, arm_missing], TARGETS)
    assert missing == [
        "aiohttp>=3.10: 0 pins for Python 3.11 on aarch64",
        "aiohttp>=3.10: 0 pins for Python 3.12 on aarch64",
    ]
    assert disagreements(["aiohttp"], [*pins, too_old], TARGETS)  # pinned twice


def test_the_lock_is_made_from_requires_pythons_floor() -> None:
    # scripts/lock.sh resolves for every Python from this floor up (uv's --universal).
    floor = re.search(r"^PYTHON_FLOOR=(\S+)", (REPO / "scripts" / "lock.sh").read_text(), re.M)
    assert floor is not None
    requires = SpecifierSet(pyproject()["project"]["requires-python"])
    assert requires == SpecifierSet(f">={floor[1]}")
