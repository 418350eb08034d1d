#!/usr/bin/env python3
"""Real architectures on the NPU: batch-1 latency and batch-8 throughput per model.

Runs in the guest (``make bench`` runs it with ``--json``). It loads each
model of the benchmark zoo (build/models/, made on the host by ``make zoo``:
examples/models/make_zoo.py, docs/models.md) with
``npu.InferenceSession``, checks its logits of the 8 sample inputs of
zoo_sample.npz against onnxruntime's on the host (within 2e-3 x max
|logit| with the same top-1 class, docs/models.md's ResNet-50 tolerance),
then measures the median batch-1 latency and batch-8 throughput after a
warm-up of each. ResNet-50's figures come from examples/infer_resnet50.py.

With ``--ort`` each model also runs on the guest's onnxruntime (a child
process, :func:`inference_common.ort_baseline`): slow under TCG (VGG-19 takes
minutes), so off by default.

Keys per model (``<model>`` as in make_zoo.MODELS): ``<model>_b1_ms_npu``,
``<model>_b8_images_per_s_npu``, ``<model>_b1_ms_npu_sequential`` and
``<model>_b1_concurrent_speedup`` (the session with ``concurrent=False``,
runs interleaved with the default one; their outputs must be identical;
None for a model file above 256 MiB: VGG-19),
``<model>_partitions`` (partitions of the
session; 1: the whole network on the NPU), ``<model>_max_rel_logit_diff``;
with ``--ort`` also ``<model>_b1_ms_guest_ort`` and
``<model>_b8_images_per_s_guest_ort``.

Usage::

    python3 examples/bench_models.py [--json] [--ort] [MODEL ...]

Exits 1 if a model is missing or its logits are outside the tolerance.
``BENCH_QUICK=1`` cuts the repetitions. Progress goes to stderr, the JSON
(``--json``) is the last line of stdout.
"""

from __future__ import annotations

import argparse
import gc
import json
import logging
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent / "models"))

import inference_common as ic
from make_resnet50 import DEFAULT_OUT
from make_zoo import MODELS, SAMPLE

import npu

QUICK = os.environ.get("BENCH_QUICK", "") == "1"
BATCH = 8
# Timed runs after one warm-up run: (batch 1, batch 8). VGG-19 takes about half
# a second per image on the NPU.
RUNS = (3, 2) if QUICK else (10, 4)
# The concurrency A/B opens the model twice: not for a model file above this
# (VGG-19's 548 MiB of weights twice do not fit the guest; it is a chain of
# ops anyway, with nothing to run concurrently).
AB_MAX_MODEL_BYTES = 256 << 20
# docs/models.md, ResNet-50: |NPU - reference| <= LOGIT_RTOL * max |reference|.
LOGIT_RTOL = 2e-3

log = logging.getLogger("bench_models")


def speed(sess: npu.InferenceSession, x1: np.ndarray, xb: np.ndarray) -> ic.Speed:
    """Median batch-1 latency and batch throughput of sess, after a warm-up run of each."""
    f1, fb = ic.feed(sess, x1), ic.feed(sess, xb)
    sess.run(None, f1)
    t1 = ic.timed_runs(lambda: sess.run(None, f1), RUNS[0])
    sess.run(None, fb)
    tb = ic.timed_runs(lambda: sess.run(None, fb), RUNS[1])
    return ic.Speed(statistics.median(t1), len(xb), statistics.median(tb), (len(t1), len(tb)))


def concurrency_ab(
    sess: npu.InferenceSession, path: Path, x1: np.ndarray
) -> tuple[float, float, bool]:
    """(median batch-1 seconds of sess, of the same model with
    ``concurrent=False``, outputs identical): runs interleaved, so drift
    in the host's load hits both alike."""
    with npu.InferenceSession(str(path), concurrent=False) as seq:
        f1 = ic.feed(seq, x1)
        want = seq.run(None, f1)[0]
        got = sess.run(None, f1)[0]
        times: dict[bool, list[float]] = {True: [], False: []}
        for _ in range(RUNS[0]):
            for concurrent, s in ((True, sess), (False, seq)):
                t0 = time.perf_counter()
                s.run(None, f1)
                times[concurrent].append(time.perf_counter() - t0)
    return (
        statistics.median(times[True]),
        statistics.median(times[False]),
        bool(np.array_equal(got, want)),
    )


def bench(
    model: str, x: np.ndarray, want: np.ndarray, with_ort: bool
) -> tuple[bool, dict[str, Any]]:
    """(within tolerance, the keys) of one model."""
    path = DEFAULT_OUT / f"{model}.onnx"
    t0 = time.perf_counter()
    with npu.InferenceSession(str(path)) as sess:
        load_s = time.perf_counter() - t0
        got = ic.run(sess, x)
        err = float(np.abs(got - want).max() / np.abs(want).max())
        ok = err <= LOGIT_RTOL and bool((got.argmax(1) == want.argmax(1)).all())
        s = speed(sess, x[:1], x)
        ab = path.stat().st_size <= AB_MAX_MODEL_BYTES
        conc_s, seq_s, same = concurrency_ab(sess, path, x[:1]) if ab else (0.0, 0.0, True)
        ok &= same
        parts = [p.provider for p in sess.partitions]
        fallbacks = ic.describe_fallbacks(sess)
    log.info("%s: loaded in %.1f s; %d partitions (%d on the NPU); logits max rel diff %.1e%s; "
             "batch 1 %.1f ms, batch %d %.2f images/s", model, load_s, len(parts),
             parts.count("NPU"), err,
             "" if ok else " (OUT OF TOLERANCE)", s.latency_b1_s * 1e3, BATCH,
             s.images_per_s)  # fmt: skip
    if ab:
        log.info("%s: batch 1 with independent ops concurrent %.1f ms, one at a time %.1f ms%s",
                 model, conc_s * 1e3, seq_s * 1e3,
                 "" if same else " (OUTPUTS DIFFER)")  # fmt: skip
    for f in fallbacks[:3]:
        log.info("%s: on the CPU: %s%s", model, f, " ..." if len(fallbacks) > 3 else "")
    keys: dict[str, Any] = {
        f"{model}_b1_ms_npu": round(s.latency_b1_s * 1e3, 2),
        f"{model}_b{BATCH}_images_per_s_npu": round(s.images_per_s, 2),
        f"{model}_b1_ms_npu_sequential": round(seq_s * 1e3, 2) if ab else None,
        f"{model}_b1_concurrent_speedup": round(seq_s / conc_s, 3) if ab else None,
        f"{model}_partitions": len(parts),
        f"{model}_max_rel_logit_diff": err,
    }
    if with_ort:
        o = ic.ort_baseline(str(path), x, x[:1], x, min_runs=1)
        keys[f"{model}_b1_ms_guest_ort"] = (
            None if o is None else round(o.speed.latency_b1_s * 1e3, 2)
        )
        keys[f"{model}_b{BATCH}_images_per_s_guest_ort"] = (
            None if o is None else round(o.speed.images_per_s, 2)
        )
    return ok, keys


def main() -> int:
    """Check and measure the models; 0 if all are within tolerance."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("models", nargs="*", metavar="MODEL", help=f"of {', '.join(MODELS)} (all)")
    ap.add_argument("--json", action="store_true", help="print the figures as one JSON line")
    ap.add_argument("--ort", action="store_true", help="also onnxruntime in the guest (slow)")
    args = ap.parse_args()
    logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="bench_models: %(message)s")
    names = args.models or list(MODELS)
    missing = [m for m in names if m not in MODELS or not (DEFAULT_OUT / f"{m}.onnx").exists()]
    if missing or not (DEFAULT_OUT / SAMPLE).exists():
        log.error("missing in %s: %s; run `make zoo` on the host", DEFAULT_OUT,
                  ", ".join(missing) or SAMPLE)  # fmt: skip
        return 1
    with np.load(DEFAULT_OUT / SAMPLE) as d:
        x = np.ascontiguousarray(d["x"][:BATCH], dtype=np.float32)
        refs = {m: np.array(d[f"logits_{m}"][:BATCH]) for m in names}
    ok, figures = True, {}
    for model in names:
        model_ok, keys = bench(model, x, refs[model], args.ort)
        ok &= model_ok
        figures.update(keys)
        gc.collect()  # VGG-19's weights are 548 MiB: free each model's before the next
    if args.json:
        print(json.dumps(figures))
    else:
        for key, value in figures.items():
            print(f"{key:<40} {value}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
