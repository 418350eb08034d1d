"""The runtime's dma-buf sharing: Buffer.export_dmabuf and Device.import_dmabuf.

What tests/guest/test_prime.py checks with raw ioctls, through the public
API: a buffer shared by one Device is the same memory to another (two opens
of /dev/npu0, each its own address space), a udmabuf over a memfd imports
as a Buffer the device writes, and what cannot be shared is refused with
an NpuError that keeps the driver's errno.
"""

from __future__ import annotations

import errno
import mmap
import os
from collections.abc import Iterator

import numpy as np
import pytest
from dmabuf_util import udmabuf

import npu
from npu import _abi, ops

PAGE = mmap.PAGESIZE
SYSFS = "/sys/class/accel/accel0/device/npu"


def bo_count() -> int:
    with open(f"{SYSFS}/bo_count") as f:
        return int(f.read())


@pytest.fixture
def dev2(dev_path: str) -> Iterator[npu.Device]:
    """A second npu.Device on /dev/npu0: another file, another address space."""
    d = npu.Device(dev_path)
    try:
        yield d
    finally:
        d.close()


def test_a_buffer_exported_by_one_device_and_filled_by_another_is_seen_by_the_exporter(
    dev: npu.Device, dev2: npu.Device
) -> None:
    size = 16 * PAGE
    with dev.alloc(size) as mine:
        mine.write(bytes(range(256)) * (size // 256))
        fd = mine.export_dmabuf()
        try:
            theirs = dev2.import_dmabuf(fd)
        finally:
            os.close(fd)  # the imported buffer keeps the memory
        with theirs:
            assert theirs.device is dev2 and theirs.size == mine.alloc_size
            assert theirs.va  # an address of dev2's own space
            info = dev2.bo_info(theirs.handle)
            assert info.flags == _abi.NPU_BO_INFO_IMPORTED and info.alloc_size == size
            assert theirs.read(256) == bytes(range(256))  # mapped through dev2's file
            dev2.run([ops.fill(theirs, 0xA1B2C3D4, size - PAGE, PAGE)])
        got = mine.numpy(np.uint32)
        assert bytes(mine.view[:PAGE]) == bytes(range(256)) * (PAGE // 256)
        assert (got[PAGE // 4 :] == 0xA1B2C3D4).all()


def test_the_importer_copies_what_the_exporter_wrote(dev: npu.Device, dev2: npu.Device) -> None:
    size = 8 * PAGE
    data = np.random.default_rng(7).integers(0, 256, size, dtype=np.uint8)
    with dev.alloc(size) as src, dev2.alloc(size) as dst:
        src.write(data)
        fd = dev.export_dmabuf(src)
        try:
            with dev2.import_dmabuf(fd) as shared:
                dev2.run([ops.copy(shared, dst, size)])
        finally:
            os.close(fd)
        np.testing.assert_array_equal(dst.numpy(), data)


def test_a_udmabuf_imported_and_filled_by_the_device_is_seen_through_its_memfd(
    dev: npu.Device,
) -> None:
    size = 1 << 20
    memfd, dmabuf = udmabuf(size)
    try:
        buf = dev.import_dmabuf(dmabuf)
        assert buf.size == size and buf in dev.buffers
        dev.run([ops.fill(buf, 0x11223344, size)])
        assert os.pread(memfd, size, 0) == bytes([0x44, 0x33, 0x22, 0x11]) * (size // 4)
        os.pwrite(memfd, b"from the memfd", 0)
        assert buf.read(14) == b"from the memfd"  # the same pages, mapped by the device file
        buf.free()
    finally:
        os.close(dmabuf)
        os.close(memfd)


def test_the_device_reads_what_was_written_to_an_imported_memfd(dev: npu.Device) -> None:
    size = 32 * PAGE
    memfd, dmabuf = udmabuf(size)
    try:
        pattern = bytes(range(251)) * (size // 251 + 1)
        os.pwrite(memfd, pattern[:size], 0)
        with dev.import_dmabuf(dmabuf) as src, dev.alloc(size) as dst:
            dev.run([ops.copy(src, dst, size)])
            assert dst.read() == pattern[:size]
    finally:
        os.close(dmabuf)
        os.close(memfd)


def test_importing_into_the_exporting_device_gives_the_same_buffer(dev: npu.Device) -> None:
    with dev.alloc(PAGE) as buf:
        fd = buf.export_dmabuf()
        try:
            assert dev.import_dmabuf(fd) is buf
        finally:
            os.close(fd)


def test_importing_one_dmabuf_twice_gives_one_buffer(dev: npu.Device, dev2: npu.Device) -> None:
    with dev.alloc(PAGE) as buf:
        fd = buf.export_dmabuf()
        try:
            first = dev2.import_dmabuf(fd)
            assert dev2.import_dmabuf(fd) is first
            first.free()
        finally:
            os.close(fd)


def test_the_memory_outlives_the_exporting_device(dev_path: str, dev2: npu.Device) -> None:
    exporter = npu.Device(dev_path)
    buf = exporter.alloc(PAGE)
    buf.write(b"kept")
    fd = buf.export_dmabuf()
    shared = dev2.import_dmabuf(fd)
    os.close(fd)
    exporter.close()  # frees buf, closes its file
    assert shared.read(4) == b"kept"
    with dev2.alloc(PAGE) as copy:
        dev2.run([ops.copy(shared, copy, 4)])
        assert copy.read(4) == b"kept"


def test_freeing_buffers_on_both_sides_releases_the_object(
    dev: npu.Device, dev2: npu.Device
) -> None:
    base = bo_count()
    buf = dev.alloc(PAGE)
    fd = buf.export_dmabuf()
    shared = dev2.import_dmabuf(fd)
    os.close(fd)
    buf.free()
    assert bo_count() > base  # the importer still holds it
    shared.free()
    assert bo_count() == base


def test_exporting_a_device_memory_buffer_fails_with_eopnotsupp(dev: npu.Device) -> None:
    if not dev.info.device_memory:
        pytest.skip("the device has no memory of its own")
    with dev.alloc(PAGE, device_memory=True) as buf:
        with pytest.raises(npu.NpuError) as info:
            buf.export_dmabuf()
        assert info.value.errno == errno.EOPNOTSUPP
        assert "PRIME_HANDLE_TO_FD" in str(info.value) and "device memory" in str(info.value)
        assert not buf.freed  # still usable
        dev.run([ops.fill(buf, 1, PAGE)])


def test_exporting_a_userptr_buffer_fails_with_eopnotsupp(dev: npu.Device) -> None:
    array = np.zeros(PAGE // 4, np.uint32)
    buf, _ = dev.userptr(array)
    with buf, pytest.raises(npu.NpuError) as info:
        buf.export_dmabuf()
    assert info.value.errno == errno.EOPNOTSUPP
    assert "user memory" in str(info.value)


def test_importing_a_file_that_is_no_dmabuf_fails_with_einval(dev: npu.Device) -> None:
    with open("/proc/self/status", "rb") as f, pytest.raises(npu.NpuError) as info:
        fd = f.fileno()
        dev.import_dmabuf(fd)
    assert info.value.errno == errno.EINVAL
    assert f"PRIME_FD_TO_HANDLE(fd={fd})" in str(info.value)


def test_importing_a_closed_fd_fails_with_ebadf(dev: npu.Device) -> None:
    r, w = os.pipe()
    os.close(r)
    os.close(w)
    with pytest.raises(npu.NpuError) as info:
        dev.import_dmabuf(r)
    assert info.value.errno == errno.EBADF
