"""Engine-control figures of the device model, measured through qtest on the host.

- ``tile_us``: host time of one GEMM tile (a block of C of at most 2^27
  multiply-adds) on one core, the unit every control point waits for,
  measured on the GEMM and device of the two figures below (4096^3 fp32);
- ``reset_abort_ms``: a soft reset written while a 4096^3 fp32 GEMM runs,
  until ``STATUS`` reads READY again (the GEMM alone takes seconds);
- ``preempt_latency_us``: a priority-3 NOP rung while a priority-0 GEMM runs,
  until its fence write-back is seen; ``nop_latency_us`` is the same NOP on
  an idle device, the qtest round trips both include.
- ``park_latency_ms``: ``{opcode: {event: ms}}``, the host time from an
  engine-control event (soft reset, system reset, D3hot, QMP stop, the
  ``cmd-budget-ms`` expiry, a priority-3 NOP) until the device answered,
  with each opcode's worst-case command running (tests/host/park_matrix.py;
  median of PARK_RUNS runs per cell, null where an event does not apply);
  ``park_latency_ms_max`` and ``park_latency_ms_p50`` over all cells (the
  target: 10 ms). These run on the default two-core device.
- ``rss_over_budget_mib``: ``{opcode: MiB}``, QEMU's peak RSS (VmHWM) less
  its RSS before the command and less ``mem-budget=16M``, for the commands
  whose host scratch is sized by guest numbers; ``rss_over_budget_mib_max``.

The device has one AI core here: this host has two, and with both busy
with BLAS QEMU's main loop (which handles the guest's register writes)
waits for a time slice of the host scheduler, milliseconds that belong to
the host rather than to the device (measured once: 7.9 ms for the reset and
3.4 ms for the NOP on a two-core device, docs/benchmarks.md).

They run against the release QEMU (``$NPU_CACHE/bin/qemu-system-x86_64``): the
qtest protocol drives the device with no guest, so no TCG time is in them.
Each figure is the median of several runs after a warm-up run.
"""

from __future__ import annotations

import logging
import math
import os
import statistics
import struct
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "host"))

log = logging.getLogger("bench")

RUNS = 5
BIG_N = 4096  # A, B, C of 64 MiB each: seconds of work
CORES = 1  # see above
# The device's GEMM tiling (qemu_device/npu_exec.c, npu_exec_gemm).
GEMM_TILE_WORK = 1 << 27
GEMM_TILE_MIN_WORK = 1 << 22
A = 0x0400_0000
B = A + BIG_N * BIG_N * 4
C = B + BIG_N * BIG_N * 4
POLL_S = 20.0
PARK_RUNS = 3


def _release_qemu() -> Path:
    cache = Path(os.environ.get("NPU_CACHE") or Path.home() / ".cache" / "npu-stack")
    return cache / "bin" / "qemu-system-x86_64"


def _median(fn: Callable[[], float], runs: int = RUNS) -> float:
    fn()  # warm-up: page faults of the guest RAM, BLAS buffers
    return statistics.median(fn() for _ in range(runs))


def _wait(cond: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + POLL_S
    while not cond():
        if time.monotonic() > deadline:
            raise RuntimeError(f"engine benchmark: {what} timed out")


def gemm_tiles(m: int, n: int, k: int, cores: int) -> tuple[int, int, int]:
    """(tiles, block rows, block cols) of an m x n x k GEMM, as the device splits it."""
    work = min(GEMM_TILE_WORK, max(m * n * k // (2 * cores), GEMM_TILE_MIN_WORK))
    side = max(work // k, 1)
    pow2 = 1 << (math.isqrt(2 * side).bit_length() - 1)  # pow2floor(sqrt(2 side))
    cb = n if n * n <= side else min(n, max(64, pow2))
    rb = min(m, max(1, side // cb))
    return -(-m // rb) * -(-n // cb), rb, cb


def measure() -> dict[str, Any]:
    """The figures above, as a dict for build/bench.json."""
    os.environ.setdefault("NPU_QTEST_QEMU", str(_release_qemu()))
    # Imported here: qtest reads NPU_QTEST_QEMU when it is imported.
    from qtest import Npu, gemm, hw, nop, queue_fence, queue_ring, setup_queue

    res: dict[str, Any] = {}
    with tempfile.TemporaryDirectory() as tmp:
        npu = Npu(Path(tmp) / "qemu.log", device=f"npu,cores={CORES},cmd-budget-ms=0")
        try:
            n = BIG_N
            big = gemm(A, B, C, n, n, n, n, n, n, fence=7)
            tiles, rb, cb = gemm_tiles(n, n, n, CORES)

            def one_gemm() -> float:
                t0 = time.perf_counter()
                npu.run(big, timeout=POLL_S)
                return time.perf_counter() - t0

            npu.start(size=64)
            res["tile_us"] = _median(one_gemm) * CORES / tiles * 1e6
            npu.soft_reset()
            res["meta_engine_tile"] = (
                f"fp32 GEMM {n}^3, {CORES} AI core(s): {tiles} blocks of {rb}x{cb}"
            )
            log.info("engine: tile %.0f us (%s)", res["tile_us"], res["meta_engine_tile"])

            def reset_abort() -> float:
                npu.start(size=64)
                npu.submit(big)
                _wait(lambda: bool(npu.qrd(hw.Q_STATUS) & hw.QSTAT_ACTIVE), "GEMM start")
                time.sleep(0.05)
                t0 = time.perf_counter()
                npu.wr(hw.REG_CONTROL, hw.CONTROL_RESET)
                _wait(lambda: npu.rd(hw.REG_STATUS) == hw.STATUS_READY, "reset")
                dt = time.perf_counter() - t0
                npu.tail = 0
                return dt

            res["reset_abort_ms"] = _median(reset_abort) * 1e3

            def nop_latency(busy: bool) -> float:
                npu.start(size=64)
                setup_queue(npu, 3, priority=3)
                npu.qt.memwrite(queue_fence(3), bytes(16))
                if busy:
                    npu.submit(big)
                    _wait(lambda: bool(npu.qrd(hw.Q_STATUS) & hw.QSTAT_ACTIVE), "GEMM start")
                    time.sleep(0.05)
                npu.qt.memwrite(queue_ring(3), nop(0x33))
                t0 = time.perf_counter()
                npu.wr(hw.doorbell(3), 1)
                _wait(
                    lambda: struct.unpack("<Q", npu.qt.memread(queue_fence(3), 8))[0] == 0x33,
                    "NOP",
                )
                dt = time.perf_counter() - t0
                if busy and npu.fence_wb()[0] == 7:
                    raise RuntimeError("engine benchmark: the GEMM ended before the NOP")
                npu.soft_reset()
                return dt

            res["preempt_latency_us"] = _median(lambda: nop_latency(True)) * 1e6
            res["nop_latency_us"] = _median(lambda: nop_latency(False)) * 1e6
            log.info(
                "engine: reset during a GEMM %.2f ms; preempting NOP %.0f us (idle %.0f us)",
                res["reset_abort_ms"],
                res["preempt_latency_us"],
                res["nop_latency_us"],
            )
            npu.assert_alive()
        finally:
            npu.close()
    res.update(measure_park())
    return res


def measure_park(runs: int = PARK_RUNS) -> dict[str, Any]:
    """The park matrix and the RSS figures (release QEMU, see above)."""
    os.environ.setdefault("NPU_QTEST_QEMU", str(_release_qemu()))
    import park_matrix as pm

    res: dict[str, Any] = {}
    with tempfile.TemporaryDirectory() as tmp:
        m = pm.measure_matrix(Path(tmp), runs=runs)
        cells = m.median()
        vals = sorted(v for row in cells.values() for v in row.values() if v is not None)
        res["park_latency_ms"] = cells
        res["park_latency_ms_max"] = vals[-1]
        res["park_latency_ms_p50"] = statistics.median(vals)
        for note in m.notes:
            log.info("engine: park: %s", note)
        worst = max(
            ((op, ev, v) for op, row in cells.items() for ev, v in row.items() if v is not None),
            key=lambda c: c[2],
        )
        log.info(
            "engine: park latency p50 %.2f ms, max %.1f ms (%s, %s)",
            res["park_latency_ms_p50"],
            res["park_latency_ms_max"],
            worst[0],
            worst[1],
        )
        over: dict[str, float] = {}
        for op in pm.RSS_WORST:
            fig = pm.measure_rss(Path(tmp) / f"rss-{op}", op)
            over[op] = fig.over_budget / (1 << 20)
            log.info(
                "engine: %s peak RSS %.0f MiB over RSS before + 16 MiB budget (status %s)",
                op,
                over[op],
                fig.status,
            )
        res["rss_over_budget_mib"] = over
        res["rss_over_budget_mib_max"] = max(over.values())
    return res


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO, format="[bench] %(message)s")
    print(measure())
