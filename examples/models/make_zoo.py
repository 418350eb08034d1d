#!/usr/bin/env python3
"""Write the benchmark zoo: six real CNN architectures with seeded weights as ONNX.

Runs on the host (``make zoo``, part of ``make models`` and ``make bench``;
numpy, onnx and onnxruntime). Every model takes ``input`` [N, 3, 224, 224]
float32 (N symbolic) and returns ``logits`` [N, 1000], opset 17, like
resnet50.onnx (examples/models/make_resnet50.py), and uses only ops of the
runner's NPU op table (docs/inference.md):

- ``densenet121``: DenseNet-121, growth 32, dense blocks of 6, 12, 24 and
  16 BN-Relu-Conv1x1(128)-BN-Relu-Conv3x3(32) layers, each concatenated
  to its block's features; transitions BN-Relu-Conv1x1 (halving the
  channels)-AveragePool 2x2/2; a 7x7/2 stem and a 3x3/2 max pool.
- ``inception_v2``: GoogLeNet with batchnorm (BN-Inception): stem
  7x7/2-pool-1x1-3x3-pool, ten inception modules (1x1, 1x1-3x3,
  1x1-3x3-3x3 and pool-projection branches, concatenated; two of them
  reduce the resolution with stride-2 branches and a max pool).
- ``squeezenet1_1``: SqueezeNet 1.1: a 3x3/2 stem, eight fire modules
  (1x1 squeeze, then 1x1 and 3x3 expands, concatenated), a 1x1 conv to
  1000 channels, Relu and global average pooling. Convs have biases, no BN.
- ``shufflenet_v2``: ShuffleNet v2 1.0x: stages of 4, 8 and 4 units
  (116, 232, 464 channels); a unit splits its channels (Split), runs
  1x1-depthwise 3x3-1x1 on one half, concatenates and shuffles the
  channels (Reshape [N, 2, C/2, H, W], Transpose, Reshape; the shapes are
  constants, so this model runs at 224x224 only); 1x1 conv to 1024.
- ``mobilenet_v2``: MobileNet v2 1.0: 17 inverted residual blocks (1x1
  expand, depthwise 3x3, linear 1x1 project; residual add where the shape
  stays), Relu6 as ``Clip(0, 6)``, a 1x1 conv to 1280.
- ``vgg19``: VGG-19: sixteen 3x3 convs with biases and Relu, five 2x2 max
  pools, Flatten and the fully connected 25088-4096-4096-1000 classifier
  (fixed 224x224; the model is 548 MiB).

The weights are seeded, not trained. Convolutions are He-normal and
calibrated as make_resnet50.py's are: a float64 numpy forward pass of a
seeded batch of sample-like images (make_resnet50's pipeline) runs
alongside the construction, and each BatchNormalization takes its
statistics from its real input on that batch (the last BN of a residual
branch with gamma in [0.2, 0.5]); the models without BN (SqueezeNet, VGG)
get the same normalisation folded into each conv's weights and bias; fully
connected layers are scaled so that their outputs spread by about 1 over
the batch. So activations keep a sane scale through every layer. That
forward pass doubles as a self-check: onnxruntime must reproduce its
logits of the calibration batch within 2e-3 x max |logit|.

Also writes ``zoo_sample.npz``: ``x``, the 8 sample inputs of
resnet50_sample.npz (make resnet50 first), and ``logits_<model>`` [8,
1000], onnxruntime's logits of x on the host (the reference of
examples/bench_models.py). A model is skipped when ``<model>.stamp`` holds
this script's fingerprint (the script and the helpers it uses).

Usage::

    python examples/models/make_zoo.py [--out build/models] [--force] [MODEL ...]
"""

from __future__ import annotations

import argparse
import hashlib
import logging
import os
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

for _var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "2")

import numpy as np  # noqa: E402
import numpy.typing as npt  # noqa: E402

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import numpy_nn as nn  # noqa: E402
from make_resnet import Builder  # noqa: E402
from make_resnet50 import DEFAULT_OUT, preprocess, sample_images  # noqa: E402
from onnx_build import INPUT, save  # noqa: E402

Array = npt.NDArray[Any]

log = logging.getLogger("make_zoo")

SIZE = 224
NUM_CLASSES = 1000
CALIB_BATCH = 4
CALIB_SEED = 61
# The logits of onnxruntime against the float64 construction pass, relative
# to max |logit| (docs/models.md's tolerance for ResNet-50 on the NPU).
SELF_CHECK_RTOL = 2e-3
MAIN = (0.7, 1.3)  # gamma range of a BN on the main path
RESIDUAL = (0.2, 0.5)  # gamma range of the last BN of a residual branch
SAMPLE = "zoo_sample.npz"


# -- numpy kernels of the calibration pass (float64, NCHW) -------------------------------


def conv(h: Array, w: Array, stride: int, pad: int, groups: int) -> Array:
    """ONNX Conv of h with w (no bias): dense (groups 1) or depthwise (groups = channels).

    One image at a time: the im2col matrix of a 224x224 layer is large."""
    if groups == 1:
        return np.concatenate(
            [nn.conv2d(h[i : i + 1], w, None, stride, pad) for i in range(len(h))]
        )
    if groups != h.shape[1] or w.shape[:2] != (groups, 1):
        raise ValueError("only dense and depthwise convolutions are supported")
    k = w.shape[2]
    hp = np.pad(h, ((0, 0), (0, 0), (pad, pad), (pad, pad)))
    win = np.lib.stride_tricks.sliding_window_view(hp, (k, k), axis=(2, 3))[
        :, :, ::stride, ::stride
    ]
    out: Array = np.einsum("nchwij,cij->nchw", win, w[:, 0])
    return out


def pool(h: Array, kind: str, k: int, stride: int, pad: int) -> Array:
    """MaxPool or AveragePool (padding excluded from the count, ONNX's default), floor mode."""
    if kind == "max":
        hp = np.pad(h, ((0, 0), (0, 0), (pad, pad), (pad, pad)), constant_values=-np.inf)
        win = np.lib.stride_tricks.sliding_window_view(hp, (k, k), axis=(2, 3))
        out: Array = win[:, :, ::stride, ::stride].max(axis=(4, 5))
        return out
    hp = np.pad(h, ((0, 0), (0, 0), (pad, pad), (pad, pad)))
    ones = np.pad(np.ones(h.shape[2:]), pad)
    total = np.lib.stride_tricks.sliding_window_view(hp, (k, k), axis=(2, 3))
    count = np.lib.stride_tricks.sliding_window_view(ones, (k, k))
    out = total[:, :, ::stride, ::stride].sum(axis=(4, 5))
    avg: Array = out / count[::stride, ::stride].sum(axis=(2, 3))
    return avg


class ZooBuilder(Builder):
    """make_resnet's builder with one calibration activation per tensor name.

    Branches and concatenations need the activation of any earlier tensor,
    not only the latest: every method takes its inputs' activations from
    ``acts`` and records its output's there (``self.h`` stays the latest,
    as the base class expects)."""

    def __init__(self, rng: np.random.Generator, calib: Array) -> None:
        super().__init__(rng, calib)
        self.acts: dict[str, Array] = {INPUT: calib}

    def _at(self, x: str) -> None:
        self.h = self.acts[x]

    def _keep(self, out: str) -> str:
        self.acts[out] = self.h
        return out

    def conv_g(
        self,
        x: str,
        name: str,
        cin: int,
        cout: int,
        k: int,
        stride: int = 1,
        pad: int | None = None,
        groups: int = 1,
        calibrated: tuple[float, float] | None = None,
        gain: Callable[[Array], float] | None = None,
    ) -> str:
        """Conv with He-normal weights; depthwise when groups = cin = cout.

        ``calibrated``: the conv gets a bias, and a batchnorm calibrated on
        its output (gamma in that range) is folded into its weights and
        bias (for the models without BN layers); ``gain`` then maps that
        output to a positive factor for the weights and bias (SqueezeNet's
        classifier: logits that spread by about 1 after Relu and pooling)."""
        self._at(x)
        pad = k // 2 if pad is None else pad
        fan_in = cin // groups * k * k
        w64 = self.rng.standard_normal((cout, cin // groups, k, k)) * np.sqrt(2.0 / fan_in)
        y = conv(self.h, w64.astype(np.float32).astype(np.float64), stride, pad, groups)
        inputs = [x]
        if calibrated is None:
            w = w64.astype(np.float32)
        else:
            mean, std = y.mean(axis=(0, 2, 3)), y.std(axis=(0, 2, 3)) + 1e-12
            s = self.rng.uniform(*calibrated, cout) / std
            b = (self.rng.normal(0.0, 0.1, cout) - mean * s).astype(np.float32)
            if gain is not None:
                g = gain(y * s[None, :, None, None] + b[None, :, None, None])
                s, b = s * g, (b * g).astype(np.float32)
            w = (w64 * s[:, None, None, None]).astype(np.float32)
            y = conv(self.h, w.astype(np.float64), stride, pad, groups) + b[None, :, None, None]
            self.params[f"{name}.bias"] = b
        self.params[f"{name}.weight"] = w
        inputs.append(self.gb.const(f"{name}.weight", w))
        if calibrated is not None:
            inputs.append(self.gb.const(f"{name}.bias", self.params[f"{name}.bias"]))
        self.h = y
        attrs: dict[str, Any] = {"kernel_shape": [k, k], "strides": [stride, stride]}
        attrs["pads"] = [pad] * 4
        if groups != 1:
            attrs["group"] = groups
        return self._keep(self.gb.node("Conv", inputs, name, **attrs))

    def bn(self, x: str, name: str, gamma_range: tuple[float, float] = MAIN) -> str:
        """BatchNormalization calibrated on x's activation."""
        self._at(x)
        return self._keep(super().bn(x, name, gamma_range))

    def relu(self, x: str, name: str) -> str:
        """Relu."""
        self._at(x)
        return self._keep(super().relu(x, name))

    def relu6(self, x: str, name: str) -> str:
        """Relu6 as Clip(x, 0, 6), the bounds as constant inputs (opset 11+)."""
        self._at(x)
        self.h = np.clip(self.h, 0.0, 6.0)
        lo = self.gb.const(f"{name}.min", np.array(0.0, dtype=np.float32))
        hi = self.gb.const(f"{name}.max", np.array(6.0, dtype=np.float32))
        return self._keep(self.gb.node("Clip", [x, lo, hi], name))

    def cbr(self, x: str, name: str, cin: int, cout: int, k: int, stride: int = 1) -> str:
        """Conv, BN, Relu."""
        y = self.bn(self.conv_g(x, f"{name}.conv", cin, cout, k, stride), f"{name}.bn")
        return self.relu(y, f"{name}.relu")

    def brc(self, x: str, name: str, cin: int, cout: int, k: int) -> str:
        """BN, Relu, Conv (DenseNet's pre-activation order)."""
        y = self.relu(self.bn(x, f"{name}.bn"), f"{name}.relu")
        return self.conv_g(y, f"{name}.conv", cin, cout, k)

    def pool(self, x: str, name: str, kind: str, k: int, stride: int, pad: int = 0) -> str:
        """MaxPool (kind "max") or AveragePool ("avg"), floor mode."""
        self._at(x)
        self.h = pool(self.h, kind, k, stride, pad)
        op = "MaxPool" if kind == "max" else "AveragePool"
        attrs = {"kernel_shape": [k, k], "strides": [stride, stride], "pads": [pad] * 4}
        return self._keep(self.gb.node(op, [x], name, **attrs))

    def concat(self, xs: Sequence[str], name: str) -> str:
        """Concat along the channels."""
        self.h = np.concatenate([self.acts[x] for x in xs], axis=1)
        return self._keep(self.gb.node("Concat", list(xs), name, axis=1))

    def add(self, a: str, b: str, name: str) -> str:
        """Add (a residual connection)."""
        self.h = self.acts[a] + self.acts[b]
        return self._keep(self.gb.node("Add", [a, b], name))

    def split2(self, x: str, name: str) -> tuple[str, str]:
        """Split the channels of x into two equal halves (sizes as a constant input)."""
        h = self.acts[x]
        c = h.shape[1] // 2
        sizes = self.gb.const(f"{name}.split", np.array([c, c], dtype=np.int64))
        outs = [f"{name}.0", f"{name}.1"]
        self.gb.nodes.append(_node("Split", [x, sizes], outs, name, axis=1))
        self.acts[outs[0]], self.acts[outs[1]] = h[:, :c], h[:, c:]
        return outs[0], outs[1]

    def shuffle(self, x: str, name: str) -> str:
        """Channel shuffle of 2 groups: Reshape, Transpose, Reshape (static H, W)."""
        h = self.acts[x]
        n, c, hh, ww = h.shape
        s5 = self.gb.const(f"{name}.shape5", np.array([0, 2, c // 2, hh, ww], dtype=np.int64))
        s4 = self.gb.const(f"{name}.shape4", np.array([0, c, hh, ww], dtype=np.int64))
        y = self.gb.node("Reshape", [x, s5], f"{name}.split")
        y = self.gb.node("Transpose", [y], f"{name}.swap", perm=[0, 2, 1, 3, 4])
        y = self.gb.node("Reshape", [y, s4], name)
        self.h = h.reshape(n, 2, c // 2, hh, ww).transpose(0, 2, 1, 3, 4).reshape(n, c, hh, ww)
        return self._keep(y)

    def dense(self, x: str, name: str, cin: int, cout: int, last: bool = False) -> str:
        """Gemm cin -> cout (transB) with weights and bias scaled so that the outputs
        spread by about 1 over the calibration batch, centred on it (their joint
        spread: a few images cannot estimate one per unit). ``last``: the
        output is the model's logits, else a Relu follows."""
        self._at(x)
        h32 = self.h.astype(np.float32)
        w = self.rng.standard_normal((cout, cin), dtype=np.float32)
        z = (h32 @ w.T).astype(np.float64)
        w *= np.float32(1.0 / ((z - z.mean(axis=0)).std() + 1e-12))
        z = (h32 @ w.T).astype(np.float64)
        b = (-z.mean(axis=0) + self.rng.normal(0.0, 0.1, cout)).astype(np.float32)
        self.params[f"{name}.weight"], self.params[f"{name}.bias"] = w, b
        self.h = z + b
        out = "logits" if last else name
        wn, bn = self.gb.const(f"{name}.weight", w), self.gb.const(f"{name}.bias", b)
        y = self._keep(self.gb.node("Gemm", [x, wn, bn], out, transB=1))
        return y if last else self.relu(y, f"{name}.relu")

    def classifier(self, x: str, cin: int) -> str:
        """GlobalAveragePool, Flatten, Gemm cin -> 1000 (``logits``)."""
        self._at(x)
        return self._keep(self.head(x, cin, NUM_CLASSES, per_class=False))


def _node(op: str, inputs: list[str], outputs: list[str], name: str, **attrs: Any) -> Any:
    """A node with several outputs (GraphBuilder.node makes single-output nodes)."""
    from onnx import helper

    return helper.make_node(op, inputs, outputs, name=f"{op.lower()}_{name}", **attrs)


# -- the architectures ---------------------------------------------------------------------


def densenet121(b: ZooBuilder) -> None:
    """DenseNet-121 (growth 32, bottleneck 4x, compression 0.5)."""
    growth, blocks = 32, (6, 12, 24, 16)
    x = b.cbr(INPUT, "stem", 3, 64, 7, 2)
    x = b.pool(x, "stem.pool", "max", 3, 2, 1)
    c = 64
    for i, layers in enumerate(blocks, 1):
        for j in range(layers):
            n = f"block{i}.{j}"
            y = b.brc(x, f"{n}.a", c, 4 * growth, 1)
            y = b.brc(y, f"{n}.b", 4 * growth, growth, 3)
            x = b.concat([x, y], f"{n}.cat")
            c += growth
        if i < len(blocks):
            x = b.brc(x, f"trans{i}", c, c // 2, 1)
            x = b.pool(x, f"trans{i}.pool", "avg", 2, 2)
            c //= 2
    x = b.relu(b.bn(x, "final.bn"), "final.relu")
    b.classifier(x, c)


# BN-Inception modules: (name, 1x1, (3x3 reduce, 3x3), (double reduce, double 3x3),
# (pool kind, projection or 0 for none), stride). Stride 2: no 1x1 branch,
# the pool branch is a max pool passed through.
INCEPTION = (
    ("3a", 64, (64, 64), (64, 96), ("avg", 32), 1),
    ("3b", 64, (64, 96), (64, 96), ("avg", 64), 1),
    ("3c", 0, (128, 160), (64, 96), ("max", 0), 2),
    ("4a", 224, (64, 96), (96, 128), ("avg", 128), 1),
    ("4b", 192, (96, 128), (96, 128), ("avg", 128), 1),
    ("4c", 160, (128, 160), (128, 160), ("avg", 128), 1),
    ("4d", 96, (128, 192), (160, 192), ("avg", 128), 1),
    ("4e", 0, (128, 192), (192, 256), ("max", 0), 2),
    ("5a", 352, (192, 320), (160, 224), ("avg", 128), 1),
    ("5b", 352, (192, 320), (192, 224), ("max", 128), 1),
)


def inception_v2(b: ZooBuilder) -> None:
    """BN-Inception (GoogLeNet with batchnorm)."""
    x = b.cbr(INPUT, "stem.conv1", 3, 64, 7, 2)
    x = b.pool(x, "stem.pool1", "max", 3, 2, 1)
    x = b.cbr(x, "stem.conv2", 64, 64, 1)
    x = b.cbr(x, "stem.conv3", 64, 192, 3)
    x = b.pool(x, "stem.pool2", "max", 3, 2, 1)
    c = 192
    for name, c1, (r3, c3), (rd, cd), (kind, proj), stride in INCEPTION:
        n = f"inc{name}"
        outs, cout = [], 0
        if c1:
            outs.append(b.cbr(x, f"{n}.1x1", c, c1, 1))
            cout += c1
        y = b.cbr(x, f"{n}.3x3r", c, r3, 1)
        outs.append(b.cbr(y, f"{n}.3x3", r3, c3, 3, stride))
        y = b.cbr(x, f"{n}.d3x3r", c, rd, 1)
        y = b.cbr(y, f"{n}.d3x3a", rd, cd, 3)
        outs.append(b.cbr(y, f"{n}.d3x3b", cd, cd, 3, stride))
        cout += c3 + cd
        y = b.pool(x, f"{n}.pool", kind, 3, stride, 1)
        if proj:
            y = b.cbr(y, f"{n}.proj", c, proj, 1)
            cout += proj
        else:
            cout += c
        outs.append(y)
        x = b.concat(outs, f"{n}.cat")
        c = cout
    b.classifier(x, c)


def logit_gain(y: Array) -> float:
    """1 / the spread over the batch of relu(y) averaged over H and W (the logits)."""
    z = np.maximum(y, 0).mean(axis=(2, 3))
    return float(1.0 / ((z - z.mean(axis=0)).std() + 1e-12))


def squeezenet1_1(b: ZooBuilder) -> None:
    """SqueezeNet 1.1 (convs with biases, no BN; the classifier is a 1x1 conv)."""

    def conv_relu(
        x: str, name: str, cin: int, cout: int, k: int, stride: int = 1, pad: int | None = None
    ) -> str:
        gain = logit_gain if name == "classifier" else None
        y = b.conv_g(x, name, cin, cout, k, stride, pad=pad, calibrated=MAIN, gain=gain)
        return b.relu(y, f"{name}.relu")

    def fire(x: str, name: str, cin: int, squeeze: int, expand: int) -> str:
        s = conv_relu(x, f"{name}.squeeze", cin, squeeze, 1)
        e1 = conv_relu(s, f"{name}.expand1x1", squeeze, expand, 1)
        e3 = conv_relu(s, f"{name}.expand3x3", squeeze, expand, 3)
        return b.concat([e1, e3], f"{name}.cat")

    x = conv_relu(INPUT, "stem", 3, 64, 3, 2, pad=0)
    c = 64
    for stage, fires in enumerate((((16, 64),) * 2, ((32, 128),) * 2,
                                   ((48, 192),) * 2 + ((64, 256),) * 2)):  # fmt: skip
        x = b.pool(x, f"pool{stage + 1}", "max", 3, 2)
        for i, (sq, ex) in enumerate(fires):
            x = fire(x, f"fire{stage + 1}.{i}", c, sq, ex)
            c = 2 * ex
    x = conv_relu(x, "classifier", c, NUM_CLASSES, 1)
    b._at(x)
    b.h = b.h.mean(axis=(2, 3))
    x = b.gb.node("GlobalAveragePool", [x], "pool")
    b._keep(b.gb.node("Flatten", [x], "logits", axis=1))


def shufflenet_v2(b: ZooBuilder) -> None:
    """ShuffleNet v2 1.0x."""
    x = b.cbr(INPUT, "stem", 3, 24, 3, 2)
    x = b.pool(x, "stem.pool", "max", 3, 2, 1)
    c = 24
    for s, (cout, units) in enumerate(((116, 4), (232, 8), (464, 4)), 2):
        half = cout // 2
        for i in range(units):
            n = f"stage{s}.{i}"
            if i == 0:  # downsampling: both branches see the whole input
                a = b.bn(b.conv_g(x, f"{n}.b1.dw", c, c, 3, 2, groups=c), f"{n}.b1.dw_bn")
                a = b.cbr(a, f"{n}.b1.pw", c, half, 1)
                y, cin = x, c
            else:
                a, y = b.split2(x, f"{n}.split")
                cin = half
            y = b.cbr(y, f"{n}.b2.pw1", cin, half, 1)
            stride = 2 if i == 0 else 1
            y = b.bn(b.conv_g(y, f"{n}.b2.dw", half, half, 3, stride, groups=half),
                     f"{n}.b2.dw_bn")  # fmt: skip
            y = b.cbr(y, f"{n}.b2.pw2", half, half, 1)
            x = b.shuffle(b.concat([a, y], f"{n}.cat"), f"{n}.shuffle")
            c = cout
    x = b.cbr(x, "conv5", c, 1024, 1)
    b.classifier(x, 1024)


# MobileNet v2's inverted residual stages: (expansion, channels, blocks, stride).
MOBILENET_V2 = (
    (1, 16, 1, 1),
    (6, 24, 2, 2),
    (6, 32, 3, 2),
    (6, 64, 4, 2),
    (6, 96, 3, 1),
    (6, 160, 3, 2),
    (6, 320, 1, 1),
)


def mobilenet_v2(b: ZooBuilder) -> None:
    """MobileNet v2 1.0 (Relu6 as Clip)."""

    def cbr6(x: str, name: str, cin: int, cout: int, k: int, stride: int = 1, g: int = 1) -> str:
        y = b.bn(b.conv_g(x, f"{name}.conv", cin, cout, k, stride, groups=g), f"{name}.bn")
        return b.relu6(y, f"{name}.relu6")

    x = cbr6(INPUT, "stem", 3, 32, 3, 2)
    c = 32
    for s, (t, cout, blocks, stride) in enumerate(MOBILENET_V2, 1):
        for i in range(blocks):
            n, st = f"block{s}.{i}", stride if i == 0 else 1
            hidden = c * t
            y = cbr6(x, f"{n}.expand", c, hidden, 1) if t != 1 else x
            y = cbr6(y, f"{n}.dw", hidden, hidden, 3, st, g=hidden)
            residual = st == 1 and c == cout
            y = b.bn(b.conv_g(y, f"{n}.project", hidden, cout, 1), f"{n}.project_bn",
                     RESIDUAL if residual else MAIN)  # fmt: skip
            x = b.add(y, x, f"{n}.add") if residual else y
            c = cout
    x = cbr6(x, "last", c, 1280, 1)
    b.classifier(x, 1280)


VGG19 = (64, 64, 0, 128, 128, 0, 256, 256, 256, 256, 0, 512, 512, 512, 512, 0,
         512, 512, 512, 512, 0)  # fmt: skip  # 0: a 2x2 max pool


def vgg19(b: ZooBuilder) -> None:
    """VGG-19 with its 4096-wide fully connected layers (no BN)."""
    x, c = INPUT, 3
    for i, width in enumerate(VGG19):
        if width == 0:
            x = b.pool(x, f"pool{i}", "max", 2, 2)
            continue
        x = b.relu(b.conv_g(x, f"conv{i}", c, width, 3, calibrated=MAIN), f"conv{i}.relu")
        c = width
    b._at(x)
    b.h = b.h.reshape(len(b.h), -1)
    x = b._keep(b.gb.node("Flatten", [x], "flatten", axis=1))
    x = b.dense(x, "fc1", c * 7 * 7, 4096)
    x = b.dense(x, "fc2", 4096, 4096)
    b.dense(x, "fc3", 4096, NUM_CLASSES, last=True)


MODELS: dict[str, tuple[int, Callable[[ZooBuilder], None]]] = {
    "densenet121": (121, densenet121),
    "inception_v2": (22, inception_v2),
    "squeezenet1_1": (11, squeezenet1_1),
    "shufflenet_v2": (20, shufflenet_v2),
    "mobilenet_v2": (2, mobilenet_v2),
    "vgg19": (19, vgg19),
}


def build(name: str) -> tuple[Any, Array, Array]:
    """(ModelProto, the calibration batch float32, its float64 logits from the build pass)."""
    seed, arch = MODELS[name]
    calib = preprocess(sample_images(np.random.default_rng(CALIB_SEED), CALIB_BATCH))
    b = ZooBuilder(np.random.default_rng(1000 + seed), calib)
    arch(b)
    model = b.gb.model(name, ["N", 3, SIZE, SIZE], NUM_CLASSES)
    return model, calib.astype(np.float32), b.acts["logits"]


def ort_logits(path: Path, x: Array) -> Array:
    """onnxruntime's logits of x for the model at path (CPU, 2 threads, one image at a time)."""
    import onnxruntime as ort  # type: ignore[import-untyped]

    opts = ort.SessionOptions()
    opts.intra_op_num_threads = 2
    sess = ort.InferenceSession(str(path), opts, providers=["CPUExecutionProvider"])
    out = [sess.run(None, {INPUT: x[i : i + 1]})[0] for i in range(len(x))]
    return np.concatenate(out).astype(np.float32)


def fingerprint() -> str:
    """The hash of this script and its helpers: a model is remade when it changes."""
    h = hashlib.sha256()
    for name in ("make_zoo.py", "make_resnet.py", "make_resnet50.py", "onnx_build.py",
                 "numpy_nn.py"):  # fmt: skip
        h.update((HERE / name).read_bytes())
    return h.hexdigest()[:16]


def make(name: str, out: Path) -> None:
    """Build, self-check and write one model."""
    t0 = time.perf_counter()
    model, calib, want = build(name)
    path = out / f"{name}.onnx"
    save(model, path)
    got = ort_logits(path, calib)
    scale = float(np.abs(want).max())
    err = float(np.abs(got - want).max())
    if not np.isfinite(got).all() or err > SELF_CHECK_RTOL * scale:
        raise SystemExit(f"{name}: onnxruntime differs from the build pass by {err:.3g}")
    n_params = sum(int(np.prod(t.dims)) for t in model.graph.initializer)
    log.info(
        "%s.onnx: %d nodes, %.1f M parameters, %d MiB; calibration logits max |x| %.3g, "
        "std %.3g, onnxruntime vs float64 %.1e; %.0f s",
        name,
        len(model.graph.node),
        n_params / 1e6,
        path.stat().st_size >> 20,
        scale,
        float(want.std()),
        err / scale,
        time.perf_counter() - t0,
    )


def write_sample(out: Path, names: Sequence[str]) -> None:
    """zoo_sample.npz: resnet50_sample.npz's x and onnxruntime's logits of every model."""
    with np.load(out / "resnet50_sample.npz") as d:
        x = d["x"].astype(np.float32)
    arrays = {"x": x}
    for name in names:
        arrays[f"logits_{name}"] = ort_logits(out / f"{name}.onnx", x)
    np.savez_compressed(out / SAMPLE, **arrays)


def main(argv: list[str] | None = None) -> int:
    """Make the models that are missing or out of date, then the sample."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("models", nargs="*", metavar="MODEL", help=f"of {', '.join(MODELS)} (all)")
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT, help="output directory")
    ap.add_argument("--force", action="store_true", help="rebuild even if up to date")
    args = ap.parse_args(argv)
    unknown = set(args.models) - set(MODELS)
    if unknown:
        ap.error(f"unknown models: {', '.join(sorted(unknown))}")
    logging.basicConfig(level=logging.INFO, format="make_zoo: %(message)s")
    fp = fingerprint()
    names = args.models or list(MODELS)
    sample_stamp = args.out / "zoo_sample.stamp"
    changed = False
    for name in names:
        stamp = args.out / f"{name}.stamp"
        if not args.force and stamp.exists() and stamp.read_text().strip() == fp:
            log.info("%s: up to date in %s", name, args.out)
            continue
        make(name, args.out)
        stamp.write_text(fp + "\n")
        changed = True
    if args.models:  # a partial run leaves the sample to a full one
        return 0
    if not (args.out / "resnet50_sample.npz").exists():
        raise SystemExit("resnet50_sample.npz is missing: run make resnet50 first")
    if changed or args.force or not sample_stamp.exists() or sample_stamp.read_text().strip() != fp:
        write_sample(args.out, names)
        sample_stamp.write_text(fp + "\n")
        log.info("%s: onnxruntime's logits of the 8 sample inputs", SAMPLE)
    return 0


if __name__ == "__main__":
    sys.exit(main())
