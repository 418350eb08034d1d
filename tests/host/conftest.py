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
