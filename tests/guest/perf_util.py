"""Reading the device's performance counters exactly (docs/npu-spec.md 4.7),
for the in-guest tests that compare them with known figures.

A plain module, not a test file (pytest puts tests/guest on sys.path).

Two things stand between a finished run and an exact count:

- runtime PM: while the device sleeps, the driver shows the last snapshot
  it took rather than waking the device (kernel_module/npu_perf.c), and
  that snapshot may predate the last commands; :func:`device_awake` holds
  the device awake (``power/control`` = ``on``), so every read is fresh;
- ordering: a waiter sees a command's fence (6.3 step 7) a moment before
  the device counts it (step 8, with ``Q_DONE``, under the lock that a
  snapshot takes); :func:`settle` waits for ``Q_DONE`` to reach the last
  fence the driver handed out, after which a snapshot holds every count.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator

POWER = "/sys/class/accel/accel0/device/power"
QUEUES = "/sys/kernel/debug/npu/npu0/queues"


@contextlib.contextmanager
def device_awake() -> Iterator[None]:
    """Runtime PM off (``power/control`` = ``on``) inside, as it was after."""
    with open(f"{POWER}/control") as f:
        old = f.read().strip()
    with open(f"{POWER}/control", "w") as f:
        f.write("on")
    try:
        yield
    finally:
        with open(f"{POWER}/control", "w") as f:
            f.write(old)


def kernel_queue() -> dict[str, int]:
    """Queue 0 in debugfs ``queues``, its numeric fields: the driver's
    ``submitted`` (its last fence: one per command it put on the ring) and
    ``retired``, the device's ``head``, ``tail`` and ``done`` (``Q_DONE``, the
    fence of the last command it completed), ..."""
    with open(QUEUES) as f:
        first = f.readline().split()
    if first == ["suspended"]:
        raise AssertionError("the device is suspended: read it inside device_awake()")
    return {k: int(v) for k, v in (kv.split("=", 1) for kv in first) if v.isdigit()}


def settle(timeout_s: float = 10.0) -> dict[str, int]:
    """Wait until the device has completed (and counted) every command the
    driver submitted on queue 0; :func:`kernel_queue` then."""
    deadline = time.monotonic() + timeout_s
    while (q := kernel_queue())["done"] != q["submitted"]:
        assert time.monotonic() < deadline, f"queue 0 not done after {timeout_s:g} s: {q}"
        time.sleep(0.001)
    return q
