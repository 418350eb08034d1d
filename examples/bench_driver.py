#!/usr/bin/env python3
"""DRM driver benchmarks, run inside the guest (``make bench`` runs it).

- ``dmabuf_import_copy_gbps``: a 64 MiB udmabuf (a sealed memfd) imported
  with PRIME, one device COPY from a host BO into it (SUBMIT + WAIT),
  median of 5 after a warm-up; the bytes are checked through the memfd.
- ``runtime_resume_ms``: with ``power/autosuspend_delay_ms`` at 50 ms, a
  FILL submitted on the suspended device until its WAIT returns (resume,
  firmware boot, the op), median of 5; ``runtime_resume_driver_ms`` is the
  driver's own figure for the resume (sysfs ``npu/last_resume_us``), and
  ``awake_submit_ms`` the same FILL on an awake device for comparison.

The last line of stdout is one JSON object (docs/benchmarks.md)::

    python3 examples/bench_driver.py
"""

from __future__ import annotations

import ctypes
import fcntl
import json
import mmap
import os
import statistics
import struct
import sys
import time

import numpy as np

from npu import _abi

COPY_BYTES = 64 << 20
RUNS = 5
DEV_PATH = "/dev/npu0"
POWER = "/sys/class/accel/accel0/device/power"
SYSFS = "/sys/class/accel/accel0/device/npu"
UDMABUF_CREATE = (1 << 30) | (24 << 16) | (ord("u") << 8) | 0x42
F_ADD_SEALS, F_SEAL_SHRINK = 1033, 0x0002


def ioctl(fd: int, request: int, arg: ctypes.Structure) -> None:
    fcntl.ioctl(fd, request, arg, True)


def run(fd: int, op: _abi.NpuOp) -> None:
    ops = (_abi.NpuOp * 1)(op)
    sub = _abi.NpuSubmit(
        ops_ptr=ctypes.addressof(ops), num_ops=1, op_size=ctypes.sizeof(_abi.NpuOp)
    )
    ioctl(fd, _abi.DRM_IOCTL_NPU_SUBMIT, sub)
    wait = _abi.NpuWait(fence=sub.fence, deadline_ns=_abi.deadline_after(60 * 10**9))
    ioctl(fd, _abi.DRM_IOCTL_NPU_WAIT, wait)


def copy_op(src: int, dst: int, size: int) -> _abi.NpuOp:
    op = _abi.NpuOp(opcode=_abi.NPU_OP_COPY, num_bufs=2)
    op.bufs[0] = _abi.NpuBufRef(handle=src, size=size)
    op.bufs[1] = _abi.NpuBufRef(handle=dst, size=size)
    return op


def fill_op(dst: int, size: int, pattern: int) -> _abi.NpuOp:
    op = _abi.NpuOp(opcode=_abi.NPU_OP_FILL, num_bufs=1)
    op.bufs[0] = _abi.NpuBufRef(handle=dst, size=size)
    op.params[0] = pattern
    return op


def timed(fn) -> float:  # type: ignore[no-untyped-def]
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def dmabuf_import_copy_gbps(fd: int) -> float:
    memfd = os.memfd_create("bench-udmabuf", os.MFD_ALLOW_SEALING)
    os.ftruncate(memfd, COPY_BYTES)
    fcntl.fcntl(memfd, F_ADD_SEALS, F_SEAL_SHRINK)
    dev = os.open("/dev/udmabuf", os.O_RDWR)
    arg = bytearray(struct.pack("=IIQQ", memfd, 1, 0, COPY_BYTES))
    dmabuf = fcntl.ioctl(dev, UDMABUF_CREATE, arg)
    os.close(dev)
    prime = _abi.DrmPrimeHandle(fd=dmabuf)
    ioctl(fd, _abi.DRM_IOCTL_PRIME_FD_TO_HANDLE, prime)
    src = _abi.NpuBoCreate(size=COPY_BYTES)
    ioctl(fd, _abi.DRM_IOCTL_NPU_BO_CREATE, src)
    with mmap.mmap(fd, COPY_BYTES, mmap.MAP_SHARED, mmap.PROT_WRITE, offset=src.mmap_offset) as m:
        data = np.random.default_rng(0).integers(0, 256, COPY_BYTES, dtype=np.uint8)
        m[:] = data.tobytes()
    op = copy_op(src.handle, prime.handle, COPY_BYTES)
    run(fd, op)  # warm-up
    seconds = statistics.median(timed(lambda: run(fd, op)) for _ in range(RUNS))
    if os.pread(memfd, COPY_BYTES, 0) != data.tobytes():
        raise SystemExit("bench_driver: the udmabuf did not get the copy")
    os.close(dmabuf)
    os.close(memfd)
    return COPY_BYTES / seconds / 1e9


def read(path: str) -> str:
    with open(path) as f:
        return f.read().strip()


def write(path: str, value: str) -> None:
    with open(path, "w") as f:
        f.write(value)


def resume_figures(fd: int) -> dict[str, float]:
    dst = _abi.NpuBoCreate(size=4096)
    ioctl(fd, _abi.DRM_IOCTL_NPU_BO_CREATE, dst)
    op = fill_op(dst.handle, 4096, 1)
    old_delay, old_control = read(f"{POWER}/autosuspend_delay_ms"), read(f"{POWER}/control")
    write(f"{POWER}/control", "auto")
    write(f"{POWER}/autosuspend_delay_ms", "50")
    try:
        cold, driver = [], []
        for _ in range(RUNS):
            deadline = time.monotonic() + 10
            while read(f"{POWER}/runtime_status") != "suspended":
                if time.monotonic() > deadline:
                    raise SystemExit("bench_driver: the device never suspended")
                time.sleep(0.01)
            cold.append(timed(lambda: run(fd, op)))
            driver.append(int(read(f"{SYSFS}/last_resume_us")) / 1000)
        run(fd, op)
        warm = statistics.median(timed(lambda: run(fd, op)) for _ in range(RUNS))
    finally:
        write(f"{POWER}/autosuspend_delay_ms", old_delay)
        write(f"{POWER}/control", old_control)
    return {
        "runtime_resume_ms": statistics.median(cold) * 1000,
        "runtime_resume_driver_ms": statistics.median(driver),
        "awake_submit_ms": warm * 1000,
    }


def main() -> int:
    fd = os.open(DEV_PATH, os.O_RDWR)
    res = {"dmabuf_import_copy_gbps": dmabuf_import_copy_gbps(fd)}
    res.update(resume_figures(fd))
    os.close(fd)
    print(json.dumps({k: round(v, 3) for k, v in res.items()}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
