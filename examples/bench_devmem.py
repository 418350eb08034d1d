#!/usr/bin/env python3
"""Device-memory copy benchmark, run inside the guest (``make bench`` runs it).

Copies of 64 MiB with the device's DMA engine (SUBMIT COPY + WAIT, median
of 5 after a warm-up) between host-memory BOs (scatter-gather pages) and
device-memory BOs (``NPU_BO_DEVICE``, BAR2): host to device, device to
host, device to device, and for comparison host to host; plus the CPU
writing and reading device memory through its BAR mapping. Every copy is
checked. The last line of stdout is one JSON object (docs/benchmarks.md)::

    python3 examples/bench_devmem.py
"""

from __future__ import annotations

import ctypes
import fcntl
import json
import mmap
import os
import statistics
import sys
import time
from collections.abc import Callable

import numpy as np

from npu import _abi

COPY_BYTES = 64 << 20
RUNS = 5
DEV_PATH = "/dev/npu0"


class Bo:
    """A buffer object of the file, mapped."""

    def __init__(self, fd: int, size: int, device: bool) -> None:
        arg = _abi.NpuBoCreate(size=size, flags=_abi.NPU_BO_DEVICE if device else 0)
        fcntl.ioctl(fd, _abi.DRM_IOCTL_NPU_BO_CREATE, arg, True)
        self.handle = arg.handle
        self.map = mmap.mmap(fd, size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE,
                             offset=arg.mmap_offset)  # fmt: skip
        self.array = np.frombuffer(self.map, np.uint8)


def copy_s(fd: int, src: Bo, dst: Bo) -> float:
    """Seconds of one COPY of COPY_BYTES, submit to completion."""
    op = _abi.NpuOp(opcode=_abi.NPU_OP_COPY, num_bufs=2)
    op.bufs[0] = _abi.NpuBufRef(handle=src.handle, offset=0, size=COPY_BYTES)
    op.bufs[1] = _abi.NpuBufRef(handle=dst.handle, offset=0, size=COPY_BYTES)
    ops = (_abi.NpuOp * 1)(op)
    sub = _abi.NpuSubmit(ops_ptr=ctypes.addressof(ops), num_ops=1,
                         op_size=ctypes.sizeof(_abi.NpuOp))  # fmt: skip
    t0 = time.perf_counter()
    fcntl.ioctl(fd, _abi.DRM_IOCTL_NPU_SUBMIT, sub, True)
    wait = _abi.NpuWait(fence=sub.fence, deadline_ns=_abi.deadline_after(60 * 10**9))
    fcntl.ioctl(fd, _abi.DRM_IOCTL_NPU_WAIT, wait, True)
    return time.perf_counter() - t0


def gbps(fn: Callable[[], float]) -> float:
    fn()  # warm-up
    return COPY_BYTES / statistics.median(fn() for _ in range(RUNS)) / 1e9


def timed(fn: Callable[[], object]) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def main() -> int:
    fd = os.open(DEV_PATH, os.O_RDWR)
    info = _abi.NpuInfo()
    fcntl.ioctl(fd, _abi.DRM_IOCTL_NPU_GET_INFO, info, True)
    if not info.caps & _abi.NPU_INFO_CAP_LOCAL_MEM:
        print(json.dumps({}))
        return 0
    data = np.random.default_rng(0).integers(0, 256, COPY_BYTES, dtype=np.uint8)
    h1, h2 = Bo(fd, COPY_BYTES, False), Bo(fd, COPY_BYTES, False)
    d1, d2 = Bo(fd, COPY_BYTES, True), Bo(fd, COPY_BYTES, True)
    h1.array[:] = data
    res = {
        "devmem_h2d_gbps": gbps(lambda: copy_s(fd, h1, d1)),
        "devmem_d2d_gbps": gbps(lambda: copy_s(fd, d1, d2)),
        "devmem_d2h_gbps": gbps(lambda: copy_s(fd, d2, h2)),
        "hostmem_h2h_gbps": gbps(lambda: copy_s(fd, h1, h2)),
    }
    h2.array[:] = 0
    copy_s(fd, d2, h2)
    if not (np.array_equal(d1.array, data) and np.array_equal(h2.array, data)):
        print("bench_devmem: a copy came back different", file=sys.stderr)
        return 1
    scratch = np.empty_like(data)
    res["devmem_cpu_write_gbps"] = gbps(lambda: timed(lambda: np.copyto(d1.array, data)))
    res["devmem_cpu_read_gbps"] = gbps(lambda: timed(lambda: np.copyto(scratch, d1.array)))
    res["devmem_h2d_vs_hostmem"] = res["devmem_h2d_gbps"] / res["hostmem_h2h_gbps"]
    print(json.dumps({k: round(v, 3) for k, v in res.items()}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
