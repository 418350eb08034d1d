#!/usr/bin/env python3
"""Write a small ResNet-style network with fixed seeded weights as ONNX.

Runs on the host (``make models``; numpy and onnx). The network is a CIFAR
ResNet-8 in shape: input [N, 3, 32, 32], a 3x3 stem conv 3->16 with
batchnorm and relu, three stages of two basic residual blocks (16, 32, 64
channels; the first block of stages 2 and 3 has stride 2 and a 1x1 stride-2
projection shortcut with batchnorm), GlobalAveragePool, Flatten and a Gemm
64->10 (output ``logits``). Convolutions have no bias, as in ResNets.

The weights are not trained but are not arbitrary either: He-normal conv
weights, and batchnorm statistics calibrated on a seeded batch of inputs
(each BN's running mean and variance are the batch statistics of its input,
slightly perturbed) with gamma in [0.7, 1.3] (the second BN of each block:
[0.2, 0.5], as trained residual branches tend to be) and small betas, so
every BatchNormalization node does real work and activations keep a sane
scale through the 17 layers. The graph keeps the BatchNormalization nodes
(opset 17, inference mode); folding them is the runner's business.

Also writes a seeded sample input and its reference logits (onnx's
ReferenceEvaluator, float32) for the examples and tests. See docs/models.md.

Writes, next to this script (or into --out)::

    resnet_small.onnx  resnet_sample.npz (x [8, 3, 32, 32] float32, logits [8, 10])

Usage::

    python examples/models/make_resnet.py [--out DIR]
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Any

for _var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ[_var] = "1"  # bit-reproducible BLAS results (see train_digits.py)

import numpy as np  # noqa: E402
import numpy.typing as npt  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))

import numpy_nn as nn  # noqa: E402
from onnx_build import GraphBuilder, reference_run, save  # noqa: E402

Array = npt.NDArray[Any]

HERE = Path(__file__).resolve().parent
SEED = 1234
CALIB_SEED = 1
SAMPLE_SEED = 2
CALIB_BATCH = 32
SAMPLE_BATCH = 8
BN_EPS = 1e-5
STAGES = ((16, 1), (32, 2), (64, 2))  # (channels, stride of the first block)
BLOCKS_PER_STAGE = 2
NUM_CLASSES = 10
# The numpy float64 forward pass against ReferenceEvaluator (float32): the
# generator fails if they differ by more than this (relative to max |logit|).
SELF_CHECK_RTOL = 1e-4


class Builder:
    """Builds the graph and, alongside, a float64 numpy forward pass on the
    calibration batch that fixes each BN's statistics from its real input."""

    def __init__(self, rng: np.random.Generator, calib: Array) -> None:
        self.rng = rng
        self.gb = GraphBuilder()
        self.params: dict[str, Array] = {}
        self.h = calib  # float64 activation of the calibration batch at the current node

    def conv(self, x: str, name: str, cin: int, cout: int, k: int, stride: int) -> str:
        """Conv (no bias) with He-normal weights; advances the calibration activation."""
        w = self.rng.standard_normal((cout, cin, k, k)) * np.sqrt(2.0 / (cin * k * k))
        w = w.astype(np.float32)
        self.params[f"{name}.weight"] = w
        pad = k // 2
        self.h = nn.conv2d(self.h, w.astype(np.float64), None, stride=stride, pad=pad)
        return self.gb.node(
            "Conv",
            [x, self.gb.const(f"{name}.weight", w)],
            name,
            kernel_shape=[k, k],
            strides=[stride, stride],
            pads=[pad, pad, pad, pad],
        )

    def bn(self, x: str, name: str, gamma_range: tuple[float, float]) -> str:
        """BatchNormalization with statistics calibrated on the current activation."""
        c = self.h.shape[1]
        mean = self.h.mean(axis=(0, 2, 3))
        std = self.h.std(axis=(0, 2, 3))
        p = {
            "scale": self.rng.uniform(*gamma_range, c),
            "bias": self.rng.normal(0.0, 0.1, c),
            "mean": mean + 0.1 * std * self.rng.standard_normal(c),
            "var": std**2 * self.rng.uniform(0.8, 1.25, c),
        }
        p32 = {k: v.astype(np.float32) for k, v in p.items()}
        for k, v in p32.items():
            self.params[f"{name}.{k}"] = v
        p64 = {k: v.astype(np.float64) for k, v in p32.items()}
        self.h = nn.batchnorm(self.h, p64["scale"], p64["bias"], p64["mean"], p64["var"], BN_EPS)
        names = [self.gb.const(f"{name}.{k}", p32[k]) for k in ("scale", "bias", "mean", "var")]
        return self.gb.node("BatchNormalization", [x, *names], name, epsilon=BN_EPS)

    def relu(self, x: str, name: str) -> str:
        """Relu node."""
        self.h = np.maximum(self.h, 0)
        return self.gb.node("Relu", [x], name)

    def block(self, x: str, name: str, cin: int, cout: int, stride: int) -> str:
        """A basic residual block: conv-BN-relu-conv-BN, + shortcut, relu."""
        h_in = self.h
        y = self.relu(
            self.bn(self.conv(x, f"{name}.conv1", cin, cout, 3, stride), f"{name}.bn1", (0.7, 1.3)),
            f"{name}.relu1",
        )
        y = self.bn(self.conv(y, f"{name}.conv2", cout, cout, 3, 1), f"{name}.bn2", (0.2, 0.5))
        h_branch = self.h
        if stride != 1 or cin != cout:
            self.h = h_in
            sc = self.bn(
                self.conv(x, f"{name}.proj", cin, cout, 1, stride), f"{name}.proj_bn", (0.7, 1.3)
            )
            h_sc = self.h
        else:
            sc, h_sc = x, h_in
        self.h = h_branch + h_sc
        out = self.gb.node("Add", [y, sc], f"{name}.add")
        return self.relu(out, f"{name}.relu2")

    def head(self, x: str, cin: int, num_classes: int = NUM_CLASSES, per_class: bool = True) -> str:
        """GlobalAveragePool, Flatten, Gemm cin -> num_classes.

        ``per_class``: each logit's spread over the calibration batch is
        scaled to 1; else their joint spread (a batch of a few images
        cannot estimate one spread per class).
        """
        x = self.gb.node("GlobalAveragePool", [x], "pool")
        x = self.gb.node("Flatten", [x], "flatten", axis=1)
        self.h = self.h.mean(axis=(2, 3))
        # Scaled and centred on the calibration batch: each logit has unit
        # spread over inputs (not a near-constant offset), plus a small bias.
        w64 = self.rng.standard_normal((num_classes, cin))
        z = self.h @ w64.T
        if per_class:
            w64 /= z.std(axis=0)[:, None]
        else:
            w64 /= (z - z.mean(axis=0)).std() + 1e-12
        b64 = -(self.h @ w64.T).mean(axis=0) + self.rng.normal(0.0, 0.1, num_classes)
        w, b = w64.astype(np.float32), b64.astype(np.float32)
        self.params["fc.weight"], self.params["fc.bias"] = w, b
        self.h = self.h @ w.T.astype(np.float64) + b
        return self.gb.node(
            "Gemm",
            [x, self.gb.const("fc.weight", w), self.gb.const("fc.bias", b)],
            "logits",
            transB=1,
        )


def build() -> tuple[GraphBuilder, dict[str, Array]]:
    """The graph builder of the network and its parameters."""
    rng = np.random.default_rng(SEED)
    calib = np.random.default_rng(CALIB_SEED).standard_normal((CALIB_BATCH, 3, 32, 32))
    b = Builder(rng, calib)
    x = b.relu(b.bn(b.conv("input", "stem.conv", 3, 16, 3, 1), "stem.bn", (0.7, 1.3)), "stem.relu")
    cin = 16
    for s, (cout, stride) in enumerate(STAGES, 1):
        for i in range(BLOCKS_PER_STAGE):
            x = b.block(x, f"layer{s}.{i}", cin, cout, stride if i == 0 else 1)
            cin = cout
    b.head(x, cin)
    return b.gb, b.params


def conv_bn(p: dict[str, Array], h: Array, conv: str, bn: str, stride: int) -> Array:
    """Conv ``conv`` (no bias, "same" padding) then BatchNormalization ``bn``, in float64."""
    w = p[f"{conv}.weight"]
    y = nn.conv2d(h, w, None, stride=stride, pad=w.shape[2] // 2)
    return nn.batchnorm(
        y, p[f"{bn}.scale"], p[f"{bn}.bias"], p[f"{bn}.mean"], p[f"{bn}.var"], BN_EPS
    )


def forward(params: dict[str, Array], x: Array) -> Array:
    """The network's logits for x in float64 numpy (the independent reference)."""
    p = {k: v.astype(np.float64) for k, v in params.items()}
    h = x.astype(np.float64)

    def cbn(h: Array, name: str, bn: str, stride: int) -> Array:
        return conv_bn(p, h, name, bn, stride)

    h = np.maximum(cbn(h, "stem.conv", "stem.bn", 1), 0)
    for s, (_, stride) in enumerate(STAGES, 1):
        for i in range(BLOCKS_PER_STAGE):
            n = f"layer{s}.{i}"
            st = stride if i == 0 else 1
            y = np.maximum(cbn(h, f"{n}.conv1", f"{n}.bn1", st), 0)
            y = cbn(y, f"{n}.conv2", f"{n}.bn2", 1)
            sc = cbn(h, f"{n}.proj", f"{n}.proj_bn", st) if f"{n}.proj.weight" in p else h
            h = np.maximum(y + sc, 0)
    f = h.mean(axis=(2, 3))
    out: Array = f @ p["fc.weight"].T + p["fc.bias"]
    return out


def main(argv: list[str] | None = None) -> int:
    """Build, check and write the model and the sample input."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=HERE, help="output directory")
    args = ap.parse_args(argv)

    gb, params = build()
    model = gb.model("resnet_small", ["N", 3, 32, 32], NUM_CLASSES)
    path = args.out / "resnet_small.onnx"
    save(model, path)
    x = (
        np.random.default_rng(SAMPLE_SEED)
        .standard_normal((SAMPLE_BATCH, 3, 32, 32))
        .astype(np.float32)
    )
    ref = reference_run(model, x)
    want = forward(params, x)
    scale = float(np.max(np.abs(want)))
    err = float(np.max(np.abs(ref - want)))
    if err > SELF_CHECK_RTOL * scale:
        raise SystemExit(f"ReferenceEvaluator differs from the numpy forward pass: {err:.3g}")
    np.savez_compressed(args.out / "resnet_sample.npz", x=x, logits=ref)
    n_params = sum(v.size for v in params.values())
    print(
        f"resnet_small.onnx: {len(model.graph.node)} nodes, {n_params} parameters, "
        f"{path.stat().st_size} bytes; sample logits max |x| {scale:.3g}, "
        f"ReferenceEvaluator vs float64 numpy max err {err:.2e}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
