"""Fences on DRM syncobjs (docs/uapi.md, SUBMIT's in_syncs / out_syncobj).

Every SUBMIT job has a dma_fence. SUBMIT puts it into an out syncobj
(binary, or a timeline point); DRM's syncobj ioctls wait for it and export
it as a sync_file that poll() reports readable once the job is done. A job's
dependencies (syncobj points, or a fence value of one of the file's user
queues) are waited for by the device: the job's ops do not start before
they are met, and the CPU does not block in SUBMIT.

Foreign fences come from sw_sync (debugfs sync/sw_sync, CONFIG_SW_SYNC: the
debug kernel has it), whose fences the test signals by hand.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import fcntl
import mmap
import os
import select
import struct
import time
from collections.abc import Iterator

import numpy as np
import pytest
from test_user_queues import RawQueue, cmd

from npu import _abi, ops

PAGE = mmap.PAGESIZE
RW = mmap.PROT_READ | mmap.PROT_WRITE
WAIT_NS = 30 * 10**9
SW_SYNC = "/sys/kernel/debug/sync/sw_sync"
# <linux/sync_file.h> and sw_sync's debugfs ABI (drivers/dma-buf/sw_sync.c)
SW_SYNC_IOC_CREATE_FENCE = (3 << 30) | (40 << 16) | (ord("W") << 8) | 0
SW_SYNC_IOC_INC = (1 << 30) | (4 << 16) | (ord("W") << 8) | 1
SYNC_IOC_FILE_INFO = (3 << 30) | (56 << 16) | (ord(">") << 8) | 4
HANG_TIMEOUT = "/sys/module/npu/parameters/hang_timeout_ms"


def ioctl(fd: int, request: int, arg: ctypes.Structure) -> None:
    fcntl.ioctl(fd, request, arg, True)


def errno_of(call) -> int:
    with pytest.raises(OSError) as info:
        call()
    return int(info.value.errno or 0)


class Bo:
    def __init__(self, fd: int, size: int) -> None:
        arg = _abi.NpuBoCreate(size=size)
        ioctl(fd, _abi.DRM_IOCTL_NPU_BO_CREATE, arg)
        self.handle, self.size, self.va = int(arg.handle), size, int(arg.va)
        self.map = mmap.mmap(fd, size, mmap.MAP_SHARED, RW, offset=arg.mmap_offset)


def syncobj(fd: int, signaled: bool = False) -> int:
    arg = _abi.DrmSyncobjCreate(flags=_abi.DRM_SYNCOBJ_CREATE_SIGNALED if signaled else 0)
    ioctl(fd, _abi.DRM_IOCTL_SYNCOBJ_CREATE, arg)
    return int(arg.handle)


def submit(
    fd: int,
    op_list: list,
    deps: list[tuple[int, int, int]] = (),  # (handle, flags, point)
    out: int = 0,
    out_point: int = 0,
) -> int:
    raw = (_abi.NpuOp * len(op_list))(*(op.pack() for op in op_list))
    syncs = (_abi.NpuSync * max(len(deps), 1))(*(_abi.NpuSync(*d) for d in deps))
    arg = _abi.NpuSubmit(
        ops_ptr=ctypes.addressof(raw),
        num_ops=len(op_list),
        op_size=ctypes.sizeof(_abi.NpuOp),
        in_syncs=ctypes.addressof(syncs) if deps else 0,
        num_in_syncs=len(deps),
        out_syncobj=out,
        out_point=out_point,
    )
    ioctl(fd, _abi.DRM_IOCTL_NPU_SUBMIT, arg)
    return int(arg.fence)


def npu_wait(fd: int, fence: int, timeout_ns: int = WAIT_NS) -> _abi.NpuWait:
    arg = _abi.NpuWait(fence=fence, deadline_ns=_abi.deadline_after(timeout_ns))
    ioctl(fd, _abi.DRM_IOCTL_NPU_WAIT, arg)
    return arg


def syncobj_wait(fd: int, handle: int, point: int = 0, timeout_ns: int = WAIT_NS) -> None:
    handles = (ctypes.c_uint32 * 1)(handle)
    points = (ctypes.c_uint64 * 1)(point)
    arg = _abi.DrmSyncobjTimelineWait(
        handles=ctypes.addressof(handles),
        points=ctypes.addressof(points),
        timeout_nsec=_abi.deadline_after(timeout_ns),
        count_handles=1,
        flags=_abi.DRM_SYNCOBJ_WAIT_FLAGS_WAIT_ALL,
    )
    ioctl(fd, _abi.DRM_IOCTL_SYNCOBJ_TIMELINE_WAIT, arg)


def syncobj_query(fd: int, handle: int) -> int:
    handles = (ctypes.c_uint32 * 1)(handle)
    points = (ctypes.c_uint64 * 1)(0)
    arg = _abi.DrmSyncobjTimelineArray(
        handles=ctypes.addressof(handles), points=ctypes.addressof(points), count_handles=1
    )
    ioctl(fd, _abi.DRM_IOCTL_SYNCOBJ_QUERY, arg)
    return int(points[0])


def export_sync_file(fd: int, handle: int) -> int:
    arg = _abi.DrmSyncobjHandle(
        handle=handle, flags=_abi.DRM_SYNCOBJ_HANDLE_TO_FD_FLAGS_EXPORT_SYNC_FILE, fd=-1
    )
    ioctl(fd, _abi.DRM_IOCTL_SYNCOBJ_HANDLE_TO_FD, arg)
    return int(arg.fd)


def import_sync_file(fd: int, handle: int, sync_file: int) -> None:
    arg = _abi.DrmSyncobjHandle(
        handle=handle, flags=_abi.DRM_SYNCOBJ_FD_TO_HANDLE_FLAGS_IMPORT_SYNC_FILE, fd=sync_file
    )
    ioctl(fd, _abi.DRM_IOCTL_SYNCOBJ_FD_TO_HANDLE, arg)


def sync_file_status(sync_file: int) -> int:
    """1 signalled, 0 active, a negative errno: signalled with that error."""
    info = bytearray(56)
    fcntl.ioctl(sync_file, SYNC_IOC_FILE_INFO, info, True)
    return int(struct.unpack_from("<i", info, 32)[0])


class SwTimeline:
    """A sw_sync timeline: fences at values the test signals with inc()."""

    def __init__(self) -> None:
        if not os.path.exists(SW_SYNC):
            pytest.skip("no sw_sync (CONFIG_SW_SYNC; the debug kernel has it)")
        self.fd = os.open(SW_SYNC, os.O_RDWR)

    def fence(self, value: int) -> int:
        data = bytearray(struct.pack("<I32si", value, b"npu-test", -1))
        fcntl.ioctl(self.fd, SW_SYNC_IOC_CREATE_FENCE, data, True)
        return int(struct.unpack_from("<i", data, 36)[0])

    def inc(self, by: int = 1) -> None:
        fcntl.ioctl(self.fd, SW_SYNC_IOC_INC, struct.pack("<I", by))

    def close(self) -> None:
        os.close(self.fd)


@pytest.fixture
def timeline() -> Iterator[SwTimeline]:
    t = SwTimeline()
    yield t
    t.close()


def foreign_dep(fd: int, timeline: SwTimeline, value: int = 1) -> int:
    """A binary syncobj holding an unsignalled sw_sync fence at ``value``."""
    handle = syncobj(fd)
    f = timeline.fence(value)
    try:
        import_sync_file(fd, handle, f)
    finally:
        os.close(f)
    return handle


def filled(fd: int, size: int, byte: int) -> Bo:
    bo = Bo(fd, size)
    bo.map[:] = bytes([byte]) * size
    return bo


# --------------------------------------------------------------------------
# The job's fence in an out syncobj
# --------------------------------------------------------------------------


def test_a_binary_out_syncobj_signals_once_the_job_is_done(fd):
    dst = filled(fd, 1 << 20, 0)
    out = syncobj(fd)
    submit(fd, [ops.fill(dst, 0x5A5A5A5A, 1 << 20)], out=out)
    syncobj_wait(fd, out)
    assert dst.map[:] == b"\x5a" * (1 << 20)


def test_a_timeline_out_point_is_reached_after_its_job(fd):
    dst = filled(fd, PAGE, 0)
    out = syncobj(fd)
    for point in (3, 7):
        submit(fd, [ops.fill(dst, point, PAGE)], out=out, out_point=point)
    syncobj_wait(fd, out, 7)
    assert syncobj_query(fd, out) == 7
    assert dst.map[:4] == struct.pack("<I", 7)


def test_the_out_fence_exports_as_a_sync_file_that_polls_readable_when_done(fd):
    dst = filled(fd, 4 << 20, 0)
    out = syncobj(fd)
    fence = submit(fd, [ops.fill(dst, 1, 4 << 20)], out=out)
    sync_file = export_sync_file(fd, out)
    try:
        p = select.poll()
        p.register(sync_file, select.POLLIN)
        assert p.poll(30_000), "the sync_file never became readable"
        assert sync_file_status(sync_file) == 1
        npu_wait(fd, fence, 0)  # done when the fence is
    finally:
        os.close(sync_file)


def test_a_failed_op_signals_the_fence_with_an_error(fd):
    src = filled(fd, PAGE, 1)
    out = syncobj(fd)
    # The driver lets no bad op through: the device's fault injection fails it.
    with open("/sys/kernel/debug/npu/npu0/inject", "w") as f:
        f.write("hw_error")
    fence = submit(fd, [ops.fill(src, 2, PAGE)], out=out)
    with pytest.raises(OSError) as info:
        npu_wait(fd, fence)
    assert info.value.errno == errno.EIO
    sync_file = export_sync_file(fd, out)
    try:
        assert sync_file_status(sync_file) == -errno.EIO
    finally:
        os.close(sync_file)


FAILURE_ROUNDS = 50


def test_every_failed_op_reaches_its_wait_even_when_another_cpu_retires_it(fd):
    """The IRQ thread on one CPU takes the failed job off the queue (its
    fence is done) while this WAIT, on the other, sees the fence done: the
    WAIT must still report the failure, not 0 (with two vCPUs the old
    driver lost it about one round in three)."""
    src = filled(fd, PAGE, 1)
    lost = 0
    for _ in range(FAILURE_ROUNDS):
        with open("/sys/kernel/debug/npu/npu0/inject", "w") as f:
            f.write("hw_error")
        fence = submit(fd, [ops.fill(src, 2, PAGE)])
        try:
            npu_wait(fd, fence)
            lost += 1
        except OSError as exc:
            assert exc.errno == errno.EIO
    assert lost == 0, f"{lost} of {FAILURE_ROUNDS} failed ops completed without an error"


# --------------------------------------------------------------------------
# Dependencies
# --------------------------------------------------------------------------


def test_a_job_does_not_start_before_its_foreign_dependency_signals(fd, timeline):
    size = 1 << 20
    src, dst = filled(fd, size, 1), filled(fd, size, 0)
    dep = foreign_dep(fd, timeline)
    fence = submit(fd, [ops.copy(src, dst, size)], deps=[(dep, 0, 0)])
    time.sleep(0.3)
    assert errno_of(lambda: npu_wait(fd, fence, 0)) == errno.ETIMEDOUT
    assert dst.map[:] == bytes(size), "the copy ran before its dependency"
    src.map[:] = b"\x07" * size  # what the copy must see: it starts after this
    timeline.inc()
    npu_wait(fd, fence)
    assert dst.map[:] == b"\x07" * size


def test_submit_does_not_block_on_an_unmet_dependency(fd, timeline):
    dst = filled(fd, PAGE, 0)
    dep = foreign_dep(fd, timeline)
    t0 = time.monotonic()
    fence = submit(fd, [ops.fill(dst, 3, PAGE)], deps=[(dep, 0, 0)])
    assert time.monotonic() - t0 < 5.0
    timeline.inc()
    npu_wait(fd, fence)


def test_a_job_waits_for_every_one_of_its_dependencies(fd, timeline):
    dst = filled(fd, PAGE, 0)
    deps = [foreign_dep(fd, timeline, v) for v in (1, 2, 3)]
    fence = submit(fd, [ops.fill(dst, 9, PAGE)], deps=[(d, 0, 0) for d in deps])
    timeline.inc(2)
    time.sleep(0.2)
    assert errno_of(lambda: npu_wait(fd, fence, 0)) == errno.ETIMEDOUT
    timeline.inc()
    npu_wait(fd, fence)
    assert dst.map[:4] == struct.pack("<I", 9)


def test_a_signalled_dependency_takes_no_fence_value(fd):
    dst = filled(fd, PAGE, 0)
    first = submit(fd, [ops.fill(dst, 1, PAGE)])
    npu_wait(fd, first)
    ready = syncobj(fd, signaled=True)
    fence = submit(fd, [ops.fill(dst, 2, PAGE)], deps=[(ready, 0, 0)])
    assert fence == first + 1


def test_a_dependency_on_queue_0s_own_fence_needs_no_wait(fd):
    a, b = filled(fd, 4 << 20, 0), filled(fd, 4 << 20, 0)
    out = syncobj(fd)
    first = submit(fd, [ops.fill(a, 0x01010101, 4 << 20)], out=out)
    fence = submit(fd, [ops.copy(a, b, 4 << 20)], deps=[(out, 0, 0)])
    assert fence == first + 1  # the queue runs in order: no WAIT descriptor
    npu_wait(fd, fence)
    assert b.map[:] == b"\x01" * (4 << 20)


def test_a_job_can_wait_for_a_user_queue_fence_value(fd):
    size = PAGE
    flag, x, y = filled(fd, PAGE, 0), filled(fd, size, 0), filled(fd, size, 0)
    q = RawQueue(fd)
    try:
        # The user queue: WAIT until the CPU raises the flag, then FILL x (fence 2).
        q.push(cmd(_abi.NPU_OP_WAIT, flag.va, 1))
        q.push(cmd(_abi.NPU_OP_FILL, x.va, size, 0x3C3C3C3C))
        q.kick()
        fence = submit(fd, [ops.copy(x, y, size)], deps=[(q.index, _abi.NPU_SYNC_USER_QUEUE, 2)])
        time.sleep(0.3)
        assert errno_of(lambda: npu_wait(fd, fence, 0)) == errno.ETIMEDOUT
        assert y.map[:] == bytes(size)
        flag.map[:8] = struct.pack("<Q", 1)
        npu_wait(fd, fence)
        assert y.map[:] == b"\x3c" * size
    finally:
        q.close()


def test_a_user_queue_value_already_reached_takes_no_fence_value(fd):
    dst = filled(fd, PAGE, 0)
    q = RawQueue(fd)
    try:
        q.push(cmd(_abi.NPU_OP_NOP))
        q.kick()
        deadline = time.monotonic() + 10
        while q.fence_record()[0] < 1:
            assert time.monotonic() < deadline
            time.sleep(0.001)
        first = submit(fd, [ops.fill(dst, 1, PAGE)])
        fence = submit(fd, [ops.fill(dst, 2, PAGE)], deps=[(q.index, _abi.NPU_SYNC_USER_QUEUE, 1)])
        assert fence == first + 1
    finally:
        q.close()


# --------------------------------------------------------------------------
# Bad arguments: exact errnos, nothing queued
# --------------------------------------------------------------------------


def next_fence(fd: int, dst: Bo) -> int:
    return submit(fd, [ops.fill(dst, 0, PAGE)])


@pytest.mark.parametrize(
    ("case", "expected"),
    [
        ("unknown_syncobj", errno.ENOENT),
        ("syncobj_without_fence", errno.EINVAL),
        ("timeline_point_not_there", errno.EINVAL),
        ("unknown_sync_flag", errno.EINVAL),
        ("too_many_syncs", errno.EINVAL),
        ("bad_syncs_pointer", errno.EFAULT),
        ("unknown_out_syncobj", errno.ENOENT),
        ("out_point_without_syncobj", errno.EINVAL),
        ("user_queue_not_held", errno.ENOENT),
        ("queue_0_as_user_queue", errno.ENOENT),
    ],
)
def test_a_bad_dependency_fails_the_submit_and_queues_nothing(fd, case, expected):
    dst = filled(fd, PAGE, 0)
    before = next_fence(fd, dst)
    raw = (_abi.NpuOp * 1)(ops.fill(dst, 1, PAGE).pack())
    arg = _abi.NpuSubmit(
        ops_ptr=ctypes.addressof(raw), num_ops=1, op_size=ctypes.sizeof(_abi.NpuOp)
    )
    syncs = (_abi.NpuSync * (_abi.NPU_SUBMIT_MAX_SYNCS + 1))()
    arg.in_syncs, arg.num_in_syncs = ctypes.addressof(syncs), 1
    if case == "unknown_syncobj":
        syncs[0].handle = 0x7FFF
    elif case == "syncobj_without_fence":
        syncs[0].handle = syncobj(fd)
    elif case == "timeline_point_not_there":
        syncs[0].handle, syncs[0].point = syncobj(fd, signaled=True), 5
    elif case == "unknown_sync_flag":
        syncs[0].handle, syncs[0].flags = syncobj(fd, signaled=True), 1 << 1
    elif case == "too_many_syncs":
        arg.num_in_syncs = _abi.NPU_SUBMIT_MAX_SYNCS + 1
    elif case == "bad_syncs_pointer":
        arg.in_syncs = 8
    elif case == "unknown_out_syncobj":
        arg.num_in_syncs, arg.out_syncobj = 0, 0x7FFF
    elif case == "out_point_without_syncobj":
        arg.num_in_syncs, arg.out_point = 0, 3
    elif case == "user_queue_not_held":
        syncs[0].handle, syncs[0].flags = 1, _abi.NPU_SYNC_USER_QUEUE
    elif case == "queue_0_as_user_queue":
        syncs[0].handle, syncs[0].flags = 0, _abi.NPU_SYNC_USER_QUEUE
    assert errno_of(lambda: ioctl(fd, _abi.DRM_IOCTL_NPU_SUBMIT, arg)) == expected
    assert next_fence(fd, dst) == before + 1


def test_another_files_user_queue_is_not_a_dependency(fd, dev_path):
    other = os.open(dev_path, os.O_RDWR)
    q = RawQueue(other)
    try:
        dst = filled(fd, PAGE, 0)
        assert (
            errno_of(lambda: submit(fd, [ops.fill(dst, 1, PAGE)], deps=[(q.index, 1, 1)]))
            == errno.ENOENT
        )
    finally:
        q.close()
        os.close(other)


# --------------------------------------------------------------------------
# Dependencies that never come, files that go
# --------------------------------------------------------------------------


@pytest.fixture
def short_hang_timeout() -> Iterator[None]:
    with open(HANG_TIMEOUT) as f:
        old = f.read().strip()
    with open(HANG_TIMEOUT, "w") as f:
        f.write("500")
    yield
    with open(HANG_TIMEOUT, "w") as f:
        f.write(old)


def test_an_unmet_dependency_times_out_the_job_and_not_the_others(
    fd, dev_path, timeline, short_hang_timeout
):
    dst = filled(fd, PAGE, 0)
    dep = foreign_dep(fd, timeline)
    out = syncobj(fd)
    fence = submit(fd, [ops.fill(dst, 1, PAGE)], deps=[(dep, 0, 0)], out=out)
    other = os.open(dev_path, os.O_RDWR)
    try:
        odst = filled(other, PAGE, 0)
        ofence = submit(other, [ops.fill(odst, 0x11111111, PAGE)])
        with pytest.raises(OSError) as info:
            npu_wait(fd, fence)
        assert info.value.errno == errno.EIO
        npu_wait(other, ofence)  # replayed after the reset, not failed
        assert odst.map[:4] == b"\x11" * 4
        sync_file = export_sync_file(fd, out)
        try:
            assert sync_file_status(sync_file) == -errno.ETIME
        finally:
            os.close(sync_file)
        assert dst.map[:4] == bytes(4), "the job whose dependency never came ran"
    finally:
        os.close(other)
        timeline.inc()


def test_a_file_closed_while_its_job_waits_leaves_nothing_behind(dev_path, timeline):
    with open("/sys/class/accel/accel0/device/npu/bo_count") as f:
        base = int(f.read())
    f = os.open(dev_path, os.O_RDWR)
    dst = filled(f, PAGE, 0)
    dep = foreign_dep(f, timeline)
    submit(f, [ops.fill(dst, 1, PAGE)], deps=[(dep, 0, 0)])
    del dst
    os.close(f)
    timeline.inc()
    deadline = time.monotonic() + 10
    while True:
        with open("/sys/class/accel/accel0/device/npu/bo_count") as bc:
            if int(bc.read()) == base:
                break
        assert time.monotonic() < deadline, "the closed file's BO was not freed"
        time.sleep(0.01)


def test_dependencies_mixed_with_plain_jobs_keep_every_result(fd, timeline):
    rng = np.random.default_rng(3)
    bos = [filled(fd, PAGE, 0) for _ in range(8)]
    fences, want = [], []
    deps = []
    for i, bo in enumerate(bos):
        value = int(rng.integers(1, 2**31))
        d = [(foreign_dep(fd, timeline, len(deps) + 1), 0, 0)] if i % 2 else []
        deps += d
        fences.append(submit(fd, [ops.fill(bo, value, PAGE)], deps=d))
        want.append(value)
    timeline.inc(len(deps))
    for fence in fences:
        npu_wait(fd, fence)
    for bo, value in zip(bos, want, strict=True):
        assert np.frombuffer(bo.map, np.uint32)[0] == value
    with contextlib.suppress(OSError):
        npu_wait(fd, fences[-1], 0)
