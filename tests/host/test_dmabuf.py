"""Sharing buffers as dma-bufs: Buffer.export_dmabuf, Device.import_dmabuf, BO_INFO.

The CPU backend has no dma-bufs: it refuses with ``EOPNOTSUPP``, which the
device layer keeps in its NpuError. What the device layer does with what a
backend imports (a Buffer over it, one Buffer per handle, cleanup when the
mapping fails) runs here on a CPU backend that pretends to share: the
driver's real sharing is tested in the guest (tests/guest/test_runtime_dmabuf.py).
"""

from __future__ import annotations

import errno
import mmap
import os
import pickle
from collections.abc import Iterator

import numpy as np
import pytest

import npu
from npu import _abi
from npu.hal import Backend, BoInfo, CpuBackend, DriverBackend, HalCall

PAGE = mmap.PAGESIZE


class SharingCpu(CpuBackend):
    """A CPU backend whose dma-bufs are stand-ins: an exported fd names its handle
    (importing it gives that handle back, as the driver does in the exporting
    file); any other file imports as a new, zeroed buffer of the file's size
    (not the same memory: only the device layer's bookkeeping is under test)."""

    def __init__(self) -> None:
        super().__init__(record=True)
        self.exported: dict[tuple[int, int], int] = {}  # (st_dev, st_ino) -> handle
        self.bad_mapping = False  # imports report a mapping offset no buffer has
        self.flags = 0  # BO_INFO flags reported

    def bo_info(self, handle: int) -> BoInfo:
        info = super().bo_info(handle)
        return BoInfo(info.handle, info.mmap_offset, info.alloc_size, info.va, self.flags)

    def dmabuf_export(self, handle: int) -> int:
        self.bo_info(handle)  # ENOENT for an unknown handle
        if self.flags & _abi.NPU_BO_INFO_DEVICE:
            raise OSError(errno.EOPNOTSUPP, os.strerror(errno.EOPNOTSUPP))
        fd = os.eventfd(0, os.EFD_CLOEXEC)
        st = os.fstat(fd)
        self.exported[(st.st_dev, st.st_ino)] = handle
        return fd

    def dmabuf_import(self, fd: int) -> BoInfo:
        st = os.fstat(fd)
        handle = self.exported.get((st.st_dev, st.st_ino))
        if handle is not None:
            return self.bo_info(handle)
        info = self.bo_create(st.st_size, 0)
        if self.bad_mapping:
            return BoInfo(info.handle, 1 << 60, info.alloc_size, info.va, self.flags)
        return self.bo_info(info.handle)


@pytest.fixture
def sharing() -> Iterator[SharingCpu]:
    backend = SharingCpu()
    yield backend
    backend.close()


@pytest.fixture
def sdev(sharing: SharingCpu) -> Iterator[npu.Device]:
    with npu.Device(sharing) as dev:
        yield dev


@pytest.fixture
def memfd() -> Iterator[int]:
    fd = os.memfd_create("test-dmabuf", os.MFD_CLOEXEC)
    os.ftruncate(fd, 3 * PAGE)
    yield fd
    os.close(fd)


# -- the CPU backend: no dma-bufs --------------------------------------------------


def test_the_cpu_backend_refuses_to_export_or_import_with_eopnotsupp(
    driver: CpuBackend, memfd: int
) -> None:
    bo = driver.bo_create(PAGE, 0)
    for call in (lambda: driver.dmabuf_export(bo.handle), lambda: driver.dmabuf_import(memfd)):
        with pytest.raises(OSError) as info:
            call()
        assert info.value.errno == errno.EOPNOTSUPP
        assert "the CPU backend has no dma-bufs" in str(info.value.strerror)
    assert [c.name for c in driver.calls[-2:]] == ["dmabuf_export", "dmabuf_import"]


def test_exporting_a_buffer_of_the_cpu_backend_is_an_npu_error_keeping_eopnotsupp(
    device: npu.Device,
) -> None:
    with device.alloc(100) as buf:
        for export in (buf.export_dmabuf, lambda: device.export_dmabuf(buf)):
            with pytest.raises(npu.NpuError) as info:
                export()
            exc = info.value
            assert isinstance(exc, OSError) and exc.errno == errno.EOPNOTSUPP
            assert exc.context == f"PRIME_HANDLE_TO_FD(handle={buf.handle})"
            assert "the CPU backend has no dma-bufs" in str(exc)
            assert pickle.loads(pickle.dumps(exc)).errno == errno.EOPNOTSUPP
        assert not buf.freed
        buf.write(b"still usable")
        assert buf.read(12) == b"still usable"


def test_importing_into_the_cpu_backend_is_an_npu_error_keeping_eopnotsupp(
    device: npu.Device, driver: CpuBackend, memfd: int
) -> None:
    with pytest.raises(npu.NpuError) as info:
        device.import_dmabuf(memfd)
    assert info.value.errno == errno.EOPNOTSUPP
    assert info.value.context == f"PRIME_FD_TO_HANDLE(fd={memfd})"
    assert "the CPU backend has no dma-bufs" in str(info.value)
    assert device.buffers == [] and driver.handles == frozenset()
    os.fstat(memfd)  # the fd stays the caller's, open


def test_bo_info_of_the_cpu_backend_tells_what_bo_create_returned(driver: CpuBackend) -> None:
    bo = driver.bo_create(3 * PAGE - 1, 0)
    assert driver.bo_info(bo.handle) == BoInfo(bo.handle, bo.mmap_offset, 3 * PAGE, bo.va, 0)
    driver.bo_destroy(bo.handle)
    with pytest.raises(OSError) as info:
        driver.bo_info(bo.handle)
    assert info.value.errno == errno.ENOENT


def test_device_bo_info_describes_a_buffer_and_names_an_unknown_handle(
    device: npu.Device,
) -> None:
    with device.alloc(100) as buf:
        info = device.bo_info(buf.handle)
        assert (info.handle, info.mmap_offset, info.alloc_size, info.va, info.flags) == (
            buf.handle,
            buf.mmap_offset,
            buf.alloc_size,
            buf.va,
            0,
        )
    with pytest.raises(npu.NpuError) as err:
        device.bo_info(12345)
    assert err.value.errno == errno.ENOENT and err.value.context == "BO_INFO(handle=12345)"
    with pytest.raises(ValueError):
        device.bo_info(-1)


# -- checks made before the backend is called -----------------------------------------


def test_exporting_a_freed_buffer_is_ebadf_without_a_backend_call(
    device: npu.Device, driver: CpuBackend
) -> None:
    buf = device.alloc(PAGE)
    buf.free()
    for export in (buf.export_dmabuf, lambda: device.export_dmabuf(buf)):
        with pytest.raises(npu.NpuError) as info:
            export()
        assert info.value.errno == errno.EBADF
    assert not any(c.name == "dmabuf_export" for c in driver.calls)


def test_exporting_a_buffer_of_another_device_is_a_value_error(device: npu.Device) -> None:
    with (
        npu.Device("cpu") as other,
        other.alloc(PAGE) as buf,
        pytest.raises(ValueError, match="belongs to"),
    ):
        device.export_dmabuf(buf)


@pytest.mark.parametrize("fd", [-1, 1 << 31])
def test_importing_an_out_of_range_fd_is_a_value_error(device: npu.Device, fd: int) -> None:
    with pytest.raises(ValueError, match="PRIME_FD_TO_HANDLE"):
        device.import_dmabuf(fd)


@pytest.mark.parametrize("fd", [True, "3", 3.0])
def test_importing_a_non_int_fd_is_a_type_error(device: npu.Device, fd: object) -> None:
    with pytest.raises(TypeError):
        device.import_dmabuf(fd)  # type: ignore[arg-type]


def test_a_numpy_integer_names_an_fd(device: npu.Device, memfd: int) -> None:
    with pytest.raises(npu.NpuError) as info:
        device.import_dmabuf(np.int32(memfd))
    assert info.value.errno == errno.EOPNOTSUPP


# -- the driver backend issues the ioctls ------------------------------------------------


def test_the_driver_backend_issues_bo_info_and_prime_ioctls() -> None:
    backend = DriverBackend(os.devnull)  # /dev/null answers every ioctl with ENOTTY
    assert isinstance(backend, Backend)
    with npu.Device(backend) as dev:
        for call, context in (
            (lambda: dev.bo_info(1), "BO_INFO(handle=1)"),
            (lambda: dev.import_dmabuf(0), "PRIME_FD_TO_HANDLE(fd=0)"),
        ):
            with pytest.raises(npu.NpuError) as info:
                call()
            assert info.value.errno == errno.ENOTTY and info.value.context == context
        with pytest.raises(OSError) as raw:
            backend.dmabuf_export(1)
        assert raw.value.errno == errno.ENOTTY


# -- what the device layer makes of an import (a stand-in backend) -------------------------


def test_an_import_is_a_mapped_buffer_of_the_importing_device(
    sdev: npu.Device, sharing: SharingCpu, memfd: int
) -> None:
    buf = sdev.import_dmabuf(memfd)
    info = sharing.bo_info(buf.handle)
    assert (buf.size, buf.alloc_size, buf.mmap_offset, buf.va) == (
        3 * PAGE,
        3 * PAGE,
        info.mmap_offset,
        info.va,
    )
    assert buf.device is sdev and buf in sdev.buffers
    sdev.run([npu.ops.fill(buf, 0x01020304, 3 * PAGE)])
    assert buf.read(4) == bytes([4, 3, 2, 1])
    handle = buf.handle
    buf.free()
    assert HalCall("bo_destroy", (handle,)) in sharing.calls
    assert handle not in sharing.handles and sdev.buffers == []


def test_importing_an_own_export_gives_back_the_same_buffer(sdev: npu.Device) -> None:
    with sdev.alloc(100) as buf:
        fd = buf.export_dmabuf()
        try:
            assert sdev.import_dmabuf(fd) is buf
            assert sdev.import_dmabuf(fd) is buf
            assert sdev.buffers == [buf]
        finally:
            os.close(fd)


def test_an_import_whose_mapping_fails_destroys_its_handle(
    sdev: npu.Device, sharing: SharingCpu, memfd: int
) -> None:
    sharing.bad_mapping = True
    with pytest.raises(npu.NpuError) as info:
        sdev.import_dmabuf(memfd)
    assert info.value.errno == errno.EINVAL and info.value.context.startswith("mmap(handle=")
    assert sharing.handles == frozenset() and sdev.buffers == []


def test_closing_the_device_frees_its_imported_buffers(sharing: SharingCpu, memfd: int) -> None:
    dev = npu.Device(sharing)
    buf = dev.import_dmabuf(memfd)
    dev.close()
    assert buf.freed
    with pytest.raises(npu.NpuError) as info:
        buf.export_dmabuf()
    assert info.value.errno == errno.EBADF


def test_a_refused_export_of_device_memory_says_so(sdev: npu.Device, sharing: SharingCpu) -> None:
    with sdev.alloc(PAGE) as buf:
        sharing.flags = _abi.NPU_BO_INFO_DEVICE
        with pytest.raises(npu.NpuError) as info:
            buf.export_dmabuf()
        assert info.value.errno == errno.EOPNOTSUPP
        assert info.value.context == f"PRIME_HANDLE_TO_FD(handle={buf.handle}, device memory)"
