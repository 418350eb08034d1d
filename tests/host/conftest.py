"""Fixtures of the host tests (no NPU needed): the runtime on its CPU backend."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

import npu
from npu.hal import CpuBackend


@pytest.fixture
def driver() -> Iterator[CpuBackend]:
    """The CPU backend, recording the calls made to it (``driver.calls``)."""
    backend = CpuBackend(record=True)
    yield backend
    backend.close()


@pytest.fixture
def device(driver: CpuBackend) -> Iterator[npu.Device]:
    """A Device on the ``driver`` backend."""
    with npu.Device(driver) as dev:
        yield dev


@pytest.fixture
def default_device(device: npu.Device) -> Iterator[npu.Device]:
    """``device`` as npu's default device for the test (reset afterwards)."""
    npu.set_default_device(device)
    yield device
    npu.set_default_device(None)


@pytest.fixture
def no_default_device(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """No default device, no NPU_DEVICE/NPU_BACKEND; the default opened meanwhile is closed."""
    monkeypatch.delenv("NPU_DEVICE", raising=False)
    monkeypatch.delenv("NPU_BACKEND", raising=False)
    npu.set_default_device(None)
    yield
    npu.close_default_device()
