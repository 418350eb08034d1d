#!/usr/bin/env python3
"""ONNX inference benchmarks, run inside the guest (``make bench`` runs it).

The digits CNN (batch-1 latency, batch-64 throughput) and the ResNet-style
network (batch-8 throughput) of examples/models/ through
``npu.InferenceSession`` on the NPU and on the CPU provider (numpy in the
guest), measured with the helpers of inference_common.py that
infer_digits.py and infer_resnet.py use. Results are checked: the NPU's
digits predictions must equal numpy's on the benchmark batch and the
ResNet's logits must be within tolerance of the reference; the script exits
1 otherwise. Progress goes to stderr; the last line of stdout is one JSON
object (keys in docs/benchmarks.md)::

    python3 examples/bench_inference.py

Environment: ``BENCH_QUICK=1`` shrinks the repetition counts.
"""

from __future__ import annotations

import json
import logging
import sys
import time
from typing import Any

import inference_common as ic

# The keys below name the batch sizes.
assert ic.BATCH == 64 and ic.RESNET_BATCH == 8

log = logging.getLogger("bench_inference")


def breakdown_keys(prefix: str, bd: ic.Breakdown | None) -> dict[str, float]:
    """The NPU time breakdown of one run as <prefix>_<part>_ms keys."""
    if bd is None:
        return {}
    return {
        f"{prefix}_{part}_ms": getattr(bd, f"{part}_s") * 1e3
        for part in ("upload", "compute", "download", "cpu", "total")
    }


def stream_keys(prefix: str, kernel: ic.Speed, stream: ic.Speed | None) -> dict[str, float]:
    """The NPU's batch-1 latency and batch throughput inside ``with npu.Stream(...)``,
    and the batch-1 ratio to the default stream's (SUBMIT) in the same run."""
    if stream is None:
        return {}
    return {
        f"{prefix}_b1_latency_ms_npu_stream": stream.latency_b1_s * 1e3,
        f"{prefix}_b{stream.batch}_images_per_s_npu_stream": stream.images_per_s,
        f"{prefix}_b1_stream_vs_submit": kernel.latency_b1_s / stream.latency_b1_s,
    }


def bench_digits_cnn() -> dict[str, Any]:
    """digits_cnn_* keys; raises RuntimeError if the NPU disagrees with numpy."""
    r = ic.digits("digits_cnn.onnx", accuracy=False, on_stream=True)
    if r.agree != r.n:
        raise RuntimeError(f"digits CNN: NPU and numpy disagree on {r.n - r.agree}/{r.n} images")
    res: dict[str, Any] = {
        "digits_cnn_b1_latency_ms_npu": r.npu.latency_b1_s * 1e3,
        "digits_cnn_b1_latency_ms_guest_numpy": r.cpu.latency_b1_s * 1e3,
        "digits_cnn_b64_images_per_s_npu": r.npu.images_per_s,
        "digits_cnn_b64_images_per_s_guest_numpy": r.cpu.images_per_s,
        "digits_cnn_b1_npu_vs_guest_numpy": r.cpu.latency_b1_s / r.npu.latency_b1_s,
        "digits_cnn_b64_npu_vs_guest_numpy": r.npu.images_per_s / r.cpu.images_per_s,
        "digits_cnn_guest_numpy_runs": list(r.cpu.runs),
        "digits_cnn_npu_partitions": r.partitions,
    }
    res.update(breakdown_keys("digits_cnn_b1_npu", r.npu.breakdown_b1))
    res.update(breakdown_keys("digits_cnn_b64_npu", r.npu.breakdown_batch))
    res.update(stream_keys("digits_cnn", r.npu, r.npu_stream))
    log.info(
        "digits CNN: b1 %.2f ms npu / %.1f ms numpy; b64 %.0f / %.1f images/s (%.1fx)",
        r.npu.latency_b1_s * 1e3,
        r.cpu.latency_b1_s * 1e3,
        r.npu.images_per_s,
        r.cpu.images_per_s,
        res["digits_cnn_b64_npu_vs_guest_numpy"],
    )
    return res


def bench_resnet() -> dict[str, Any]:
    """resnet_* keys; raises RuntimeError if the NPU's logits are out of tolerance."""
    r = ic.resnet(on_stream=True)
    if not r.within_tolerance:
        raise RuntimeError(f"ResNet: NPU logits off the reference by {r.max_diff_vs_ref:.3g}")
    res: dict[str, Any] = {
        "resnet_b8_images_per_s_npu": r.npu.images_per_s,
        "resnet_b8_images_per_s_guest_numpy": r.cpu.images_per_s,
        "resnet_b8_npu_vs_guest_numpy": r.npu.images_per_s / r.cpu.images_per_s,
        "resnet_b1_latency_ms_npu": r.npu.latency_b1_s * 1e3,
        "resnet_b1_latency_ms_guest_numpy": r.cpu.latency_b1_s * 1e3,
        "resnet_max_abs_diff_vs_guest_numpy": r.max_diff_vs_cpu,
        "resnet_guest_numpy_runs": list(r.cpu.runs),
        "resnet_npu_partitions": r.partitions,
    }
    res.update(breakdown_keys("resnet_b8_npu", r.npu.breakdown_batch))
    res.update(stream_keys("resnet", r.npu, r.npu_stream))
    log.info(
        "ResNet: b8 %.1f images/s npu / %.2f numpy (%.1fx); max |npu - numpy| %.2g",
        r.npu.images_per_s,
        r.cpu.images_per_s,
        res["resnet_b8_npu_vs_guest_numpy"],
        r.max_diff_vs_cpu,
    )
    return res


def main() -> int:
    """Run both benchmarks; print the JSON result; 0 on success, 1 on a wrong result."""
    logging.basicConfig(
        level=logging.INFO, stream=sys.stderr, format="bench_inference: %(message)s"
    )
    if ic.device_line() is None:
        log.error("no NPU found: is the driver loaded? (insmod kernel_module/npu.ko)")
        return 1
    t0 = time.perf_counter()
    result: dict[str, Any] = {}
    try:
        result.update(bench_digits_cnn())
        result.update(bench_resnet())
    except RuntimeError as e:
        log.error("WRONG RESULT: %s", e)
        return 1
    result["inference_bench_s"] = time.perf_counter() - t0
    print(json.dumps(result, sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.exit(main())
