"""npu.Event on the CPU backend: markers, query, synchronize, and device-clock
elapsed times from FENCE_INFO."""

from __future__ import annotations

import numpy as np
import pytest

import npu
from npu import _abi
from npu.hal import CpuBackend


def test_a_timing_event_records_a_nop_marker(
    default_device: npu.Device, driver: CpuBackend
) -> None:
    e = npu.Event(enable_timing=True)
    e.record()
    assert driver.submitted[-1].opcode == _abi.NPU_OP_NOP
    assert e.fence == default_device.submitted_fences()[0]


def test_a_plain_event_records_the_last_fence_without_a_marker_op(
    default_device: npu.Device, driver: CpuBackend
) -> None:
    npu.relu(npu.tensor([1.0, -2.0]))
    e = npu.Event()
    e.record()
    assert driver.submits[-1][1] == 1, "only the relu, flushed from its batch"
    assert e.fence == default_device.submitted_fences()[0]


def test_a_plain_event_is_after_the_eager_ops_still_held_back(
    default_device: npu.Device, driver: CpuBackend
) -> None:
    x = npu.tensor(np.ones(4, np.float32))
    npu.synchronize()
    before = len(driver.submitted_tensor)
    y = npu.exp(x)
    assert len(driver.submitted_tensor) == before, "exp is held in the eager batch"
    e = npu.Event()
    e.record()
    assert len(driver.submitted_tensor) == before + 1
    e.synchronize()
    np.testing.assert_allclose(y.numpy(), np.exp(np.ones(4, np.float32)), rtol=1e-6)


def test_query_is_true_once_synchronized(default_device: npu.Device) -> None:
    e = npu.Event()
    assert e.query()  # never recorded
    npu.exp(npu.tensor(np.ones(8, np.float32)))
    e.record()
    e.synchronize()
    assert e.query()


def test_elapsed_time_is_the_device_clock_difference(default_device: npu.Device) -> None:
    start, end = npu.Event(enable_timing=True), npu.Event(enable_timing=True)
    start.record()
    npu.matmul(npu.tensor(np.ones((64, 64), np.float32)), np.ones((64, 64), np.float32))
    end.record()
    end.synchronize()
    ms = start.elapsed_time(end)
    assert ms >= 0.0
    assert end.elapsed_time(start) == -ms


def test_elapsed_time_needs_timing_events(default_device: npu.Device) -> None:
    plain, timed = npu.Event(), npu.Event(enable_timing=True)
    plain.record()
    timed.record()
    with pytest.raises(ValueError, match="enable_timing"):
        plain.elapsed_time(timed)
    with pytest.raises(ValueError, match="enable_timing"):
        timed.elapsed_time(npu.Event(enable_timing=True))  # not recorded


def test_a_plain_record_inside_a_capture_raises(default_device: npu.Device) -> None:
    with npu.Graph().capture(), pytest.raises(RuntimeError, match="capturing"):
        npu.Event().record()
