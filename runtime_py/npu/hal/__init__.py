"""The hardware abstraction layer: backends that run the device's descriptors.

- :class:`Backend`: the protocol every backend implements;
- :class:`DriverBackend`: the kernel driver (``/dev/npuN``, ioctl and mmap);
- :class:`CpuBackend`: the same descriptors run with numpy in this process.

This package imports nothing of the runtime above it but :mod:`npu._abi`.
"""

from .backend import Backend
from .cpu import CPU_CAPS, CpuBackend, HalCall
from .driver import DriverBackend
from .types import BoInfo, FenceTimes, HalInfo, QueueInfo, WaitFailed

__all__ = [
    "CPU_CAPS",
    "Backend",
    "BoInfo",
    "CpuBackend",
    "DriverBackend",
    "FenceTimes",
    "HalCall",
    "HalInfo",
    "QueueInfo",
    "WaitFailed",
]
