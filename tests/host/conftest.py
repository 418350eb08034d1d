"""Fixtures of the host tests (no NPU needed)."""

from __future__ import annotations

import fcntl
from collections.abc import Iterator
from pathlib import Path

import pytest

import npu
from fake_driver import FakeDriver


@pytest.fixture
def driver(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> FakeDriver:
    """A fake driver answering the ioctls of a regular file standing in for /dev/npu0."""
    node = tmp_path / "npu0"
    node.write_bytes(b"")
    fake = FakeDriver(str(node))
    monkeypatch.setattr(fcntl, "ioctl", fake.ioctl)
    return fake


@pytest.fixture
def device(driver: FakeDriver) -> Iterator[npu.Device]:
    """A Device opened on the fake driver's node."""
    with npu.Device(driver.path) as dev:
        yield dev


@pytest.fixture
def default_device(device: npu.Device) -> Iterator[npu.Device]:
    """``device`` as npu's default device for the test (reset afterwards)."""
    npu.set_default_device(device)
    yield device
    npu.set_default_device(None)
