"""The driver backend: one open ``/dev/npuN`` (the DRM accel device
``/dev/accel/accelN``), driven by ioctl and mmap.

Each method packs the ``include/npu_uapi.h`` structure of its ioctl, issues
it and returns plain values; an ``OSError`` from the kernel propagates with
its errno. This module is the only one that knows the driver's ABI.
"""

from __future__ import annotations

import ctypes
import dataclasses
import errno
import fcntl
import mmap
import os
from typing import Any

from .. import _abi
from .types import BoInfo, FenceTimes, HalInfo, QueueInfo, WaitFailed

__all__ = ["DriverBackend"]


class DriverBackend:
    """The kernel driver's device node ``path`` (opened read-write, close-on-exec)."""

    kind = "driver"

    def __init__(self, path: str) -> None:
        self.path = path
        self._fd = os.open(path, os.O_RDWR | os.O_CLOEXEC)

    def __repr__(self) -> str:
        return f"<npu.hal.DriverBackend {self.path} fd={self._fd}>"

    def fileno(self) -> int:
        if self._fd < 0:
            raise OSError(errno.EBADF, f"{self.path} is closed")
        return self._fd

    def close(self) -> None:
        fd, self._fd = self._fd, -1
        if fd >= 0:
            os.close(fd)

    def _ioctl(self, request: int, arg: ctypes.Structure) -> None:
        fcntl.ioctl(self.fileno(), request, arg, True)

    def query(self) -> HalInfo:
        raw = _abi.NpuInfo()
        self._ioctl(_abi.DRM_IOCTL_NPU_GET_INFO, raw)
        return HalInfo(**{f.name: int(getattr(raw, f.name)) for f in dataclasses.fields(HalInfo)})

    def bo_create(self, size: int, flags: int) -> BoInfo:
        arg = _abi.NpuBoCreate(size=size, flags=flags)
        self._ioctl(_abi.DRM_IOCTL_NPU_BO_CREATE, arg)
        return BoInfo(int(arg.handle), int(arg.mmap_offset), int(arg.alloc_size), int(arg.va))

    def bo_userptr(self, addr: int, size: int, flags: int) -> BoInfo:
        arg = _abi.NpuBoUserptr(addr=addr, size=size, flags=flags, handle=0)
        self._ioctl(_abi.DRM_IOCTL_NPU_BO_USERPTR, arg)
        return BoInfo(int(arg.handle), 0, size, int(arg.va))

    def bo_destroy(self, handle: int) -> None:
        self._ioctl(_abi.DRM_IOCTL_NPU_BO_DESTROY, _abi.NpuBoDestroy(handle=handle, rsvd=0))

    def bo_info(self, handle: int) -> BoInfo:
        arg = _abi.NpuBoInfo(handle=handle)
        self._ioctl(_abi.DRM_IOCTL_NPU_BO_INFO, arg)
        return BoInfo(
            handle=handle,
            mmap_offset=int(arg.mmap_offset),
            alloc_size=int(arg.size),
            va=int(arg.va),
            flags=int(arg.flags),
        )

    def dmabuf_export(self, handle: int) -> int:
        arg = _abi.DrmPrimeHandle(handle=handle, flags=_abi.DRM_CLOEXEC | _abi.DRM_RDWR, fd=-1)
        self._ioctl(_abi.DRM_IOCTL_PRIME_HANDLE_TO_FD, arg)
        return int(arg.fd)

    def dmabuf_import(self, fd: int) -> BoInfo:
        arg = _abi.DrmPrimeHandle(handle=0, flags=0, fd=fd)
        self._ioctl(_abi.DRM_IOCTL_PRIME_FD_TO_HANDLE, arg)
        # The handle is not closed should BO_INFO fail: it may be one this
        # file already had (its own export, an earlier import). The file's
        # close releases it.
        return self.bo_info(int(arg.handle))

    def map(self, offset: int, length: int, prot: int) -> mmap.mmap:
        return mmap.mmap(self.fileno(), length, flags=mmap.MAP_SHARED, prot=prot, offset=offset)

    def submit(self, ops: ctypes.Array[Any], op_size: int, queue: int) -> int:
        arg = _abi.NpuSubmit(
            ops_ptr=ctypes.addressof(ops), num_ops=len(ops), queue=queue, flags=0, op_size=op_size
        )
        self._ioctl(_abi.DRM_IOCTL_NPU_SUBMIT, arg)
        return int(arg.fence)

    def wait(self, fence: int, timeout_ns: int, queue: int) -> None:
        # The driver takes an absolute deadline, so a WAIT the kernel
        # restarts after a signal keeps its end.
        arg = _abi.NpuWait(fence=fence, deadline_ns=_abi.deadline_after(timeout_ns), queue=queue)
        try:
            self._ioctl(_abi.DRM_IOCTL_NPU_WAIT, arg)
        except OSError as exc:
            if exc.errno in (errno.EIO, errno.EBADFD):
                raise WaitFailed(exc.errno, int(arg.status), int(arg.error_fence)) from exc
            raise

    def fence_info(self, fence: int, queue: int) -> FenceTimes:
        arg = _abi.NpuFenceInfo(fence=fence, queue=queue)
        self._ioctl(_abi.DRM_IOCTL_NPU_FENCE_INFO, arg)
        return FenceTimes(int(arg.status), int(arg.t_start), int(arg.t_end))

    def queue_create(self, entries: int, priority: int) -> QueueInfo:
        arg = _abi.NpuQueueCreate(entries=entries, priority=priority)
        self._ioctl(_abi.DRM_IOCTL_NPU_QUEUE_CREATE, arg)
        return QueueInfo(
            index=int(arg.queue),
            mem_offset=int(arg.mem_offset),
            mem_size=int(arg.mem_size),
            cpl_offset=int(arg.cpl_offset),
            fence_offset=int(arg.fence_offset),
            doorbell_offset=int(arg.doorbell_offset),
        )

    def queue_destroy(self, index: int) -> None:
        self._ioctl(_abi.DRM_IOCTL_NPU_QUEUE_DESTROY, _abi.NpuQueueDestroy(queue=index, rsvd=0))
