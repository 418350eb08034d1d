"""Buffer and file descriptor lifetimes: mappings outlive handles, nothing leaks.

BO memory is measured exactly by the driver's ``bo_bytes`` sysfs counter
(bytes of live BO backing pages, across all files), so a leak of a single
page shows.
"""

from __future__ import annotations

import ctypes
import fcntl
import mmap
import os
import time
from collections.abc import Callable

import numpy as np
import pytest
from guest_util import soak_cycles

import npu
from npu import _abi, ops

MiB = 1 << 20
PAGE = mmap.PAGESIZE
RW = mmap.PROT_READ | mmap.PROT_WRITE
SYSFS = "/sys/class/accel/accel0/device/npu"
# The accounting is exact: no tolerance.
MEM_TOLERANCE = 0
BIG_BO = 4 * MiB


# --------------------------------------------------------------------------
# Helpers
# --------------------------------------------------------------------------


def bo_memory_free() -> int:
    """Minus the bytes of live BOs on the device: rises as BOs are freed."""
    with open(f"{SYSFS}/bo_bytes") as f:
        return -int(f.read())


def bo_counts() -> tuple[int, int]:
    """The device's live BOs and their bytes (sysfs bo_count, bo_bytes)."""
    with open(f"{SYSFS}/bo_count") as c, open(f"{SYSFS}/bo_bytes") as b:
        return int(c.read()), int(b.read())


def fences() -> tuple[int, int]:
    """(last submitted, last completed) fence of queue 0."""
    with open(f"{SYSFS}/fences") as f:
        submitted, completed = f.read().split()
    return int(submitted), int(completed)


def poll(predicate: Callable[[], bool], timeout_s: float = 30.0, interval_s: float = 0.05) -> bool:
    deadline = time.monotonic() + timeout_s
    while True:
        if predicate():
            return True
        if time.monotonic() > deadline:
            return False
        time.sleep(interval_s)


def wait_idle(timeout_s: float = 60.0) -> None:
    assert poll(lambda: fences()[1] == fences()[0], timeout_s), f"device not idle: {fences()}"


def assert_memory_back_to(baseline: int, timeout_s: float = 10.0) -> None:
    poll(lambda: abs(bo_memory_free() - baseline) <= MEM_TOLERANCE, timeout_s)
    now = bo_memory_free()
    assert abs(now - baseline) <= MEM_TOLERANCE, (
        f"free BO memory {now // 1024} kB, baseline {baseline // 1024} kB "
        f"(missing {(baseline - now) // 1024} kB)"
    )


def ioctl(fd: int, request: int, arg) -> None:
    fcntl.ioctl(fd, request, arg, True)


def bo_create(fd: int, size: int) -> _abi.NpuBoCreate:
    arg = _abi.NpuBoCreate(size=size)
    ioctl(fd, _abi.DRM_IOCTL_NPU_BO_CREATE, arg)
    return arg


def bo_destroy(fd: int, handle: int) -> None:
    ioctl(fd, _abi.DRM_IOCTL_NPU_BO_DESTROY, _abi.NpuBoDestroy(handle=handle))


def raw_submit(fd: int, op_list: list[npu.Op]) -> int:
    raw = (_abi.NpuOp * len(op_list))(*(op.pack() for op in op_list))
    arg = _abi.NpuSubmit(
        ops_ptr=ctypes.addressof(raw),
        num_ops=len(op_list),
        queue=0,
        flags=0,
        op_size=ctypes.sizeof(_abi.NpuOp),
    )
    ioctl(fd, _abi.DRM_IOCTL_NPU_SUBMIT, arg)
    return int(arg.fence)


def raw_wait(fd: int, fence: int, timeout_s: float = 60.0) -> None:
    arg = _abi.NpuWait(fence=fence, deadline_ns=_abi.deadline_after(int(timeout_s * 1e9)), queue=0)
    ioctl(fd, _abi.DRM_IOCTL_NPU_WAIT, arg)


class Bo:
    """A raw BO usable with the op builders (handle + size)."""

    def __init__(self, fd: int, size: int) -> None:
        arg = bo_create(fd, size)
        self.handle, self.size, self.mmap_offset = int(arg.handle), size, int(arg.mmap_offset)
        self.alloc_size = int(arg.alloc_size)

    def map(self, fd: int) -> mmap.mmap:
        return mmap.mmap(fd, self.alloc_size, mmap.MAP_SHARED, RW, offset=self.mmap_offset)


def device_still_computes(dev_path: str) -> None:
    rng = np.random.default_rng(7)
    a = rng.standard_normal((31, 17), dtype=np.float32)
    b = rng.standard_normal((17, 9), dtype=np.float32)
    with npu.Device(dev_path) as dev:
        np.testing.assert_allclose(npu.matmul(a, b, device=dev), a @ b, rtol=1e-4, atol=1e-4)


@pytest.fixture
def idle_baseline() -> int:
    """Free BO memory with the device idle, before the test."""
    wait_idle()
    return bo_memory_free()


# --------------------------------------------------------------------------
# DMA mapping
# --------------------------------------------------------------------------

DMA_API_ERRORS = "/sys/kernel/debug/dma-api/error_count"


@pytest.mark.skipif(not os.path.exists(DMA_API_ERRORS), reason="needs CONFIG_DMA_API_DEBUG")
def test_bos_of_any_size_map_without_dma_api_errors(fd):
    # Pages that happen to be contiguous merge into scatterlist segments
    # longer than 64 KiB, the PCI default limit the driver used to keep.
    with open(DMA_API_ERRORS) as f:
        before = int(f.read())
    bos = [Bo(fd, size) for size in (4096, 72 << 10, MiB, BIG_BO, 16 * MiB)]
    for bo in bos:
        bo_destroy(fd, bo.handle)
    with open(DMA_API_ERRORS) as f:
        assert int(f.read()) == before


def test_an_ioctl_faulting_in_its_argument_and_mmap_take_no_locks_in_opposite_orders(fd):
    # mmap() enters the driver holding mmap_lock; an ioctl whose argument
    # page is not mapped yet takes mmap_lock (the fault) inside the driver.
    # With a rwsem as the unplug lock, those two and a remove() deadlock,
    # which lockdep (the debug kernel) reports; the SRCU read side cannot.
    Bo(fd, PAGE).map(fd).close()
    arg = _abi.NpuBoCreate(size=PAGE)
    mfd = os.memfd_create("npu-ioctl-arg")
    try:
        os.write(mfd, bytes(arg).ljust(PAGE, b"\0"))
        page = mmap.mmap(mfd, PAGE, mmap.MAP_SHARED, RW)
        page.madvise(mmap.MADV_DONTNEED)  # the next access faults it back in
        addr = ctypes.addressof(ctypes.c_char.from_buffer(page))
        libc = ctypes.CDLL(None, use_errno=True)
        libc.ioctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_void_p]
        assert libc.ioctl(fd, _abi.DRM_IOCTL_NPU_BO_CREATE, addr) == 0, os.strerror(
            ctypes.get_errno()
        )
        out = _abi.NpuBoCreate.from_buffer_copy(page[: ctypes.sizeof(_abi.NpuBoCreate)])
        bo_destroy(fd, out.handle)
        del addr
        page.close()
    finally:
        os.close(mfd)


# --------------------------------------------------------------------------
# Mappings
# --------------------------------------------------------------------------


def test_mapping_stays_readable_and_writable_after_bo_destroy(fd):
    bo = Bo(fd, 64 * 1024)
    m = bo.map(fd)
    raw_wait(fd, raw_submit(fd, [ops.fill(bo, 0xA1B2C3D4, bo.size)]))
    bo_destroy(fd, bo.handle)
    words = np.frombuffer(m, dtype=np.uint32)
    assert (words == 0xA1B2C3D4).all(), "device results lost by BO_DESTROY"
    words[:] = np.arange(words.size, dtype=np.uint32)
    assert np.array_equal(np.frombuffer(m, dtype=np.uint32), np.arange(words.size))
    del words
    m.close()


def test_mapping_stays_readable_and_writable_after_the_fd_is_closed(dev_path):
    f = os.open(dev_path, os.O_RDWR)
    try:
        bo = Bo(f, 64 * 1024)
        m = bo.map(f)
        raw_wait(f, raw_submit(f, [ops.fill(bo, 0x600DF00D, bo.size)]))
    finally:
        os.close(f)
    words = np.frombuffer(m, dtype=np.uint32)
    assert (words == 0x600DF00D).all()
    words[::3] = 7
    assert (np.frombuffer(m, dtype=np.uint32)[::3] == 7).all()
    del words
    m.close()


def test_mapping_keeps_bo_memory_until_unmapped(dev_path, idle_baseline):
    f = os.open(dev_path, os.O_RDWR)
    bos = [Bo(f, BIG_BO) for _ in range(4)]
    maps = [bo.map(f) for bo in bos]
    for bo in bos:
        bo_destroy(f, bo.handle)
    os.close(f)
    assert idle_baseline - bo_memory_free() >= 4 * BIG_BO - MEM_TOLERANCE, "BO freed while mapped"
    m = maps[-1]
    m[0:4] = b"live"
    m[-4:] = b"tail"
    assert (m[0:4], m[-4:]) == (b"live", b"tail")
    for m in maps:
        m.close()
    assert_memory_back_to(idle_baseline)


def test_partial_mappings_of_one_bo_see_the_same_memory(fd):
    bo = Bo(fd, 4 * PAGE)
    whole = bo.map(fd)
    tail = mmap.mmap(fd, PAGE, mmap.MAP_SHARED, RW, offset=bo.mmap_offset + 3 * PAGE)
    bo_destroy(fd, bo.handle)
    tail[:5] = b"hello"
    assert whole[3 * PAGE : 3 * PAGE + 5] == b"hello"
    whole[3 * PAGE + 5 : 3 * PAGE + 6] = b"!"
    assert tail[:6] == b"hello!"
    tail.close()
    whole.close()


def test_bo_destroyed_with_a_job_in_flight_stays_alive_until_the_job_is_done(fd):
    d = 512
    a, b, c = (Bo(fd, d * d * 4) for _ in range(3))
    ma, mb, mc = a.map(fd), b.map(fd), c.map(fd)
    rng = np.random.default_rng(3)
    av = rng.standard_normal((d, d), dtype=np.float32)
    bv = rng.standard_normal((d, d), dtype=np.float32)
    np.frombuffer(ma, dtype=np.float32)[:] = av.ravel()
    np.frombuffer(mb, dtype=np.float32)[:] = bv.ravel()
    ma.close()
    mb.close()
    fence = raw_submit(fd, [ops.gemm(a, b, c, d, d, d)])
    for bo in (a, b, c):
        bo_destroy(fd, bo.handle)
    raw_wait(fd, fence)
    got = np.frombuffer(mc, dtype=np.float32).reshape(d, d).copy()
    mc.close()
    np.testing.assert_allclose(got, av @ bv, rtol=1e-3, atol=1e-3)


# --------------------------------------------------------------------------
# No leaks
# --------------------------------------------------------------------------


def test_closing_an_fd_with_jobs_in_flight_frees_every_bo_and_the_device_still_works(
    dev_path, idle_baseline
):
    f = os.open(dev_path, os.O_RDWR)
    try:
        pairs = [(Bo(f, BIG_BO), Bo(f, BIG_BO)) for _ in range(8)]
        d = 1024  # 1024 x 1024 fp32 = 4 MiB
        ga, gb, gc = (Bo(f, d * d * 4) for _ in range(3))
        in_use = idle_baseline - bo_memory_free()
        assert in_use >= 19 * BIG_BO - MEM_TOLERANCE
        copies = [ops.copy(s, t, s.size) for s, t in pairs] * 32
        gemms = [ops.gemm(ga, gb, gc, d, d, d)] * 4
        last = 0
        for _ in range(4):
            raw_submit(f, copies)
            last = raw_submit(f, gemms)
    finally:
        os.close(f)  # no WAIT: the jobs are still queued or running
    submitted, _ = fences()
    assert submitted >= last
    wait_idle(120)
    assert_memory_back_to(idle_baseline)
    device_still_computes(dev_path)


def test_closing_an_fd_with_mapped_and_unmapped_bos_frees_them_all(dev_path, idle_baseline):
    f = os.open(dev_path, os.O_RDWR)
    maps = []
    try:
        for i in range(8):
            bo = Bo(f, BIG_BO if i % 3 else 1 * MiB)
            if i % 2:
                maps.append(bo.map(f))
    finally:
        os.close(f)
    for m in maps:
        m.close()
    assert_memory_back_to(idle_baseline)


def test_200_create_destroy_cycles_return_bo_memory_to_its_baseline(fd, idle_baseline):
    sizes = [1 * MiB, BIG_BO, 512 * 1024 + 1, 3 * MiB]
    for i in range(200):
        bo = Bo(fd, sizes[i % len(sizes)])
        if i % 5 == 0:
            m = bo.map(fd)
            m[0:1] = b"x"
            m.close()
        bo_destroy(fd, bo.handle)
    assert_memory_back_to(idle_baseline)


def test_200_runtime_alloc_free_cycles_with_work_return_bo_memory_to_its_baseline(
    dev, idle_baseline
):
    for i in range(200):
        with dev.alloc(1 * MiB) as buf:
            if i % 20 == 0:
                dev.run([ops.fill(buf, i, buf.size)])
                assert buf.numpy(np.uint32)[-1] == i
    assert dev.buffers == []
    assert_memory_back_to(idle_baseline)


def test_closing_many_fds_with_bos_frees_them(dev_path, idle_baseline):
    for _ in range(20):
        f = os.open(dev_path, os.O_RDWR)
        for _ in range(3):
            Bo(f, BIG_BO)
        os.close(f)
    assert_memory_back_to(idle_baseline)


# --------------------------------------------------------------------------
# sysfs
# --------------------------------------------------------------------------


def test_fences_attribute_shows_completed_equal_to_submitted_after_wait(dev):
    with dev.alloc(1 * MiB) as a, dev.alloc(1 * MiB) as b:
        fence = dev.submit([ops.copy(a, b, a.size), ops.fill(a, 1, a.size)] * 20)
        dev.wait(fence)
    submitted, completed = fences()
    assert submitted == fence
    assert completed == submitted


def test_fences_attribute_counts_every_submitted_op(dev):
    before, _ = fences()
    fence = dev.run([ops.nop()] * 17)
    after, completed = fences()
    assert after - before == 17
    assert after == fence == completed


def test_irq_count_increases_with_completed_jobs(dev):
    with open(f"{SYSFS}/irq_count") as f:
        before = int(f.read())
    for _ in range(3):
        dev.run([ops.nop()])
    with open(f"{SYSFS}/irq_count") as f:
        assert int(f.read()) > before


def test_bo_destroy_racing_the_create_of_a_predictable_handle_frees_each_bo_once(
    dev_path: str,
) -> None:
    # A new BO gets the lowest free handle, so a second thread can destroy
    # it while the BO_CREATE that makes it is still running. The handle is
    # published last now; it used to be visible while BO_CREATE still read
    # the BO (a use-after-free on the debug kernel). Every BO must end up
    # freed exactly once.
    import threading

    fd = os.open(dev_path, os.O_RDWR)
    before = bo_counts()
    stop = threading.Event()
    created: list[int] = []

    def destroyer() -> None:
        guess = 0
        while not stop.is_set():
            guess = guess % 4 + 1
            try:
                arg = _abi.NpuBoDestroy(handle=guess)
                fcntl.ioctl(fd, _abi.DRM_IOCTL_NPU_BO_DESTROY, arg, True)
            except OSError:
                pass

    thread = threading.Thread(target=destroyer)
    thread.start()
    try:
        for _ in range(soak_cycles(2000)):
            arg = _abi.NpuBoCreate(size=PAGE)
            fcntl.ioctl(fd, _abi.DRM_IOCTL_NPU_BO_CREATE, arg, True)
            created.append(int(arg.handle))
    finally:
        stop.set()
        thread.join()
        os.close(fd)
    assert all(created)
    assert poll(lambda: bo_counts() == before), (bo_counts(), before)
