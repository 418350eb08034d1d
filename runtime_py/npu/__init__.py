"""Python runtime of the emulated NPU.

Quick start::

    import numpy as np
    import npu

    c = npu.matmul(np.ones((4, 3)), np.ones((3, 5)))   # on the default device

    with npu.open_device(0) as dev, dev.alloc(4096) as buf:
        fence = dev.submit([npu.ops.fill(buf, 0xDEADBEEF, 4096)])
        dev.wait(fence)
        print(hex(buf.numpy(np.uint32)[0]))

Layers: :mod:`npu._abi` (ctypes mirrors of the C headers), :mod:`npu.errors`,
:mod:`npu.device` (discovery, :class:`Device`), :mod:`npu.buffer`
(:class:`Buffer`), :mod:`npu.ops` (op builders) and :mod:`npu.api`
(numpy-level functions). See docs/runtime.md.
"""

from __future__ import annotations

import logging

from . import ops
from ._abi import Cap, DType, Opcode, Status, status_name
from .api import copy_array, fill, matmul
from .buffer import Buffer
from .device import (
    DEFAULT_TIMEOUT_S,
    Device,
    DeviceInfo,
    close_default_device,
    default_device,
    devices,
    open_device,
    set_default_device,
)
from .errors import DeviceNotFoundError, NpuDeviceError, NpuError, NpuTimeoutError
from .ops import BufRef, Op

__version__ = "0.1.0"

__all__ = [
    "DEFAULT_TIMEOUT_S",
    "BufRef",
    "Buffer",
    "Cap",
    "DType",
    "Device",
    "DeviceInfo",
    "DeviceNotFoundError",
    "NpuDeviceError",
    "NpuError",
    "NpuTimeoutError",
    "Op",
    "Opcode",
    "Status",
    "__version__",
    "close_default_device",
    "copy_array",
    "default_device",
    "devices",
    "fill",
    "matmul",
    "open_device",
    "ops",
    "set_default_device",
    "status_name",
]

logging.getLogger(__name__).addHandler(logging.NullHandler())
