#!/usr/bin/env python3
"""NPU micro-benchmarks, run inside the guest.

Measures the submit/wait round trip, NOP throughput, DMA copy bandwidth and
fp32 GEMM throughput of the NPU next to the guest CPU doing the same work with
numpy. Every result is checked (copy equal, GEMM close to numpy); the script
exits 1 if one is wrong. Progress goes to stderr; the last line of stdout is
one JSON object (see docs/benchmarks.md for the keys)::

    python3 examples/bench_npu.py            # in the guest; `make bench` runs it

Environment: ``BENCH_QUICK=1`` shrinks the repetition counts (for a smoke
test; the figures are then noisier).
"""

from __future__ import annotations

import json
import logging
import os
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

import numpy as np

import npu

log = logging.getLogger("bench_npu")

MIB = 1 << 20
COPY_BYTES = 64 * MIB
GEMM_N = 1024
# numpy in the guest (TCG) runs at ~0.07 GFLOP/s: a 1024^3 GEMM takes ~30 s.
# If one would take longer than this, the guest-numpy figure uses 512 instead.
GUEST_GEMM_BUDGET_S = 60.0
REF_ROWS = 128  # rows of the NPU GEMM result checked when the guest GEMM ran at 512
WAIT_TIMEOUT_S = 120.0

QUICK = os.environ.get("BENCH_QUICK", "") == "1"
NOP_WARMUP = 5 if QUICK else 20
NOP_RUNS = 30 if QUICK else 200
BATCH = 64
BATCH_SUBMITS = 20 if QUICK else 200
COPY_RUNS = 2 if QUICK else 5
GEMM_RUNS = 2 if QUICK else 5
E2E_RUNS = 1 if QUICK else 3
GETPPID_LOOPS = 20_000 if QUICK else 200_000


class BenchError(RuntimeError):
    """A benchmark produced a wrong result."""


def gemm_flop(n: int) -> float:
    """Floating-point operations of an n x n x n GEMM."""
    return 2.0 * n * n * n


def timed_runs(fn: Callable[[], Any], runs: int) -> list[float]:
    """Wall-clock seconds of `runs` calls of fn."""
    times = []
    for _ in range(runs):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return times


def check_gemm(c: np.ndarray, ref: np.ndarray, k: int, what: str) -> None:
    """Raise BenchError unless c matches the numpy reference.

    ref may hold only the first rows of the product; those rows are compared."""
    top = c[: ref.shape[0]]
    if top.shape != ref.shape or not np.allclose(top, ref, rtol=1e-4, atol=1e-3 * np.sqrt(k)):
        err = float(np.max(np.abs(top - ref))) if top.shape == ref.shape else float("inf")
        raise BenchError(f"{what}: result differs from numpy (max abs err {err:.3g})")


def bench_nop_roundtrip(dev: npu.Device) -> float:
    """Median microseconds of one NOP SUBMIT + WAIT."""
    nop = [npu.ops.nop()]
    for _ in range(NOP_WARMUP):
        dev.wait(dev.submit(nop), timeout_s=WAIT_TIMEOUT_S)
    times = timed_runs(lambda: dev.wait(dev.submit(nop), timeout_s=WAIT_TIMEOUT_S), NOP_RUNS)
    return statistics.median(times) * 1e6


def bench_getppid() -> float:
    """Microseconds of one os.getppid() call from Python (a cheap syscall, for scale)."""
    getppid = os.getppid
    loops = range(GETPPID_LOOPS)
    t0 = time.perf_counter()
    for _ in loops:
        getppid()
    t1 = time.perf_counter()
    for _ in loops:  # the empty loop, subtracted
        pass
    t2 = time.perf_counter()
    return max((t1 - t0) - (t2 - t1), 0.0) / GETPPID_LOOPS * 1e6


def bench_nop_batch(dev: npu.Device) -> float:
    """NOPs per second, submitted BATCH per SUBMIT, one WAIT at the end."""
    batch = [npu.ops.nop()] * BATCH
    dev.wait(dev.submit(batch), timeout_s=WAIT_TIMEOUT_S)  # warm-up
    t0 = time.perf_counter()
    fence = 0
    for _ in range(BATCH_SUBMITS):
        fence = dev.submit(batch)
    dev.wait(fence, timeout_s=WAIT_TIMEOUT_S)
    return BATCH * BATCH_SUBMITS / (time.perf_counter() - t0)


def bench_dma_copy(dev: npu.Device) -> float:
    """GB/s (1e9 bytes/s) of one 64 MiB COPY, submit + wait; median of COPY_RUNS."""
    with dev.alloc(COPY_BYTES) as src, dev.alloc(COPY_BYTES) as dst:
        s = src.numpy(np.uint32)
        s[:] = np.arange(s.size, dtype=np.uint32) * np.uint32(2654435761)
        d = dst.numpy(np.uint32)
        d[:] = 0  # touch every page before timing
        op = [npu.ops.copy(src, dst, COPY_BYTES)]
        dev.wait(dev.submit(op), timeout_s=WAIT_TIMEOUT_S)  # warm-up
        if not np.array_equal(d, s):
            raise BenchError("COPY: destination differs from source")
        d[:] = 0
        times = timed_runs(lambda: dev.wait(dev.submit(op), timeout_s=WAIT_TIMEOUT_S), COPY_RUNS)
        if not np.array_equal(d, s):
            raise BenchError("COPY: destination differs from source")
        del s, d
    return COPY_BYTES / statistics.median(times) / 1e9


def bench_guest_memcpy() -> float:
    """GB/s of np.copyto of 64 MiB into a preallocated array in the guest."""
    src = np.arange(COPY_BYTES // 4, dtype=np.uint32)
    dst = np.zeros_like(src)
    np.copyto(dst, src)  # warm-up, faults the pages in
    times = timed_runs(lambda: np.copyto(dst, src), COPY_RUNS)
    if not np.array_equal(dst, src):
        raise BenchError("guest memcpy: copy differs")
    return COPY_BYTES / statistics.median(times) / 1e9


def bench_gemm(
    dev: npu.Device, a: np.ndarray, b: np.ndarray, ref: np.ndarray
) -> tuple[float, float]:
    """(device GFLOP/s, end-to-end GFLOP/s) of an n^3 fp32 GEMM, checked against ref."""
    n = a.shape[0]
    nbytes = n * n * 4
    with dev.alloc(nbytes) as ba, dev.alloc(nbytes) as bb, dev.alloc(nbytes) as bc:
        ba.numpy(np.float32, (n, n))[:] = a
        bb.numpy(np.float32, (n, n))[:] = b
        c = bc.numpy(np.float32, (n, n))
        c[:] = 0
        op = [npu.ops.gemm(ba, bb, bc, m=n, n=n, k=n)]
        dev.wait(dev.submit(op), timeout_s=WAIT_TIMEOUT_S)  # warm-up
        check_gemm(c, ref, n, "NPU GEMM")
        times = timed_runs(lambda: dev.wait(dev.submit(op), timeout_s=WAIT_TIMEOUT_S), GEMM_RUNS)
        check_gemm(c, ref, n, "NPU GEMM")
        del c
    dev_gflops = gemm_flop(n) / statistics.median(times) / 1e9

    out: list[np.ndarray] = []
    e2e = timed_runs(
        lambda: out.append(npu.matmul(a, b, device=dev, timeout_s=WAIT_TIMEOUT_S)), E2E_RUNS
    )
    for c_e2e in out:
        check_gemm(c_e2e, ref, n, "npu.matmul")
    e2e_gflops = gemm_flop(n) / statistics.median(e2e) / 1e9
    return dev_gflops, e2e_gflops


def bench_guest_numpy_gemm(a: np.ndarray, b: np.ndarray) -> tuple[float, int, np.ndarray]:
    """(GFLOP/s, n used, reference rows of a @ b) of numpy a @ b in the guest.

    A 256^3 probe estimates the full-size time; if that is over the budget the
    measurement is made at 512 instead, and the reference for checking the
    NPU is then only the first REF_ROWS rows of a @ b (cheaper to compute).
    """
    n = a.shape[0]
    probe = 256
    t0 = time.perf_counter()
    _ = a[:probe, :probe] @ b[:probe, :probe]
    est = (time.perf_counter() - t0) * (n / probe) ** 3
    log.info("guest numpy %d^3 probe: estimated %.1f s for %d^3", probe, est, n)
    if est > GUEST_GEMM_BUDGET_S:
        n = 512
    a_n, b_n = np.ascontiguousarray(a[:n, :n]), np.ascontiguousarray(b[:n, :n])
    t0 = time.perf_counter()
    c = a_n @ b_n
    dt = time.perf_counter() - t0
    if n != a.shape[0]:
        c = a[:REF_ROWS] @ b
    return gemm_flop(n) / dt / 1e9, n, c


def main() -> int:
    """Run every benchmark; print the JSON result; 0 on success, 1 on a wrong result."""
    logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="bench_npu: %(message)s")
    found = npu.devices()
    if not found:
        log.error("no NPU found: is the driver loaded? (insmod kernel_module/npu.ko)")
        return 1
    result: dict[str, Any] = {}
    t_start = time.perf_counter()
    try:
        with npu.open_device(found[0]) as dev:
            info = dev.info
            result["device"] = {
                "path": info.path,
                "hw_version": info.hw_version_str,
                "driver_version": info.driver_version_str,
                "caps": "|".join(c.name or "" for c in npu.Cap if c in info.caps),
                "num_cores": info.num_cores,
                "ring_entries": info.ring_entries,
            }
            result["nop_roundtrip_us"] = bench_nop_roundtrip(dev)
            log.info("nop round trip %.1f us", result["nop_roundtrip_us"])
            result["getppid_us"] = bench_getppid()
            log.info("getppid %.2f us", result["getppid_us"])
            result["nop_batch_ops_per_s"] = bench_nop_batch(dev)
            log.info("nop batch %.0f ops/s", result["nop_batch_ops_per_s"])
            result["dma_copy_gbps"] = bench_dma_copy(dev)
            log.info("dma copy %.2f GB/s", result["dma_copy_gbps"])
            result["guest_memcpy_gbps"] = bench_guest_memcpy()
            log.info("guest memcpy %.2f GB/s", result["guest_memcpy_gbps"])

            rng = np.random.default_rng(0)
            a = rng.standard_normal((GEMM_N, GEMM_N), dtype=np.float32)
            b = rng.standard_normal((GEMM_N, GEMM_N), dtype=np.float32)
            gflops, n_used, ref = bench_guest_numpy_gemm(a, b)
            result["gemm_fp32_1024_gflops_guest_numpy"] = gflops
            result["guest_numpy_gemm_n"] = n_used
            log.info("guest numpy gemm %d^3: %.3f GFLOP/s", n_used, gflops)
            dev_gflops, e2e_gflops = bench_gemm(dev, a, b, ref)
            result["gemm_fp32_1024_gflops_npu"] = dev_gflops
            result["gemm_fp32_1024_gflops_npu_e2e"] = e2e_gflops
            log.info("npu gemm %.2f GFLOP/s (e2e %.2f)", dev_gflops, e2e_gflops)
    except BenchError as e:
        log.error("WRONG RESULT: %s", e)
        return 1
    result["guest_bench_s"] = time.perf_counter() - t_start
    print(json.dumps(result, sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.exit(main())
