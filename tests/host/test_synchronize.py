"""npu.synchronize and NPU_LAUNCH_BLOCKING: waiting for all queued work, and
failures raised where the work is waited for."""

from __future__ import annotations

import sys

import numpy as np
import pytest

import npu
from npu import _abi
from npu.core.eager import eager_queue
from npu.hal import CpuBackend


def test_synchronize_waits_for_every_submitted_op(default_device: npu.Device) -> None:
    t = npu.relu(npu.tensor(np.arange(-4, 4, dtype=np.float32)) * 2)
    eager = eager_queue(default_device)
    last = eager.last_fence
    assert last >= 2 and not eager.completed(last)
    npu.synchronize()
    assert eager.completed(last)
    assert default_device.completed(0, default_device.submitted_fences()[0])
    np.testing.assert_array_equal(t.numpy(), np.maximum(np.arange(-4, 4) * 2, 0))


def test_synchronize_raises_the_failure_and_the_tensor_keeps_it(
    default_device: npu.Device, driver: CpuBackend
) -> None:
    driver.fail_opcode[_abi.NPU_OP_UNARY] = _abi.NPU_ST_BAD_ARGS
    t = npu.relu(npu.tensor([1.0, -1.0]))
    with pytest.raises(npu.NpuDeviceError) as info:
        npu.synchronize()
    assert "UNARY.RELU" in str(info.value)
    with pytest.raises(npu.NpuDeviceError):
        t.numpy()


def test_launch_blocking_raises_at_the_failing_call(
    default_device: npu.Device, driver: CpuBackend, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The variable is read at import (as CUDA_LAUNCH_BLOCKING); set what it sets.
    monkeypatch.setattr(sys.modules["npu.tensors.tensor"], "_launch_blocking", True)
    x = npu.tensor([1.0, -1.0])
    y = x * 3  # fine, and already waited for
    assert y.fence is None
    driver.fail_opcode[_abi.NPU_OP_UNARY] = _abi.NPU_ST_BAD_ARGS
    with pytest.raises(npu.NpuDeviceError, match=r"UNARY\.RELU"):
        npu.relu(x)


def test_synchronize_inside_a_capture_raises(default_device: npu.Device) -> None:
    with npu.Graph().capture(), pytest.raises(RuntimeError, match="capturing"):
        npu.synchronize()
