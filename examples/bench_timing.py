#!/usr/bin/env python3
"""The chip timing model in the guest (``make bench`` runs it once per chip).

Run in a guest whose device was started with ``timing=<chip>``
(``NPU_DEVICES="-device npu,timing=edge"``). It checks that sysfs says so,
then measures:

- ``timing_model_gemm_error_pct_<chip>`` and ``..._conv_error_pct_<chip>``:
  how far a GEMM's and a CONV2D's device time (``t_end - t_start`` of their
  completion records) is from the chip description's roofline computed here
  by :mod:`npu.chips` from the op's shape (issue 19's target: within 5 %),
  with ``..._bound_<chip>`` saying which bound each case hits;
- ``timing_model_resnet50_ms_<chip>``: ResNet-50 at batch 1
  (build/models/resnet50.onnx), the device time of its NPU ops in one run
  summed over the nodes (``InferenceSession.node_times``): what the chip
  would spend on it, host gaps excluded (median of 3 runs after a warm-up),
  and ``timing_model_resnet50_nodes_<chip>``, how many NPU nodes that is.

The last line of stdout is one JSON object::

    python3 examples/bench_timing.py --chip edge
"""

from __future__ import annotations

import argparse
import json
import logging
import statistics
import sys
from pathlib import Path
from typing import Any

import numpy as np

import npu
from npu import ops
from npu.chips import CHIPS, Chip

log = logging.getLogger("bench_timing")

ROOT = Path(__file__).resolve().parent.parent
RESNET50 = ROOT / "build" / "models" / "resnet50.onnx"
SYSFS_TIMING = "/sys/class/accel/accel0/device/npu/timing"
FP32 = 4


def device_ns(dev: npu.Device, fence: int) -> int:
    info = dev.fence_info(fence)
    return info.t_end_ns - info.t_start_ns


def error_pct(got: int, want: int) -> float:
    return abs(got - want) / want * 100.0


def gemm_case(dev: npu.Device, chip: Chip, m: int, n: int, k: int) -> tuple[float, str]:
    a, b, c = (dev.alloc(r * s * FP32) for r, s in ((m, k), (k, n), (m, n)))
    with a, b, c:
        a.write(np.ones(m * k, np.float32).tobytes())
        b.write(np.ones(k * n, np.float32).tobytes())
        fence = dev.submit([ops.gemm(a, b, c, m, n, k)])
        dev.wait(fence, timeout_s=120)
        want = chip.roofline(m * n * k, (m * k + k * n + m * n) * FP32, npu.DType.FP32)
        got = device_ns(dev, fence)
    log.info(
        "GEMM %dx%dx%d: %d ns, roofline %d ns (%s-bound)",
        m,
        n,
        k,
        got,
        want.duration_ns,
        want.bound,
    )
    return error_pct(got, want.duration_ns), want.bound


def conv_case(dev: npu.Device, chip: Chip) -> tuple[float, str]:
    n, c, h, w, o = 1, 64, 56, 56, 64
    shapes = {"x": (n, c, h, w), "w": (o, c, 3, 3), "b": (1, o, 1, 1), "y": (n, o, h, w)}
    bufs = {k: dev.alloc(int(np.prod(s)) * FP32) for k, s in shapes.items()}
    try:
        rng = np.random.default_rng(1)
        for key in ("x", "w", "b"):
            bufs[key].write(
                rng.standard_normal(int(np.prod(shapes[key])), dtype=np.float32).tobytes()
            )
        refs = {k: ops.tensor_ref(bufs[k], npu.DType.FP32, shapes[k]) for k in shapes}
        op = ops.conv2d_op(
            refs["x"], refs["w"], refs["b"], refs["y"], 1, 1, buffers=tuple(bufs.values())
        )
        fence = dev.submit([op])
        dev.wait(fence, timeout_s=120)
        macs = n * o * h * w * c * 9
        nbytes = sum(int(np.prod(s)) for s in shapes.values()) * FP32
        want = chip.roofline(macs, nbytes, npu.DType.FP32, conv=True)
        got = device_ns(dev, fence)
    finally:
        for buf in bufs.values():
            buf.close()
    log.info(
        "CONV2D 3x3 %dx%dx%d: %d ns, roofline %d ns (%s-bound)",
        c,
        h,
        w,
        got,
        want.duration_ns,
        want.bound,
    )
    return error_pct(got, want.duration_ns), want.bound


def resnet50_ms() -> tuple[float, int]:
    sess = npu.InferenceSession(str(RESNET50))
    x = np.random.default_rng(0).standard_normal((1, 3, 224, 224), dtype=np.float32)
    name = sess.get_inputs()[0].name
    sess.run(None, {name: x})  # warm-up: plans and uploads the weights
    totals = []
    for _ in range(3):
        sess.run(None, {name: x})
        times = sess.node_times()
        totals.append(sum(t.device_us for t in times) / 1000.0)
    return statistics.median(totals), len(times)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--chip", required=True, choices=sorted(CHIPS))
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(name)s: %(message)s", stream=sys.stderr)
    with open(SYSFS_TIMING) as f:
        mode = f.read().strip()
    if mode != args.chip:
        log.error("the device runs timing=%s, not %s", mode, args.chip)
        return 1
    chip = CHIPS[args.chip]
    out: dict[str, Any] = {}
    with npu.open_device(0) as dev:
        gemm_err, gemm_bound = gemm_case(dev, chip, 512, 512, 512)
        conv_err, conv_bound = conv_case(dev, chip)
    out[f"timing_model_gemm_error_pct_{args.chip}"] = round(gemm_err, 3)
    out[f"timing_model_gemm_bound_{args.chip}"] = gemm_bound
    out[f"timing_model_conv_error_pct_{args.chip}"] = round(conv_err, 3)
    out[f"timing_model_conv_bound_{args.chip}"] = conv_bound
    if RESNET50.is_file():
        ms, nodes = resnet50_ms()
        out[f"timing_model_resnet50_ms_{args.chip}"] = round(ms, 3)
        out[f"timing_model_resnet50_nodes_{args.chip}"] = nodes
    else:
        log.warning("%s missing (make resnet50): no ResNet-50 figure", RESNET50)
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
