#!/usr/bin/env python3
"""ResNet-18 through ``torch.compile(model, backend="npu")`` against eager torch.

The ResNet-18 architecture (He et al.; torchvision's layout: a 7x7/2 stem,
3x3/2 max pool, four stages of two basic blocks with 64/128/256/512
channels, global average pool, a 1000-way linear layer) is defined here,
with seeded weights (no download) and batchnorm statistics set from a
seeded batch so that every layer keeps a sane scale. The script compiles
it for the NPU, checks the logits against eager torch on the CPU of this
guest, and prints the latency of both and the speedup. Run in the guest::

    python3 examples/torch_compile_resnet18.py [--size 224] [--runs 3] [--json]

Exit status 1 if the logits differ from eager torch by more than the
tolerance (rtol 1e-4, atol 1e-4 on logits of magnitude ~1: the NPU and
torch sum the convolutions in different orders, in fp32).
"""

from __future__ import annotations

import argparse
import json
import logging
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "runtime_py"))

import torch
from torch import nn

import npu
import npu.dynamo

RTOL = ATOL = 1e-4


class BasicBlock(nn.Module):
    """Two 3x3 conv-bn layers and a residual (projected when the shape changes)."""

    def __init__(self, cin: int, cout: int, stride: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.down: nn.Module | None = None
        if stride != 1 or cin != cout:
            self.down = nn.Sequential(
                nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout)
            )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.relu(self.bn1(self.conv1(x)))
        y = self.bn2(self.conv2(y))
        return torch.relu(y + (x if self.down is None else self.down(x)))


class ResNet18(nn.Module):
    """ResNet-18 for 1000 classes."""

    def __init__(self) -> None:
        super().__init__()
        self.stem = nn.Sequential(
            nn.Conv2d(3, 64, 7, 2, 3, bias=False), nn.BatchNorm2d(64), nn.ReLU(),
            nn.MaxPool2d(3, 2, 1),
        )  # fmt: skip
        blocks: list[nn.Module] = []
        cin = 64
        for cout, stride in ((64, 1), (128, 2), (256, 2), (512, 2)):
            blocks += [BasicBlock(cin, cout, stride), BasicBlock(cout, cout, 1)]
            cin = cout
        self.blocks = nn.Sequential(*blocks)
        self.fc = nn.Linear(512, 1000)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.blocks(self.stem(x))
        return self.fc(torch.flatten(nn.functional.adaptive_avg_pool2d(y, 1), 1))


def make_model(size: int, seed: int = 0) -> ResNet18:
    """The seeded ResNet-18, its batchnorm statistics calibrated on a seeded batch."""
    torch.manual_seed(seed)
    model = ResNet18()
    model.train()
    with torch.no_grad():
        for bn in model.modules():
            if isinstance(bn, nn.BatchNorm2d):
                bn.momentum = None  # a cumulative average: one batch sets the statistics
                bn.weight.uniform_(0.5, 1.0)
                bn.bias.uniform_(-0.1, 0.1)
        model(torch.randn(8, 3, size, size))
    return model.eval()


def timed(fn: Any, x: torch.Tensor, runs: int) -> tuple[torch.Tensor, float]:
    """Run ``fn(x)`` once to warm up, then ``runs`` times; (last output, median ms)."""
    out = fn(x)
    times = []
    for _ in range(runs):
        t0 = time.perf_counter()
        out = fn(x)
        times.append((time.perf_counter() - t0) * 1e3)
    return out, statistics.median(times)


def main() -> int:
    """Compile, check against eager torch, time both; 0 if the logits agree."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size", type=int, default=224, help="input height and width")
    ap.add_argument("--runs", type=int, default=3, help="timed runs of each")
    ap.add_argument("--json", action="store_true", help="print the figures as JSON")
    args = ap.parse_args()
    logging.basicConfig(level=logging.WARNING)
    torch.set_num_threads(max(1, torch.get_num_threads()))
    model = make_model(args.size)
    x = torch.randn(1, 3, args.size, args.size, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        t0 = time.perf_counter()
        compiled = torch.compile(model, backend="npu")
        compiled(x)
        compile_s = time.perf_counter() - t0
        got, npu_ms = timed(compiled, x, args.runs)
        want, eager_ms = timed(model, x, args.runs)
    graph = npu.dynamo.compiled_graphs()[-1]
    diff = float((got - want).abs().max())
    ok = torch.allclose(got, want, rtol=RTOL, atol=ATOL)
    figures = {
        "torch_compile_resnet18_ms_npu": round(npu_ms, 2),
        "torch_compile_resnet18_ms_eager_cpu": round(eager_ms, 2),
        "torch_compile_resnet18_speedup": round(eager_ms / npu_ms, 2),
        "torch_compile_resnet18_compile_s": round(compile_s, 1),
        "torch_compile_resnet18_npu_nodes": len(graph.npu_nodes),
        "torch_compile_resnet18_cpu_nodes": len(graph.cpu_nodes),
        "torch_compile_resnet18_max_abs_diff": diff,
    }
    if args.json:
        print(json.dumps(figures))
    else:
        print(f"ResNet-18, 1x3x{args.size}x{args.size}, torch {torch.__version__}")
        print(
            f"  compiled for the NPU in {compile_s:.1f} s: {len(graph.npu_nodes)} ATen nodes"
            f" on the NPU, {len(graph.cpu_nodes)} left to torch {graph.cpu_nodes or ''}"
        )
        print(f"  NPU (replayed graph): {npu_ms:8.2f} ms")
        print(f"  eager torch, CPU:     {eager_ms:8.2f} ms   speedup {eager_ms / npu_ms:.1f}x")
        print(f"  max |NPU - eager| = {diff:.2e} ({'ok' if ok else 'OUT OF TOLERANCE'})")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
