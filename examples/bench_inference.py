#!/usr/bin/env python3
"""ONNX inference benchmarks, run inside the guest (``make bench`` runs it).

The digits CNN (batch-1 latency, batch-64 throughput) and the ResNet-style
network (batch-8 throughput) of examples/models/ through
``npu.InferenceSession`` on the NPU and on the CPU provider (numpy in the
guest), measured with the helpers of inference_common.py that
infer_digits.py and infer_resnet.py use. The guest's onnxruntime
(``onnxruntime.InferenceSession(path, providers=["CPUExecutionProvider"])``,
one intra-op thread per guest CPU) is a second CPU baseline, measured the
same way: the ``*_guest_ort`` keys beside the ``*_guest_numpy`` ones, and
``*_npu_vs_guest_ort`` ratios beside ``*_npu_vs_guest_numpy``. Every CPU
baseline is the median of at least ic.GUEST_MIN_RUNS timed runs after a
warm-up run. Without an importable onnxruntime those keys are null and a
warning is logged; the benchmark still passes.

Results are checked: the NPU's digits predictions must equal numpy's (and
onnxruntime's) on the benchmark batch, the ResNet's logits must be within
tolerance of the reference and onnxruntime's within the same tolerance of
the reference and of numpy's; the script exits 1 otherwise. Progress goes
to stderr; the last line of stdout is one JSON object (keys in
docs/benchmarks.md), with ``guest_env`` (onnxruntime's version, or null)
for scripts/bench.py's ``meta``::

    python3 examples/bench_inference.py

Environment: ``BENCH_QUICK=1`` shrinks the repetition counts (not below
ic.GUEST_MIN_RUNS for the CPU baselines).
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


def ort_keys(
    prefix: str, npu: ic.Speed, cpu: ic.Speed, ort: ic.Speed | None, b1_ratio: bool
) -> dict[str, Any]:
    """One model's guest-onnxruntime keys, named like its guest-numpy ones.

    ``<prefix>_b1_latency_ms_guest_ort``, ``<prefix>_b<batch>_images_per_s_guest_ort``,
    ``<prefix>_b<batch>_npu_vs_guest_ort`` (NPU images/s over onnxruntime's),
    ``<prefix>_b1_npu_vs_guest_ort`` if b1_ratio (where a batch-1 numpy ratio
    exists too), ``<prefix>_b<batch>_guest_ort_vs_guest_numpy`` (onnxruntime's
    images/s over numpy's: how strong each CPU baseline is) and
    ``<prefix>_guest_ort_runs`` ([batch-1, batch] run counts). All None
    without onnxruntime."""
    b = npu.batch
    names = [
        f"{prefix}_b1_latency_ms_guest_ort",
        f"{prefix}_b{b}_images_per_s_guest_ort",
        f"{prefix}_b{b}_npu_vs_guest_ort",
        f"{prefix}_b{b}_guest_ort_vs_guest_numpy",
        f"{prefix}_guest_ort_runs",
    ]
    if b1_ratio:
        names.append(f"{prefix}_b1_npu_vs_guest_ort")
    if ort is None:
        return dict.fromkeys(names, None)
    res: dict[str, Any] = {
        f"{prefix}_b1_latency_ms_guest_ort": ort.latency_b1_s * 1e3,
        f"{prefix}_b{b}_images_per_s_guest_ort": ort.images_per_s,
        f"{prefix}_b{b}_npu_vs_guest_ort": npu.images_per_s / ort.images_per_s,
        f"{prefix}_b{b}_guest_ort_vs_guest_numpy": ort.images_per_s / cpu.images_per_s,
        f"{prefix}_guest_ort_runs": list(ort.runs),
    }
    if b1_ratio:
        res[f"{prefix}_b1_npu_vs_guest_ort"] = ort.latency_b1_s / npu.latency_b1_s
    return res


def log_ort(what: str, npu: ic.Speed, ort: ic.Speed | None) -> None:
    """One progress line for a model's onnxruntime baseline."""
    if ort is None:
        log.info("%s: no onnxruntime baseline", what)
        return
    log.info(
        "%s: onnxruntime b1 %.2f ms, b%d %.1f images/s (npu %.1fx); runs %s",
        what,
        ort.latency_b1_s * 1e3,
        ort.batch,
        ort.images_per_s,
        npu.images_per_s / ort.images_per_s,
        ort.runs,
    )


def bench_digits_cnn() -> tuple[dict[str, Any], str | None]:
    """(digits_cnn_* keys, onnxruntime's version or None); raises RuntimeError if
    the NPU disagrees with numpy or onnxruntime (when importable)."""
    r = ic.digits("digits_cnn.onnx", accuracy=False, on_stream=True, with_ort=True)
    if r.agree != r.n:
        raise RuntimeError(f"digits CNN: NPU and numpy disagree on {r.n - r.agree}/{r.n} images")
    if r.agree_ort is not None and r.agree_ort != r.n:
        raise RuntimeError(
            f"digits CNN: NPU and onnxruntime disagree on {r.n - r.agree_ort}/{r.n} images"
        )
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
    res.update(ort_keys("digits_cnn", r.npu, r.cpu, r.ort, b1_ratio=True))
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
    log_ort("digits CNN", r.npu, r.ort)
    return res, r.ort_version


def bench_resnet() -> tuple[dict[str, Any], str | None]:
    """(resnet_* keys, onnxruntime's version or None); raises RuntimeError if the
    NPU's logits (or onnxruntime's, when importable) are out of tolerance."""
    r = ic.resnet(on_stream=True, with_ort=True)
    if not r.within_tolerance:
        raise RuntimeError(f"ResNet: NPU logits off the reference by {r.max_diff_vs_ref:.3g}")
    if r.ort_within_tolerance is False:
        raise RuntimeError(
            "ResNet: onnxruntime logits out of tolerance of the reference or numpy "
            f"(off the reference by {r.max_diff_ort_vs_ref:.3g})"
        )
    res: dict[str, Any] = {
        "resnet_b8_images_per_s_npu": r.npu.images_per_s,
        "resnet_b8_images_per_s_guest_numpy": r.cpu.images_per_s,
        "resnet_b8_npu_vs_guest_numpy": r.npu.images_per_s / r.cpu.images_per_s,
        "resnet_b1_latency_ms_npu": r.npu.latency_b1_s * 1e3,
        "resnet_b1_latency_ms_guest_numpy": r.cpu.latency_b1_s * 1e3,
        "resnet_max_abs_diff_vs_guest_numpy": r.max_diff_vs_cpu,
        "resnet_guest_numpy_runs": list(r.cpu.runs),
        "resnet_npu_partitions": r.partitions,
        "resnet_max_abs_diff_vs_guest_ort": r.max_diff_vs_ort,
    }
    res.update(ort_keys("resnet", r.npu, r.cpu, r.ort, b1_ratio=False))
    res.update(breakdown_keys("resnet_b8_npu", r.npu.breakdown_batch))
    res.update(stream_keys("resnet", r.npu, r.npu_stream))
    log.info(
        "ResNet: b8 %.1f images/s npu / %.2f numpy (%.1fx); max |npu - numpy| %.2g",
        r.npu.images_per_s,
        r.cpu.images_per_s,
        res["resnet_b8_npu_vs_guest_numpy"],
        r.max_diff_vs_cpu,
    )
    log_ort("ResNet", r.npu, r.ort)
    return res, r.ort_version


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
    versions: list[str | None] = []
    try:
        for bench in (bench_digits_cnn, bench_resnet):
            keys, version = bench()
            result.update(keys)
            versions.append(version)
    except RuntimeError as e:
        log.error("WRONG RESULT: %s", e)
        return 1
    version = next((v for v in versions if v is not None), None)
    # For scripts/bench.py's meta (guest_onnxruntime, guest_onnxruntime_threads).
    result["guest_env"] = {
        "onnxruntime": version,
        "onnxruntime_threads": ic.ORT_THREADS if version is not None else None,
    }
    result["inference_bench_s"] = time.perf_counter() - t0
    print(json.dumps(result, sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.exit(main())
