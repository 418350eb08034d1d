"""Tensor.copy_ from another tensor and Tensor.clone: device copies, queued
like any op (COPY on the DMA engine when the layouts match, else CONVERT)."""

from __future__ import annotations

import numpy as np
import pytest

import npu
from npu import _abi
from npu.hal import CpuBackend
from test_tensor import flush


def test_clone_is_a_copy_in_new_memory_by_the_dma_engine(
    default_device: npu.Device, driver: CpuBackend
) -> None:
    t = npu.tensor(np.arange(6, dtype=np.float32).reshape(2, 3))
    c = t.clone()
    flush()
    assert driver.submitted[-1].opcode == _abi.NPU_OP_COPY
    assert c.buffer is not None and t.buffer is not None
    assert (c.buffer.handle, c.offset) != (t.buffer.handle, t.offset)
    np.testing.assert_array_equal(c.numpy(), t.numpy())


def test_copy_from_a_tensor_of_another_dtype_converts(
    default_device: npu.Device, driver: CpuBackend
) -> None:
    dst = npu.tensor(np.zeros((2, 2), np.float16))
    dst.copy_(npu.tensor(np.array([[1.5, -2.0], [3.25, 4.0]], np.float32)))
    flush()
    assert driver.submitted_tensor[-1].opcode == _abi.NPU_OP_CONVERT
    np.testing.assert_array_equal(dst.numpy(), np.float16([[1.5, -2.0], [3.25, 4.0]]))


def test_copy_from_a_tensor_broadcasts_a_row(default_device: npu.Device) -> None:
    dst = npu.tensor(np.zeros((3, 4), np.float32))
    dst.copy_(npu.tensor(np.arange(4, dtype=np.float32)))
    np.testing.assert_array_equal(dst.numpy(), np.tile(np.arange(4, dtype=np.float32), (3, 1)))


def test_copy_from_a_transposed_view_lays_it_out(default_device: npu.Device) -> None:
    src = npu.tensor(np.arange(6, dtype=np.int32).reshape(2, 3))
    dst = npu.tensor(np.zeros((3, 2), np.int32))
    dst.copy_(src.T)
    np.testing.assert_array_equal(dst.numpy(), np.arange(6).reshape(2, 3).T)


def test_copy_from_a_shape_that_does_not_broadcast_raises(default_device: npu.Device) -> None:
    dst = npu.tensor(np.zeros((2, 3), np.float32))
    with pytest.raises(ValueError, match="broadcast"):
        dst.copy_(npu.tensor(np.zeros((3, 3), np.float32)))
    with pytest.raises(ValueError, match="broadcast"):
        npu.tensor(np.zeros(3, np.float32)).copy_(dst)


def test_copy_of_a_tensor_into_itself_submits_nothing(
    default_device: npu.Device, driver: CpuBackend
) -> None:
    t = npu.tensor(np.ones(8, np.float32))
    calls = len(driver.calls)
    assert t.copy_(t) is t
    assert len(driver.calls) == calls
