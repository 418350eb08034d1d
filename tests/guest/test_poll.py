"""poll() on the device file: readable once everything the file submitted
has completed (its SUBMITs and its user queues), so an event loop can wait
for the device without a thread blocked in WAIT."""

from __future__ import annotations

import ctypes
import fcntl
import os
import select
import time

from npu import _abi

DEV_PATH = "/dev/npu0"
MiB = 1 << 20


def fill_submit(fd: int, size: int, count: int) -> int:
    """Queue count FILLs of a new size-byte BO; returns the last fence."""
    bo = _abi.NpuBoCreate(size=size)
    fcntl.ioctl(fd, _abi.DRM_IOCTL_NPU_BO_CREATE, bo, True)
    op = _abi.NpuOp(opcode=_abi.NPU_OP_FILL, num_bufs=1)
    op.bufs[0] = _abi.NpuBufRef(handle=bo.handle, offset=0, size=size)
    op.params[0] = 0x5A5A5A5A
    ops = (_abi.NpuOp * count)(*([op] * count))
    sub = _abi.NpuSubmit(ops_ptr=ctypes.addressof(ops), num_ops=count,
                         op_size=ctypes.sizeof(_abi.NpuOp))  # fmt: skip
    fcntl.ioctl(fd, _abi.DRM_IOCTL_NPU_SUBMIT, sub, True)
    return int(sub.fence)


def poll_mask(fd: int, timeout_ms: int) -> int:
    p = select.poll()
    p.register(fd, select.POLLIN | select.POLLERR)
    events = p.poll(timeout_ms)
    return events[0][1] if events else 0


def test_a_file_with_nothing_submitted_polls_readable_at_once(fd):
    assert poll_mask(fd, 0) & select.POLLIN


def test_poll_waits_for_the_files_work_then_reports_readable(fd):
    fence = fill_submit(fd, 64 * MiB, 8)  # hundreds of ms under TCG
    assert poll_mask(fd, 0) == 0, "readable while 512 MiB of FILL is in flight"
    t0 = time.monotonic()
    assert poll_mask(fd, 60_000) & select.POLLIN
    assert time.monotonic() - t0 < 60
    fcntl.ioctl(
        fd,
        _abi.DRM_IOCTL_NPU_WAIT,
        _abi.NpuWait(fence=fence, deadline_ns=_abi.deadline_after(0)),
        True,
    )


def test_another_files_work_does_not_make_a_file_unreadable(fd):
    other = os.open(DEV_PATH, os.O_RDWR)
    try:
        fill_submit(other, 64 * MiB, 4)
        assert poll_mask(fd, 0) & select.POLLIN
    finally:
        os.close(other)


def test_poll_is_not_an_error_for_a_healthy_file(fd):
    assert not poll_mask(fd, 0) & select.POLLERR


def test_an_epoll_watch_outlives_a_destroyed_user_queue(fd):
    # poll() used to wait on the user queue's own wait queue, which
    # QUEUE_DESTROY frees: closing the epoll afterwards then unlinked its
    # entry from freed memory (a KASAN report on the debug kernel). It now
    # waits on the file's own wait queue.
    arg = _abi.NpuQueueCreate(entries=16, priority=0)
    fcntl.ioctl(fd, _abi.DRM_IOCTL_NPU_QUEUE_CREATE, arg, True)
    ep = select.epoll()
    ep.register(fd, select.EPOLLIN)
    destroy = _abi.NpuQueueDestroy(queue=arg.queue)
    fcntl.ioctl(fd, _abi.DRM_IOCTL_NPU_QUEUE_DESTROY, destroy, True)
    assert ep.poll(0) == [(fd, select.EPOLLIN)]
    ep.close()
    assert poll_mask(fd, 0) & select.POLLIN
