"""Helpers shared by the in-guest tests (tests/guest/ is on sys.path)."""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Callable

DEV_PATH = "/dev/npu0"
# npu.ko as built for the running kernel (scripts/build-module.sh).
MODULE = f"/mnt/npu/build/module/{os.uname().release}/npu.ko"


def soak_cycles(full: int) -> int:
    """The cycle count of a soak loop: ``full`` under NPU_STRESS_SCALE=full
    (make stress), a tenth of it otherwise (make test's short scale, the
    default). Leak and recycle checks hold at either size; the full size
    only runs them longer."""
    scale = os.environ.get("NPU_STRESS_SCALE", "").strip() or "short"
    if scale not in ("full", "short"):
        raise ValueError(f"NPU_STRESS_SCALE={scale!r}: full or short")
    return full if scale == "full" else max(1, full // 10)


def load_driver() -> str | None:
    """insmod npu.ko unless it is loaded, and wait for /dev/npu0; None, or
    what went wrong."""
    if not os.path.isdir("/sys/module/npu"):
        # What npu.ko needs and insmod does not load (a no-op where built in).
        subprocess.run(["modprobe", "-q", "drm_shmem_helper"], check=False)
        r = subprocess.run(["insmod", MODULE], capture_output=True, text=True)
        if r.returncode != 0:
            return f"insmod {MODULE} failed: {r.stderr.strip()}"
    subprocess.run(["udevadm", "settle", "-t", "30"], check=False)
    if not wait_until(lambda: os.path.exists(DEV_PATH), 10.0):
        return f"{DEV_PATH} did not appear after loading the driver"
    return None


def wait_until(predicate: Callable[[], bool], timeout_s: float = 10.0) -> bool:
    """Poll ``predicate`` every 10 ms until it holds (True) or ``timeout_s`` passed (False)."""
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    return True
