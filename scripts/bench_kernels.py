"""Host time of the device's compute kernels, through qtest, and an A/B of two QEMU builds.

Each figure is one command on a two-core device (the release QEMU by
default), dense operands in guest RAM, the median of several runs after a
warm-up: the shapes of the models ``make bench`` runs (ResNet-50's 3x3,
1x1 and 7x7 stride-2 convolutions, a batch-8 convolution, VGG's 3x3 over
224x224, MobileNet's depthwise 3x3, the classifier LINEAR, fp32 and int8
MATMUL, an int8 convolution, a 2048^3 GEMM and a max pool). No guest and
no TCG: only the device's own time and the qtest round trip (~0.1 ms).

    python3 scripts/bench_kernels.py                  # figures of the release QEMU
    python3 scripts/bench_kernels.py --ab OLD NEW     # both, alternating rounds

``--ab`` runs every shape on both binaries in alternating rounds, so that
drift of the host hits both alike, and prints, per shape, each median and
NEW/OLD: the check of issue 35 that finer control points cost no speed
(docs/benchmarks.md).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "host"))

log = logging.getLogger("bench_kernels")

RUNS = 7
ROUNDS = 3
PARAMS = 0x40_0000  # parameter blocks
HEAP = 0x80_0000  # operands, bump-allocated
POLL_S = 60.0


@dataclass(frozen=True)
class Shape:
    """One command of the benchmark: an opcode over dense NCHW/row-major operands."""

    name: str
    opcode: str  # "CONV2D", "LINEAR", "MATMUL", "GEMM", "POOL2D"
    dims: tuple[int, ...]  # CONV2D: N, C, H, W, O, KH, KW, stride, pad, groups
    dtype: str = "FP32"


SHAPES = (
    Shape("conv3x3_64_56", "CONV2D", (1, 64, 56, 56, 64, 3, 3, 1, 1, 1)),
    Shape("conv1x1_256to64_56", "CONV2D", (1, 256, 56, 56, 64, 1, 1, 1, 0, 1)),
    Shape("conv7x7s2_3to64_224", "CONV2D", (1, 3, 224, 224, 64, 7, 7, 2, 3, 1)),
    Shape("conv3x3_512_7", "CONV2D", (1, 512, 7, 7, 512, 3, 3, 1, 1, 1)),
    Shape("conv3x3_128_28_b8", "CONV2D", (8, 128, 28, 28, 128, 3, 3, 1, 1, 1)),
    Shape("conv3x3_64_224", "CONV2D", (1, 64, 224, 224, 64, 3, 3, 1, 1, 1)),
    Shape("dwconv3x3_144_56", "CONV2D", (1, 144, 56, 56, 144, 3, 3, 1, 1, 144)),
    Shape("conv3x3_64_56_int8", "CONV2D", (1, 64, 56, 56, 64, 3, 3, 1, 1, 1), "INT8"),
    Shape("linear_1x2048x1000", "LINEAR", (1, 2048, 1000)),
    Shape("matmul_256x1024x1024", "MATMUL", (256, 1024, 1024)),
    Shape("matmul_256x1024x1024_int8", "MATMUL", (256, 1024, 1024), "INT8"),
    Shape("gemm_2048", "GEMM", (2048, 2048, 2048)),
    Shape("maxpool3x3s2_64_112", "POOL2D", (1, 64, 112, 112, 3, 2, 1)),
)


def _dense(shape: tuple[int, ...]) -> tuple[int, ...]:
    strides, acc = [], 1
    for d in reversed(shape):
        strides.append(acc)
        acc *= d
    return tuple(reversed(strides))


class Bench:
    """One QEMU with queue 0 running and the MMU off: commands on bus addresses."""

    def __init__(self, qemu: Path, tmp: Path) -> None:
        os.environ["NPU_QTEST_QEMU"] = str(qemu)
        import qtest  # reads NPU_QTEST_QEMU when imported

        self.q = qtest
        self.hw = qtest.hw
        self.npu = qtest.Npu(tmp / "qemu.log", device="npu,cores=2,cmd-budget-ms=0")
        self.npu.start(size=64)
        self.heap = HEAP
        self.fence = 1

    def close(self) -> None:
        self.npu.close()

    def alloc(self, nbytes: int) -> int:
        va = self.heap
        self.heap += (nbytes + 0xFFFF) & ~0xFFFF
        return va

    def tensor(self, dtype: str, shape: tuple[int, ...]) -> bytes:
        hw = self.hw
        dt = getattr(hw, f"DTYPE_{dtype}")
        size = {"FP32": 4, "INT8": 1, "INT32": 4}[dtype]
        n = 1
        for d in shape:
            n *= d
        return self.q.hw_tensor(self.alloc(n * size), dt, shape, _dense(shape))

    def build(self, s: Shape) -> bytes:
        hw, q = self.hw, self.q
        self.heap = HEAP
        acc = "INT32" if s.dtype == "INT8" else "FP32"
        if s.opcode == "GEMM":
            m, n, k = s.dims
            a, b, c = self.alloc(m * k * 4), self.alloc(k * n * 4), self.alloc(m * n * 4)
            return bytes(q.gemm(a, b, c, m, n, k, k, n, n, fence=self.fence))
        if s.opcode == "CONV2D":
            nb, c, h, w, o, kh, kw, st, pad, g = s.dims
            oh, ow = (h + 2 * pad - kh) // st + 1, (w + 2 * pad - kw) // st + 1
            ops = [
                self.tensor(s.dtype, (nb, c, h, w)),
                self.tensor(s.dtype, (o, c // g, kh, kw)),
                self.tensor(acc, (1, o, 1, 1)),
                self.tensor(acc, (nb, o, oh, ow)),
            ]
            params = [st, st, pad, pad, 1, 1, g, 0, 0]
            kind = hw.ACT_RELU
        elif s.opcode in ("LINEAR", "MATMUL"):
            m, k, n = s.dims
            ops = [self.tensor(s.dtype, (m, k)), self.tensor(s.dtype, (k, n))]
            if s.opcode == "LINEAR":
                ops.append(self.tensor(acc, (1, n)))
            ops.append(self.tensor(acc, (m, n)))
            params, kind = [0], hw.ACT_NONE
        else:  # POOL2D
            nb, c, h, w, k, st, pad = s.dims
            oh = (h + 2 * pad - k) // st + 1
            ops = [self.tensor("FP32", (nb, c, h, w)), self.tensor("FP32", (nb, c, oh, oh))]
            params, kind = [k, k, st, st, pad, pad, 0], hw.POOL_MAX
        self.npu.qt.memwrite(PARAMS, q.tensor_params(ops, params))
        return bytes(q.tensor(getattr(hw, f"OP_{s.opcode}"), PARAMS, kind, fence=self.fence))

    def time_ms(self, s: Shape, runs: int = RUNS) -> float:
        desc = self.build(s)

        def once() -> float:
            t0 = time.perf_counter()
            c = self.npu.run(desc, timeout=POLL_S)
            dt = time.perf_counter() - t0
            if c.status != self.hw.ST_OK:
                raise RuntimeError(f"{s.name}: status {c.status}")
            return dt * 1e3

        once()  # warm-up: guest RAM page faults, oneDNN primitives
        return statistics.median(once() for _ in range(runs))


def _release_qemu() -> Path:
    cache = Path(os.environ.get("NPU_CACHE") or Path.home() / ".cache" / "npu-stack")
    return cache / "bin" / "qemu-system-x86_64"


def measure(
    qemu: Path | None = None, runs: int = RUNS, only: tuple[str, ...] = ()
) -> dict[str, float]:
    """Milliseconds per shape on ``qemu`` (the release build by default);
    ``only``: the shapes whose names contain one of these strings."""
    shapes = [s for s in SHAPES if not only or any(o in s.name for o in only)]
    with tempfile.TemporaryDirectory() as tmp:
        b = Bench(qemu or _release_qemu(), Path(tmp))
        try:
            return {s.name: b.time_ms(s, runs) for s in shapes}
        finally:
            b.close()


def _round(qemu: Path, runs: int, only: tuple[str, ...]) -> dict[str, float]:
    # A process per binary: qtest binds NPU_QTEST_QEMU at import.
    sel = [a for o in only for a in ("--only", o)]
    out = subprocess.run(
        [sys.executable, __file__, "--qemu", str(qemu), "--runs", str(runs), *sel],
        check=True, capture_output=True, text=True,
    ).stdout  # fmt: skip
    res: dict[str, float] = json.loads(out)
    return res


def ab(
    old: Path, new: Path, rounds: int = ROUNDS, runs: int = RUNS, only: tuple[str, ...] = ()
) -> dict[str, Any]:
    """Per shape: the median over rounds of each binary's figure, and new/old."""
    seen: dict[str, dict[str, list[float]]] = {"old": {}, "new": {}}
    for r in range(rounds):
        order: list[tuple[str, Path]] = [("old", old), ("new", new)]
        for tag, qemu in order if r % 2 == 0 else reversed(order):
            for k, v in _round(qemu, runs, only).items():
                seen[tag].setdefault(k, []).append(v)
            log.info("round %d: %s done", r, tag)
    res: dict[str, Any] = {}
    for k in seen["old"]:
        o, n = statistics.median(seen["old"][k]), statistics.median(seen["new"][k])
        res[k] = {"old_ms": round(o, 3), "new_ms": round(n, 3), "new_over_old": round(n / o, 3)}
    return res


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--qemu", type=Path, help="QEMU binary (default: the release build)")
    ap.add_argument("--ab", nargs=2, type=Path, metavar=("OLD", "NEW"))
    ap.add_argument("--runs", type=int, default=RUNS)
    ap.add_argument("--rounds", type=int, default=ROUNDS)
    ap.add_argument("--only", action="append", default=[], help="shapes whose name contains this")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s", stream=sys.stderr)
    if args.ab:
        res: dict[str, Any] = ab(args.ab[0], args.ab[1], args.rounds, args.runs, tuple(args.only))
    else:
        res = dict(measure(args.qemu, args.runs, tuple(args.only)))
    json.dump(res, sys.stdout, indent=1)
    sys.stdout.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
