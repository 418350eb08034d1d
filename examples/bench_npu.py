#!/usr/bin/env python3
"""NPU micro-benchmarks, run inside the guest.

Measures the submit/wait round trip, NOP throughput, the per-op cost and
round trip of a user-mode queue (``npu.UserQueue``) next to the ioctl path,
the per-op cost of small tensor ops and graph replays on an ``npu.Stream``
next to the default stream (and of an empty Python call, for scale), DMA
copy bandwidth,
fp32 GEMM throughput, the MATMUL op (fp32, fp16, bf16), the fused LINEAR
epilogue, the tensor ops (element-wise, unary, convert, transpose on
``npu.Tensor``) and 2-D convolution and pooling (CONV2D, POOL2D) of the NPU
next to the guest CPU doing the same work with numpy. Every result is
checked (copy equal, GEMM, MATMUL, tensor ops and conv2d close to numpy); the
script exits 1 if one is wrong.

Every guest-numpy baseline is measured like the NPU side: one untimed
warm-up run at the size that is reported, then the median of at least
GUEST_RUNS timed runs (see :func:`guest_median_s`), also with
``BENCH_QUICK=1``. The JSON also carries ``guest_env`` (see
:func:`guest_environment`): the guest's Python, numpy and the BLAS library
numpy actually runs on, which scripts/bench.py moves into ``meta``.

Progress goes to stderr; the last line of stdout is one JSON object (see
docs/benchmarks.md for the keys)::

    python3 examples/bench_npu.py            # in the guest; `make bench` runs it

Environment: ``BENCH_QUICK=1`` shrinks the repetition counts (for a smoke
test; the figures are then noisier).
"""

from __future__ import annotations

import ctypes
import json
import logging
import math
import os
import platform
import re
import statistics
import subprocess
import sys
import time
import timeit
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

import npu
from npu.allocator import allocator

log = logging.getLogger("bench_npu")

MIB = 1 << 20
COPY_BYTES = 64 * MIB
GEMM_N = 1024
# Timed runs of every guest-numpy baseline, after one untimed warm-up run at
# the measured size; BENCH_QUICK=1 does not lower it (a single run is not a
# baseline). The NPU side runs its own counts (GEMM_RUNS, TENSOR_RUNS...).
GUEST_RUNS = 3
# numpy in the guest (TCG, -cpu max) runs at ~0.17 GFLOP/s fp32: one 1024^3
# GEMM takes ~13 s, the warm-up and the GUEST_RUNS timed runs ~50 s. If one
# run would take longer than this, the guest-numpy figure uses 512 instead.
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
# User-mode queue vs SUBMIT: UQ_OPS single-NOP submissions then one wait,
# median of UQ_RUNS; round trips: median of UQ_ROUNDTRIPS single NOPs.
UQ_OPS = 256
UQ_RUNS = 3 if QUICK else 7
UQ_ROUNDTRIPS = 30 if QUICK else 200
UQ_IRQ_OPS = 1000
# npu.Stream: STREAM_OPS small ELTWISE adds (STREAM_ELEMS fp32) then one
# synchronize, median of UQ_RUNS; an empty Python call, PY_CALL_LOOPS times.
STREAM_OPS = 1000
STREAM_ELEMS = 256
# npu.Tensor ops (x + y of STREAM_ELEMS fp32) on the default and on a user
# stream: TENSOR_LOOP_OPS then one wait; a captured chain of GRAPH_OPS such
# adds replayed GRAPH_REPLAYS times on each.
TENSOR_LOOP_OPS = 200 if QUICK else 1000
GRAPH_OPS = 256
GRAPH_REPLAYS = 5 if QUICK else 20
PY_CALL_LOOPS = 20_000 if QUICK else 200_000
IRQ_SETTLE_S = 0.05
# Tensor ops: square fp32 tensors of 1M (1024 x 1024) and 256K (512 x 512)
# elements. The NPU figure is a chain of TENSOR_CHAIN identical ops submitted
# back to back and one wait, divided by TENSOR_CHAIN; median of TENSOR_RUNS.
TENSOR_SIZES = (("1m", 1024), ("256k", 512))
TENSOR_CHAIN = 4 if QUICK else 16
TENSOR_RUNS = 2 if QUICK else 5
TENSOR_NUMPY_RUNS = GUEST_RUNS  # after a warm-up, also with BENCH_QUICK=1
GELU_EXACT_SAMPLES = 4096  # elements of the GELU result checked against the exact erf form
# MATMUL op: 1024^3 on device-resident operands; fp16/bf16 results are
# checked on their first MATMUL_REF_ROWS rows (numpy in the guest is slow).
MATMUL_REF_ROWS = 64
# |got - want| <= rtol * (|want| + sqrt(K)): output rounding of each dtype
# plus the fp32 accumulation, for standard-normal inputs.
MATMUL_RTOL = {"fp32": 1e-5, "fp16": 2e-3, "bf16": 1e-2}
# Fused epilogue: matmul + bias add + relu as three ops vs one LINEAR(relu).
FUSED_N = 512
# CONV2D: a ResNet-like 64 -> 64 channel 3x3 conv (padding 1) on 56x56, batch
# 8, fp32. Guest numpy (im2col + matmul) runs on the whole batch unless a
# batch-1 probe predicts more than CONV_GUEST_BUDGET_S for one run; then on
# batch 1 (a rate, so comparable), and conv2d_guest_numpy_batch says so.
# Either way: a warm-up run, then the median of GUEST_RUNS.
CONV_N, CONV_C, CONV_O, CONV_HW, CONV_K = 8, 64, 64, 56, 3
CONV_GUEST_BUDGET_S = 60.0
CONV_RUNS = 2 if QUICK else 5
# |got - want| <= rtol * (|want| + sqrt(K)), K = C * KH * KW: fp32 output
# rounding plus the accumulation order, for standard-normal inputs.
CONV_RTOL = 1e-4
# Debian's alternative for the BLAS that programs linked with -lblas load.
BLAS_ALTERNATIVE = "/etc/alternatives/libblas.so.3-x86_64-linux-gnu"
# Libraries in /proc/self/maps that are a BLAS (or its wrapper/dispatcher).
BLAS_LIB_RE = re.compile(r"^lib(?:scipy_)?(?:open|flexi|c)?blas|^libblis|^libmkl_rt")


class BenchError(RuntimeError):
    """A benchmark produced a wrong result."""


def _numpy_build_blas() -> dict[str, Any] | None:
    """numpy's build-time BLAS and LAPACK (``numpy.show_config(mode="dicts")``).

    {"name", "version", "detection_method", "lapack"}; None if this numpy
    cannot say (numpy < 1.26 has no "dicts" mode)."""
    try:
        config = np.show_config(mode="dicts")
    except (TypeError, ValueError, AttributeError, ImportError):
        return None
    if not isinstance(config, dict):
        return None
    deps = config.get("Build Dependencies", {})
    blas, lapack = deps.get("blas", {}), deps.get("lapack", {})
    return {
        "name": blas.get("name"),
        "version": blas.get("version"),
        "detection_method": blas.get("detection method"),
        "lapack": lapack.get("name"),
    }


def _mapped_blas_libraries() -> list[str]:
    """Real paths of the BLAS libraries mapped into this process (/proc/self/maps),
    in load order: what numpy's dynamic linking actually resolved to."""
    found: list[str] = []
    try:
        with open("/proc/self/maps") as f:
            lines = f.read().splitlines()
    except OSError:
        return found
    for line in lines:
        fields = line.split(maxsplit=5)
        if len(fields) < 6 or not fields[5].startswith("/"):
            continue
        path = fields[5]
        if BLAS_LIB_RE.match(os.path.basename(path)) and path not in found:
            found.append(path)
    return found


def _openblas_runtime(paths: list[str]) -> dict[str, Any]:
    """OpenBLAS's own report (config string, kernel core, threads) from the first
    of the already-loaded `paths` that exports openblas_get_config; {} if none."""
    for path in paths:
        try:
            lib = ctypes.CDLL(path, mode=getattr(os, "RTLD_NOLOAD", 0))
        except OSError:
            continue
        for prefix, suffix in (("", ""), ("", "64_"), ("scipy_", "64_"), ("scipy_", "")):
            get_config = getattr(lib, f"{prefix}openblas_get_config{suffix}", None)
            if get_config is None:
                continue
            get_config.restype = ctypes.c_char_p
            out: dict[str, Any] = {"openblas_config": get_config().decode(errors="replace")}
            corename = getattr(lib, f"{prefix}openblas_get_corename{suffix}", None)
            if corename is not None:
                corename.restype = ctypes.c_char_p
                out["openblas_corename"] = corename().decode(errors="replace")
            threads = getattr(lib, f"{prefix}openblas_get_num_threads{suffix}", None)
            if threads is not None:
                threads.restype = ctypes.c_int
                out["num_threads"] = int(threads())
            return out
    return {}


def guest_blas() -> dict[str, Any]:
    """The BLAS numpy runs on in this guest, as precisely as can be told.

    ``library``: the implementation's file; ``source`` says how it was
    found: threadpoolctl if it is installed (its first BLAS pool), else the
    libraries mapped into this process after ``import numpy`` and a matmul
    (/proc/self/maps: an OpenBLAS/BLIS/MKL file is preferred over a libblas
    wrapper), else the realpath of Debian's libblas.so.3 alternative.
    ``alternative`` is that realpath (None without the alternative),
    ``mapped`` every BLAS file mapped, ``numpy_build`` numpy's build-time
    BLAS (:func:`_numpy_build_blas`); for OpenBLAS also its config string,
    core (the kernels picked for this CPU) and thread count, and
    threadpoolctl's internal_api, version, architecture and num_threads
    when it is there."""
    a = np.ones((64, 64), np.float32)
    _ = a @ a  # BLAS in use (and its threads started) before looking
    alt = os.path.realpath(BLAS_ALTERNATIVE) if os.path.lexists(BLAS_ALTERNATIVE) else None
    mapped = _mapped_blas_libraries()
    info: dict[str, Any] = {
        "library": None,
        "source": None,
        "alternative": alt,
        "mapped": mapped,
        "numpy_build": _numpy_build_blas(),
    }
    try:
        from threadpoolctl import threadpool_info  # type: ignore[import-not-found]
    except ImportError:
        pools: list[dict[str, Any]] = []
    else:
        pools = [p for p in threadpool_info() if p.get("user_api") == "blas"]
    if pools:
        pool = pools[0]
        info["library"], info["source"] = pool.get("filepath"), "threadpoolctl"
        for k in ("internal_api", "version", "architecture", "num_threads"):
            info[k] = pool.get(k)
    elif mapped:
        impl = [m for m in mapped if not os.path.basename(m).startswith("libblas.so")]
        info["library"], info["source"] = (impl or mapped)[0], "/proc/self/maps"
    elif alt is not None:
        info["library"], info["source"] = alt, "alternatives"
    info.update({k: v for k, v in _openblas_runtime(mapped).items() if info.get(k) is None})
    return info


def guest_environment() -> dict[str, Any]:
    """What the guest-numpy baselines ran on: the ``guest_env`` JSON key.

    ``python`` (version), ``numpy`` (``numpy.__version__``), ``blas``
    (:func:`guest_blas`) and ``cpus`` (os.cpu_count()). scripts/bench.py
    moves these into ``meta`` as ``guest_python``, ``guest_numpy``,
    ``guest_blas`` and ``guest_cpus``."""
    return {
        "python": platform.python_version(),
        "numpy": np.__version__,
        "blas": guest_blas(),
        "cpus": os.cpu_count(),
    }


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


def guest_median_s(fn: Callable[[], Any], runs: int = GUEST_RUNS) -> tuple[float, Any]:
    """(median seconds, warm-up result) of a guest-numpy baseline.

    One untimed warm-up call of fn (page faults, BLAS thread start-up,
    numpy's first-call dispatch), whose result is returned for checking the
    NPU against, then the median of max(runs, GUEST_RUNS) timed calls."""
    warm = fn()
    return statistics.median(timed_runs(fn, max(runs, GUEST_RUNS))), warm


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


def read_irq_count(dev: npu.Device) -> int:
    """The driver's interrupt counter (sysfs irq_count: all of the device's vectors)."""
    accel = os.path.basename(os.path.realpath(dev.path))  # /dev/npuN links to accelN
    with open(f"/sys/class/accel/{accel}/device/npu/irq_count") as f:
        return int(f.read())


def bench_user_queue(dev: npu.Device) -> dict[str, float]:
    """Small ops through the ioctl path vs a user-mode queue (npu.UserQueue).

    op_us_ioctl_submit: UQ_OPS NOPs, each its own SUBMIT ioctl, then one
    WAIT, per op. op_us_user_queue: the same NOPs through a UserQueue, each
    pushed and its doorbell rung (no system call), then one wait, per op;
    op_us_user_queue_batched: pushed all, one doorbell, one wait.
    roundtrip_us_spin / roundtrip_us_block: one NOP pushed and waited for by
    spinning on the fence record / by the WAIT ioctl (the NOP asks for an
    interrupt). irqs_per_1000_ops: the driver's irq_count across 1000 NOPs
    with NPU_CMD_F_IRQ on the last only. irqs_per_1000_flagged_ops: across
    1000 64 KiB FILLs that each ask for an interrupt, pushed at once (what
    the device's moderation with the driver's irq_coalesce_* leaves)."""
    res: dict[str, float] = {}
    nop = [npu.ops.nop()]

    def ioctl_ops() -> None:
        fence = 0
        for _ in range(UQ_OPS):
            fence = dev.submit(nop)
        dev.wait(fence, timeout_s=WAIT_TIMEOUT_S)

    with dev.create_queue(entries=max(UQ_OPS, 1024)) as q:

        def uq_ops() -> None:
            push, kick = q.nop, q.kick
            for _ in range(UQ_OPS):
                push()
                kick()
            q.synchronize(timeout_s=WAIT_TIMEOUT_S)

        def uq_ops_batched() -> None:
            push = q.nop
            for _ in range(UQ_OPS):
                push()
            q.synchronize(timeout_s=WAIT_TIMEOUT_S)

        for name, fn in (
            ("op_us_ioctl_submit", ioctl_ops),
            ("op_us_user_queue", uq_ops),
            ("op_us_user_queue_batched", uq_ops_batched),
        ):
            fn()  # warm-up
            res[name] = statistics.median(timed_runs(fn, UQ_RUNS)) / UQ_OPS * 1e6

        def spin() -> None:
            q.wait(q.nop(), timeout_s=WAIT_TIMEOUT_S, spin_s=WAIT_TIMEOUT_S)

        def block() -> None:
            q.wait(q.nop(irq=True), timeout_s=WAIT_TIMEOUT_S, spin_s=0)

        for name, fn in (("roundtrip_us_spin", spin), ("roundtrip_us_block", block)):
            for _ in range(NOP_WARMUP):
                fn()
            res[name] = statistics.median(timed_runs(fn, UQ_ROUNDTRIPS)) * 1e6

        q.synchronize(timeout_s=WAIT_TIMEOUT_S)
        time.sleep(IRQ_SETTLE_S)  # the interrupt threads of earlier work have run
        before = read_irq_count(dev)
        for _ in range(UQ_IRQ_OPS - 1):
            q.nop()
        q.wait(q.nop(irq=True), timeout_s=WAIT_TIMEOUT_S, spin_s=0)
        time.sleep(IRQ_SETTLE_S)  # the WAIT may return before the IRQ thread counts
        res["irqs_per_1000_ops"] = float(read_irq_count(dev) - before) * 1000 / UQ_IRQ_OPS
        if q.completed() != q.last_fence:
            raise BenchError("user queue: not every NOP completed")
        with dev.alloc(64 * 1024) as buf:
            time.sleep(IRQ_SETTLE_S)
            before = read_irq_count(dev)
            for _ in range(UQ_IRQ_OPS):
                q.fill(buf, 7, buf.size, irq=True)
            q.kick()
            q.synchronize(timeout_s=WAIT_TIMEOUT_S)
            time.sleep(IRQ_SETTLE_S)
            irqs = read_irq_count(dev) - before
        res["irqs_per_1000_flagged_ops"] = float(irqs) * 1000 / UQ_IRQ_OPS
    res["user_queue_op_speedup"] = res["op_us_ioctl_submit"] / res["op_us_user_queue"]
    return res


def bench_stream_ops(dev: npu.Device) -> float:
    """Microseconds per op of STREAM_OPS small ELTWISE adds launched on an npu.Stream.

    One op built with npu.ops.eltwise and launched STREAM_OPS times (each
    launch: parameter block into the stream's arena, descriptor, doorbell
    store), then one synchronize; total / STREAM_OPS, median of UQ_RUNS
    after a warm-up. Compare op_us_user_queue (NOPs, no parameter block).
    """
    n = STREAM_ELEMS
    with dev.alloc(n * 4) as a, dev.alloc(n * 4) as b, dev.alloc(n * 4) as c:
        a.numpy(np.float32)[:] = 1.5
        b.numpy(np.float32)[:] = 2.0

        def ref(buf: npu.Buffer) -> npu.TensorRef:
            return npu.ops.tensor_ref(buf, npu.DType.FP32, (n,))

        op = npu.ops.eltwise(npu.EltwiseKind.ADD, ref(a), ref(b), ref(c), (a, b, c))
        stream = npu.Stream(dev, entries=1024)
        try:
            launch = stream.launch

            def run() -> None:
                for _ in range(STREAM_OPS):
                    launch(op)
                stream.synchronize(timeout_s=WAIT_TIMEOUT_S)

            run()  # warm-up: the arena, the packed block
            us = statistics.median(timed_runs(run, UQ_RUNS)) / STREAM_OPS * 1e6
        finally:
            stream.close()
        if not (c.numpy(np.float32) == 3.5).all():
            raise BenchError("stream ELTWISE add: wrong result")
    return us


def bench_stream_tensors(dev: npu.Device) -> dict[str, float]:
    """Per-op cost of npu.Tensor ops and graph replays, default stream vs a user stream.

    ``tensor_op_us_*``: ``t = x + y`` (STREAM_ELEMS fp32) TENSOR_LOOP_OPS
    times then one wait, per op, median of UQ_RUNS. ``graph_submit_us_*``:
    the launch of a captured chain of GRAPH_OPS adds (one ``Graph.replay``,
    ring empty), per op; ``graph_op_us_*``: replay plus synchronize, per op;
    medians of GRAPH_REPLAYS. ``*_default``: SUBMIT to the driver's queue 0;
    ``*_stream``: inside ``with npu.Stream(...)``, no ioctl.
    """
    n = STREAM_ELEMS
    x = npu.tensor(np.full(n, 1.5, np.float32), device=dev)
    y = npu.tensor(np.full(n, 2.0, np.float32), device=dev)
    graph = npu.Graph(dev)
    with graph.capture():
        acc = x
        for _ in range(GRAPH_OPS):
            acc = acc + y
    res: dict[str, float] = {}
    stream = npu.Stream(dev, entries=1024)
    try:
        for name, where in (("default", npu.default_stream(dev)), ("stream", stream)):
            with where:

                def loop(name: str = name) -> None:
                    out = x
                    for _ in range(TENSOR_LOOP_OPS):
                        out = x + y
                    if not (out.numpy() == 3.5).all():
                        raise BenchError(f"tensor add on the {name} stream: wrong result")

                loop()
                runs = timed_runs(loop, UQ_RUNS)
                res[f"tensor_op_us_{name}"] = statistics.median(runs) / TENSOR_LOOP_OPS * 1e6
                graph.replay()
                graph.synchronize(WAIT_TIMEOUT_S)
                launch, total = [], []
                for _ in range(GRAPH_REPLAYS):
                    t0 = time.perf_counter()
                    graph.replay()
                    t1 = time.perf_counter()
                    graph.synchronize(WAIT_TIMEOUT_S)
                    launch.append(t1 - t0)
                    total.append(time.perf_counter() - t0)
                if not (acc.numpy() == 1.5 + 2.0 * GRAPH_OPS).all():
                    raise BenchError(f"graph replay on the {name} stream: wrong result")
                res[f"graph_submit_us_{name}"] = statistics.median(launch) / GRAPH_OPS * 1e6
                res[f"graph_op_us_{name}"] = statistics.median(total) / GRAPH_OPS * 1e6
    finally:
        stream.close()
    return res


def _empty_function() -> None:
    pass


def bench_import_npu() -> tuple[float, float]:
    """Seconds of ``python3 -c 'import npu'`` and of ``python3 -c pass`` (a fresh
    interpreter each, median of 5 after one warm-up)."""
    runtime = os.path.dirname(os.path.dirname(os.path.abspath(npu.__file__)))
    env = {**os.environ, "PYTHONPATH": runtime}

    def run(code: str) -> float:
        t0 = time.perf_counter()
        subprocess.run([sys.executable, "-c", code], env=env, check=True)
        return time.perf_counter() - t0

    run("import npu")
    with_import = statistics.median(run("import npu") for _ in range(5))
    bare = statistics.median(run("pass") for _ in range(5))
    return with_import, bare


def bench_python_call() -> float:
    """Microseconds of one call of an empty Python function (timeit), for scale."""
    fn = _empty_function
    total = min(timeit.repeat(fn, number=PY_CALL_LOOPS, repeat=3))
    return total / PY_CALL_LOOPS * 1e6


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
    """GB/s of np.copyto of 64 MiB into a preallocated array in the guest.

    A warm-up copy (it faults the pages in), then the median of COPY_RUNS
    copies, at least GUEST_RUNS."""
    src = np.arange(COPY_BYTES // 4, dtype=np.uint32)
    dst = np.zeros_like(src)
    sec, _ = guest_median_s(lambda: np.copyto(dst, src), COPY_RUNS)
    if not np.array_equal(dst, src):
        raise BenchError("guest memcpy: copy differs")
    return COPY_BYTES / sec / 1e9


def bench_memory(dev: npu.Device) -> dict[str, float]:
    """Host <-> device copies of COPY_BYTES and allocation costs (issue 5's figures).

    h2d/d2h: Tensor.copy_ between a device tensor and an npu.from_numpy
    tensor pinned once (the DMA engine, like CUDA's pinned memcpy); d2d: a
    device-to-device copy_; userptr_h2d: pin a fresh array, copy, unpin, per
    run; h2d_cpu: npu.tensor(x) (a host copy into mapped device memory).
    Median of COPY_RUNS, submit + wait. alloc_free: 1 MiB, BO_CREATE + mmap
    + BO_DESTROY against the caching allocator."""
    n = COPY_BYTES // 4
    x = np.arange(n, dtype=np.float32)
    y = np.zeros(n, np.float32)
    hx, hy = npu.from_numpy(x, device=dev), npu.from_numpy(y, device=dev)
    d1, d2 = npu.tensor(y, device=dev), npu.tensor(y, device=dev)

    def copy_s(dst: npu.Tensor, src: npu.Tensor) -> float:
        dst.copy_(src).wait(timeout_s=WAIT_TIMEOUT_S)  # warm-up
        return statistics.median(
            timed_runs(lambda: dst.copy_(src).wait(timeout_s=WAIT_TIMEOUT_S), COPY_RUNS)
        )

    res = {
        "h2d_gbps": COPY_BYTES / copy_s(d1, hx) / 1e9,
        "d2d_gbps": COPY_BYTES / copy_s(d2, d1) / 1e9,
        "d2h_gbps": COPY_BYTES / copy_s(hy, d2) / 1e9,
    }
    if not np.array_equal(y, x):
        raise BenchError("h2d -> d2d -> d2h: the data came back different")

    def userptr_h2d(dst: npu.Tensor = d1) -> None:
        dst.copy_(npu.from_numpy(x, device=dev)).wait(timeout_s=WAIT_TIMEOUT_S)

    res["userptr_h2d_gbps"] = (
        COPY_BYTES / statistics.median(timed_runs(userptr_h2d, COPY_RUNS)) / 1e9
    )
    res["h2d_cpu_gbps"] = (
        COPY_BYTES
        / statistics.median(timed_runs(lambda: npu.tensor(x, device=dev), COPY_RUNS))
        / 1e9
    )
    del hx, hy, d1, d2

    rounds = 200
    t0 = time.perf_counter()
    for _ in range(rounds):
        dev.alloc(MIB).free()
    res["alloc_free_us_ioctl"] = (time.perf_counter() - t0) / rounds * 1e6
    pool = allocator(dev)
    pool.allocate(MIB).release()  # warm: the segment exists
    rounds = 2000
    t0 = time.perf_counter()
    for _ in range(rounds):
        pool.allocate(MIB).release()
    res["alloc_free_us_cached"] = (time.perf_counter() - t0) / rounds * 1e6
    res["alloc_cached_speedup"] = res["alloc_free_us_ioctl"] / res["alloc_free_us_cached"]
    for key, value in res.items():
        log.info("%-22s %10.3f", key, value)
    return res


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

    A 256^3 probe (itself run once untimed first) estimates the time of one
    full-size run; if that is over GUEST_GEMM_BUDGET_S the measurement is
    made at 512 instead, and the reference for checking the NPU is then
    only the first REF_ROWS rows of a @ b (cheaper to compute). At the size
    used: one untimed warm-up run (its product is the reference at full
    size), then the median of GUEST_RUNS timed runs.
    """
    n = a.shape[0]
    probe = 256
    a_p, b_p = np.ascontiguousarray(a[:probe, :probe]), np.ascontiguousarray(b[:probe, :probe])
    probe_s, _ = guest_median_s(lambda: a_p @ b_p, 1)
    est = probe_s * (n / probe) ** 3
    log.info("guest numpy %d^3 probe: estimated %.1f s per %d^3 run", probe, est, n)
    if est > GUEST_GEMM_BUDGET_S:
        n = 512
    a_n, b_n = np.ascontiguousarray(a[:n, :n]), np.ascontiguousarray(b[:n, :n])
    dt, c = guest_median_s(lambda: a_n @ b_n)
    if n != a.shape[0]:
        c = a[:REF_ROWS] @ b
    return gemm_flop(n) / dt / 1e9, n, c


@dataclass
class TensorInputs:
    """Operands of the tensor-op benchmarks: host arrays and their device copies."""

    n: int
    x: np.ndarray  # (n, n) fp32
    y: np.ndarray  # (n, n) fp32
    row: np.ndarray  # (n,) fp32, broadcast over the rows of x
    tx: npu.Tensor
    ty: npu.Tensor
    trow: npu.Tensor

    @staticmethod
    def buf(t: npu.Tensor) -> npu.Buffer:
        """The tensor's buffer (a caching-allocator segment: its data starts at t.offset)."""
        assert t.buffer is not None
        return t.buffer


def tref_of(
    t: npu.Tensor, shape: tuple[int, ...] | None = None, strides: tuple[int, ...] | None = None
) -> Any:
    """A TensorRef of an uploaded tensor's data (at its offset in the segment)."""
    assert t.buffer is not None
    return npu.ops.tensor_ref(
        t.buffer, t.npu_dtype, t.shape if shape is None else shape, strides, t.offset * t.itemsize
    )


def numpy_gelu_tanh(x: np.ndarray) -> np.ndarray:
    """GELU, tanh approximation (fp32): the guest-numpy baseline for npu.gelu.

    The exact form needs erf, which numpy lacks (np.vectorize(math.erf) would
    take minutes in the guest). x**3 is written x*x*x, which numpy computes
    faster, so the baseline is the stronger one.
    """
    out: np.ndarray = 0.5 * x * (1 + np.tanh(0.79788456 * (x + 0.044715 * (x * x * x))))
    return out


def _ref(src: Any, dtype: npu.DType, n: int, strides: tuple[int, int] | None = None) -> Any:
    """An (n, n) TensorRef of a tensor's data or of a whole buffer."""
    if isinstance(src, npu.Tensor):
        assert src.npu_dtype is dtype
        return tref_of(src, (n, n), strides)
    return npu.ops.tensor_ref(src, dtype, (n, n), strides)


@dataclass(frozen=True)
class TensorBench:
    """One tensor op: the Tensor-API call, the same op into a preallocated
    output (npu.ops), the numpy baseline and the check tolerances."""

    name: str
    npu_fn: Callable[[TensorInputs], npu.Tensor]
    raw_fn: Callable[[TensorInputs, npu.Buffer], Any]  # -> TensorOp writing the buffer
    numpy_fn: Callable[[TensorInputs], np.ndarray]
    out_dtype: Any
    rtol: float
    atol: float


FP32, FP16 = npu.DType.FP32, npu.DType.FP16


def _unary_bench(name: str, kind: npu.UnaryKind, fn: Any, ref: Any, rtol: float) -> TensorBench:
    return TensorBench(
        name,
        lambda t: fn(t.tx),
        lambda t, out: npu.ops.unary(
            kind, _ref(t.tx, FP32, t.n), _ref(out, FP32, t.n), (t.buf(t.tx), out)
        ),
        ref,
        np.float32,
        rtol,
        1e-6,
    )


TENSOR_BENCHES: tuple[TensorBench, ...] = (
    TensorBench(
        "eltwise_add",
        lambda t: npu.add(t.tx, t.ty),
        lambda t, out: npu.ops.eltwise(
            npu.EltwiseKind.ADD,
            _ref(t.tx, FP32, t.n),
            _ref(t.ty, FP32, t.n),
            _ref(out, FP32, t.n),
            (t.buf(t.tx), t.buf(t.ty), out),
        ),
        lambda t: np.add(t.x, t.y),
        np.float32,
        1e-6,
        0.0,
    ),
    TensorBench(
        "eltwise_mul_bcast",
        lambda t: npu.multiply(t.tx, t.trow),
        lambda t, out: npu.ops.eltwise(
            npu.EltwiseKind.MUL,
            _ref(t.tx, FP32, t.n),
            _ref(t.trow, FP32, t.n, (0, 1)),
            _ref(out, FP32, t.n),
            (t.buf(t.tx), t.buf(t.trow), out),
        ),
        lambda t: np.multiply(t.x, t.row),
        np.float32,
        1e-6,
        0.0,
    ),
    _unary_bench("unary_relu", npu.UnaryKind.RELU, npu.relu, lambda t: np.maximum(t.x, 0), 0.0),
    # Checked against the tanh approximation (max abs difference from the
    # exact GELU ~5e-4), and GELU_EXACT_SAMPLES elements against math.erf.
    TensorBench(
        "unary_gelu",
        lambda t: npu.gelu(t.tx),
        lambda t, out: npu.ops.unary(
            npu.UnaryKind.GELU,
            _ref(t.tx, FP32, t.n),
            _ref(out, FP32, t.n),
            (t.buf(t.tx), out),
        ),
        lambda t: numpy_gelu_tanh(t.x),
        np.float32,
        0.0,
        1e-3,
    ),
    _unary_bench("unary_exp", npu.UnaryKind.EXP, npu.exp, lambda t: np.exp(t.x), 1e-5),
    _unary_bench(
        "unary_sigmoid",
        npu.UnaryKind.SIGMOID,
        npu.sigmoid,
        lambda t: 1 / (1 + np.exp(-t.x)),
        1e-5,
    ),
    TensorBench(
        "convert_fp32_fp16",
        lambda t: t.tx.astype(np.float16),
        lambda t, out: npu.ops.convert(
            _ref(t.tx, FP32, t.n), _ref(out, FP16, t.n), (t.buf(t.tx), out)
        ),
        lambda t: t.x.astype(np.float16),
        np.float16,
        1e-3,
        6e-8,
    ),
    TensorBench(
        "transpose",
        lambda t: t.tx.T.contiguous(),
        lambda t, out: npu.ops.convert(
            _ref(t.tx, FP32, t.n, (1, t.n)), _ref(out, FP32, t.n), (t.buf(t.tx), out)
        ),
        lambda t: np.ascontiguousarray(t.x.T),
        np.float32,
        0.0,
        0.0,
    ),
)


def check_tensor(got: np.ndarray, ref: np.ndarray, bench: TensorBench, what: str) -> None:
    """Raise BenchError unless got has ref's shape and dtype and is close to it."""
    if got.shape != ref.shape or got.dtype != np.dtype(bench.out_dtype):
        raise BenchError(
            f"{what}: got {got.dtype}{got.shape}, want {np.dtype(bench.out_dtype)}{ref.shape}"
        )
    g, r = got.astype(np.float32), ref.astype(np.float32)
    if not np.allclose(g, r, rtol=bench.rtol, atol=bench.atol):
        err = float(np.max(np.abs(g - r)))
        raise BenchError(f"{what}: result differs from numpy (max abs err {err:.3g})")


def check_gelu_exact(got: np.ndarray, x: np.ndarray, what: str) -> None:
    """Raise BenchError unless sampled elements of got match the exact (erf) GELU."""
    idx = np.random.default_rng(1).choice(x.size, GELU_EXACT_SAMPLES, replace=False)
    xs = x.reshape(-1)[idx].astype(np.float64)
    exact = np.array([0.5 * v * (1.0 + math.erf(v / math.sqrt(2.0))) for v in xs])
    gs = got.reshape(-1)[idx].astype(np.float64)
    if not np.allclose(gs, exact, rtol=1e-5, atol=1e-6):
        err = float(np.max(np.abs(gs - exact)))
        raise BenchError(f"{what}: differs from the exact GELU (max abs err {err:.3g})")


def npu_chain_us(fn: Callable[[], Any], wait: Callable[[Any], None]) -> tuple[float, Any]:
    """(median us per op, last result) of TENSOR_CHAIN calls of fn, then one wait.

    Every result of a chain stays referenced until the chain is timed, so no
    buffer is freed inside the timed region."""
    wait(fn())  # warm-up
    times = []
    last = None
    for _ in range(TENSOR_RUNS):
        outs = []
        t0 = time.perf_counter()
        for _ in range(TENSOR_CHAIN):
            outs.append(fn())
        wait(outs[-1])
        times.append(time.perf_counter() - t0)
        last = outs[-1]
        del outs
    return statistics.median(times) / TENSOR_CHAIN * 1e6, last


def graph_us(dev: npu.Device, t: TensorInputs, bench: TensorBench, ref: Any, key: str) -> float:
    """us per op of TENSOR_CHAIN Tensor-API calls captured in an npu.Graph and replayed.

    A replay is one SUBMIT of the packed ops and one WAIT, so this is the
    device's time per op with the dispatch shared by the whole chain."""
    g = npu.Graph(dev)
    with g.capture():
        outs = [bench.npu_fn(t) for _ in range(TENSOR_CHAIN)]
    g.replay()  # warm-up
    g.synchronize(WAIT_TIMEOUT_S)
    times = []
    for _ in range(TENSOR_RUNS):
        t0 = time.perf_counter()
        g.replay()
        g.synchronize(WAIT_TIMEOUT_S)
        times.append(time.perf_counter() - t0)
    check_tensor(outs[-1].numpy(timeout_s=WAIT_TIMEOUT_S), ref, bench, f"npu {key} (graph)")
    del outs, g
    return statistics.median(times) / TENSOR_CHAIN * 1e6


def bench_tensor_op(
    dev: npu.Device, t: TensorInputs, bench: TensorBench, size: str
) -> dict[str, float]:
    """This op's figures at one size: NPU (Tensor API and preallocated), guest numpy."""
    key = f"{bench.name}_{size}"
    # The warm-up run's result is the reference.
    numpy_s, ref = guest_median_s(lambda: bench.numpy_fn(t), TENSOR_NUMPY_RUNS)

    us_npu, last = npu_chain_us(lambda: bench.npu_fn(t), lambda r: r.wait(timeout_s=WAIT_TIMEOUT_S))
    got = last.numpy(timeout_s=WAIT_TIMEOUT_S)
    check_tensor(got, ref, bench, f"npu {key}")
    if bench.name == "unary_gelu":
        check_gelu_exact(got, t.x, f"npu {key}")
    del last, got

    itemsize = np.dtype(bench.out_dtype).itemsize
    with dev.alloc(t.n * t.n * itemsize) as out:
        view = out.numpy(bench.out_dtype, (t.n, t.n))
        view[:] = 0  # touch the pages before timing
        op = [bench.raw_fn(t, out)]
        us_raw, _ = npu_chain_us(
            lambda: dev.submit(op), lambda f: dev.wait(f, timeout_s=WAIT_TIMEOUT_S)
        )
        check_tensor(np.array(view), ref, bench, f"npu {key} (preallocated)")
        del view
    us_graph = graph_us(dev, t, bench, ref, key)

    us_numpy = numpy_s * 1e6
    log.info(
        "%-22s npu %8.0f us (prealloc %8.0f, graph %7.0f)  guest numpy %9.0f us"
        "  -> %6.1fx (%6.1fx, %6.1fx)",
        key,
        us_npu,
        us_raw,
        us_graph,
        us_numpy,
        us_numpy / us_npu,
        us_numpy / us_raw,
        us_numpy / us_graph,
    )
    return {
        f"{key}_us_npu": us_npu,
        f"{key}_us_npu_prealloc": us_raw,
        f"{key}_us_guest_numpy": us_numpy,
        f"{key}_speedup": us_numpy / us_npu,
        f"{key}_speedup_prealloc": us_numpy / us_raw,
        f"{key}_us_npu_graph": us_graph,
        f"{key}_speedup_graph": us_numpy / us_graph,
    }


def bench_tensor_ops(dev: npu.Device) -> dict[str, float]:
    """Every TENSOR_BENCHES op at every TENSOR_SIZES size, plus the minimum speedups."""
    res: dict[str, float] = {}
    for size, n in TENSOR_SIZES:
        rng = np.random.default_rng(n)
        x = rng.standard_normal((n, n), dtype=np.float32)
        y = rng.standard_normal((n, n), dtype=np.float32)
        row = rng.standard_normal(n, dtype=np.float32)
        t = TensorInputs(
            n,
            x,
            y,
            row,
            npu.tensor(x, device=dev),
            npu.tensor(y, device=dev),
            npu.tensor(row, device=dev),
        )
        for bench in TENSOR_BENCHES:
            res.update(bench_tensor_op(dev, t, bench, size))
        for suffix in ("", "_prealloc", "_graph"):
            res[f"tensor_ops_min_speedup_{size}{suffix}"] = min(
                res[f"{b.name}_{size}_speedup{suffix}"] for b in TENSOR_BENCHES
            )
        del t
    return res


def device_seconds(dev: npu.Device, batches: list[list[Any]], chain: int, runs: int) -> float:
    """Median seconds per round of `batches` (one SUBMIT each), `chain` rounds, one WAIT.

    Outputs are preallocated, so this is the device time plus the submits."""
    fence = 0
    for batch in batches:  # warm-up
        fence = dev.submit(batch)
    dev.wait(fence, timeout_s=WAIT_TIMEOUT_S)
    times = []
    for _ in range(runs):
        t0 = time.perf_counter()
        for _ in range(chain):
            for batch in batches:
                fence = dev.submit(batch)
        dev.wait(fence, timeout_s=WAIT_TIMEOUT_S)
        times.append((time.perf_counter() - t0) / chain)
    return statistics.median(times)


def check_matmul(got: np.ndarray, ref: np.ndarray, k: int, rtol: float, what: str) -> None:
    """Raise BenchError unless the first rows of got match ref within rtol * (|ref| + sqrt(k))."""
    top = got[: ref.shape[0]].astype(np.float64)
    err = np.abs(top - ref)
    bound = rtol * (np.abs(ref) + math.sqrt(k))
    if top.shape != ref.shape or not np.all(err <= bound):
        worst = float(np.max(err / bound)) if top.shape == ref.shape else float("inf")
        raise BenchError(f"{what}: result differs from numpy ({worst:.3g}x the tolerance)")


def bench_matmul_op(
    dev: npu.Device, a: np.ndarray, b: np.ndarray, ref: np.ndarray
) -> dict[str, float]:
    """GFLOP/s of the MATMUL op at 1024^3 in fp32, fp16 and bf16 (device time).

    Operands are uploaded once as tensors of each dtype; the output buffer
    is preallocated; submit + wait, median of GEMM_RUNS. fp32 is checked
    against ref (the fp32 GEMM reference), fp16/bf16 against numpy of the
    rounded inputs on the first MATMUL_REF_ROWS rows."""
    n = a.shape[0]
    res: dict[str, float] = {}
    for name, dtype in (("fp32", np.float32), ("fp16", np.float16), ("bf16", npu.bfloat16)):
        ta = npu.tensor(a, dtype=dtype, device=dev)
        tb = npu.tensor(b, dtype=dtype, device=dev)
        npu_dtype = ta.npu_dtype
        with dev.alloc(n * n * npu_dtype.itemsize) as out:
            assert ta.buffer is not None and tb.buffer is not None
            op = npu.ops.matmul_op(
                tref_of(ta),
                tref_of(tb),
                npu.ops.tensor_ref(out, npu_dtype, (n, n)),
                npu.ActKind.NONE,
                (ta.buffer, tb.buffer, out),
            )
            sec = device_seconds(dev, [[op]], 1, GEMM_RUNS)
            if npu_dtype is npu.DType.BF16:
                got = npu.bf16_to_float32(out.numpy(np.uint16, (n, n)))
            else:
                got = np.array(out.numpy(dtype, (n, n)))
        if name == "fp32":
            check_gemm(got, ref, n, "NPU MATMUL fp32")
        else:
            ha = ta.numpy()[:MATMUL_REF_ROWS].astype(np.float32)
            hb = tb.numpy().astype(np.float32)
            check_matmul(got, ha @ hb, n, MATMUL_RTOL[name], f"NPU MATMUL {name}")
        key = f"gemm_{name}_1024_gflops_npu" if name != "fp32" else "matmul_fp32_1024_gflops_npu"
        res[key] = gemm_flop(n) / sec / 1e9
        log.info("npu MATMUL %s %d^3: %.2f GFLOP/s", name, n, res[key])
        del ta, tb, got
    return res


def bench_gemm_int8(dev: npu.Device) -> dict[str, float]:
    """GOP/s of the integer MATMUL at GEMM_N^3: int8 operands, exact int32 accumulators.

    Operands are uploaded once; the int32 output buffer is preallocated;
    device time (submit + wait), median of GEMM_RUNS, 2 * n^3 operations per
    op. The first MATMUL_REF_ROWS rows must equal numpy's int64 product."""
    n = GEMM_N
    rng = np.random.default_rng(6)
    a = rng.integers(-128, 128, (n, n), dtype=np.int8)
    b = rng.integers(-128, 128, (n, n), dtype=np.int8)
    ta, tb = npu.tensor(a, device=dev), npu.tensor(b, device=dev)
    ba, bb = TensorInputs.buf(ta), TensorInputs.buf(tb)
    i32 = npu.DType.INT32
    with dev.alloc(n * n * i32.itemsize) as out:
        op = npu.ops.matmul_op(
            tref_of(ta),
            tref_of(tb),
            npu.ops.tensor_ref(out, i32, (n, n)),
            npu.ActKind.NONE,
            (ba, bb, out),
        )
        sec = device_seconds(dev, [[op]], 1, GEMM_RUNS)
        got = np.array(out.numpy(np.int32, (n, n))[:MATMUL_REF_ROWS])
    want = a[:MATMUL_REF_ROWS].astype(np.int64) @ b.astype(np.int64)
    if not np.array_equal(got, want):
        raise BenchError("NPU int8 MATMUL: the int32 result differs from numpy")
    gops = gemm_flop(n) / sec / 1e9
    log.info("npu MATMUL int8 -> int32 %d^3: %.2f GOP/s", n, gops)
    return {"gemm_int8_1024_gflops_npu": gops}


def bench_fused_epilogue(dev: npu.Device) -> dict[str, float]:
    """relu(x @ w.T + b) at FUSED_N^3 fp32: three ops (MATMUL, ELTWISE add, UNARY relu)
    against one LINEAR with relu; device time per round and the Tensor-API time."""
    n = FUSED_N
    rng = np.random.default_rng(5)
    x = rng.standard_normal((n, n), dtype=np.float32)
    w = rng.standard_normal((n, n), dtype=np.float32)
    bias = rng.standard_normal(n, dtype=np.float32)
    tx, tw, tb = (npu.tensor(v, device=dev) for v in (x, w, bias))
    bx, bw, bb = (TensorInputs.buf(t) for t in (tx, tw, tb))
    f32 = npu.DType.FP32
    xr = tref_of(tx)
    wt = tref_of(tw, strides=(1, n))  # w.T, a strided view
    ref = np.maximum(x[:MATMUL_REF_ROWS] @ w.T + bias, 0)
    nbytes = n * n * 4
    with dev.alloc(nbytes) as o1, dev.alloc(nbytes) as o2, dev.alloc(nbytes) as o3:
        r1, r2, r3 = (npu.ops.tensor_ref(o, f32, (n, n)) for o in (o1, o2, o3))
        unfused = [
            [npu.ops.matmul_op(xr, wt, r1, npu.ActKind.NONE, (bx, bw, o1))],
            [
                npu.ops.eltwise(
                    npu.EltwiseKind.ADD,
                    r1,
                    tref_of(tb, (1, n)),
                    r2,
                    (o1, bb, o2),
                )
            ],
            [npu.ops.unary(npu.UnaryKind.RELU, r2, r3, (o2, o3))],
        ]
        sec_unfused = device_seconds(dev, unfused, TENSOR_CHAIN, TENSOR_RUNS)
        check_matmul(np.array(o3.numpy(np.float32, (n, n))), ref, n, 1e-5, "unfused epilogue")
        o3.numpy(np.float32)[:] = 0
        fused = [
            [
                npu.ops.linear_op(
                    xr,
                    wt,
                    tref_of(tb, (1, n)),
                    r3,
                    npu.ActKind.RELU,
                    (bx, bw, bb, o3),
                )
            ]
        ]
        sec_fused = device_seconds(dev, fused, TENSOR_CHAIN, TENSOR_RUNS)
        check_matmul(np.array(o3.numpy(np.float32, (n, n))), ref, n, 1e-5, "fused LINEAR")

    def api_unfused() -> npu.Tensor:
        return npu.relu(npu.matmul(tx, tw.T) + tb)

    def api_fused() -> npu.Tensor:
        return npu.linear(tx, tw, tb, activation="relu")

    def wait(t: npu.Tensor) -> None:
        t.wait(timeout_s=WAIT_TIMEOUT_S)

    us_api_unfused, last_u = npu_chain_us(api_unfused, wait)
    us_api_fused, last_f = npu_chain_us(api_fused, wait)
    for what, t in (("npu.relu(x @ w.T + b)", last_u), ("npu.linear", last_f)):
        check_matmul(t.numpy(timeout_s=WAIT_TIMEOUT_S), ref, n, 1e-5, what)
    del last_u, last_f
    res = {
        "fused_epilogue_n": float(n),
        "fused_epilogue_us_unfused": sec_unfused * 1e6,
        "fused_epilogue_us_fused": sec_fused * 1e6,
        "fused_epilogue_speedup": sec_unfused / sec_fused,
        "fused_epilogue_us_unfused_tensor_api": us_api_unfused,
        "fused_epilogue_us_fused_tensor_api": us_api_fused,
        "fused_epilogue_speedup_tensor_api": us_api_unfused / us_api_fused,
    }
    log.info(
        "fused epilogue %d^3: 3 ops %.0f us, LINEAR %.0f us -> %.2fx (Tensor API %.2fx)",
        n,
        res["fused_epilogue_us_unfused"],
        res["fused_epilogue_us_fused"],
        res["fused_epilogue_speedup"],
        res["fused_epilogue_speedup_tensor_api"],
    )
    return res


def conv_flop(n: int, c: int, o: int, k: int, oh: int, ow: int) -> float:
    """Floating-point operations of a conv2d: 2 * N * O * C * KH * KW * OH * OW."""
    return 2.0 * n * o * c * k * k * oh * ow


def numpy_conv2d_im2col(x: np.ndarray, w: np.ndarray, b: np.ndarray, pad: int) -> np.ndarray:
    """conv2d (stride 1) of x [N, C, H, W] by im2col + one matmul, in x's dtype; NCHW result.

    The timed work: padding, the im2col copy ([N*OH*OW, C*KH*KW]), the
    matmul, the bias add and the transpose back to NCHW."""
    n, c = x.shape[:2]
    o, _, kh, kw = w.shape
    xp = np.pad(x, ((0, 0), (0, 0), (pad, pad), (pad, pad)))
    win = np.lib.stride_tricks.sliding_window_view(xp, (kh, kw), axis=(2, 3))
    oh, ow = win.shape[2], win.shape[3]
    cols = win.transpose(0, 2, 3, 1, 4, 5).reshape(n * oh * ow, c * kh * kw)
    y = cols @ w.reshape(o, c * kh * kw).T + b
    return np.ascontiguousarray(y.reshape(n, oh, ow, o).transpose(0, 3, 1, 2))


def check_conv(got: np.ndarray, ref: np.ndarray, k: int, what: str) -> None:
    """Raise BenchError unless got matches ref within CONV_RTOL * (|ref| + sqrt(k))."""
    err = np.abs(got.astype(np.float64) - ref)
    bound = CONV_RTOL * (np.abs(ref) + math.sqrt(k))
    if got.shape != ref.shape or not np.all(err <= bound):
        worst = float(np.max(err / bound)) if got.shape == ref.shape else float("inf")
        raise BenchError(f"{what}: result differs from numpy ({worst:.3g}x the tolerance)")


def bench_conv2d(dev: npu.Device) -> dict[str, float]:
    """CONV2D fp32 GFLOP/s on device-resident tensors (device time), the Tensor API
    time, guest numpy im2col + matmul on the same problem, and a 2x2 max pool."""
    n, c, o, hw, k = CONV_N, CONV_C, CONV_O, CONV_HW, CONV_K
    rng = np.random.default_rng(7)
    x = rng.standard_normal((n, c, hw, hw), dtype=np.float32)
    w = rng.standard_normal((o, c, k, k), dtype=np.float32)
    bias = rng.standard_normal(o, dtype=np.float32)
    res: dict[str, float] = {}

    # Guest numpy: probe batch 1 (cold); the whole batch if one run of it fits
    # the budget. At the batch used: a warm-up run (the reference), then the
    # median of GUEST_RUNS (at batch 1 the probe is the warm-up).
    t0 = time.perf_counter()
    ref1 = numpy_conv2d_im2col(x[:1], w, bias, 1)
    t1 = time.perf_counter() - t0
    guest_n = n if t1 * n <= CONV_GUEST_BUDGET_S else 1
    log.info("guest numpy conv2d batch 1: %.2f s (cold); measuring batch %d", t1, guest_n)
    if guest_n == 1:
        ref = ref1
        sec = statistics.median(
            timed_runs(lambda: numpy_conv2d_im2col(x[:1], w, bias, 1), GUEST_RUNS)
        )
    else:
        sec, ref = guest_median_s(lambda: numpy_conv2d_im2col(x, w, bias, 1))
    res["conv2d_fp32_gflops_guest_numpy"] = conv_flop(guest_n, c, o, k, hw, hw) / sec / 1e9
    res["conv2d_guest_numpy_batch"] = guest_n
    ref64 = ref.astype(np.float64)

    tx = npu.tensor(x, device=dev)
    tw = npu.tensor(w, device=dev)
    tb = npu.tensor(bias.reshape(1, o, 1, 1), device=dev)
    tref = npu.ops.tensor_ref
    fp32 = npu.DType.FP32
    with dev.alloc(n * o * hw * hw * 4) as obuf:
        bufs = tuple(TensorInputs.buf(t) for t in (tx, tw, tb))
        op = npu.ops.conv2d_op(
            tref_of(tx),
            tref_of(tw),
            tref_of(tb),
            tref(obuf, fp32, (n, o, hw, hw)),
            1,
            1,
            1,
            1,
            npu.ActKind.NONE,
            (*bufs, obuf),
        )
        sec = device_seconds(dev, [[op]], 1, CONV_RUNS)
        got = np.array(obuf.numpy(np.float32, (n, o, hw, hw)))
    check_conv(got[:guest_n], ref64, c * k * k, "NPU CONV2D fp32")
    res["conv2d_fp32_gflops_npu"] = conv_flop(n, c, o, k, hw, hw) / sec / 1e9
    log.info(
        "conv2d %dx%d->%d 3x3 on %dx%d: npu %.2f GFLOP/s, guest numpy %.3f GFLOP/s (batch %d)",
        n,
        c,
        o,
        hw,
        hw,
        res["conv2d_fp32_gflops_npu"],
        res["conv2d_fp32_gflops_guest_numpy"],
        guest_n,
    )

    # The Tensor API: npu.conv2d (fresh output each call) + wait.
    def api() -> npu.Tensor:
        y = npu.conv2d(tx, tw, tb.reshape(o), padding=1)
        y.wait(timeout_s=WAIT_TIMEOUT_S)
        return y

    y = api()
    check_conv(y.numpy()[:guest_n], ref64, c * k * k, "npu.conv2d")
    del y
    api_s = statistics.median(timed_runs(api, CONV_RUNS))
    res["conv2d_fp32_gflops_npu_tensor_api"] = conv_flop(n, c, o, k, hw, hw) / api_s / 1e9

    # 2x2 max pool of the conv output (8 x 64 x 56 x 56 -> 28 x 28).
    ty = npu.tensor(got, device=dev)
    pooled = npu.max_pool2d(ty, 2)
    blocks = (n, o, hw // 2, 2, hw // 2, 2)
    pool_s, want = guest_median_s(lambda: got.reshape(blocks).max(axis=(3, 5)))
    res["maxpool2d_fp32_us_guest_numpy"] = pool_s * 1e6
    if not np.array_equal(pooled.numpy(), want):
        raise BenchError("NPU max_pool2d differs from numpy")
    with dev.alloc(want.nbytes) as pbuf:
        pop = npu.ops.pool2d_op(
            npu.PoolKind.MAX,
            tref_of(ty),
            tref(pbuf, fp32, want.shape),
            2,
            buffers=(TensorInputs.buf(ty), pbuf),
        )
        res["maxpool2d_fp32_us_npu"] = device_seconds(dev, [[pop]], 4, CONV_RUNS) * 1e6
    res["maxpool2d_npu_vs_guest_numpy"] = (
        res["maxpool2d_fp32_us_guest_numpy"] / res["maxpool2d_fp32_us_npu"]
    )
    res["conv2d_npu_vs_guest_numpy"] = (
        res["conv2d_fp32_gflops_npu"] / res["conv2d_fp32_gflops_guest_numpy"]
    )
    log.info(
        "max_pool2d 2x2 of %s: npu %.0f us, guest numpy %.0f us",
        got.shape,
        res["maxpool2d_fp32_us_npu"],
        res["maxpool2d_fp32_us_guest_numpy"],
    )
    return res


# Independent 1x1 convolutions (Inception-like branch heads): each small
# enough (3.2M multiply-adds) that the device runs it on one core.
BRANCH_CONVS = 8
BRANCH_SHAPE = (1, 64, 64, 28)  # N, C, O, H = W


def bench_concurrent(dev: npu.Device) -> dict[str, float]:
    """Independent small CONV2Ds one after another against flagged concurrent
    (Cap.CONCURRENT): device time per round, and the results must agree."""
    n, c, o, hw = BRANCH_SHAPE
    rng = np.random.default_rng(11)
    tx = npu.tensor(rng.standard_normal((n, c, hw, hw), dtype=np.float32), device=dev)
    tw = npu.tensor(rng.standard_normal((o, c, 1, 1), dtype=np.float32), device=dev)
    tb = npu.tensor(np.zeros((1, o, 1, 1), np.float32), device=dev)
    bufs = tuple(TensorInputs.buf(t) for t in (tx, tw, tb))
    fp32 = npu.DType.FP32
    outs = [dev.alloc(n * o * hw * hw * 4) for _ in range(BRANCH_CONVS)]
    try:

        def conv(out: npu.Buffer) -> npu.ops.TensorOp:
            oref = npu.ops.tensor_ref(out, fp32, (n, o, hw, hw))
            args = (tref_of(tx), tref_of(tw), tref_of(tb), oref, 1, 0, 1, 1)
            return npu.ops.conv2d_op(*args, npu.ActKind.NONE, (*bufs, out))

        ops = [conv(out) for out in outs]
        flagged = [ops[0], *(op.with_concurrent() for op in ops[1:])]
        times = {"sequential": [], "concurrent": []}
        device_seconds(dev, [ops, flagged], 1, 1)  # warm-up
        for _ in range(CONV_RUNS):  # interleaved, so drift hits both alike
            times["sequential"].append(device_seconds(dev, [ops], 4, 1))
            times["concurrent"].append(device_seconds(dev, [flagged], 4, 1))
        first = np.array(outs[0].numpy(np.float32, (n * o * hw * hw,)))
        if not all(np.array_equal(first, b.numpy(np.float32, (first.size,))) for b in outs):
            raise BenchError("concurrent CONV2Ds differ from one another")
    finally:
        for out in outs:
            out.free()
    seq = statistics.median(times["sequential"])
    con = statistics.median(times["concurrent"])
    log.info(
        "%d independent 1x1 CONV2Ds %s: %.2f ms one after another, %.2f ms concurrent",
        BRANCH_CONVS, BRANCH_SHAPE, seq * 1e3, con * 1e3,
    )  # fmt: skip
    return {
        "branch_convs_ms_sequential": seq * 1e3,
        "branch_convs_ms_concurrent": con * 1e3,
        "branch_convs_concurrent_speedup": seq / con,
    }


def main() -> int:
    """Run every benchmark; print the JSON result; 0 on success, 1 on a wrong result."""
    logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="bench_npu: %(message)s")
    found = npu.devices()
    if not found:
        log.error("no NPU found: is the driver loaded? (insmod kernel_module/npu.ko)")
        return 1
    result: dict[str, Any] = {"guest_env": guest_environment()}
    blas = result["guest_env"]["blas"]
    log.info(
        "guest numpy %s on %s (%s; %s)",
        np.__version__,
        blas["library"],
        blas["source"],
        blas.get("openblas_config") or blas.get("version") or "version unknown",
    )
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
            if info.user_queues:
                uq = bench_user_queue(dev)
                result.update(uq)
                log.info(
                    "per op: SUBMIT %.1f us, user queue %.1f us (batched %.1f us); "
                    "round trip: spin %.1f us, block %.1f us; %.1f irqs per 1000 ops "
                    "(%.0f with an interrupt asked by each)",
                    uq["op_us_ioctl_submit"],
                    uq["op_us_user_queue"],
                    uq["op_us_user_queue_batched"],
                    uq["roundtrip_us_spin"],
                    uq["roundtrip_us_block"],
                    uq["irqs_per_1000_ops"],
                    uq["irqs_per_1000_flagged_ops"],
                )
                if info.has(npu.Cap.TENSOR):
                    result["stream_op_us"] = bench_stream_ops(dev)
                    log.info("stream ELTWISE add %.1f us per op", result["stream_op_us"])
                    st = bench_stream_tensors(dev)
                    result.update(st)
                    log.info(
                        "tensor x + y per op: default %.0f us, stream %.0f us; graph replay "
                        "per op: launch %.2f / %.2f us, with sync %.2f / %.2f us",
                        st["tensor_op_us_default"],
                        st["tensor_op_us_stream"],
                        st["graph_submit_us_default"],
                        st["graph_submit_us_stream"],
                        st["graph_op_us_default"],
                        st["graph_op_us_stream"],
                    )
            else:
                log.warning("the driver lends no user queues: user-queue figures skipped")
            result["python_call_us"] = bench_python_call()
            log.info("empty python call %.3f us", result["python_call_us"])
            result["import_npu_s"], result["python_start_s"] = bench_import_npu()
            log.info(
                "python3 -c 'import npu' %.2f s (python3 -c pass %.2f s)",
                result["import_npu_s"],
                result["python_start_s"],
            )
            result["dma_copy_gbps"] = bench_dma_copy(dev)
            log.info("dma copy %.2f GB/s", result["dma_copy_gbps"])
            result["guest_memcpy_gbps"] = bench_guest_memcpy()
            log.info("guest memcpy %.2f GB/s", result["guest_memcpy_gbps"])
            result.update(bench_memory(dev))

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
            if info.has(npu.Cap.MATMUL):
                result.update(bench_matmul_op(dev, a, b, ref))
            del a, b, ref
            if info.has(npu.Cap.QUANT):
                result.update(bench_gemm_int8(dev))
            else:
                log.warning("the device has no int8 MATMUL: gemm_int8 figure skipped")
            if info.has(npu.Cap.MATMUL):
                result.update(bench_fused_epilogue(dev))
            else:
                log.warning("the device has no MATMUL op: MATMUL and fused figures skipped")

            if info.has(npu.Cap.CONV):
                t_conv = time.perf_counter()
                result.update(bench_conv2d(dev))
                result["conv_bench_s"] = time.perf_counter() - t_conv
            else:
                log.warning("the device has no CONV2D op: conv2d figures skipped")
            if info.has(npu.Cap.CONV) and info.has(npu.Cap.CONCURRENT):
                result.update(bench_concurrent(dev))

            t_tensor = time.perf_counter()
            result.update(bench_tensor_ops(dev))
            result["tensor_bench_s"] = time.perf_counter() - t_tensor
            log.info("tensor ops: %.1f s", result["tensor_bench_s"])
    except BenchError as e:
        log.error("WRONG RESULT: %s", e)
        return 1
    result["guest_bench_s"] = time.perf_counter() - t_start
    print(json.dumps(result, sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.exit(main())
