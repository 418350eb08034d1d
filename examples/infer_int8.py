#!/usr/bin/env python3
"""int8 models on the NPU: the digits CNN and the small ResNet, quantised.

The models are onnxruntime static quantisations (QDQ form, int8
activations, per-channel symmetric int8 weights) of the fp32 models,
made on the host by examples/models/quantize_models.py (``make models``;
the digits CNN calibrated on its training split). ``npu.InferenceSession``
fuses each ``DequantizeLinear -> Conv/Gemm -> QuantizeLinear`` island into
an integer node (QLinearConv, QGemm) that the NPU runs as its integer
CONV2D/LINEAR with exact int32 sums and one REQUANT; the rest (input
quantisation, max pools, residual adds) run as QuantizeLinear /
DequantizeLinear and float ops on the NPU. For each model the example:

1. checks that it runs as one NPU partition;
2. classifies: the digits CNN's test accuracy, int8 against fp32 (both on
   the NPU), which must be within 1 point; the small ResNet (seeded, not
   trained: no labels) its top-1 agreement with its fp32 model on a
   seeded set of 256 images (printed: int8 rounding flips its close
   calls, docs/decisions.md);
3. compares the NPU's int8 outputs with the CPU provider's (numpy, the
   same integer definition): equal bit for bit for the digits CNN, whose
   float steps (max pools) are exact; the ResNet's global average pool
   and residual adds are float sums whose last bit depends on the order,
   and a 1-ulp difference before a QuantizeLinear can move a value by
   one step, so there the top classes must agree on 95% of the images;
4. times batch-1 latency and batch-64 throughput of int8 against fp32 on
   the NPU.

Run in the guest::

    python3 examples/infer_int8.py [--json]

Exits 1 if a check fails.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

import inference_common as ic
import numpy as np

RESNET_EVAL_SEED = 12  # as examples/models/quantize_models.py
RESNET_EVAL_BATCH = 256
MAX_DROP = 0.01
MIN_CPU_AGREEMENT = 0.95


def resnet_eval_images() -> ic.Array:
    """The small ResNet's seeded evaluation images (float32 [256, 3, 32, 32])."""
    rng = np.random.default_rng(RESNET_EVAL_SEED)
    return rng.standard_normal((RESNET_EVAL_BATCH, 3, 32, 32)).astype(np.float32)


def evaluate(
    name: str, fp32: str, int8: str, x: ic.Array, y: ic.Array | None, exact: bool
) -> dict[str, Any]:
    """Run one model pair on ``x``; the figures and whether the checks hold.

    ``exact``: the NPU's int8 outputs must equal numpy's bit for bit (else
    their top classes must agree on MIN_CPU_AGREEMENT of the images).
    """
    s8 = ic.session(int8, ic.NPU_PROVIDERS)
    s32 = ic.session(fp32, ic.NPU_PROVIDERS)
    c8 = ic.session(int8, ic.CPU_PROVIDERS)
    got8 = ic.predict(s8, x)
    got32 = ic.predict(s32, x)
    cpu8 = ic.predict(c8, x[: ic.BATCH])
    one = [p.provider for p in s8.partitions] == ["NPU"]
    same = bool(np.array_equal(got8[: ic.BATCH], cpu8))
    cpu_agree = float(np.mean(got8[: ic.BATCH].argmax(axis=1) == cpu8.argmax(axis=1)))
    p8, p32 = got8.argmax(axis=1), got32.argmax(axis=1)
    fig: dict[str, Any] = {
        "model": name,
        "partitions": ic.describe_partitions(s8),
        "fused": int(s8.rewrites.get("fuse_qdq", 0)),
        "one_partition": one,
        "npu_equals_cpu": same,
        "npu_cpu_top1_agreement": cpu_agree,
        "agreement": float(np.mean(p8 == p32)),
    }
    ok = one and (same if exact else cpu_agree >= MIN_CPU_AGREEMENT)
    if y is not None:
        fig["accuracy_int8"] = float(np.mean(p8 == y))
        fig["accuracy_fp32"] = float(np.mean(p32 == y))
        ok = ok and fig["accuracy_int8"] >= fig["accuracy_fp32"] - MAX_DROP
    xb = x[: ic.BATCH]
    for key, sess in (("int8", s8), ("fp32", s32)):
        speed = ic.measure(sess, x[:1], xb, on_npu=True)
        fig[f"latency_b1_ms_{key}"] = speed.latency_b1_s * 1e3
        fig[f"images_per_s_{key}"] = speed.images_per_s
    fig["ok"] = ok
    return fig


def report(f: dict[str, Any]) -> None:
    """Print one model's figures."""
    print(f"\n{f['model']}  (partitions: {', '.join(f['partitions'])}; "
          f"{f['fused']} QDQ islands fused into integer ops)")  # fmt: skip
    if "accuracy_int8" in f:
        print(f"  test accuracy      int8 {f['accuracy_int8'] * 100:6.2f} %   "
              f"fp32 {f['accuracy_fp32'] * 100:6.2f} %")  # fmt: skip
    print(f"  top-1 agreement with fp32   {f['agreement'] * 100:6.2f} %")
    same = "bit for bit" if f["npu_equals_cpu"] else "not bit for bit"
    print(f"  NPU int8 vs numpy int8      {same}, "
          f"top-1 {f['npu_cpu_top1_agreement'] * 100:.2f} %")  # fmt: skip
    print(f"  batch-1 latency    int8 {f['latency_b1_ms_int8']:8.2f} ms   "
          f"fp32 {f['latency_b1_ms_fp32']:8.2f} ms")  # fmt: skip
    print(f"  batch-{ic.BATCH} images/s  int8 {f['images_per_s_int8']:8.1f}      "
          f"fp32 {f['images_per_s_fp32']:8.1f}")  # fmt: skip
    print(f"  {'OK' if f['ok'] else 'FAILED'}")


def main(argv: list[str] | None = None) -> int:
    """Evaluate both int8 models; print a report or one JSON line."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--json", action="store_true", help="print the figures as one JSON line")
    args = ap.parse_args(argv)
    x, y = ic.load_digits_split()
    digits = evaluate("digits_cnn", "digits_cnn.onnx", "digits_cnn_int8.onnx", x, y, True)
    resnet = evaluate(
        "resnet_small",
        "resnet_small.onnx",
        "resnet_small_int8.onnx",
        resnet_eval_images(),
        None,
        False,
    )
    ok = digits["ok"] and resnet["ok"]
    if args.json:
        print(json.dumps({
            "digits_cnn_int8_accuracy": digits["accuracy_int8"],
            "digits_cnn_fp32_accuracy": digits["accuracy_fp32"],
            "digits_cnn_int8_b64_images_per_s_npu": digits["images_per_s_int8"],
            "digits_cnn_fp32_b64_images_per_s_npu": digits["images_per_s_fp32"],
            "resnet_small_int8_top1_agreement": resnet["agreement"],
            "resnet_small_int8_b64_images_per_s_npu": resnet["images_per_s_int8"],
            "resnet_small_fp32_b64_images_per_s_npu": resnet["images_per_s_fp32"],
            "int8_examples_ok": ok,
        }))  # fmt: skip
    else:
        report(digits)
        report(resnet)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
