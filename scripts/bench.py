#!/usr/bin/env python3
"""Benchmark the NPU stack end to end and compare it with numpy.

Boots the guest (scripts/guest.py), loads the driver, runs
examples/bench_npu.py, examples/bench_inference.py (the ONNX models),
examples/bench_devmem.py (device memory), examples/bench_driver.py (PRIME
import, runtime resume), the ioctl fuzzer (tests/stress/fuzz_model.py:
calls per second), examples/bench_models.py (real architectures from
``make zoo``), examples/bench_profiler.py (what npu.profiler costs a
model run) and examples/bench_recovery.py
(hang detection and reset recovery) in the guest, then measures numpy and
onnxruntime (scripts/bench_host_ort.py: the same architectures) on
the host in the same run, the engine-control figures through qtest
(scripts/bench_engine.py: tile time, reset abort, preemption latency), and
writes everything, with ratios and the
targets, to build/bench.json, and draws docs/img/models_vs_host_ort.png
(the NPU against host onnxruntime per model). The JSON is also printed on stdout;
diagnostics go to stderr through logging. ``make bench`` builds QEMU, the
guest and the module first; this script builds nothing.

``meta`` records what the baselines ran on: the guest scripts report a
``guest_env`` object (bench_npu.py: Python, numpy, the BLAS numpy actually
uses and the CPU count; bench_inference.py: onnxruntime), which becomes
``meta.guest_python``, ``meta.guest_numpy``, ``meta.guest_blas``,
``meta.guest_cpus``, ``meta.guest_onnxruntime`` (null if not importable)
and ``meta.guest_onnxruntime_threads``; the Debian image's build-time
package versions and BLAS alternative ($NPU_CACHE/guest/current/versions
and blas) become ``meta.guest_image_versions`` and ``meta.guest_image_blas``
and are cross-checked against what the guest reported (a warning if they
differ).

Usage::

    scripts/bench.py [--out build/bench.json] [--quick] [--strict]
                     [--guest-baselines] [-v]

``--quick`` passes BENCH_QUICK=1 to the guest side (fewer repetitions).
``--strict`` also exits 1 when a target is missed (default: only when a
benchmark fails or a result is wrong). See docs/benchmarks.md for the keys.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import logging
import os
import platform
import re
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "scripts"))

import bench_engine  # noqa: E402
import bench_host_ort  # noqa: E402
import bench_kernels  # noqa: E402
import ci_times  # noqa: E402
import onnx_conformance  # noqa: E402

from guest import GUEST_DIR, Guest, GuestError, bad_dmesg_lines, qemu_argv  # noqa: E402

log = logging.getLogger("bench")

# Run one after the other in the same guest; their JSON results are merged.
# The recovery benchmark resets the device over and over: it runs last.
GUEST_CMDS = (
    "python3 examples/bench_npu.py",
    "python3 examples/bench_inference.py",
    "python3 examples/bench_devmem.py",
    "python3 examples/bench_driver.py",
    # The ioctl fuzzer's rate (fuzz_calls_per_s): 20,000 calls (quick: 5,000).
    "python3 -m tests.stress.fuzz_model",
    # ResNet-50 end to end on the NPU (per-layer split). Its in-guest
    # onnxruntime and numpy baselines take over 15 minutes under TCG and
    # compare against a CPU no user has: --guest-baselines (make
    # bench-guest-baselines) adds them; the comparison that counts is host
    # onnxruntime's (scripts/bench_host_ort.py).
    "python3 examples/infer_resnet50.py --json --no-baselines",
    # DenseNet-121, Inception v2, SqueezeNet, ShuffleNet v2, MobileNet v2, VGG-19
    # (make zoo) on the NPU: batch 1 and batch 8 (the host's onnxruntime runs
    # them after QEMU has exited: scripts/bench_host_ort.py).
    "python3 examples/bench_models.py --json",
    # int8 (QDQ) digits CNN and small ResNet against their fp32 models on the NPU.
    "python3 examples/infer_int8.py --json",
    # torch.compile(backend="npu") on ResNet-18 against eager torch in the guest.
    "python3 examples/torch_compile_resnet18.py --json --runs 2",
    # npu.profiler.profile() around the digits CNN at batch 64 (profiler_overhead).
    "python3 examples/bench_profiler.py",
    # npu-smi diag on the four injected stuck jobs (it resets the device twice).
    "python3 examples/bench_diag.py",
    "python3 examples/bench_recovery.py",
)
GUEST_TIMEOUT_S = 900.0
# What --guest-baselines puts in place of ResNet-50's NPU-only run, and its
# time: onnxruntime and numpy under TCG at batch 1 and 8 (over 15 minutes
# on a busy host).
RESNET50_NPU_ONLY = "python3 examples/infer_resnet50.py --json --no-baselines"
RESNET50_WITH_BASELINES = "python3 examples/infer_resnet50.py --json"
GUEST_TIMEOUTS_S = {RESNET50_WITH_BASELINES: 2700.0}
# Guest memory unless NPU_MEM says otherwise: VGG-19 (examples/bench_models.py)
# holds its 548 MiB model, weights and device buffers at once, more than the
# 2 GiB that scripts/guest.py gives by default.
GUEST_MEM = "4G"
# guest_env keys that meta always has (as guest_<key>, null when no guest
# script reported them); the guest scripts may report more.
GUEST_ENV_KEYS = ("python", "numpy", "blas", "cpus", "onnxruntime")
# Debian packages of the guest image whose upstream version must match what
# the guest reports: (package in the versions file, guest_env key).
GUEST_IMAGE_PACKAGES = (
    ("python3", "python"),
    ("python3-numpy", "numpy"),
    ("python3-onnxruntime", "onnxruntime"),
)
GEMM_N = 1024
COPY_BYTES = 64 << 20
HOST_RUNS = 5

# The targets of the issue: (result key, comparison, threshold, description).
# The chip timing model: one guest per chip description (docs/npu-spec.md 12.2).
TIMING_CHIPS = ("edge", "datacenter")
TARGETS: list[tuple[str, str, float, str]] = [
    ("reset_abort_ms", "<=", 10.0, "a reset during a GEMM answers within 10 ms"),
    # "Preemption within one tile": the NOP's latency beyond an idle NOP's.
    ("preempt_tiles", "<=", 1.0, "a priority-3 NOP waits at most one tile of a GEMM"),
    ("gemm_npu_vs_guest_numpy", ">=", 50.0, "NPU GEMM >= 50x numpy in the guest"),
    ("gemm_npu_vs_host_numpy", ">=", 0.5, "NPU GEMM >= 0.5x numpy on the host"),
    ("boot_s", "<=", 30.0, "boot to shell <= 30 s"),
    # "Every op at least 20x faster than numpy in the guest for tensors of 256K
    # elements or more": the slowest op at each measured size (the guest
    # computes these minimums, Tensor-API figures).
    (
        "tensor_ops_min_speedup_256k",
        ">=",
        20.0,
        "every tensor op >= 20x numpy in the guest at 256K elements",
    ),
    (
        "tensor_ops_min_speedup_1m",
        ">=",
        20.0,
        "every tensor op >= 20x numpy in the guest at 1M elements",
    ),
    # The same through an npu.Graph (the chain captured once, replayed with
    # one SUBMIT): the device's time per op with the dispatch shared.
    (
        "tensor_ops_min_speedup_256k_graph",
        ">=",
        20.0,
        "every tensor op >= 20x numpy in the guest at 256K elements, npu.Graph replay",
    ),
    (
        "tensor_ops_min_speedup_1m_graph",
        ">=",
        20.0,
        "every tensor op >= 20x numpy in the guest at 1M elements, npu.Graph replay",
    ),
    (
        "conv2d_npu_vs_host_numpy",
        ">=",
        0.5,
        "NPU conv2d >= 0.5x numpy im2col + matmul on the host",
    ),
    # Issue 5: copies through pinned memory and the caching allocator.
    ("h2d_vs_host_memcpy", ">=", 0.5, "H2D >= 0.5x host memcpy (outside the guest)"),
    # Issue 16: a dma-buf imported from another driver (udmabuf) copied into.
    (
        "dmabuf_import_copy_vs_host_memcpy",
        ">=",
        0.5,
        "a device COPY into an imported 64 MiB udmabuf >= 0.5x host memcpy",
    ),
    ("d2h_vs_host_memcpy", ">=", 0.5, "D2H >= 0.5x host memcpy (outside the guest)"),
    ("h2d_vs_guest_memcpy", ">=", 1.0, "H2D above guest memcpy"),
    ("d2h_vs_guest_memcpy", ">=", 1.0, "D2H above guest memcpy"),
    ("alloc_cached_speedup", ">=", 20.0, "cached allocation >= 20x cheaper than BO_CREATE"),
    # Issue 6: user-mode submission. One op at a time from Python
    # (op_us_user_queue) and prebuilt (a graph replayed on an npu.Stream).
    (
        "user_queue_vs_ioctl_submit",
        "<=",
        1 / 3,
        "user-mode submission <= 1/3 of the ioctl path's per-op cost",
    ),
    (
        "user_queue_vs_python_call",
        "<=",
        5.0,
        "user-mode submission, one op at a time, <= 5x an empty Python call",
    ),
    (
        "graph_submit_stream_vs_python_call",
        "<=",
        5.0,
        "user-mode submission of a prebuilt graph on a stream <= 5x an empty Python call",
    ),
    ("irqs_per_1000_ops", "<=", 10.0, "<= 10 interrupts per 1,000 batched ops"),
    # Issue 4: ONNX models through npu.InferenceSession (examples/bench_inference.py).
    (
        "digits_cnn_b64_npu_vs_guest_numpy",
        ">=",
        20.0,
        "digits CNN at batch 64 >= 20x numpy in the guest (images/s)",
    ),
    (
        "resnet_b8_npu_vs_guest_numpy",
        ">=",
        20.0,
        "ResNet-style net at batch 8 >= 20x numpy in the guest (images/s)",
    ),
    # Issue 18: every real architecture at batch 1 at least as fast on the NPU in
    # the guest as on onnxruntime on the host (scripts/bench_host_ort.py).
    (
        "models_b1_vs_host_ort_min",
        ">=",
        1.0,
        "every real architecture at batch 1 >= 1.0x onnxruntime on the host",
    ),
    # Issue 18: pipelined batches (InferenceSession.run_async, examples/infer_resnet50.py).
    (
        "resnet50_b8_pipelined_speedup",
        ">=",
        1.3,
        "pipelined batch-8 ResNet-50 >= 1.3x the same requests one after another",
    ),
    # Issue 18: parallel branches (Cap.CONCURRENT, examples/bench_models.py).
    (
        "inception_v2_b1_concurrent_speedup",
        ">=",
        1.0,
        "Inception v2 at batch 1 with its branches concurrent >= 1.0x one op at a time",
    ),
    # Issue 19: npu-smi diag places each injected stuck job (examples/bench_diag.py).
    (
        "diag_verdicts_correct",
        ">=",
        4.0,
        "npu-smi diag right in 4 of 4 injected cases (host, firmware, engine, interrupt)",
    ),
    # Issue 17: int8 models within 1 point of fp32 (examples/infer_int8.py).
    (
        "digits_cnn_int8_accuracy_drop",
        "<=",
        0.01,
        "the int8 digits CNN's test accuracy at most 1 point below fp32's",
    ),
    # Issue 19: every layer recorded costs a digits-CNN batch-64 run at most 10%.
    (
        "profiler_overhead",
        "<=",
        0.10,
        "digits CNN batch 64 at most 10% slower inside npu.profiler.profile()",
    ),
    # Issue 19: the timing model against the chip description's own roofline.
    *(
        (
            f"timing_model_{op}_error_pct_{chip}",
            "<=",
            5.0,
            f"timing mode {op} within 5% of the {chip} roofline",
        )
        for op in ("gemm", "conv")
        for chip in TIMING_CHIPS
    ),
]
# CONV2D problem of examples/bench_npu.py: N, C, O, H = W, K (padding 1).
CONV_SHAPE = (8, 64, 64, 56, 3)


class BenchFailed(RuntimeError):
    """The benchmark could not run or produced a wrong result."""


def median_seconds(fn: Callable[[], Any], runs: int) -> float:
    """Median wall-clock seconds of `runs` calls of fn, after one warm-up call."""
    fn()
    times = []
    for _ in range(runs):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def host_numpy_gemm_gflops(n: int = GEMM_N) -> float:
    """GFLOP/s of numpy's fp32 n x n x n a @ b on the host, median of HOST_RUNS."""
    rng = np.random.default_rng(0)
    a = rng.standard_normal((n, n), dtype=np.float32)
    b = rng.standard_normal((n, n), dtype=np.float32)
    c = np.empty((n, n), dtype=np.float32)
    dt = median_seconds(lambda: np.matmul(a, b, out=c), HOST_RUNS)
    return 2.0 * n**3 / dt / 1e9


def numpy_conv2d_im2col(x: np.ndarray, w: np.ndarray, b: np.ndarray, pad: int) -> np.ndarray:
    """conv2d (stride 1) of NCHW x by im2col + one matmul (as examples/bench_npu.py)."""
    n, c, _, _ = x.shape
    o, _, kh, kw = w.shape
    xp = np.pad(x, ((0, 0), (0, 0), (pad, pad), (pad, pad)))
    win = np.lib.stride_tricks.sliding_window_view(xp, (kh, kw), axis=(2, 3))
    oh, ow = win.shape[2], win.shape[3]
    cols = win.transpose(0, 2, 3, 1, 4, 5).reshape(n * oh * ow, c * kh * kw)
    y = cols @ w.reshape(o, c * kh * kw).T + b
    return np.ascontiguousarray(y.reshape(n, oh, ow, o).transpose(0, 3, 1, 2))


def host_numpy_conv2d_gflops() -> float:
    """GFLOP/s of the fp32 CONV_SHAPE conv2d as numpy im2col + matmul on the host.

    Median of HOST_RUNS; checked on one output pixel per channel against a
    direct float64 sum."""
    n, c, o, hw, k = CONV_SHAPE
    rng = np.random.default_rng(7)
    x = rng.standard_normal((n, c, hw, hw), dtype=np.float32)
    w = rng.standard_normal((o, c, k, k), dtype=np.float32)
    b = rng.standard_normal(o, dtype=np.float32)
    out: list[np.ndarray] = []
    dt = median_seconds(lambda: out.append(numpy_conv2d_im2col(x, w, b, 1)), HOST_RUNS)
    y = out[-1]
    want = (x[3, :, 9 : 9 + k, 19 : 19 + k].astype(np.float64) * w).sum(axis=(1, 2, 3)) + b
    if y.shape != (n, o, hw, hw) or not np.allclose(y[3, :, 10, 20], want, rtol=1e-4, atol=1e-3):
        raise BenchFailed("host numpy conv2d: result differs from a direct sum")
    return 2.0 * n * o * c * k * k * hw * hw / dt / 1e9


def host_memcpy_gbps(nbytes: int = COPY_BYTES) -> float:
    """GB/s (1e9 bytes/s) of np.copyto of nbytes into a preallocated array on the host."""
    src = np.arange(nbytes // 4, dtype=np.uint32)
    dst = np.empty_like(src)
    dt = median_seconds(lambda: np.copyto(dst, src), HOST_RUNS)
    if not np.array_equal(dst, src):
        raise BenchFailed("host memcpy: copy differs")
    return nbytes / dt / 1e9


def host_numpy_threads() -> dict[str, Any] | None:
    """BLAS thread pools numpy uses (threadpoolctl), or None if it is not installed."""
    try:
        from threadpoolctl import threadpool_info  # type: ignore[import-not-found]
    except ImportError:
        return None
    pools = threadpool_info()
    return {
        "num_threads": max((p.get("num_threads", 0) for p in pools), default=0),
        "pools": [
            {k: p.get(k) for k in ("internal_api", "num_threads", "version", "architecture")}
            for p in pools
        ],
    }


def git_commit() -> str | None:
    """HEAD's commit, with "-dirty" if the tree has changes; None outside git."""
    try:
        head = subprocess.run(
            ["git", "-C", str(ROOT), "rev-parse", "HEAD"],
            check=True,
            capture_output=True,
            text=True,
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "-C", str(ROOT), "status", "--porcelain", "--untracked-files=no"],
            check=True,
            capture_output=True,
            text=True,
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return None
    return head + ("-dirty" if dirty else "")


def host_cpu_model() -> str:
    """The host CPU's model name from /proc/cpuinfo (platform.processor() otherwise)."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor()


def guest_image_meta() -> dict[str, Any]:
    """The Debian guest image's build-time records: guest_image_versions and
    guest_image_blas.

    ``guest_image_versions``: {package: Debian version} from
    $NPU_CACHE/guest/current/versions ("package version" lines);
    ``guest_image_blas``: the libblas.so.3 alternative resolved at build
    time ($NPU_CACHE/guest/current/blas). Each is None when its file is
    missing or another image is booted (NPU_GUEST=buildroot)."""
    meta: dict[str, Any] = {"guest_image_versions": None, "guest_image_blas": None}
    if (os.environ.get("NPU_GUEST", "").strip() or "debian") != "debian":
        return meta
    try:
        lines = (GUEST_DIR / "versions").read_text().splitlines()
    except OSError:
        pass
    else:
        pairs = (line.split(None, 1) for line in lines)
        meta["guest_image_versions"] = {p[0]: p[1].strip() for p in pairs if len(p) == 2}
    with contextlib.suppress(OSError):
        meta["guest_image_blas"] = (GUEST_DIR / "blas").read_text().strip() or None
    return meta


def debian_upstream(version: str) -> str:
    """The upstream part of a Debian version: "1:2.2.4+ds-1" -> "2.2.4"."""
    return re.split(r"[+~-]", re.sub(r"^\d+:", "", version), maxsplit=1)[0]


def same_version(debian: str, reported: str) -> bool:
    """Whether a Debian package version is the version a module reports, ignoring
    trailing ".0" parts: "1.21.0+dfsg-1" is onnxruntime "1.21"."""

    def parts(v: str) -> list[str]:
        p = v.split(".")
        while len(p) > 1 and p[-1] == "0":
            p.pop()
        return p

    return parts(debian_upstream(debian)) == parts(reported)


def guest_meta(env: dict[str, Any]) -> dict[str, Any]:
    """meta's guest_<key> entries from the merged guest_env reports of the guest
    scripts (every GUEST_ENV_KEYS key present, None if not reported)."""
    meta: dict[str, Any] = {f"guest_{k}": None for k in GUEST_ENV_KEYS}
    meta.update({f"guest_{k}": v for k, v in env.items()})
    return meta


def check_guest_meta(meta: dict[str, Any]) -> list[str]:
    """Disagreements between what the guest reported and the image's build-time
    records or the QEMU setup, one readable line each (logged as warnings)."""
    problems = []
    versions = meta.get("guest_image_versions") or {}
    for package, key in GUEST_IMAGE_PACKAGES:
        built, got = versions.get(package), meta.get(f"guest_{key}")
        if built is None:
            continue
        if got is None:
            problems.append(f"the image has {package} {built}, but the guest reported no {key}")
        elif not same_version(built, str(got)):
            problems.append(f"the image has {package} {built}, the guest reported {key} {got}")
    blas = meta.get("guest_blas") or {}
    image_blas = meta.get("guest_image_blas")
    if image_blas and blas.get("alternative") and blas["alternative"] != image_blas:
        problems.append(
            f"the image's libblas.so.3 alternative was {image_blas}, "
            f"the guest's is {blas['alternative']}"
        )
    cpus = meta.get("guest_cpus")
    if cpus is not None and cpus != meta.get("guest_smp"):
        problems.append(f"guest_smp is {meta.get('guest_smp')}, the guest has {cpus} CPUs")
    return problems


def metadata() -> dict[str, Any]:
    """When, what and where: date, commit, QEMU accelerator, the host and the
    guest image's build-time records (:func:`guest_image_meta`)."""
    argv = qemu_argv()
    accel = argv[argv.index("-accel") + 1] if "-accel" in argv else "unknown"
    return {
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "git_commit": git_commit(),
        "qemu_accel": accel,
        "guest_kernel": os.environ.get("NPU_KERNEL", "").strip() or "distro",
        "guest_smp": int(os.environ.get("NPU_SMP", "").strip() or 1),
        "guest_mem": os.environ.get("NPU_MEM", "").strip() or "2G",
        "host_cpu": host_cpu_model(),
        "host_cpus": os.cpu_count(),
        "host_numpy": np.__version__,
        "openblas_coretype": os.environ.get("OPENBLAS_CORETYPE"),
        **guest_image_meta(),
    }


class _LineLogger:
    """Feeds streamed guest output to the log one line at a time."""

    def __init__(self) -> None:
        self._partial = ""

    def __call__(self, chunk: str) -> None:
        lines = (self._partial + chunk).split("\n")
        self._partial = lines.pop()
        for line in lines:
            log.info("guest| %s", line)

    def flush(self) -> None:
        if self._partial:
            log.info("guest| %s", self._partial)
            self._partial = ""


def parse_guest_json(output: str) -> dict[str, Any]:
    """The JSON object on the last JSON-looking line of the guest's output."""
    for line in reversed(output.splitlines()):
        line = line.strip()
        if line.startswith("{") and line.endswith("}"):
            result: dict[str, Any] = json.loads(line)
            return result
    raise BenchFailed("guest benchmark printed no JSON result")


def guest_cmds(guest_baselines: bool) -> list[str]:
    """The in-guest benchmark commands, with ResNet-50's slow in-guest
    baselines only when asked for."""
    if not guest_baselines:
        return list(GUEST_CMDS)
    return [RESNET50_WITH_BASELINES if c == RESNET50_NPU_ONLY else c for c in GUEST_CMDS]


def run_guest(quick: bool, guest_baselines: bool = False) -> tuple[float, dict[str, Any]]:
    """Boot the guest, load the driver, run the in-guest benchmarks: (boot_s, their JSON).

    The scripts' JSON objects are merged, except their ``guest_env`` objects
    (facts about the guest), which are merged into one ``guest_env``."""
    log.info("booting the guest")
    with Guest() as g:
        assert g.boot_s is not None
        log.info("guest shell after %.1f s; loading the driver", g.boot_s)
        g.load_module()
        result: dict[str, Any] = {}
        env: dict[str, Any] = {}
        for guest_cmd in guest_cmds(guest_baselines):
            mark = g.dmesg_mark()
            cmd = ("BENCH_QUICK=1 " if quick else "") + guest_cmd
            log.info("guest: %s", cmd)
            stream = _LineLogger()
            timeout = GUEST_TIMEOUTS_S.get(guest_cmd, GUEST_TIMEOUT_S)
            rc, out = g.run(cmd, timeout=timeout, stream=stream)
            stream.flush()
            bad = bad_dmesg_lines(g.new_dmesg(mark))
            if bad:
                raise BenchFailed("kernel log has errors after the benchmark:\n" + "\n".join(bad))
            if rc != 0:
                raise BenchFailed(f"`{cmd}` exited {rc} in the guest")
            part = parse_guest_json(out)
            env.update(part.pop("guest_env", None) or {})
            result.update(part)
        result["guest_env"] = env
        return g.boot_s, result


def run_timing_guests(quick: bool) -> dict[str, Any]:
    """Boot a guest whose device runs each chip's timing model and run
    examples/bench_timing.py there: its keys, merged."""
    result: dict[str, Any] = {}
    saved = os.environ.get("NPU_DEVICES")
    try:
        for chip in TIMING_CHIPS:
            os.environ["NPU_DEVICES"] = f"-device npu,timing={chip}"
            log.info("booting a guest with timing=%s", chip)
            with Guest() as g:
                g.load_module()
                cmd = (
                    "BENCH_QUICK=1 " if quick else ""
                ) + f"python3 examples/bench_timing.py --chip {chip}"
                mark = g.dmesg_mark()
                stream = _LineLogger()
                rc, out = g.run(cmd, timeout=GUEST_TIMEOUT_S, stream=stream)
                stream.flush()
                bad = bad_dmesg_lines(g.new_dmesg(mark))
                if bad:
                    raise BenchFailed(
                        "kernel log has errors after the benchmark:\n" + "\n".join(bad)
                    )
                if rc != 0:
                    raise BenchFailed(f"`{cmd}` exited {rc} in the guest")
                result.update(parse_guest_json(out))
    finally:
        if saved is None:
            os.environ.pop("NPU_DEVICES", None)
        else:
            os.environ["NPU_DEVICES"] = saved
    return result


def conformance_keys(meta: dict[str, Any]) -> dict[str, Any]:
    """``onnx_node_suite_pass`` and ``onnx_node_suite_npu_share`` of the latest conformance run.

    Read from build/onnx-conformance.json, which ``make test``
    (tests/test_onnx_conformance.py, about 4 minutes in the guest) writes,
    rather than running the suite again; ``meta.onnx_conformance`` says which
    run (its date and onnx version). Null keys without such a file.
    """
    path = ROOT / "build" / "onnx-conformance.json"
    if not path.is_file():
        log.warning("no %s (make test writes it): the ONNX suite keys are null", path)
        meta["onnx_conformance"] = None
        return {"onnx_node_suite_pass": None, "onnx_node_suite_npu_share": None}
    data = json.loads(path.read_text())
    stamp = datetime.datetime.fromtimestamp(path.stat().st_mtime, datetime.UTC)
    meta["onnx_conformance"] = {
        "file": str(path.relative_to(ROOT)),
        "written": stamp.strftime("%Y-%m-%dT%H:%M:%SZ"),
        "onnx": data.get("meta", {}).get("onnx"),
    }
    keys = onnx_conformance.summary(data)
    return {k: keys[k] for k in ("onnx_node_suite_pass", "onnx_node_suite_npu_share")}


def add_ratios_and_targets(res: dict[str, Any]) -> None:
    """Add the GEMM ratios and the target verdicts to res, in place."""
    npu_gflops = res["gemm_fp32_1024_gflops_npu"]
    res["gemm_npu_vs_guest_numpy"] = npu_gflops / res["gemm_fp32_1024_gflops_guest_numpy"]
    res["gemm_npu_vs_host_numpy"] = npu_gflops / res["gemm_fp32_1024_gflops_host_numpy"]
    res["gemm_npu_e2e_vs_guest_numpy"] = (
        res["gemm_fp32_1024_gflops_npu_e2e"] / res["gemm_fp32_1024_gflops_guest_numpy"]
    )
    if "matmul_fp32_1024_gflops_npu" in res:  # MATMUL op against the v1 GEMM of this run
        res["matmul_vs_gemm_fp32"] = res["matmul_fp32_1024_gflops_npu"] / npu_gflops
    if "dmabuf_import_copy_gbps" in res:
        res["dmabuf_import_copy_vs_host_memcpy"] = (
            res["dmabuf_import_copy_gbps"] / res["host_memcpy_gbps"]
        )
    for way in ("h2d", "d2h"):
        res[f"{way}_vs_host_memcpy"] = res[f"{way}_gbps"] / res["host_memcpy_gbps"]
        res[f"{way}_vs_guest_memcpy"] = res[f"{way}_gbps"] / res["guest_memcpy_gbps"]
    if "conv2d_fp32_gflops_npu" in res:
        conv = res["conv2d_fp32_gflops_npu"]
        res["conv2d_npu_vs_guest_numpy"] = conv / res["conv2d_fp32_gflops_guest_numpy"]
        res["conv2d_npu_vs_host_numpy"] = conv / res["conv2d_fp32_gflops_host_numpy"]
    if "op_us_user_queue" in res:
        call = res["python_call_us"]
        res["user_queue_vs_ioctl_submit"] = res["op_us_user_queue"] / res["op_us_ioctl_submit"]
        res["user_queue_vs_python_call"] = res["op_us_user_queue"] / call
        res["graph_submit_stream_vs_python_call"] = res["graph_submit_us_stream"] / call
    res["preempt_tiles"] = (res["preempt_latency_us"] - res["nop_latency_us"]) / res["tile_us"]
    res["digits_cnn_int8_accuracy_drop"] = (
        res["digits_cnn_fp32_accuracy"] - res["digits_cnn_int8_accuracy"]
    )
    bench_host_ort.add_ratios(res)
    targets: dict[str, dict[str, Any]] = {}
    for key, op, threshold, what in TARGETS:
        target = {"target": f"{op} {threshold:g}", "what": what}
        if res[key] is None:  # a figure it needs is missing (logged where it went missing)
            targets[key] = {**target, "value": None, "met": False}
            continue
        value = float(res[key])
        met = value >= threshold if op == ">=" else value <= threshold
        targets[key] = {**target, "value": value, "met": met}
    res["targets"] = targets
    res["targets_met"] = all(t["met"] for t in targets.values())


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark; 0 on success, 1 on failure (or a missed target with --strict)."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    kernel = os.environ.get("NPU_KERNEL", "").strip() or "distro"
    ap.add_argument(
        "--out",
        type=Path,
        # The debug kernel's figures go beside, not over, the distribution's.
        default=ROOT / "build" / ("bench.json" if kernel == "distro" else f"bench-{kernel}.json"),
        help="where to write the JSON (default: build/bench.json; with NPU_KERNEL=debug "
        "build/bench-debug.json)",
    )
    ap.add_argument("--quick", action="store_true", help="fewer repetitions in the guest")
    ap.add_argument("--strict", action="store_true", help="exit 1 if a target is missed")
    ap.add_argument(
        "--guest-baselines",
        action="store_true",
        help="also ResNet-50 on the guest's onnxruntime and numpy (slow: 15+ minutes)",
    )
    ap.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    args = ap.parse_args(argv)
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO,
        stream=sys.stderr,
        format="[bench] %(message)s",
    )

    if not os.environ.get("NPU_MEM", "").strip():
        os.environ["NPU_MEM"] = GUEST_MEM
    res: dict[str, Any] = {"meta": metadata()}
    try:
        t0 = time.monotonic()
        boot_s, guest = run_guest(args.quick, args.guest_baselines)
        guest.update(run_timing_guests(args.quick))
        res["boot_s"] = boot_s
        res["meta"].update(guest_meta(guest.pop("guest_env")))
        res.update(guest)
        res["meta"]["guest_total_s"] = time.monotonic() - t0
        for problem in check_guest_meta(res["meta"]):
            log.warning("guest environment: %s", problem)
        blas = res["meta"]["guest_blas"] or {}
        log.info(
            "guest: python %s, numpy %s on %s (%s), onnxruntime %s",
            res["meta"]["guest_python"],
            res["meta"]["guest_numpy"],
            blas.get("library"),
            blas.get("openblas_config") or blas.get("version"),
            res["meta"]["guest_onnxruntime"],
        )
        # The host figures are taken after QEMU has exited, so that it does
        # not compete with numpy for the host's cores.
        log.info("host numpy: %dx%d fp32 GEMM and a 64 MiB copy", GEMM_N, GEMM_N)
        threads = host_numpy_threads()
        if threads is not None:
            res["host_numpy_threads"] = threads["num_threads"]
            res["meta"]["host_blas_pools"] = threads["pools"]
        res["gemm_fp32_1024_gflops_host_numpy"] = host_numpy_gemm_gflops()
        res["host_memcpy_gbps"] = host_memcpy_gbps()
        log.info("host numpy: conv2d %s as im2col + matmul", CONV_SHAPE)
        res["conv2d_fp32_gflops_host_numpy"] = host_numpy_conv2d_gflops()
        log.info("host onnxruntime: the real architectures (%d threads)", bench_host_ort.THREADS)
        res.update(bench_host_ort.measure(quick=args.quick))
        log.info("engine control through qtest (release QEMU)")
        engine = bench_engine.measure()
        res["meta"]["engine_tile"] = engine.pop("meta_engine_tile")
        res.update(engine)
        log.info("the device's kernels through qtest (release QEMU)")
        res["kernel_ms"] = bench_kernels.measure()
        res.update(conformance_keys(res["meta"]))
        # CI's own figures, from the latest make test / fresh-check runs
        # (not re-run here; null where none has run on this machine).
        res.update(ci_times.ci_times())
        add_ratios_and_targets(res)
        chart = bench_host_ort.write_chart(res)
        res["meta"]["models_chart"] = str(bench_host_ort.CHART.relative_to(ROOT)) if chart else None
    except (BenchFailed, GuestError, KeyError, ValueError) as e:
        log.error("benchmark failed: %s", e)
        return 1

    args.out.parent.mkdir(parents=True, exist_ok=True)
    text = json.dumps(res, indent=2, sort_keys=True)
    args.out.write_text(text + "\n")
    log.info("wrote %s", args.out)
    for key, t in res["targets"].items():
        log.info(
            "target %-28s %s: %s -> %s",
            key,
            t["target"],
            "missing" if t["value"] is None else f"{t['value']:.3g}",
            "MET" if t["met"] else "MISSED",
        )
    print(text)
    return 1 if args.strict and not res["targets_met"] else 0


if __name__ == "__main__":
    sys.exit(main())
