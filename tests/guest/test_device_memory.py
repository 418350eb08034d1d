"""Device memory (BAR2): buffer objects created with NPU_BO_DEVICE live in
the device's own memory, are cleared before a file gets them, map through
the BAR, work as operands of every command, are charged to the file
(fdinfo ``npu-memory-device``) and to the device (sysfs
``mem_device_used``), and run out with ENOMEM without leaking."""

from __future__ import annotations

import ctypes
import errno
import fcntl
import mmap
import os
from collections.abc import Callable

import numpy as np
import pytest
from guest_util import soak_cycles

from npu import _abi

DEV_PATH = "/dev/npu0"
SYSFS = "/sys/class/accel/accel0/device/npu"
MiB = 1 << 20
PAGE = mmap.PAGESIZE
RW = mmap.PROT_READ | mmap.PROT_WRITE


def ioctl(fd: int, request: int, arg) -> None:
    fcntl.ioctl(fd, request, arg, True)


def assert_errno(expected: int, call: Callable[[], object]) -> None:
    with pytest.raises(OSError) as info:
        call()
    assert info.value.errno == expected, errno.errorcode.get(info.value.errno)


def sysfs_int(name: str) -> int:
    with open(f"{SYSFS}/{name}") as f:
        return int(f.read())


def fdinfo_kib(fd: int, key: str) -> int:
    with open(f"/proc/self/fdinfo/{fd}") as f:
        for line in f:
            if line.startswith(key + ":"):
                value, unit = line.split(":", 1)[1].split()
                assert unit == "KiB"
                return int(value)
    raise AssertionError(f"{key} missing from fdinfo")


def bo_create(fd: int, size: int, device: bool = True) -> _abi.NpuBoCreate:
    arg = _abi.NpuBoCreate(size=size, flags=_abi.NPU_BO_DEVICE if device else 0)
    ioctl(fd, _abi.DRM_IOCTL_NPU_BO_CREATE, arg)
    return arg


def bo_destroy(fd: int, handle: int) -> None:
    ioctl(fd, _abi.DRM_IOCTL_NPU_BO_DESTROY, _abi.NpuBoDestroy(handle=handle))


def bo_map(fd: int, bo: _abi.NpuBoCreate) -> mmap.mmap:
    return mmap.mmap(fd, bo.alloc_size, mmap.MAP_SHARED, RW, offset=bo.mmap_offset)


def run(fd: int, ops: list[_abi.NpuOp]) -> None:
    arr = (_abi.NpuOp * len(ops))(*ops)
    sub = _abi.NpuSubmit(ops_ptr=ctypes.addressof(arr), num_ops=len(ops),
                         op_size=ctypes.sizeof(_abi.NpuOp))  # fmt: skip
    ioctl(fd, _abi.DRM_IOCTL_NPU_SUBMIT, sub)
    ioctl(
        fd,
        _abi.DRM_IOCTL_NPU_WAIT,
        _abi.NpuWait(fence=sub.fence, deadline_ns=_abi.deadline_after(60 * 10**9)),
    )


def op(opcode: int, bufs: list[tuple[int, int]], params: tuple[int, ...] = ()) -> _abi.NpuOp:
    o = _abi.NpuOp(opcode=opcode, num_bufs=len(bufs))
    for i, (handle, size) in enumerate(bufs):
        o.bufs[i] = _abi.NpuBufRef(handle=handle, offset=0, size=size)
    for i, p in enumerate(params):
        o.params[i] = p
    return o


@pytest.fixture(autouse=True)
def _needs_device_memory(fd: int) -> None:
    info = _abi.NpuInfo()
    ioctl(fd, _abi.DRM_IOCTL_NPU_GET_INFO, info)
    if not info.caps & _abi.NPU_INFO_CAP_LOCAL_MEM:
        pytest.skip("the device has no device memory")


def test_get_info_and_sysfs_report_the_same_device_memory_size(fd):
    info = _abi.NpuInfo()
    ioctl(fd, _abi.DRM_IOCTL_NPU_GET_INFO, info)
    assert info.device_memory == 512 * MiB  # the device's default mem-size
    assert sysfs_int("mem_device_total") == info.device_memory


def test_a_device_bo_has_a_device_address_and_maps_through_the_bar(fd):
    bo = bo_create(fd, 3 * PAGE)
    assert bo.va != 0 and bo.va % PAGE == 0
    assert bo.alloc_size == 3 * PAGE
    with bo_map(fd, bo) as m:
        m[PAGE : PAGE + 5] = b"hello"
        assert m[PAGE : PAGE + 5] == b"hello"


def test_device_memory_reaches_a_new_file_cleared(fd):
    size = 8 * MiB
    first = os.open(DEV_PATH, os.O_RDWR)
    try:
        bo = bo_create(first, size)
        with bo_map(first, bo) as m:
            m[:] = b"\xab" * size
    finally:
        os.close(first)
    # First fit: the new BO reuses (part of) what the closed file wrote.
    bo = bo_create(fd, size)
    with bo_map(fd, bo) as m:
        assert m[:] == bytes(size)


def test_copy_host_to_device_to_host_round_trips_the_bytes(fd):
    size = 4 * MiB
    src, dev, dst = bo_create(fd, size, False), bo_create(fd, size), bo_create(fd, size, False)
    data = np.random.default_rng(1).integers(0, 256, size, dtype=np.uint8)
    with bo_map(fd, src) as m:
        m[:] = data.tobytes()
    run(fd, [op(_abi.NPU_OP_COPY, [(src.handle, size), (dev.handle, size)]),
             op(_abi.NPU_OP_COPY, [(dev.handle, size), (dst.handle, size)])])  # fmt: skip
    with bo_map(fd, dev) as m:
        assert m[:] == data.tobytes()
    with bo_map(fd, dst) as m:
        assert m[:] == data.tobytes()


def test_fill_of_device_memory_is_seen_through_the_bar(fd):
    bo = bo_create(fd, 64 * 1024)
    run(fd, [op(_abi.NPU_OP_FILL, [(bo.handle, 64 * 1024)], (0x12345678,))])
    with bo_map(fd, bo) as m:
        assert m[:] == (0x12345678).to_bytes(4, "little") * (16 * 1024)


def test_gemm_with_operands_in_device_memory_matches_numpy(fd):
    m_, n_, k_ = 64, 48, 80
    rng = np.random.default_rng(2)
    a = rng.standard_normal((m_, k_), dtype=np.float32)
    b = rng.standard_normal((k_, n_), dtype=np.float32)
    bos = [bo_create(fd, x.nbytes) for x in (a, b)] + [bo_create(fd, m_ * n_ * 4)]
    for bo, x in zip(bos[:2], (a, b), strict=True):
        with bo_map(fd, bo) as m:
            m[: x.nbytes] = x.tobytes()
    params = (m_, n_, k_, k_, n_, n_, _abi.NPU_DTYPE_FP32, 0)
    run(fd, [op(_abi.NPU_OP_GEMM, [(a_.handle, a_.alloc_size) for a_ in bos], params)])
    with bo_map(fd, bos[2]) as m:
        got = np.frombuffer(m, np.float32, m_ * n_).reshape(m_, n_).copy()
    want = a.astype(np.float64) @ b.astype(np.float64)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4 * np.sqrt(k_))


def test_device_bo_is_charged_to_its_file_and_to_the_device(fd):
    used, kib = sysfs_int("mem_device_used"), fdinfo_kib(fd, "npu-memory-device")
    host_kib = fdinfo_kib(fd, "npu-memory-host")
    bo = bo_create(fd, 2 * MiB)
    assert sysfs_int("mem_device_used") == used + 2 * MiB
    assert fdinfo_kib(fd, "npu-memory-device") == kib + 2048
    assert fdinfo_kib(fd, "npu-memory-host") == host_kib
    bo_destroy(fd, bo.handle)
    assert sysfs_int("mem_device_used") == used
    assert fdinfo_kib(fd, "npu-memory-device") == kib


def test_exhausting_device_memory_fails_with_enomem_and_closing_frees_it(fd):
    base = sysfs_int("mem_device_used")
    other = os.open(DEV_PATH, os.O_RDWR)
    try:
        chunk = 128 * MiB
        got = 0
        with pytest.raises(OSError) as info:
            for _ in range(8):
                bo_create(other, chunk)
                got += chunk
        assert info.value.errno == errno.ENOMEM
        assert got >= 512 * MiB - chunk - base
        # The failed call left the file and the other files working.
        bo_create(fd, PAGE, device=False)
    finally:
        os.close(other)
    assert sysfs_int("mem_device_used") == base


def test_mapping_past_the_end_of_a_device_bo_fails_with_einval(fd):
    bo = bo_create(fd, 2 * PAGE)
    assert_errno(errno.EINVAL, lambda: mmap.mmap(fd, 3 * PAGE, mmap.MAP_SHARED, RW,
                                                 offset=bo.mmap_offset))  # fmt: skip
    assert_errno(errno.EINVAL, lambda: mmap.mmap(fd, PAGE, mmap.MAP_SHARED, RW,
                                                 offset=bo.mmap_offset + 2 * PAGE))  # fmt: skip


def test_a_mapping_keeps_a_destroyed_device_bo_until_unmapped(fd):
    used = sysfs_int("mem_device_used")
    bo = bo_create(fd, PAGE)
    m = bo_map(fd, bo)
    bo_destroy(fd, bo.handle)
    m[:4] = b"live"
    assert m[:4] == b"live"
    assert sysfs_int("mem_device_used") == used + PAGE
    m.close()
    assert sysfs_int("mem_device_used") == used


def test_a_soak_of_device_alloc_free_cycles_leave_usage_at_baseline(fd):
    used, count = sysfs_int("mem_device_used"), sysfs_int("bo_count")
    for i in range(soak_cycles(2000)):
        bo = bo_create(fd, PAGE * (1 + i % 7))
        bo_destroy(fd, bo.handle)
    assert sysfs_int("mem_device_used") == used
    assert sysfs_int("bo_count") == count


def test_the_runtime_allocates_device_memory_buffers_that_copy_like_host_ones():
    import npu

    with npu.Device(DEV_PATH) as dev:
        assert dev.info.device_memory == 512 * MiB
        used = sysfs_int("mem_device_used")
        host = dev.alloc(MiB)
        local = dev.alloc(MiB, device_memory=True)
        assert sysfs_int("mem_device_used") == used + MiB
        data = np.random.default_rng(3).integers(0, 256, MiB, dtype=np.uint8)
        host.numpy(np.uint8)[:] = data
        dev.wait(dev.submit([npu.ops.copy(host, local, MiB)]))
        assert np.array_equal(local.numpy(np.uint8), data)
        local.close()
        host.close()
        assert sysfs_int("mem_device_used") == used
