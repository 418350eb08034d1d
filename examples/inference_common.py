"""Shared by the inference examples and benchmarks (run in the guest).

``infer_digits.py``, ``infer_resnet.py`` and ``bench_inference.py`` load the
models of ``examples/models/`` (docs/models.md) with
``npu.InferenceSession`` twice, once on the NPU and once on the CPU provider
(numpy in the guest), and measure both the same way with the helpers here.
With ``with_ort=True`` (bench_inference.py) :func:`digits` and :func:`resnet`
also run the model on the guest's onnxruntime (CPUExecutionProvider), a
second CPU baseline, in a child process (:func:`ort_baseline`); without an
importable onnxruntime that baseline is None and a warning is logged.

Guest numpy under TCG is slow (a digits-CNN batch of 64 takes seconds), so
every CPU measurement has a run count *and* a time budget; the budget never
cuts a measurement below GUEST_MIN_RUNS timed runs (after the warm-up run).
"""

from __future__ import annotations

import contextlib
import functools
import json
import logging
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

import npu

MODELS = Path(__file__).resolve().parent / "models"
DIGITS_MODELS = ("digits_cnn.onnx", "digits_mlp.onnx")
RESNET_MODEL = "resnet_small.onnx"
NPU_PROVIDERS = ("NPU", "CPU")
CPU_PROVIDERS = ("CPU",)
# onnxruntime in the guest: its CPU provider, one intra-op thread per guest CPU.
ORT_PROVIDERS = ["CPUExecutionProvider"]
ORT_THREADS = os.cpu_count() or 1
ORT_WORKER_MISSING = 3  # the exit status of the worker when onnxruntime cannot be imported
ORT_WORKER_TIMEOUT_S = 900.0

# ResNet logits against the reference (docs/models.md, "Tolerances"):
# |got - want| <= RESNET_ATOL + RESNET_RTOL * |want| elementwise.
RESNET_RTOL = 1e-3
RESNET_ATOL = 1e-4
# Lowest accuracy the digits examples accept on the test split.
MIN_ACCURACY = 0.95

QUICK = os.environ.get("BENCH_QUICK", "") == "1"
BATCH = 64  # the digits throughput batch
RESNET_BATCH = 8
# (runs, time budget in seconds) of each measurement, after a warm-up run.
# The CPU baselines (guest numpy, guest onnxruntime) stop at the budget, but
# never before GUEST_MIN_RUNS timed runs, also with BENCH_QUICK=1.
GUEST_MIN_RUNS = 3
NPU_B1_RUNS = 10 if QUICK else 30
NPU_BATCH_RUNS = 5 if QUICK else 10
CPU_B1_RUNS, CPU_B1_BUDGET_S = (3, 2.0) if QUICK else (10, 5.0)
CPU_BATCH_RUNS, CPU_BATCH_BUDGET_S = (3, 5.0) if QUICK else (3, 15.0)

Array = npt.NDArray[Any]

log = logging.getLogger("inference_common")


def load_digits_split() -> tuple[npt.NDArray[np.float32], npt.NDArray[np.int64]]:
    """The held-out digits test split: x [360, 1, 8, 8] float32 in [0, 1], y int64."""
    with np.load(MODELS / "digits_test.npz") as d:
        return d["x"].astype(np.float32), d["y"].astype(np.int64)


def load_resnet_sample() -> tuple[npt.NDArray[np.float32], npt.NDArray[np.float32]]:
    """The seeded ResNet input x [8, 3, 32, 32] and its reference logits [8, 10]."""
    with np.load(MODELS / "resnet_sample.npz") as d:
        return d["x"].astype(np.float32), d["logits"].astype(np.float32)


def session(model: str, providers: tuple[str, ...]) -> Any:
    """An npu.InferenceSession of examples/models/<model> on providers."""
    return npu.InferenceSession(str(MODELS / model), providers=providers)


@functools.cache
def ort_module() -> Any | None:
    """The guest's onnxruntime module, or None (with a warning, logged once) if it
    cannot be imported. Only the onnxruntime worker process imports it (see
    :func:`ort_baseline`)."""
    try:
        import onnxruntime  # type: ignore[import-not-found]
    except (ImportError, OSError) as e:
        log.warning("onnxruntime is not importable (%s): no onnxruntime baseline", e)
        return None
    return onnxruntime


def ort_session(model: str) -> Any | None:
    """An onnxruntime.InferenceSession of examples/models/<model> on ORT_PROVIDERS
    with ORT_THREADS intra-op threads; None if onnxruntime is not importable.

    It has the npu.InferenceSession calls the helpers here use (get_inputs,
    run), so :func:`run`, :func:`predict` and :func:`measure` take it as is."""
    ort = ort_module()
    if ort is None:
        return None
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = ORT_THREADS
    return ort.InferenceSession(str(MODELS / model), sess_options=opts, providers=ORT_PROVIDERS)


def feed(sess: Any, x: Array) -> dict[str, Array]:
    """The run() feed of x, reshaped to the rank of the session's input.

    The digits images are stored as [N, 1, 8, 8]; the MLP takes [N, 64]."""
    inp = sess.get_inputs()[0]
    rest = [int(d) for d in inp.shape[1:]]
    return {inp.name: np.ascontiguousarray(x.reshape(len(x), *rest), dtype=np.float32)}


def run(sess: Any, x: Array) -> Array:
    """The first output (the logits) of one sess.run on the batch x."""
    outs = sess.run(None, feed(sess, x))
    return np.asarray(outs[0])


def predict(sess: Any, x: Array, batch: int = BATCH) -> Array:
    """Logits of every row of x, run in batches of `batch`."""
    return np.concatenate([run(sess, x[i : i + batch]) for i in range(0, len(x), batch)])


def timed_runs(
    fn: Callable[[], Any], runs: int, budget_s: float = float("inf"), min_runs: int = 1
) -> list[float]:
    """Seconds of up to max(runs, min_runs) calls of fn, stopping early once
    budget_s has passed, but never before min_runs calls."""
    times: list[float] = []
    start = time.perf_counter()
    while len(times) < max(runs, min_runs):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
        if len(times) >= min_runs and time.perf_counter() - start >= budget_s:
            break
    return times


@dataclass
class Breakdown:
    """Where the NPU session's time went in one run (seconds, from sess.last_profile)."""

    upload_s: float
    compute_s: float
    download_s: float
    cpu_s: float
    total_s: float

    @classmethod
    def median(cls, runs: list[Breakdown]) -> Breakdown:
        """Each part's median over runs (the parts then need not add up exactly)."""
        return cls(
            *(
                statistics.median(getattr(r, f) for r in runs)
                for f in ("upload_s", "compute_s", "download_s", "cpu_s", "total_s")
            )
        )

    @classmethod
    def of(cls, sess: Any) -> Breakdown:
        """The breakdown of sess's last run."""
        p = sess.last_profile
        return cls(
            float(p.upload_s),
            float(p.compute_s),
            float(p.download_s),
            float(p.cpu_s),
            float(p.total_s),
        )

    def line(self) -> str:
        """One readable line, in milliseconds."""
        return (
            f"upload {self.upload_s * 1e3:.2f} ms, compute {self.compute_s * 1e3:.2f} ms, "
            f"download {self.download_s * 1e3:.2f} ms, CPU {self.cpu_s * 1e3:.2f} ms; "
            f"total {self.total_s * 1e3:.2f} ms"
        )


@dataclass
class Speed:
    """One provider's figures for one model."""

    latency_b1_s: float  # median seconds of a batch-1 run
    batch: int
    batch_s: float  # median seconds of a run on `batch` images
    runs: tuple[int, int]  # how many batch-1 and batch runs the medians are over
    # NPU only: each part's median over the timed batch-1 (batch) runs
    breakdown_b1: Breakdown | None = None
    breakdown_batch: Breakdown | None = None

    @property
    def images_per_s(self) -> float:
        """Throughput at `batch`."""
        return self.batch / self.batch_s


def measure(
    sess: Any,
    x1: Array,
    xb: Array,
    on_npu: bool,
    batch_out: list[Array] | None = None,
    min_runs: int = GUEST_MIN_RUNS,
) -> Speed:
    """Batch-1 latency on x1 and throughput on the batch xb, after one warm-up run of each.

    The NPU runs NPU_*_RUNS times; a CPU session (the CPU provider, or an
    onnxruntime session) CPU_*_RUNS times or until its time budget is spent,
    whichever comes first, but at least ``min_runs`` times (GUEST_MIN_RUNS;
    fewer for models whose CPU runs take minutes under TCG). If batch_out
    is given, the first output of the warm-up run on xb is appended to it."""
    inf = float("inf")
    if on_npu:
        b1_runs, b1_budget, bn_runs, bn_budget = NPU_B1_RUNS, inf, NPU_BATCH_RUNS, inf
        min_runs = 1
    else:
        b1_runs, b1_budget = CPU_B1_RUNS, CPU_B1_BUDGET_S
        bn_runs, bn_budget = CPU_BATCH_RUNS, CPU_BATCH_BUDGET_S
    f1, fb = feed(sess, x1), feed(sess, xb)
    profiles: list[Breakdown] = []

    def run_and_profile(f: dict[str, Array]) -> None:
        sess.run(None, f)
        if on_npu:
            profiles.append(Breakdown.of(sess))

    sess.run(None, f1)
    t1 = timed_runs(lambda: run_and_profile(f1), b1_runs, b1_budget, min_runs)
    bd1 = Breakdown.median(profiles) if profiles else None
    profiles.clear()
    warm = sess.run(None, fb)
    if batch_out is not None:
        batch_out.append(np.asarray(warm[0]))
    tb = timed_runs(lambda: run_and_profile(fb), bn_runs, bn_budget, min_runs)
    bdb = Breakdown.median(profiles) if profiles else None
    return Speed(
        statistics.median(t1), len(xb), statistics.median(tb), (len(t1), len(tb)), bd1, bdb
    )


def measure_on_stream(sess: Any, x1: Array, xb: Array) -> Speed:
    """:func:`measure` of an NPU session run inside ``with npu.Stream(...)``: its
    partitions go to a user queue from prebuilt descriptors instead of SUBMIT."""
    stream = npu.Stream(sess.device)
    try:
        with stream:
            return measure(sess, x1, xb, on_npu=True)
    finally:
        stream.close()


@dataclass
class Pipelined:
    """Back-to-back ``run`` against pipelined ``run_async`` (:func:`measure_pipelined`)."""

    sequential_images_per_s: float
    pipelined_images_per_s: float
    # Of the time spent copying inputs in and outputs out, the fraction the
    # device's compute hid (0: none, 1: all).
    overlap: float

    @property
    def speedup(self) -> float:
        """Pipelined over sequential throughput."""
        return self.pipelined_images_per_s / self.sequential_images_per_s


def measure_pipelined(sess: Any, xb: Array, requests: int = 8, rounds: int = 3) -> Pipelined:
    """``requests`` runs of the batch ``xb`` one after another (``run``), then the
    same requests pipelined (``run_async``, two in flight); medians of ``rounds``
    rounds, after one warm-up round of each.

    The overlap comes from device timestamps: each pipelined run's device
    span (its first op's start to its last op's end) is compute; its upload
    and download are copies. Whatever the pipelined wall time falls short of
    compute plus copies is copy time hidden behind compute:
    ``overlap = clamp((copies + compute - wall) / copies, 0, 1)``. Every
    host overhead (Python, SUBMIT) counts against it."""
    f = feed(sess, xb)

    def sequential() -> None:
        for _ in range(requests):
            sess.run(None, f)

    def pipelined() -> tuple[float, float]:
        futures = [sess.run_async(None, f) for _ in range(requests)]
        for fut in futures:
            fut.result()
        copies = sum(fut.profile.upload_s + fut.profile.download_s for fut in futures)
        spans = [fut.device_ns for fut in futures]
        compute = sum((e - s) / 1e9 for s, e in spans) if all(spans) else float("nan")
        return copies, compute

    sequential()
    pipelined()
    seq, pip, overlaps = [], [], []
    for _ in range(rounds):
        t0 = time.perf_counter()
        sequential()
        seq.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        copies, compute = pipelined()
        wall = time.perf_counter() - t0
        pip.append(wall)
        overlaps.append(min(1.0, max(0.0, (copies + compute - wall) / copies)))
    images = requests * len(xb)
    seq_rate, pip_rate = images / statistics.median(seq), images / statistics.median(pip)
    return Pipelined(seq_rate, pip_rate, statistics.median(overlaps))


@dataclass
class OrtRun:
    """One model on the guest's onnxruntime (:func:`ort_baseline`)."""

    version: str  # onnxruntime.__version__
    threads: int  # intra-op threads
    logits: Array  # the first output for the `check` inputs
    speed: Speed


_ort_missing: list[bool] = []  # [True] once a worker found no onnxruntime


def ort_baseline(
    model: str, check: Array, x1: Array, xb: Array, min_runs: int = GUEST_MIN_RUNS
) -> OrtRun | None:
    """Run examples/models/<model> on the guest's onnxruntime and measure it.

    A child process (this file run as a script: :func:`ort_worker`) makes
    the :func:`ort_session`, measures it on x1 and xb with :func:`measure`,
    as the CPU provider is measured (warm-up, then at least GUEST_MIN_RUNS
    runs), and returns the logits of `check`: the batch warm-up run's when
    `check` is xb (onnxruntime under TCG is slow: that saves a run), else
    :func:`predict`'s. A separate process because Debian's python3-onnx
    and python3-onnxruntime share one ONNX schema registry: once onnxruntime
    has made a session in a process, ``onnx.reference`` (the runtime's
    last-resort CPU kernel) no longer imports there (NotImplementedError:
    operator names not unique across domains). It also keeps onnxruntime's
    threads out of this process. (The worker hides the hundreds of harmless
    "Schema error" lines the first session prints: :func:`schema_errors_filtered`.)

    Returns None, after a warning, if onnxruntime cannot be imported (and
    from then on without starting a worker); raises RuntimeError if the
    worker fails otherwise."""
    if _ort_missing:
        return None
    with tempfile.TemporaryDirectory(prefix="npu-ort-") as tmp:
        inp, out = Path(tmp) / "in.npz", Path(tmp) / "out.npz"
        np.savez(inp, check=check, x1=x1, xb=xb, min_runs=np.array(min_runs))
        argv = [sys.executable, str(Path(__file__).resolve()), "ort-worker", model, str(inp)]
        try:
            proc = subprocess.run([*argv, str(out)], timeout=ORT_WORKER_TIMEOUT_S, check=False)
        except subprocess.TimeoutExpired as e:
            raise RuntimeError(f"onnxruntime baseline of {model}: timed out ({e.timeout} s)") from e
        if proc.returncode == ORT_WORKER_MISSING:
            _ort_missing.append(True)
            log.warning("no onnxruntime in the guest: the onnxruntime baselines are null")
            return None
        if proc.returncode != 0:
            raise RuntimeError(f"onnxruntime baseline of {model}: worker exited {proc.returncode}")
        with np.load(out) as d:
            info = json.loads(str(d["info"]))
            logits = np.array(d["logits"])
    speed = Speed(info["latency_b1_s"], info["batch"], info["batch_s"], tuple(info["runs"]))
    return OrtRun(info["version"], info["threads"], logits, speed)


@contextlib.contextmanager
def schema_errors_filtered() -> Iterator[None]:
    """Drop onnx's "Schema error: Trying to register schema ..." lines from fd 2.

    Debian's onnxruntime, whose ONNX schemas are also in the system libonnx,
    prints one such line (and a blank one) per duplicate when its first
    session is made: hundreds, harmless. Inside the block fd 2 goes to a
    temporary file; afterwards the other lines are written to stderr as
    they were, and the dropped ones are counted in one log line."""
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile() as tmp:
        os.dup2(tmp.fileno(), 2)
        try:
            yield
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
            tmp.seek(0)
            lines = tmp.read().decode(errors="replace").splitlines()
    dup = "Schema error: Trying to register schema "
    kept = [ln for ln in lines if ln.strip() and not ln.startswith(dup)]
    if kept:
        sys.stderr.write("\n".join(kept) + "\n")
    dropped = sum(ln.startswith(dup) for ln in lines)
    if dropped:
        log.info("%d duplicate ONNX schema registration messages not shown", dropped)


def ort_worker(model: str, inp: str, out: str) -> int:
    """The child of :func:`ort_baseline`: inputs from the npz `inp`, results to `out`.

    Exit status 0, or ORT_WORKER_MISSING if onnxruntime cannot be imported."""
    logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="ort-worker: %(message)s")
    ort = ort_module()
    if ort is None:
        return ORT_WORKER_MISSING
    with schema_errors_filtered():
        sess = ort_session(model)
    assert sess is not None
    with np.load(inp) as d:
        check, x1, xb, min_runs = d["check"], d["x1"], d["xb"], int(d["min_runs"])
    warm: list[Array] = []
    speed = measure(sess, x1, xb, on_npu=False, batch_out=warm, min_runs=min_runs)
    same = check.shape == xb.shape and bool(np.array_equal(check, xb))
    logits = warm[0] if same else predict(sess, check)
    info = {
        "version": str(ort.__version__),
        "threads": ORT_THREADS,
        "latency_b1_s": speed.latency_b1_s,
        "batch": speed.batch,
        "batch_s": speed.batch_s,
        "runs": list(speed.runs),
    }
    np.savez(out, logits=logits, info=np.array(json.dumps(info)))
    return 0


@dataclass
class DigitsResult:
    """Accuracy, agreement and speed of one digits model on the NPU and in guest numpy
    (and in guest onnxruntime when asked for and importable)."""

    model: str
    n: int
    accuracy_npu: float
    accuracy_cpu: float
    agree: int  # test images where the NPU's and numpy's predicted classes are equal
    npu: Speed
    cpu: Speed
    partitions: list[str] = field(default_factory=list)
    fallbacks: list[str] = field(default_factory=list)
    npu_stream: Speed | None = None  # the NPU inside `with npu.Stream(...)`
    ort: Speed | None = None  # guest onnxruntime (with_ort and importable)
    ort_version: str | None = None
    accuracy_ort: float | None = None
    agree_ort: int | None = None  # images where onnxruntime's and the NPU's classes are equal

    @property
    def ok(self) -> bool:
        """Predictions all agree and both accuracies reach MIN_ACCURACY."""
        return self.agree == self.n and min(self.accuracy_npu, self.accuracy_cpu) >= MIN_ACCURACY


def describe_partitions(sess: Any) -> list[str]:
    """One "PROVIDER: n nodes" string per partition of sess."""
    return [f"{p.provider}: {len(p.nodes)} nodes" for p in sess.partitions]


def describe_fallbacks(sess: Any) -> list[str]:
    """One string per node of sess that runs on the CPU instead of the NPU, with the reason."""
    out = []
    for f in sess.fallbacks:
        if isinstance(f, tuple) and len(f) == 3:  # (node name, op type, reason)
            out.append(f"{f[0]} ({f[1]}): {f[2]}")
        else:
            out.append(str(f))
    return out


def digits(
    model: str, accuracy: bool = True, on_stream: bool = False, with_ort: bool = False
) -> DigitsResult:
    """Run a digits model on the test split, NPU and CPU provider; measure both.

    With accuracy=False only the first BATCH images are classified (for the
    benchmark), not the whole split; with on_stream the NPU is also measured
    inside ``with npu.Stream(...)``; with with_ort the model also runs on
    the guest's onnxruntime (:func:`ort_baseline`), classified and measured
    like the CPU provider (the ort* fields stay None without onnxruntime)."""
    x, y = load_digits_split()
    if not accuracy:
        x, y = x[:BATCH], y[:BATCH]
    s_npu = session(model, NPU_PROVIDERS)
    s_cpu = session(model, CPU_PROVIDERS)
    p_npu = predict(s_npu, x).argmax(axis=1)
    p_cpu = predict(s_cpu, x).argmax(axis=1)
    o = ort_baseline(model, x, x[:1], x[:BATCH]) if with_ort else None
    p_ort = o.logits.argmax(axis=1) if o is not None else None
    return DigitsResult(
        model=model,
        n=len(x),
        accuracy_npu=float(np.mean(p_npu == y)),
        accuracy_cpu=float(np.mean(p_cpu == y)),
        agree=int(np.sum(p_npu == p_cpu)),
        npu=measure(s_npu, x[:1], x[:BATCH], on_npu=True),
        cpu=measure(s_cpu, x[:1], x[:BATCH], on_npu=False),
        partitions=describe_partitions(s_npu),
        fallbacks=describe_fallbacks(s_npu),
        npu_stream=measure_on_stream(s_npu, x[:1], x[:BATCH]) if on_stream else None,
        ort=o.speed if o is not None else None,
        ort_version=o.version if o is not None else None,
        accuracy_ort=float(np.mean(p_ort == y)) if p_ort is not None else None,
        agree_ort=int(np.sum(p_ort == p_npu)) if p_ort is not None else None,
    )


@dataclass
class ResnetResult:
    """The ResNet at batch RESNET_BATCH on the NPU and in guest numpy (and in guest
    onnxruntime when asked for and importable)."""

    max_diff_vs_cpu: float  # max |NPU - CPU provider| over the logits
    max_diff_vs_ref: float  # max |NPU - reference logits of resnet_sample.npz|
    within_tolerance: bool  # NPU vs the reference within RESNET_RTOL/ATOL
    same_top1: int  # images whose top class is the same on the NPU and the CPU provider
    npu: Speed
    cpu: Speed
    partitions: list[str] = field(default_factory=list)
    fallbacks: list[str] = field(default_factory=list)
    npu_stream: Speed | None = None  # the NPU inside `with npu.Stream(...)`
    ort: Speed | None = None  # guest onnxruntime (with_ort and importable)
    ort_version: str | None = None
    max_diff_vs_ort: float | None = None  # max |NPU - onnxruntime| over the logits
    # onnxruntime's logits within RESNET_RTOL/ATOL of both the reference and
    # the CPU provider's (numpy's)
    ort_within_tolerance: bool | None = None
    max_diff_ort_vs_ref: float | None = None  # max |onnxruntime - reference logits|


def resnet(on_stream: bool = False, with_ort: bool = False) -> ResnetResult:
    """Run the ResNet on its sample batch, NPU and CPU provider; compare and measure
    (with on_stream, the NPU inside ``with npu.Stream(...)`` as well; with
    with_ort, the guest's onnxruntime too, checked against the reference and
    numpy's logits within the RESNET tolerance, the ort* fields None without
    onnxruntime)."""
    x, ref = load_resnet_sample()
    x = x[:RESNET_BATCH]
    ref = ref[:RESNET_BATCH]
    s_npu = session(RESNET_MODEL, NPU_PROVIDERS)
    s_cpu = session(RESNET_MODEL, CPU_PROVIDERS)
    got = run(s_npu, x)
    cpu = run(s_cpu, x)
    o = ort_baseline(RESNET_MODEL, x, x[:1], x) if with_ort else None
    ort_out = o.logits if o is not None else None
    ort_ok = None
    if ort_out is not None:
        ort_ok = all(
            bool(np.allclose(ort_out, want, rtol=RESNET_RTOL, atol=RESNET_ATOL))
            for want in (ref, cpu)
        )
    return ResnetResult(
        max_diff_vs_cpu=float(np.max(np.abs(got - cpu))),
        max_diff_vs_ref=float(np.max(np.abs(got - ref))),
        within_tolerance=bool(np.allclose(got, ref, rtol=RESNET_RTOL, atol=RESNET_ATOL)),
        same_top1=int(np.sum(got.argmax(axis=1) == cpu.argmax(axis=1))),
        npu=measure(s_npu, x[:1], x, on_npu=True),
        cpu=measure(s_cpu, x[:1], x, on_npu=False),
        partitions=describe_partitions(s_npu),
        fallbacks=describe_fallbacks(s_npu),
        npu_stream=measure_on_stream(s_npu, x[:1], x) if on_stream else None,
        ort=o.speed if o is not None else None,
        ort_version=o.version if o is not None else None,
        max_diff_vs_ort=float(np.max(np.abs(got - ort_out))) if ort_out is not None else None,
        ort_within_tolerance=ort_ok,
        max_diff_ort_vs_ref=float(np.max(np.abs(ort_out - ref))) if ort_out is not None else None,
    )


def speed_rows(npu_speed: Speed, cpu_speed: Speed) -> list[str]:
    """Table rows: batch-1 latency and batch throughput, NPU vs guest numpy, with the ratio."""
    lat_n, lat_c = npu_speed.latency_b1_s * 1e3, cpu_speed.latency_b1_s * 1e3
    ips_n, ips_c = npu_speed.images_per_s, cpu_speed.images_per_s
    b = npu_speed.batch
    return [
        f"  {'latency, batch 1 (median)':<30}{lat_n:>10.2f} ms{lat_c:>12.2f} ms"
        f"{lat_c / lat_n:>9.1f}x",
        f"  {f'throughput, batch {b}':<30}{ips_n:>10,.0f} /s{ips_c:>12,.1f} /s"
        f"{ips_n / ips_c:>9.1f}x",
        f"  {'runs (batch 1, batch ' + str(b) + ')':<30}{npu_speed.runs!s:>13}"
        f"{cpu_speed.runs!s:>15}",
    ]


def header() -> str:
    """The column header of the comparison tables."""
    return f"  {'':<30}{'NPU':>13}{'numpy (guest)':>15}{'speedup':>10}"


def device_line() -> str | None:
    """The NPU that will be used, or None (with nothing opened) if there is none."""
    found = npu.devices()
    if not found:
        return None
    with npu.open_device(found[0]) as dev:
        info = dev.info
        return f"{info.path}: {info.num_cores} AI core(s), hw v{info.hw_version_str}"


if __name__ == "__main__":
    # python3 inference_common.py ort-worker MODEL IN.npz OUT.npz (see ort_baseline)
    if len(sys.argv) != 5 or sys.argv[1] != "ort-worker":
        sys.exit(f"usage: {sys.argv[0]} ort-worker MODEL IN.npz OUT.npz")
    sys.exit(ort_worker(*sys.argv[2:]))
