"""PRIME: buffer objects shared as dma-bufs (DRM_IOCTL_PRIME_*), GEM handles.

A host BO exports as a dma-buf; a dma-buf (ours or a udmabuf over a memfd)
imports as a new BO of the importing file, mapped in its own address space.
The device reads and writes the shared pages themselves: no CPU copy.
"""

from __future__ import annotations

import ctypes
import errno
import fcntl
import mmap
import os

import numpy as np
import pytest
from dmabuf_util import udmabuf

from npu import _abi, ops

PAGE = mmap.PAGESIZE
RW = mmap.PROT_READ | mmap.PROT_WRITE
SYSFS = "/sys/class/accel/accel0/device/npu"


def ioctl(fd: int, request: int, arg: ctypes.Structure) -> None:
    fcntl.ioctl(fd, request, arg, True)


def assert_errno(expected: int, call) -> None:
    with pytest.raises(OSError) as info:
        call()
    assert info.value.errno == expected, errno.errorcode.get(info.value.errno or 0)


def bo_count() -> int:
    with open(f"{SYSFS}/bo_count") as f:
        return int(f.read())


class Bo:
    """A handle of a file with what BO_INFO says of it (a BufferLike for ops)."""

    def __init__(self, fd: int, handle: int) -> None:
        info = _abi.NpuBoInfo(handle=handle)
        ioctl(fd, _abi.DRM_IOCTL_NPU_BO_INFO, info)
        self.fd, self.handle = fd, handle
        self.size, self.flags = int(info.size), int(info.flags)
        self.mmap_offset, self.va = int(info.mmap_offset), int(info.va)

    def map(self) -> mmap.mmap:
        return mmap.mmap(self.fd, self.size, mmap.MAP_SHARED, RW, offset=self.mmap_offset)


def create(fd: int, size: int, flags: int = 0) -> Bo:
    arg = _abi.NpuBoCreate(size=size, flags=flags)
    ioctl(fd, _abi.DRM_IOCTL_NPU_BO_CREATE, arg)
    return Bo(fd, int(arg.handle))


def export(fd: int, handle: int) -> int:
    arg = _abi.DrmPrimeHandle(handle=handle, flags=_abi.DRM_CLOEXEC | _abi.DRM_RDWR)
    ioctl(fd, _abi.DRM_IOCTL_PRIME_HANDLE_TO_FD, arg)
    return int(arg.fd)


def import_(fd: int, dmabuf: int) -> Bo:
    arg = _abi.DrmPrimeHandle(fd=dmabuf)
    ioctl(fd, _abi.DRM_IOCTL_PRIME_FD_TO_HANDLE, arg)
    return Bo(fd, int(arg.handle))


def gem_close(fd: int, handle: int) -> None:
    ioctl(fd, _abi.DRM_IOCTL_GEM_CLOSE, _abi.DrmGemClose(handle=handle))


def run(fd: int, op_list: list) -> None:
    raw = (_abi.NpuOp * len(op_list))(*(op.pack() for op in op_list))
    arg = _abi.NpuSubmit(
        ops_ptr=ctypes.addressof(raw), num_ops=len(op_list), op_size=ctypes.sizeof(_abi.NpuOp)
    )
    ioctl(fd, _abi.DRM_IOCTL_NPU_SUBMIT, arg)
    ioctl(
        fd,
        _abi.DRM_IOCTL_NPU_WAIT,
        _abi.NpuWait(fence=arg.fence, deadline_ns=_abi.deadline_after(60 * 10**9)),
    )


@pytest.fixture
def fd2(dev_path):
    f = os.open(dev_path, os.O_RDWR)
    yield f
    os.close(f)


def test_a_udmabuf_imported_takes_a_device_copy_seen_through_its_memfd(fd):
    size = 1 << 20
    memfd, dmabuf = udmabuf(size)
    try:
        dst = import_(fd, dmabuf)
        assert dst.flags == _abi.NPU_BO_INFO_IMPORTED and dst.size == size and dst.va
        src = create(fd, size)
        data = np.random.default_rng(1).integers(0, 256, size, dtype=np.uint8)
        with src.map() as m:
            m[:] = data.tobytes()
        run(fd, [ops.copy(src, dst, size)])
        assert os.pread(memfd, size, 0) == data.tobytes()
    finally:
        os.close(dmabuf)
        os.close(memfd)


def test_the_device_reads_what_was_written_to_an_imported_memfd(fd):
    size = 64 * PAGE
    memfd, dmabuf = udmabuf(size)
    try:
        os.pwrite(memfd, bytes(range(256)) * (size // 256), 0)
        src = import_(fd, dmabuf)
        dst = create(fd, size)
        run(fd, [ops.copy(src, dst, size)])
        with dst.map() as m:
            assert m[:] == bytes(range(256)) * (size // 256)
    finally:
        os.close(dmabuf)
        os.close(memfd)


def test_a_bo_shared_with_another_process_is_the_same_memory(fd, dev_path):
    shared = create(fd, 16 * PAGE)
    with shared.map() as m:
        m[:8] = b"exporter"
    dmabuf = export(fd, shared.handle)
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the importer: its own file, its own address space
        code = 1
        try:
            f = os.open(dev_path, os.O_RDWR)
            got = import_(f, dmabuf)
            mine = create(f, 16 * PAGE)
            run(f, [ops.copy(got, mine, 8), ops.fill(got, 0x41424344, 8, 8)])
            with mine.map() as m:
                ok = m[:8] == b"exporter" and got.size == 16 * PAGE
            os.write(w, b"ok" if ok else b"no")
            code = 0
        finally:
            os._exit(code)
    os.close(w)
    assert os.read(r, 2) == b"ok"
    assert os.waitpid(pid, 0)[1] == 0
    os.close(r)
    with shared.map() as m:
        assert m[8:16] == b"DCBADCBA"
    os.close(dmabuf)


def test_another_file_of_the_same_process_gets_its_own_object(fd, fd2):
    a = create(fd, 4 * PAGE)
    dmabuf = export(fd, a.handle)
    try:
        b = import_(fd2, dmabuf)
        assert b.flags == _abi.NPU_BO_INFO_IMPORTED
        assert b.size == a.size
        run(fd2, [ops.fill(b, 0x01020304, 4 * PAGE)])
        with a.map() as m:
            assert m[:8] == bytes([4, 3, 2, 1] * 2)
    finally:
        os.close(dmabuf)


def test_importing_a_dmabuf_into_its_exporter_gives_back_the_same_handle(fd):
    a = create(fd, PAGE)
    dmabuf = export(fd, a.handle)
    try:
        assert import_(fd, dmabuf).handle == a.handle
    finally:
        os.close(dmabuf)


def test_importing_a_dmabuf_twice_gives_one_handle(fd, fd2):
    dmabuf = export(fd, create(fd, PAGE).handle)
    try:
        assert import_(fd2, dmabuf).handle == import_(fd2, dmabuf).handle
    finally:
        os.close(dmabuf)


def test_an_exported_dmabuf_maps_the_bo_memory(fd):
    a = create(fd, 8 * PAGE)
    with a.map() as m:
        m[PAGE : PAGE + 5] = b"hello"
    dmabuf = export(fd, a.handle)
    try:
        with mmap.mmap(dmabuf, 8 * PAGE, mmap.MAP_SHARED, RW) as m:
            assert m[PAGE : PAGE + 5] == b"hello"
            m[:5] = b"world"
        with a.map() as m:
            assert m[:5] == b"world"
    finally:
        os.close(dmabuf)


def test_an_imported_bo_maps_through_the_importing_file(fd, fd2):
    a = create(fd, 2 * PAGE)
    with a.map() as m:
        m[:6] = b"shared"
    dmabuf = export(fd, a.handle)
    try:
        b = import_(fd2, dmabuf)
        with b.map() as m:
            assert m[:6] == b"shared"
    finally:
        os.close(dmabuf)


def test_the_memory_outlives_the_exporter_while_imported(dev_path, fd2):
    base = bo_count()
    f = os.open(dev_path, os.O_RDWR)
    a = create(f, PAGE)
    with a.map() as m:
        m[:4] = b"kept"
    dmabuf = export(f, a.handle)
    b = import_(fd2, dmabuf)
    os.close(dmabuf)
    os.close(f)  # the exporter's file and handle are gone
    mine = create(fd2, PAGE)
    run(fd2, [ops.copy(b, mine, 4)])
    with mine.map() as m:
        assert m[:4] == b"kept"
    gem_close(fd2, b.handle)
    gem_close(fd2, mine.handle)
    assert bo_count() == base


def test_exporting_a_device_memory_bo_fails_with_eopnotsupp(fd):
    with open(f"{SYSFS}/mem_device_total") as f:
        if not int(f.read()):
            pytest.skip("the device has no memory of its own")
    a = create(fd, PAGE, _abi.NPU_BO_DEVICE)
    assert_errno(errno.EOPNOTSUPP, lambda: export(fd, a.handle))


def test_exporting_an_unknown_handle_fails_with_enoent(fd):
    assert_errno(errno.ENOENT, lambda: export(fd, 0x7FFF_FFFF))


def test_importing_a_file_that_is_no_dmabuf_fails_with_einval(fd):
    with open("/proc/self/status", "rb") as f:
        assert_errno(errno.EINVAL, lambda: import_(fd, f.fileno()))


def test_importing_a_closed_fd_fails_with_ebadf(fd):
    r, w = os.pipe()
    os.close(r)
    os.close(w)
    assert_errno(errno.EBADF, lambda: import_(fd, r))


def test_gem_close_releases_a_bo_and_a_second_close_fails_with_einval(fd):
    base = bo_count()
    a = create(fd, PAGE)
    gem_close(fd, a.handle)
    assert bo_count() == base
    assert_errno(errno.EINVAL, lambda: gem_close(fd, a.handle))


def test_bo_info_of_an_unknown_handle_fails_with_enoent(fd):
    assert_errno(
        errno.ENOENT, lambda: ioctl(fd, _abi.DRM_IOCTL_NPU_BO_INFO, _abi.NpuBoInfo(handle=12345))
    )


def test_bo_info_with_a_nonzero_output_field_fails_with_einval(fd):
    a = create(fd, PAGE)
    for field in ("flags", "size", "mmap_offset", "va"):
        arg = _abi.NpuBoInfo(handle=a.handle)
        setattr(arg, field, 1)
        assert_errno(errno.EINVAL, lambda arg=arg: ioctl(fd, _abi.DRM_IOCTL_NPU_BO_INFO, arg))


def test_bo_info_tells_what_bo_create_returned(fd):
    arg = _abi.NpuBoCreate(size=3 * PAGE)
    ioctl(fd, _abi.DRM_IOCTL_NPU_BO_CREATE, arg)
    info = Bo(fd, int(arg.handle))
    assert (info.size, info.mmap_offset, info.va, info.flags) == (
        arg.alloc_size,
        arg.mmap_offset,
        arg.va,
        0,
    )
