"""What backends report: plain values, independent of any driver ABI."""

from __future__ import annotations

import errno
import os
from dataclasses import dataclass

__all__ = ["BoInfo", "FenceTimes", "HalInfo", "QueueInfo", "WaitFailed"]


@dataclass(frozen=True, slots=True)
class HalInfo:
    """A device's properties (the driver's GET_INFO, or the CPU backend's own)."""

    hw_version: int
    abi_version: int
    driver_version: int
    caps: int  # NPU_INFO_CAP_* bits
    num_queues: int
    num_cores: int
    max_submit: int
    ring_entries: int
    max_bo_size: int
    pci_vendor: int
    pci_device: int
    user_queues: int = 0
    device_memory: int = 0


@dataclass(frozen=True, slots=True)
class BoInfo:
    """A buffer object: its handle, where to map it, its size and device VA.

    ``flags`` are ``NPU_BO_INFO_*`` bits (device memory, user pointer,
    imported dma-buf, read-only); only :meth:`npu.hal.Backend.bo_info` and
    :meth:`~npu.hal.Backend.dmabuf_import` report them (0 otherwise).
    """

    handle: int
    mmap_offset: int
    alloc_size: int
    va: int
    flags: int = 0


@dataclass(frozen=True, slots=True)
class FenceTimes:
    """A completed fence's status and device timestamps (ns)."""

    status: int
    t_start: int
    t_end: int


@dataclass(frozen=True, slots=True)
class QueueInfo:
    """A user-mode queue lent by the backend: its index and mapping offsets."""

    index: int
    mem_offset: int
    mem_size: int
    cpl_offset: int
    fence_offset: int
    doorbell_offset: int


class WaitFailed(OSError):
    """A wait ended because the device failed an op (``EIO``) or stopped the queue (``EBADFD``).

    ``status`` is the device status of the failed op, ``error_fence`` its fence.
    """

    def __init__(self, code: int, status: int, error_fence: int) -> None:
        super().__init__(code, os.strerror(code))
        self.status = status
        self.error_fence = error_fence

    @classmethod
    def device_error(cls, status: int, error_fence: int) -> WaitFailed:
        """The ``EIO`` form: an op up to the waited fence failed."""
        return cls(errno.EIO, status, error_fence)
