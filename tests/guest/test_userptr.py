"""User-pointer buffer objects (BO_USERPTR) and npu.from_numpy: numpy memory
used by the device in place, pinned while a buffer object holds it, every
bad argument refused with its errno, and nothing left pinned afterwards."""

from __future__ import annotations

import ctypes
import errno
import fcntl
import mmap
from collections.abc import Callable

import numpy as np
import pytest

import npu
from npu import _abi, ops

SYSFS = "/sys/class/accel/accel0/device/npu"
PAGE = mmap.PAGESIZE
MiB = 1 << 20


def live_bo_bytes() -> int:
    with open(f"{SYSFS}/bo_bytes") as f:
        return int(f.read())


def page_aligned(nbytes: int) -> tuple[mmap.mmap, int]:
    """An anonymous mapping and its address."""
    m = mmap.mmap(-1, nbytes)
    addr = ctypes.addressof(ctypes.c_char.from_buffer(m))
    return m, addr


def errno_of(fn: Callable[[], object]) -> int:
    with pytest.raises(npu.NpuError) as info:
        fn()
    return info.value.errno


# -- npu.from_numpy ---------------------------------------------------------------


def test_from_numpy_shares_the_arrays_memory(dev: npu.Device) -> None:
    x = np.arange(3000, dtype=np.float32)
    t = npu.from_numpy(x, device=dev)
    assert isinstance(t.buffer, npu.UserBuffer)
    x[7] = -1.0  # no copy: the change shows on the device side
    np.testing.assert_array_equal(t.numpy(), x)


def test_ops_read_a_from_numpy_tensor_in_place(dev: npu.Device) -> None:
    rng = np.random.default_rng(1)
    a = rng.standard_normal((64, 48)).astype(np.float32)
    b = rng.standard_normal((48, 32)).astype(np.float32)
    ta, tb = npu.from_numpy(a, device=dev), npu.from_numpy(b, device=dev)
    np.testing.assert_allclose((ta @ tb).numpy(), a @ b, rtol=1e-4, atol=1e-4)
    np.testing.assert_array_equal(npu.relu(ta).numpy(), np.maximum(a, 0))


def test_from_numpy_keeps_strided_views_without_copying(dev: npu.Device) -> None:
    base = np.arange(24, dtype=np.int32).reshape(4, 6)
    view = base[:, 1::2]  # strides (24, 8): not contiguous
    t = npu.from_numpy(view, device=dev)
    assert t.shape == (4, 3) and t.strides == (6, 2)
    np.testing.assert_array_equal((t + 1).numpy(), view + 1)


def test_a_read_only_array_gives_a_read_only_buffer(dev: npu.Device) -> None:
    x = np.ones(1024, np.float32)
    x.flags.writeable = False
    t = npu.from_numpy(x, device=dev)
    assert isinstance(t.buffer, npu.UserBuffer) and t.buffer.readonly
    np.testing.assert_array_equal((t * 2).numpy(), np.full(1024, 2, np.float32))


def test_the_device_cannot_write_a_read_only_buffer(dev: npu.Device) -> None:
    x = np.ones(1024, np.float32)
    x.flags.writeable = False
    t = npu.from_numpy(x, device=dev)
    assert t.buffer is not None
    into_x = ops.tensor_ref(t.buffer, npu.DType.FP32, (1024,), offset=t.offset * 4)
    relu = ops.unary(npu.UnaryKind.RELU, t.tensor_ref(), into_x, (t.buffer,))
    assert errno_of(lambda: dev.submit([relu])) == errno.EACCES
    fill = ops.fill(t.buffer, 0, nbytes=4096)
    assert errno_of(lambda: dev.submit([fill])) == errno.EACCES


def test_from_numpy_refuses_what_the_device_cannot_address(dev: npu.Device) -> None:
    with pytest.raises(TypeError, match="dtype"):
        npu.from_numpy(np.ones(4, np.float64), device=dev)
    with pytest.raises(ValueError, match="strides"):
        npu.from_numpy(np.arange(8, dtype=np.float32)[::-1], device=dev)
    with pytest.raises(ValueError, match="empty"):
        npu.from_numpy(np.ones(0, np.float32), device=dev)
    with pytest.raises(ValueError, match="rank"):
        npu.from_numpy(np.ones((1, 1, 1, 1, 2), np.float32), device=dev)


def test_pinned_pages_are_released_when_the_tensor_dies(dev: npu.Device) -> None:
    x = np.zeros(MiB // 4, np.float32)
    t = npu.from_numpy(x, device=dev)
    y = npu.relu(t)
    y.wait()  # the job holding t's buffer object has retired
    assert t.buffer is not None
    pinned = t.buffer.size  # the whole pages holding x
    assert pinned >= MiB
    with_t = live_bo_bytes()
    del t
    assert live_bo_bytes() == with_t - pinned
    del y


# -- the BO_USERPTR ioctl ------------------------------------------------------------


def test_bo_userptr_refuses_bad_arguments_with_their_errno(dev: npu.Device) -> None:
    m, addr = page_aligned(4 * PAGE)
    assert errno_of(lambda: dev.bo_userptr(addr + 8, PAGE)) == errno.EINVAL  # unaligned addr
    assert errno_of(lambda: dev.bo_userptr(addr, PAGE + 1)) == errno.EINVAL  # unaligned size
    assert errno_of(lambda: dev.bo_userptr(addr, 0)) == errno.EINVAL
    assert errno_of(lambda: dev.bo_userptr(-PAGE % 2**64, 2 * PAGE)) == errno.EINVAL  # wraps
    too_big = _abi.NPU_BO_MAX_SIZE + PAGE
    assert errno_of(lambda: dev.bo_userptr(addr, too_big)) == errno.E2BIG
    raw = _abi.NpuBoUserptr(addr=addr, size=PAGE, flags=0x80, handle=0)  # unknown flag
    with pytest.raises(OSError) as info:
        fcntl.ioctl(dev.fileno(), _abi.DRM_IOCTL_NPU_BO_USERPTR, raw, True)
    assert info.value.errno == errno.EINVAL
    m.close()


def test_bo_userptr_of_unmapped_memory_is_efault(dev: npu.Device) -> None:
    m, addr = page_aligned(4 * PAGE)
    m.close()  # now nothing is mapped there
    assert errno_of(lambda: dev.bo_userptr(addr, 4 * PAGE)) == errno.EFAULT


def test_bo_userptr_writable_pin_of_read_only_memory_is_efault(dev: npu.Device) -> None:
    m = mmap.mmap(-1, 2 * PAGE, prot=mmap.PROT_READ)
    view = np.frombuffer(m, np.uint8)
    start = int(view.__array_interface__["data"][0])
    assert errno_of(lambda: dev.bo_userptr(start, 2 * PAGE)) == errno.EFAULT
    handle = dev.bo_userptr(start, 2 * PAGE, readonly=True)
    dev.bo_destroy(handle)
    del view
    m.close()


def test_a_userptr_buffer_object_has_no_mmap_offset(dev: npu.Device) -> None:
    m, addr = page_aligned(PAGE)
    handle = dev.bo_userptr(addr, PAGE)
    info = _abi.NpuBoInfo(handle=handle)
    fcntl.ioctl(dev.fileno(), _abi.DRM_IOCTL_NPU_BO_INFO, info, True)
    assert (info.flags, info.size, info.mmap_offset) == (_abi.NPU_BO_INFO_USERPTR, PAGE, 0)
    dev.bo_destroy(handle)
    m.close()


def test_closing_the_file_unpins_every_userptr_buffer(dev_path: str) -> None:
    baseline = live_bo_bytes()
    m, addr = page_aligned(8 * PAGE)
    d = npu.Device(dev_path)
    for i in range(8):
        d.bo_userptr(addr + i * PAGE, PAGE)
    assert live_bo_bytes() == baseline + 8 * PAGE
    d.close()
    assert live_bo_bytes() == baseline
    m.close()


def test_unmapping_the_user_memory_first_is_harmless(dev_path: str) -> None:
    baseline = live_bo_bytes()
    with npu.Device(dev_path) as d:
        m, addr = page_aligned(2 * PAGE)
        handle = d.bo_userptr(addr, 2 * PAGE)
        m.close()  # the pinned pages outlive the mapping
        out = d.alloc(2 * PAGE)
        d.run([ops.copy(_Ref(handle, 2 * PAGE), out, 2 * PAGE)])
        d.bo_destroy(handle)
        out.free()
    assert live_bo_bytes() == baseline


class _Ref:
    """A bare handle usable as an ops buffer (a BO with no runtime Buffer)."""

    def __init__(self, handle: int, size: int) -> None:
        self.handle = handle
        self.size = size


def test_pinned_copies_round_trip_through_the_dma_engine(dev: npu.Device) -> None:
    x = np.random.default_rng(2).standard_normal(3 * MiB // 4).astype(np.float32)
    y = np.zeros_like(x)
    d = npu.tensor(np.zeros_like(x), device=dev)
    d.copy_(npu.from_numpy(x, device=dev))  # H2D: one COPY, queued
    back = npu.from_numpy(y, device=dev).copy_(d * 2)  # D2H of a device result
    back.wait()
    np.testing.assert_array_equal(y, x * 2)


def test_the_same_memory_pinned_twice_works_through_both_buffers(dev: npu.Device) -> None:
    # Two BOs over the same pages (two views of one array): the DMA API's
    # debug code (the debug kernel) reported overlapping mappings until BO
    # mappings skipped the CPU syncs a coherent device never needs.
    n = MiB // 4
    x = np.arange(2 * n, dtype=np.float32)
    a = npu.from_numpy(x[:n], device=dev)
    b = npu.from_numpy(x[n // 2 : n // 2 + n], device=dev)  # half of a's pages
    np.testing.assert_array_equal((a + b).numpy(), x[:n] + x[n // 2 : n // 2 + n])


def _in_child(body: Callable[[], dict[str, int]]) -> dict[str, int]:
    """Run ``body`` in a forked child; its result (or its exception) comes back."""
    import json
    import os
    import traceback

    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(r)
        try:
            out = json.dumps({"ok": body()})
        except BaseException:
            out = json.dumps({"error": traceback.format_exc()})
        os.write(w, out.encode())
        os._exit(0)
    os.close(w)
    with os.fdopen(r) as f:
        got = json.loads(f.read() or '{"error": "the child died"}')
    os.waitpid(pid, 0)
    assert "ok" in got, got.get("error")
    return got["ok"]


def _locked_kib() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmLck:"):
                return int(line.split()[1])
    raise AssertionError("no VmLck in /proc/self/status")


def test_userptr_pins_count_against_the_memlock_limit(dev_path: str) -> None:
    # Long-term pins are locked memory of the process (VmLck), refused past
    # RLIMIT_MEMLOCK for a process without CAP_IPC_LOCK: the driver used to
    # pin any amount for anyone.
    import grp
    import os
    import resource

    def body() -> dict[str, int]:
        gid = grp.getgrnam("npu").gr_gid
        os.setgroups([gid])
        os.setgid(gid)
        os.setuid(65534)  # nobody, in group npu: no CAP_IPC_LOCK
        resource.setrlimit(resource.RLIMIT_MEMLOCK, (64 << 10, 64 << 10))
        fd = os.open(dev_path, os.O_RDWR)
        memory = page_aligned(128 << 10)  # kept mapped while pinned
        addr = memory[1]
        small = _abi.NpuBoUserptr(addr=addr, size=32 << 10)
        fcntl.ioctl(fd, _abi.DRM_IOCTL_NPU_BO_USERPTR, small, True)
        pinned = _locked_kib()
        big = _abi.NpuBoUserptr(addr=addr + (32 << 10), size=64 << 10)
        try:
            fcntl.ioctl(fd, _abi.DRM_IOCTL_NPU_BO_USERPTR, big, True)
            refused = 0
        except OSError as e:
            refused = e.errno
        fcntl.ioctl(fd, _abi.DRM_IOCTL_NPU_BO_DESTROY, _abi.NpuBoDestroy(handle=small.handle))
        after = _locked_kib()
        os.close(fd)
        return {"pinned": pinned, "refused": refused, "after": after}

    got = _in_child(body)
    assert got == {"pinned": 32, "refused": errno.ENOMEM, "after": 0}
