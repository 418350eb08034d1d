#!/usr/bin/env python3
"""What ``npu.profiler.profile()`` costs a model run, in the guest (``make bench`` runs it).

The digits CNN (examples/models/digits_cnn.onnx) at batch 64 through
``npu.InferenceSession``: after a warm-up run, rounds of runs without a
profile alternate with rounds inside one (every layer on: host spans, the
driver's tracepoints, the device's trace ring, the counters), each run
timed alone. Keys:

- ``profiler_overhead``: median run time with the profile over the median
  without, minus 1 (issue 19's target: 0.10 or less);
- ``profiler_run_ms`` and ``profiler_run_ms_profiled``: those medians;
- ``profiler_stop_s``: the median time to end a profile of one round
  (reading and parsing the trace, building events and flows), not in the
  runs' times;
- ``profiler_events_per_run``: events recorded per run (all layers);
- ``profiler_layers``: the layers the last profile saw, in order.

The last line of stdout is one JSON object (docs/benchmarks.md)::

    python3 examples/bench_profiler.py
"""

from __future__ import annotations

import json
import logging
import statistics
import sys
import time
from typing import Any

import inference_common as ic
import numpy as np

import npu

log = logging.getLogger("bench_profiler")

MODEL = "digits_cnn.onnx"
BATCH = 64
ROUNDS = 2 if ic.QUICK else 4
RUNS_PER_ROUND = 5 if ic.QUICK else 10


def main() -> int:
    """Measure; print the JSON result; 0 on success, 1 without an NPU or on a wrong result."""
    logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="bench_profiler: %(message)s")
    if ic.device_line() is None:
        log.error("no NPU found: is the driver loaded? (insmod kernel_module/npu.ko)")
        return 1
    x, _ = ic.load_digits_split()
    batch = x[:BATCH]
    sess = ic.session(MODEL, ic.NPU_PROVIDERS)
    feed = ic.feed(sess, batch)
    want = np.asarray(sess.run(None, feed)[0])  # warm-up: the plan is built here

    def run() -> float:
        t0 = time.perf_counter()
        out = sess.run(None, feed)
        dt = time.perf_counter() - t0
        if not np.array_equal(np.asarray(out[0]), want):
            raise RuntimeError("a run's logits differ from the warm-up run's")
        return dt

    plain: list[float] = []
    profiled: list[float] = []
    stops: list[float] = []
    events = 0
    layers: list[str] = []
    try:
        for _ in range(ROUNDS):
            plain += [run() for _ in range(RUNS_PER_ROUND)]
            prof = npu.profiler.profile()
            with prof:
                profiled += [run() for _ in range(RUNS_PER_ROUND)]
                t_stop = time.perf_counter()
            stops.append(time.perf_counter() - t_stop)
            events += len(prof.events)
            layers = [c for c in npu.profiler.CATS if any(e.cat == c for e in prof.events)]
    except RuntimeError as e:
        log.error("WRONG RESULT: %s", e)
        return 1
    finally:
        sess.close()
    base = statistics.median(plain)
    with_prof = statistics.median(profiled)
    result: dict[str, Any] = {
        "profiler_overhead": with_prof / base - 1.0,
        "profiler_run_ms": base * 1e3,
        "profiler_run_ms_profiled": with_prof * 1e3,
        "profiler_stop_s": statistics.median(stops),
        "profiler_events_per_run": events / (ROUNDS * RUNS_PER_ROUND),
        "profiler_layers": layers,
    }
    log.info(
        "digits CNN batch %d: %.2f ms, %.2f ms profiled (%+.1f%%); %d events per run; layers %s",
        BATCH,
        base * 1e3,
        with_prof * 1e3,
        (with_prof / base - 1) * 100,
        result["profiler_events_per_run"],
        ", ".join(layers),
    )
    print(json.dumps(result, sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.exit(main())
