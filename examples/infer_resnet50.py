#!/usr/bin/env python3
"""ResNet-50 end to end on the NPU: camera images in, logits out, timed against the CPU.

The flagship example. It loads build/models/resnet50.onnx (ResNet-50 v1
with seeded weights, made on the host by ``make models``:
examples/models/make_resnet50.py, docs/models.md) and its seeded sample
of 8 uint8 256x256 RGB images, then:

1. **the input pipeline on the NPU**: the uint8 HWC images are pinned
   where they are (``npu.from_numpy`` of their bytes as int8) and the
   device widens them to float (an int8 byte b is the pixel b + 256 for b
   < 0: a compare, a convert and a multiply-add), makes them NCHW (a
   view), resizes to 240 and centre-crops 224 as two matrix products with
   constant bilinear weights (``Ry @ img @ Rx^T``: exact for a separable
   linear resize), and normalises (one multiply-add per channel with the
   ImageNet mean and std folded in); checked against the float64 pipeline
   of make_resnet50.py;
2. **inference** with ``npu.InferenceSession``: the whole network is one
   NPU partition (BatchNormalization folded into the convolutions, the
   residual adds, pooling and the classifier); the logits are checked
   against the float64 numpy reference of the sample;
3. **speed**: batch-1 latency and batch-8 throughput on the NPU, against
   onnxruntime in the guest (if importable) and the CPU provider (numpy)
   in the guest (few runs: under TCG they take seconds per image);
4. **the NPU's time per layer**, from the device's completion records
   (``InferenceSession.node_times()``): the ten slowest layers and the
   share per op type.

Run in the guest::

    python3 examples/infer_resnet50.py [--json] [--no-baselines]

Exits 1 if the pipeline or the logits are outside tolerance, or the model
does not run as one NPU partition.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent / "models"))

import inference_common as ic
from make_resnet50 import DEFAULT_OUT, MEAN, STD, crop_matrices

import npu

MODEL = DEFAULT_OUT / "resnet50.onnx"
SAMPLE = DEFAULT_OUT / "resnet50_sample.npz"
# The pipeline against float64 (fp32 matrix products of 0..255 pixels).
PIPELINE_ATOL = 2e-4
# Logits: |got - want| <= LOGIT_ATOL * max|want| (53 fp32 convolutions).
LOGIT_ATOL = 2e-3
# Under TCG a CPU run of ResNet-50 takes seconds per image: the baselines get
# one timed run after the warm-up at each batch size (more if the time
# budgets of inference_common allow).
CPU_MIN_RUNS = 1


class Pipeline:
    """uint8 HWC images -> normalised NCHW float32 crops, on the NPU."""

    def __init__(self, height: int, width: int) -> None:
        ry, _ = crop_matrices(height)
        _, rxt = crop_matrices(width)
        self.ry = npu.tensor(ry.astype(np.float32))
        self.rxt = npu.tensor(rxt.astype(np.float32))
        scale = 1.0 / (255.0 * STD)
        shift = -MEAN / STD
        self.scale = npu.tensor(scale.astype(np.float32).reshape(1, 3, 1, 1))
        self.shift = npu.tensor(shift.astype(np.float32).reshape(1, 3, 1, 1))

    def __call__(self, images: np.ndarray) -> np.ndarray:
        """The model's input for ``images`` (uint8 [N, H, W, 3])."""
        raw = npu.from_numpy(images.view(np.int8))  # pinned in place, no copy
        f = raw.astype(npu.float32)
        pixels = f + npu.less(f, 0).astype(npu.float32) * 256.0  # int8 byte -> 0..255
        chw = pixels.permute(0, 3, 1, 2)
        crop = npu.matmul(npu.matmul(self.ry, chw), self.rxt)
        return (crop * self.scale + self.shift).numpy()


def median_ms(fn: Callable[[], Any], runs: int) -> float:
    """Median wall time of ``fn`` in ms over ``runs`` runs, after one warm-up run."""
    fn()
    return statistics.median(ic.timed_runs(fn, runs)) * 1e3


def speed_keys(name: str, speed: ic.Speed | None) -> dict[str, float | None]:
    """The bench keys of one engine's :class:`inference_common.Speed`."""
    if speed is None:
        return {f"resnet50_b1_latency_ms_{name}": None, f"resnet50_b8_images_per_s_{name}": None}
    return {
        f"resnet50_b1_latency_ms_{name}": round(speed.latency_b1_s * 1e3, 2),
        f"resnet50_b8_images_per_s_{name}": round(speed.images_per_s, 2),
    }


def baselines(x: np.ndarray, want: np.ndarray) -> dict[str, float | None]:
    """onnxruntime (in a child process) and the CPU provider (numpy) in this guest,
    measured as the NPU is (inference_common.measure: a warm-up, then the
    median of the timed runs; at least CPU_MIN_RUNS of them)."""
    out: dict[str, float | None] = {}
    ort = ic.ort_baseline(str(MODEL), x, x[:1], x, min_runs=CPU_MIN_RUNS)
    if ort is not None:
        err = float(np.abs(ort.logits - want).max() / np.abs(want).max())
        print(f"onnxruntime {ort.version}: logits max rel diff {err:.1e}", flush=True)
    out.update(speed_keys("guest_ort", None if ort is None else ort.speed))
    cpu = npu.InferenceSession(str(MODEL), providers=ic.CPU_PROVIDERS)
    speed = ic.measure(cpu, x[:1], x, on_npu=False, min_runs=CPU_MIN_RUNS)
    out.update(speed_keys("guest_numpy", speed))
    return out


def layer_report(sess: npu.InferenceSession) -> tuple[list[str], dict[str, float]]:
    """The ten slowest layers (lines) and the share of device time per op type."""
    times = sess.node_times()
    total = sum(t.device_us for t in times) or 1.0
    lines = []
    for t in sorted(times, key=lambda t: -t.device_us)[:10]:
        fused = f" (+{', '.join(t.fused)})" if t.fused else ""
        lines.append(f"  {t.name:<24} {t.op_type:<18} {t.device_us / 1e3:7.2f} ms "
                     f"{100 * t.device_us / total:5.1f}%{fused}")  # fmt: skip
    share: dict[str, float] = {}
    for t in times:
        share[t.op_type] = share.get(t.op_type, 0.0) + t.device_us / total
    return lines, share


def main() -> int:
    """Pipeline, inference, checks, timings; 0 if everything is within tolerance."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", action="store_true", help="print the figures as one JSON line")
    ap.add_argument("--no-baselines", action="store_true", help="skip onnxruntime and numpy")
    args = ap.parse_args()
    if not MODEL.exists():
        print(f"{MODEL} is missing: run `make models` on the host")
        return 1
    with np.load(SAMPLE) as d:
        images, x_ref, want = d["images"], d["x"], d["logits"]
    ok = True

    pipe = Pipeline(images.shape[1], images.shape[2])
    x = pipe(images)
    pipe_err = float(np.abs(x - x_ref).max())
    ok &= pipe_err <= PIPELINE_ATOL
    pipe_ms = median_ms(lambda: pipe(images), 5)

    t0 = time.perf_counter()
    sess = npu.InferenceSession(str(MODEL))
    load_s = time.perf_counter() - t0
    inp = sess.get_inputs()[0].name
    got = sess.run(None, {inp: x})[0]
    err = float(np.abs(got - want).max() / np.abs(want).max())
    top1 = int((got.argmax(1) == want.argmax(1)).sum())
    ok &= err <= LOGIT_ATOL and top1 == len(want)
    npu_parts = [p for p in sess.partitions if p.provider == "NPU"]
    ok &= len(sess.partitions) == 1 and len(npu_parts) == 1

    speed = ic.measure(sess, x[:1], x, on_npu=True)
    piped = ic.measure_pipelined(sess, x)
    sess.run(None, {inp: x[:1]})
    lines, share = layer_report(sess)  # per layer at batch 1
    figures: dict[str, Any] = {
        **speed_keys("npu", speed),
        "resnet50_b8_images_per_s_npu_sequential": round(piped.sequential_images_per_s, 2),
        "resnet50_b8_images_per_s_npu_pipelined": round(piped.pipelined_images_per_s, 2),
        "resnet50_b8_pipelined_speedup": round(piped.speedup, 3),
        "pipeline_overlap": round(piped.overlap, 3),
        "resnet50_partitions": len(sess.partitions),
        "resnet50_pipeline_ms_b8_npu": round(pipe_ms, 2),
        "resnet50_max_rel_logit_diff": err,
        "resnet50_top1_agreement": f"{top1}/{len(want)}",
        "resnet50_load_s": round(load_s, 1),
    }
    if not args.json:
        print(f"NPU: batch 1 {speed.latency_b1_s * 1e3:.1f} ms, batch 8 "
              f"{speed.images_per_s:.1f} images/s; logits max rel diff {err:.1e}, "
              f"top-1 {top1}/{len(want)}", flush=True)  # fmt: skip
        print(f"NPU batch 8, 8 requests: {piped.sequential_images_per_s:.1f} images/s one "
              f"after another, {piped.pipelined_images_per_s:.1f} pipelined (run_async; "
              f"{piped.speedup:.2f}x), copy time hidden {piped.overlap:.0%}",
              flush=True)  # fmt: skip
    if not args.no_baselines:
        figures.update(baselines(x, want))
    if args.json:
        print(json.dumps(figures))
        return 0 if ok else 1
    print(f"ResNet-50 ({MODEL.name}, {len(sess.graph.nodes)} nodes after the rewrites), "
          f"loaded in {load_s:.1f} s; partitions: "
          f"{', '.join(f'{p.provider}[{len(p.nodes)}]' for p in sess.partitions)}")  # fmt: skip
    print(f"pipeline on the NPU (8 images 256x256 uint8 -> 3x224x224): {pipe_ms:.1f} ms, "
          f"max |err| vs float64 {pipe_err:.1e}")  # fmt: skip
    print(f"logits: max |NPU - reference| / max |reference| = {err:.1e}; top-1 agrees "
          f"{top1}/{len(want)}")  # fmt: skip
    b1 = figures["resnet50_b1_latency_ms_npu"]
    for name in ("guest_ort", "guest_numpy"):
        lat = figures.get(f"resnet50_b1_latency_ms_{name}")
        if lat is not None:
            print(f"{name}: batch 1 {lat:.0f} ms ({lat / b1:.1f}x the NPU's), batch 8 "
                  f"{figures[f'resnet50_b8_images_per_s_{name}']} images/s")  # fmt: skip
    print("NPU time per layer (batch 1, device clock), the ten slowest:")
    print("\n".join(lines))
    print("by op type: " + ", ".join(f"{k} {100 * v:.0f}%" for k, v in
                                     sorted(share.items(), key=lambda kv: -kv[1])))  # fmt: skip
    print("OK" if ok else "OUT OF TOLERANCE")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
