#!/usr/bin/env python3
"""Hang detection and recovery benchmark, run inside the guest as root (``make bench`` runs it).

Sets the driver's ``hang_timeout_ms`` to 200 (restored afterwards), then
runs 10 cycles (``BENCH_QUICK=1``: 3). Each cycle opens a fresh file (a file
is banned after three hangs), arms the device's hang injection
(``/sys/kernel/debug/npu/npu0/inject``), submits a NOP and waits: the
watchdog must detect the hang, reset the device and fail the WAIT with
``EIO`` and ``NPU_ST_TIMEOUT``. After each recovery a FILL on the same
device must come out right; the script exits 1 otherwise. The figures come
from the driver's sysfs attributes of the last hang
(``last_hang_detect_ms``, ``last_reset_recovery_us``), read after each
cycle. Progress goes to stderr; the last line of stdout is one JSON object
(keys in docs/benchmarks.md)::

    python3 examples/bench_recovery.py
"""

from __future__ import annotations

import json
import logging
import os
import statistics
import sys
import time
from typing import Any

import numpy as np

import npu
from npu import ops

SYSFS = "/sys/class/accel/accel0/device/npu"
INJECT = "/sys/kernel/debug/npu/npu0/inject"
TIMEOUT_PARAM = "/sys/module/npu/parameters/hang_timeout_ms"
HANG_TIMEOUT_MS = 200
CYCLES = 3 if os.environ.get("BENCH_QUICK") == "1" else 10
ST_TIMEOUT = 12  # NPU_ST_TIMEOUT (include/npu_hw.h)

log = logging.getLogger("bench_recovery")


def read_int(attr: str) -> int:
    with open(f"{SYSFS}/{attr}") as f:
        return int(f.read().split()[0])


def write(path: str, text: str) -> None:
    with open(path, "w") as f:
        f.write(text)


def one_cycle() -> tuple[float, float, float]:
    """Hang one NOP of a fresh file; (detect ms, recovery us, SUBMIT-to-EIO ms)."""
    hangs = read_int("hangs")
    with npu.open_device(0) as dev:
        write(INJECT, "hang")
        t0 = time.monotonic()
        fence = dev.submit([ops.nop()])
        try:
            dev.wait(fence, timeout_s=30)
        except npu.NpuDeviceError as e:
            if e.status != ST_TIMEOUT:
                raise RuntimeError(
                    f"the hung NOP failed with status {e.status}, not TIMEOUT"
                ) from e
        else:
            raise RuntimeError("the hung NOP completed: the hang did not fire")
        eio_ms = (time.monotonic() - t0) * 1e3
    if read_int("hangs") != hangs + 1:
        raise RuntimeError("the hang was not counted once")
    return float(read_int("last_hang_detect_ms")), float(read_int("last_reset_recovery_us")), eio_ms


def check_device() -> None:
    """A FILL after the recovery comes out right."""
    with npu.open_device(0) as dev, dev.alloc(1 << 20) as buf:
        dev.wait(dev.submit([ops.fill(buf, 0x600DF111, 1 << 20)]), timeout_s=10)
        if not (buf.numpy(np.uint32) == 0x600DF111).all():
            raise RuntimeError("FILL after a recovery: wrong result")


def bench() -> dict[str, Any]:
    detect, recovery, eio = [], [], []
    for i in range(CYCLES):
        d, r, e = one_cycle()
        check_device()
        detect.append(d)
        recovery.append(r)
        eio.append(e)
        log.info("cycle %d: detected after %.0f ms, reset + replay %.0f us", i, d, r)
    return {
        "hang_timeout_ms": HANG_TIMEOUT_MS,
        "hang_cycles": CYCLES,
        "hang_detect_ms": statistics.median(detect),
        "hang_detect_ms_max": max(detect),
        "hang_eio_ms": statistics.median(eio),
        "reset_recovery_ms": statistics.median(recovery) / 1e3,
        "reset_recovery_ms_max": max(recovery) / 1e3,
    }


def main() -> int:
    """Run the cycles; print the JSON result; 0 on success, 1 on a failure."""
    logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="bench_recovery: %(message)s")
    for path in (SYSFS, INJECT, TIMEOUT_PARAM):
        if not os.path.exists(path):
            log.error("%s is missing (driver not loaded, or debugfs not mounted?)", path)
            return 1
    with open(TIMEOUT_PARAM) as f:
        saved = f.read().strip()
    t0 = time.perf_counter()
    write(TIMEOUT_PARAM, f"{HANG_TIMEOUT_MS}\n")
    try:
        result = bench()
    except (RuntimeError, npu.NpuError) as e:
        log.error("FAILED: %s", e)
        return 1
    finally:
        write(TIMEOUT_PARAM, f"{saved}\n")
    result["recovery_bench_s"] = time.perf_counter() - t0
    print(json.dumps(result, sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.exit(main())
