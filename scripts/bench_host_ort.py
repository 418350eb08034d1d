#!/usr/bin/env python3
"""onnxruntime on the host for the real architectures, and how the NPU compares.

The host half of the model benchmarks of ``make bench`` (docs/benchmarks.md,
"Real architectures"): ResNet-50 and the zoo of
examples/models/make_zoo.py (build/models/, ``make zoo``) run on the
host's onnxruntime (CPUExecutionProvider, ``intra_op_num_threads`` 2: the
device model's two AI cores run on the same two host cores), on the 8
sample inputs of zoo_sample.npz. scripts/bench.py calls :func:`measure`
after QEMU has exited, so that nothing competes for the cores, then
:func:`add_ratios` and :func:`write_chart`.

Keys: ``<model>_b1_ms_host_ort`` (median latency of one image after a
warm-up) and ``<model>_b8_images_per_s_host_ort`` (8 images per run);
:func:`add_ratios` adds ``<model>_b1_vs_host_ort`` (host onnxruntime's
batch-1 latency over the NPU's in the guest: above 1 the NPU is faster)
and ``models_b1_vs_host_ort_geomean`` (and ``_min``, the issue's target).

Usage (prints the keys as one JSON object)::

    scripts/bench_host_ort.py [--quick] [MODEL ...]
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

ROOT = Path(__file__).resolve().parent.parent
MODELS_DIR = ROOT / "build" / "models"
SAMPLE = MODELS_DIR / "zoo_sample.npz"
CHART = ROOT / "docs" / "img" / "models_vs_host_ort.png"
# ResNet-50 first, then the zoo (make_zoo.MODELS' order).
MODELS = (
    "resnet50",
    "densenet121",
    "inception_v2",
    "squeezenet1_1",
    "shufflenet_v2",
    "mobilenet_v2",
    "vgg19",
)
# The NPU's batch-1 key in the guest results: infer_resnet50.py names ResNet-50's
# differently from examples/bench_models.py.
NPU_B1_KEY = {"resnet50": "resnet50_b1_latency_ms_npu"}
THREADS = 2
BATCH = 8
# (runs, time budget in seconds) per measurement, after one warm-up run: a
# measurement stops at the budget but never below MIN_RUNS runs.
B1_RUNS, B8_RUNS, BUDGET_S, MIN_RUNS = 20, 6, 10.0, 3
QUICK_B1_RUNS, QUICK_B8_RUNS, QUICK_BUDGET_S = 5, 2, 3.0

Array = npt.NDArray[Any]

log = logging.getLogger("bench_host_ort")


def median_s(fn: Callable[[], Any], runs: int, budget_s: float) -> float:
    """Median seconds of up to ``runs`` calls of fn after a warm-up call; stops once
    budget_s has passed, but not before MIN_RUNS calls."""
    fn()
    times: list[float] = []
    start = time.perf_counter()
    while len(times) < runs:
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
        if len(times) >= MIN_RUNS and time.perf_counter() - start >= budget_s:
            break
    return statistics.median(times)


def npu_b1_key(model: str) -> str:
    """The guest result key of the model's NPU batch-1 latency in ms."""
    return NPU_B1_KEY.get(model, f"{model}_b1_ms_npu")


def measure(models: tuple[str, ...] = MODELS, quick: bool = False) -> dict[str, float | None]:
    """``<model>_b1_ms_host_ort`` and ``<model>_b8_images_per_s_host_ort`` of each model.

    A model whose file is missing gets null keys (and a warning)."""
    import onnxruntime as ort  # type: ignore[import-untyped]

    with np.load(SAMPLE) as d:
        x = np.ascontiguousarray(d["x"][:BATCH], dtype=np.float32)
    b1_runs, b8_runs, budget = (
        (QUICK_B1_RUNS, QUICK_B8_RUNS, QUICK_BUDGET_S) if quick else (B1_RUNS, B8_RUNS, BUDGET_S)
    )
    out: dict[str, float | None] = {}
    for model in models:
        path = MODELS_DIR / f"{model}.onnx"
        k1, k8 = f"{model}_b1_ms_host_ort", f"{model}_b{BATCH}_images_per_s_host_ort"
        if not path.exists():
            log.warning("%s is missing (make zoo): its host onnxruntime keys are null", path)
            out[k1] = out[k8] = None
            continue
        t1, t8 = time_model(ort.InferenceSession(str(path), session_options(ort),
                                                 providers=["CPUExecutionProvider"]),
                            x, (b1_runs, b8_runs), budget)  # fmt: skip
        out[k1], out[k8] = round(t1 * 1e3, 3), round(BATCH / t8, 2)
        log.info("host onnxruntime %s: batch 1 %.1f ms, batch 8 %.1f images/s",
                 model, t1 * 1e3, BATCH / t8)  # fmt: skip
    return out


def session_options(ort: Any) -> Any:
    """onnxruntime SessionOptions with THREADS intra-op threads, one inter-op thread."""
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = THREADS
    opts.inter_op_num_threads = 1
    return opts


def time_model(sess: Any, x: Array, runs: tuple[int, int], budget_s: float) -> tuple[float, float]:
    """Median seconds of a batch-1 run (x[:1]) and of a batch run (x) of an onnxruntime session."""
    name = sess.get_inputs()[0].name
    x1 = x[:1]
    t1 = median_s(lambda: sess.run(None, {name: x1}), runs[0], budget_s)
    return t1, median_s(lambda: sess.run(None, {name: x}), runs[1], budget_s)


def add_ratios(res: dict[str, Any], models: tuple[str, ...] = MODELS) -> None:
    """Add ``<model>_b1_vs_host_ort`` (host ms / NPU ms), their geometric mean
    ``models_b1_vs_host_ort_geomean`` and their minimum ``models_b1_vs_host_ort_min``
    to res, in place; null where a figure is missing (the aggregates cover the models
    that have both figures)."""
    ratios = []
    for model in models:
        npu_ms, host_ms = res.get(npu_b1_key(model)), res.get(f"{model}_b1_ms_host_ort")
        ratio = host_ms / npu_ms if npu_ms and host_ms else None
        res[f"{model}_b1_vs_host_ort"] = ratio
        if ratio is not None:
            ratios.append(ratio)
    res["models_b1_vs_host_ort_geomean"] = (
        math.exp(sum(math.log(r) for r in ratios) / len(ratios)) if ratios else None
    )
    res["models_b1_vs_host_ort_min"] = min(ratios) if ratios else None


def write_chart(res: dict[str, Any], path: Path = CHART, models: tuple[str, ...] = MODELS) -> bool:
    """A bar chart (PNG) of ``<model>_b1_vs_host_ort`` with the 1.0 target line and the
    geometric mean; False (and a warning) without matplotlib or any ratio."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        log.warning("matplotlib is not installed: no %s", path)
        return False
    pairs = [(m, res.get(f"{m}_b1_vs_host_ort")) for m in models]
    shown = [(m, float(r)) for m, r in pairs if r is not None]
    if not shown:
        log.warning("no model has both an NPU and a host onnxruntime figure: no chart")
        return False
    fig, ax = plt.subplots(figsize=(8, 4.2), dpi=100)
    names = [m for m, _ in shown]
    values = [r for _, r in shown]
    bars = ax.bar(names, values, color=["#2a9d8f" if v >= 1 else "#e76f51" for v in values])
    ax.bar_label(bars, labels=[f"{v:.2f}" for v in values], padding=2, fontsize=9)
    ax.axhline(1.0, color="black", linewidth=1, linestyle="--", label="parity (target)")
    geo = res.get("models_b1_vs_host_ort_geomean")
    if geo:
        ax.axhline(geo, color="#264653", linewidth=1, linestyle=":",
                   label=f"geometric mean {geo:.2f}")  # fmt: skip
    ax.set_ylabel("host onnxruntime ms / NPU ms (batch 1)")
    ax.set_title("NPU in the guest vs onnxruntime on the host (2 threads); higher is better")
    ax.set_ylim(0, max(1.2, max(values) * 1.2))
    ax.tick_params(axis="x", labelrotation=20)
    ax.legend(loc="upper right", fontsize=9)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, metadata={"Software": None})
    plt.close(fig)
    log.info("wrote %s", path)
    return True


def main(argv: list[str] | None = None) -> int:
    """Measure the models given (default: all) and print their keys as JSON."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("models", nargs="*", metavar="MODEL", help=f"of {', '.join(MODELS)} (all)")
    ap.add_argument("--quick", action="store_true", help="fewer runs")
    args = ap.parse_args(argv)
    unknown = set(args.models) - set(MODELS)
    if unknown:
        ap.error(f"unknown models: {', '.join(sorted(unknown))}")
    logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="[host-ort] %(message)s")
    print(json.dumps(measure(tuple(args.models) or MODELS, args.quick), sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.exit(main())
