"""The runtime's distribution holds every package of the source tree."""

from __future__ import annotations

import tomllib
from pathlib import Path

import setuptools

RUNTIME = Path(__file__).resolve().parents[2] / "runtime_py"


def packages_on_disk() -> set[str]:
    return {
        ".".join(init.parent.relative_to(RUNTIME).parts)
        for init in RUNTIME.joinpath("npu").rglob("__init__.py")
    }


def packages_installed() -> set[str]:
    """What setuptools puts into the wheel, from runtime_py/pyproject.toml."""
    config = tomllib.loads(RUNTIME.joinpath("pyproject.toml").read_text())["tool"]["setuptools"]
    packages = config["packages"]
    if isinstance(packages, list):  # listed by name: exactly those
        return set(packages)
    include = packages["find"].get("include", ["*"])
    return set(setuptools.find_packages(str(RUNTIME), include=include))


def test_the_wheel_holds_every_subpackage_of_npu() -> None:
    assert packages_on_disk() >= {"npu", "npu.hal", "npu.core", "npu.tensors", "npu.inference"}
    assert packages_installed() == packages_on_disk()
