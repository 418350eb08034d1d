"""Shared by the inference examples and benchmarks (run in the guest).

``infer_digits.py``, ``infer_resnet.py`` and ``bench_inference.py`` load the
models of ``examples/models/`` (docs/models.md) with
``npu.InferenceSession`` twice, once on the NPU and once on the CPU provider
(numpy in the guest), and measure both the same way with the helpers here.
Guest numpy under TCG is slow (a digits-CNN batch of 64 takes seconds), so
every numpy measurement has a run count *and* a time budget.
"""

from __future__ import annotations

import os
import statistics
import time
from collections.abc import Callable
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
NPU_B1_RUNS = 10 if QUICK else 30
NPU_BATCH_RUNS = 5 if QUICK else 10
CPU_B1_RUNS, CPU_B1_BUDGET_S = (3, 2.0) if QUICK else (10, 5.0)
CPU_BATCH_RUNS, CPU_BATCH_BUDGET_S = (1, 5.0) if QUICK else (3, 15.0)

Array = npt.NDArray[Any]


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


def timed_runs(fn: Callable[[], Any], runs: int, budget_s: float = float("inf")) -> list[float]:
    """Seconds of up to `runs` calls of fn, stopping early once budget_s has passed (>= 1 call)."""
    times: list[float] = []
    start = time.perf_counter()
    while len(times) < runs:
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
        if time.perf_counter() - start >= budget_s:
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


def measure(sess: Any, x1: Array, xb: Array, on_npu: bool) -> Speed:
    """Batch-1 latency on x1 and throughput on the batch xb, after one warm-up run of each.

    The NPU runs NPU_*_RUNS times; the CPU provider CPU_*_RUNS times or
    until its time budget is spent, whichever comes first."""
    inf = float("inf")
    if on_npu:
        b1_runs, b1_budget, bn_runs, bn_budget = NPU_B1_RUNS, inf, NPU_BATCH_RUNS, inf
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
    t1 = timed_runs(lambda: run_and_profile(f1), b1_runs, b1_budget)
    bd1 = Breakdown.median(profiles) if profiles else None
    profiles.clear()
    sess.run(None, fb)
    tb = timed_runs(lambda: run_and_profile(fb), bn_runs, bn_budget)
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
class DigitsResult:
    """Accuracy, agreement and speed of one digits model on the NPU and in guest numpy."""

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


def digits(model: str, accuracy: bool = True, on_stream: bool = False) -> DigitsResult:
    """Run a digits model on the test split, NPU and CPU provider; measure both.

    With accuracy=False only the first BATCH images are classified (for the
    benchmark), not the whole split; with on_stream the NPU is also measured
    inside ``with npu.Stream(...)``."""
    x, y = load_digits_split()
    if not accuracy:
        x, y = x[:BATCH], y[:BATCH]
    s_npu = session(model, NPU_PROVIDERS)
    s_cpu = session(model, CPU_PROVIDERS)
    p_npu = predict(s_npu, x).argmax(axis=1)
    p_cpu = predict(s_cpu, x).argmax(axis=1)
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
    )


@dataclass
class ResnetResult:
    """The ResNet at batch RESNET_BATCH on the NPU and in guest numpy."""

    max_diff_vs_cpu: float  # max |NPU - CPU provider| over the logits
    max_diff_vs_ref: float  # max |NPU - reference logits of resnet_sample.npz|
    within_tolerance: bool  # NPU vs the reference within RESNET_RTOL/ATOL
    same_top1: int  # images whose top class is the same on the NPU and the CPU provider
    npu: Speed
    cpu: Speed
    partitions: list[str] = field(default_factory=list)
    fallbacks: list[str] = field(default_factory=list)
    npu_stream: Speed | None = None  # the NPU inside `with npu.Stream(...)`


def resnet(on_stream: bool = False) -> ResnetResult:
    """Run the ResNet on its sample batch, NPU and CPU provider; compare and measure
    (with on_stream, the NPU inside ``with npu.Stream(...)`` as well)."""
    x, ref = load_resnet_sample()
    x = x[:RESNET_BATCH]
    ref = ref[:RESNET_BATCH]
    s_npu = session(RESNET_MODEL, NPU_PROVIDERS)
    s_cpu = session(RESNET_MODEL, CPU_PROVIDERS)
    got = run(s_npu, x)
    cpu = run(s_cpu, x)
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
