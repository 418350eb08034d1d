#!/usr/bin/env python3
"""A ResNet-style network on the NPU against numpy in the guest.

Loads examples/models/resnet_small.onnx (a CIFAR ResNet-8 shape with fixed
seeded weights: 15 convolutions with batchnorm, 6 residual additions,
global average pooling and a linear layer; docs/models.md) with
``npu.InferenceSession`` on the NPU and on the CPU provider (numpy in this
guest), runs the seeded sample batch of 8 32x32 RGB inputs and prints the
largest logit difference against numpy and against the reference logits
computed on the host, batch-1 latency and batch-8 throughput of both, and
the NPU's time breakdown. Exits 1 if the NPU's logits are outside the
documented tolerance of the reference. Run in the guest::

    python3 examples/infer_resnet.py     # or: make demo DEMO=examples/infer_resnet.py
"""

from __future__ import annotations

import sys
import time

import inference_common as ic


def main() -> int:
    """Run the ResNet; 0 if the NPU's logits are within tolerance."""
    dev = ic.device_line()
    if dev is None:
        print("no NPU found: is the driver loaded? (insmod kernel_module/npu.ko)")
        return 1
    print("ResNet-style network (resnet_small.onnx) on the NPU, batch of 8 32x32 RGB inputs")
    print(f"device {dev}")
    t0 = time.perf_counter()
    r = ic.resnet()
    print(
        f"NPU partitions: {', '.join(r.partitions) or 'none'}; "
        f"CPU fallbacks: {', '.join(r.fallbacks) or 'none'}"
    )
    print(ic.header())
    for row in ic.speed_rows(r.npu, r.cpu):
        print(row)
    for what, bd in (("batch 1", r.npu.breakdown_b1), ("batch 8", r.npu.breakdown_batch)):
        if bd is not None:
            print(f"  NPU time per run, {what} (medians): {bd.line()}")
    print(f"  max |NPU - numpy| logits:           {r.max_diff_vs_cpu:.3g}")
    print(
        f"  max |NPU - reference| logits:       {r.max_diff_vs_ref:.3g} "
        f"(tolerance {ic.RESNET_ATOL:g} + {ic.RESNET_RTOL:g} * |ref|: "
        f"{'within' if r.within_tolerance else 'OUTSIDE'})"
    )
    print(f"  same top-1 class as numpy:          {r.same_top1}/{ic.RESNET_BATCH}")
    print(f"done in {time.perf_counter() - t0:.0f} s")
    return 0 if r.within_tolerance else 1


if __name__ == "__main__":
    sys.exit(main())
