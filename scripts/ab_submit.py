#!/usr/bin/env python3
"""Same-boot A/B of the submission, wait and copy figures of two npu.ko builds.

Run in the guest as root, with the driver not in use::

    python3 scripts/ab_submit.py OLD.ko NEW.ko [ROUNDS]

For each round and each module (alternating, so drift hits both alike):
rmmod, insmod, then examples/bench_npu.py's nop round trip, NOP batch,
SUBMIT/user-queue per-op costs and DMA copy. Prints one JSON object: per
key, the median over the rounds for each module and new/old. Used for the
"no figure worse by more than 10%" check of issue 16 (docs/benchmarks.md).
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time

sys.path.insert(0, "/mnt/npu/examples")
sys.path.insert(0, "/mnt/npu/runtime_py")

import bench_npu

import npu

KEYS = (
    "nop_roundtrip_us",
    "nop_batch_ops_per_s",
    "op_us_ioctl_submit",
    "op_us_user_queue",
    "h2d_gbps",
)


def load(module: str) -> None:
    subprocess.run(["rmmod", "npu"], check=False, capture_output=True)
    subprocess.run(["insmod", module], check=True)
    deadline = time.monotonic() + 10
    while not os.path.exists("/dev/npu0"):
        if time.monotonic() > deadline:
            raise SystemExit(f"/dev/npu0 did not appear after insmod {module}")
        time.sleep(0.05)


def measure() -> dict[str, float]:
    with npu.open_device("/dev/npu0") as dev:
        res = {
            "nop_roundtrip_us": bench_npu.bench_nop_roundtrip(dev),
            "nop_batch_ops_per_s": bench_npu.bench_nop_batch(dev),
            "h2d_gbps": bench_npu.bench_dma_copy(dev),
        }
        uq = bench_npu.bench_user_queue(dev)
        res["op_us_ioctl_submit"] = uq["op_us_ioctl_submit"]
        res["op_us_user_queue"] = uq["op_us_user_queue"]
    return res


def main() -> int:
    old, new = sys.argv[1], sys.argv[2]
    rounds = int(sys.argv[3]) if len(sys.argv) > 3 else 3
    runs: dict[str, list[dict[str, float]]] = {"old": [], "new": []}
    for _ in range(rounds):
        for name, module in (("old", old), ("new", new)):
            load(module)
            runs[name].append(measure())
    load(new)
    out: dict[str, dict[str, float]] = {}
    for key in KEYS:
        o = statistics.median(r[key] for r in runs["old"])
        n = statistics.median(r[key] for r in runs["new"])
        out[key] = {"old": round(o, 3), "new": round(n, 3), "new_vs_old": round(n / o, 3)}
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
