"""Buffer: mapping, numpy views and release (CPU backend)."""

from __future__ import annotations

import errno
import gc
import mmap

import numpy as np
import pytest

import npu
from npu.hal import CpuBackend

PAGE = mmap.PAGESIZE


def test_alloc_keeps_the_requested_size_and_the_rounded_allocation(device: npu.Device) -> None:
    with device.alloc(100) as buf:
        assert (buf.size, buf.alloc_size) == (100, PAGE)


def test_numpy_returns_a_writable_view_of_the_mapping(device: npu.Device) -> None:
    with device.alloc(64) as buf:
        buf.numpy(np.uint32)[:] = 7
        assert buf.read(8) == bytes([7, 0, 0, 0]) * 2


def test_numpy_views_share_memory(device: npu.Device) -> None:
    with device.alloc(64) as buf:
        a = buf.numpy(np.float32, (4, 4))
        a[1, 2] = 3.5
        assert buf.numpy(np.float32)[6] == 3.5
        del a


def test_numpy_default_shape_covers_the_usable_size(device: npu.Device) -> None:
    with device.alloc(10) as buf:
        assert buf.numpy(np.uint32).shape == (2,)


def test_numpy_rejects_an_array_larger_than_the_buffer(device: npu.Device) -> None:
    with device.alloc(16) as buf, pytest.raises(ValueError, match="does not fit"):
        buf.numpy(np.float32, (2, 3))


def test_view_is_a_memoryview_of_the_usable_bytes(device: npu.Device) -> None:
    with device.alloc(10) as buf:
        assert (len(buf.view), buf.view.readonly) == (10, False)


def test_write_copies_an_array_at_an_offset(device: npu.Device) -> None:
    with device.alloc(16) as buf:
        buf.write(np.array([1, 2], dtype=np.uint16), offset=4)
        assert buf.read(4, offset=4) == b"\x01\x00\x02\x00"


def test_write_rejects_data_past_the_end(device: npu.Device) -> None:
    with device.alloc(4) as buf, pytest.raises(ValueError, match="do not fit"):
        buf.write(b"12345")


def test_free_destroys_the_buffer_object(device: npu.Device, driver: CpuBackend) -> None:
    buf = device.alloc(64)
    handle = buf.handle
    buf.free()
    assert handle not in driver.handles


def test_free_is_idempotent(device: npu.Device) -> None:
    buf = device.alloc(64)
    buf.free()
    buf.free()
    assert buf.freed


def test_a_freed_buffer_raises_npu_error_ebadf(device: npu.Device) -> None:
    buf = device.alloc(64)
    buf.free()
    with pytest.raises(npu.NpuError) as info:
        buf.numpy()
    assert info.value.errno == errno.EBADF
    assert "numpy" in info.value.context


def test_numpy_arrays_outlive_free_without_dangling(device: npu.Device) -> None:
    buf = device.alloc(64)
    a = buf.numpy(np.uint8)
    a[:] = 9
    buf.free()
    assert int(a.sum()) == 9 * 64


def test_a_buffer_collected_without_free_is_destroyed(
    device: npu.Device, driver: CpuBackend
) -> None:
    buf = device.alloc(64)
    handle = buf.handle
    del buf
    gc.collect()
    assert handle not in driver.handles


def test_repr_says_when_a_buffer_is_freed(device: npu.Device) -> None:
    buf = device.alloc(8)
    buf.free()
    assert repr(buf).endswith("freed>")
