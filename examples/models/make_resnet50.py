#!/usr/bin/env python3
"""Write ResNet-50 v1 with fixed seeded weights as ONNX (the flagship example's model).

Runs on the host (``make models``; numpy and onnx). The architecture is
torchvision's ResNet-50: a 7x7/2 stem conv 3->64 with batchnorm and relu,
a 3x3/2 max pool (pad 1), four stages of 3, 4, 6 and 3 bottleneck blocks
(1x1 reduce, 3x3 with the stage's stride, 1x1 expand x4; widths 64, 128,
256 and 512; a 1x1 projection with batchnorm where the shape changes),
global average pooling, flatten and a Gemm 2048 -> 1000 (``logits``), on
[N, 3, 224, 224]. The weights are seeded, not trained, and calibrated as
examples/models/make_resnet.py's are (He-normal convolutions, batchnorm
statistics from a seeded calibration batch, the last batchnorm of each
block scaled down as trained residual branches are), so activations keep a
sane scale through the 53 convolutions; BatchNormalization nodes stay in
the graph (folding them is the runner's business).

Also writes a seeded sample: 8 "camera images" (uint8 HWC, 256x256, smooth
random colour fields), their 224x224 inputs as the pipeline of
examples/infer_resnet50.py makes them (a bilinear resize to 240, a centre
crop of 224 and the ImageNet normalisation; ``preprocess``), and the
logits of those inputs from an independent float64 numpy forward pass. The model is about 100 MB,
so it goes to build/models/ (not committed); the script skips the work
when the files exist and were made by this version of it.

    resnet50.onnx  resnet50_sample.npz (images uint8 [8, 256, 256, 3],
                   x float32 [8, 3, 224, 224], logits float64 [8, 1000])

Usage::

    python examples/models/make_resnet50.py [--out build/models] [--force]
"""

from __future__ import annotations

import argparse
import hashlib
import os
import sys
import time
from pathlib import Path
from typing import Any

for _var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "2")

import numpy as np  # noqa: E402
import numpy.typing as npt  # noqa: E402

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from make_resnet import Builder, conv_bn  # noqa: E402
from onnx_build import save  # noqa: E402

Array = npt.NDArray[Any]

SEED = 50
CALIB_SEED = 51
SAMPLE_SEED = 52
CALIB_BATCH = 4
SAMPLE_BATCH = 8
SIZE = 224
IMAGE = 256  # the sample "camera" images, uint8 HWC
RESIZE = 240  # the pipeline: bilinear resize to RESIZE, centre crop SIZE
NUM_CLASSES = 1000
STAGES = ((64, 3, 1), (128, 4, 2), (256, 6, 2), (512, 3, 2))  # width, blocks, stride
EXPANSION = 4
MEAN = np.array([0.485, 0.456, 0.406])  # ImageNet statistics, on [0, 1] pixels
STD = np.array([0.229, 0.224, 0.225])
DEFAULT_OUT = HERE.parent.parent / "build" / "models"


def maxpool_3x3s2(h: Array) -> Array:
    """MaxPool 3x3, stride 2, pad 1 of NCHW h (the padding never wins)."""
    h = np.pad(h, ((0, 0), (0, 0), (1, 1), (1, 1)), constant_values=-np.inf)
    win = np.lib.stride_tricks.sliding_window_view(h, (3, 3), axis=(2, 3))[:, :, ::2, ::2]
    out: Array = win.max(axis=(4, 5))
    return out


class ResNet50Builder(Builder):
    """make_resnet's builder plus the max pool and the bottleneck block."""

    def maxpool(self, x: str, name: str) -> str:
        """MaxPool 3x3, stride 2, pad 1 (the stem's)."""
        self.h = maxpool_3x3s2(self.h)
        return self.gb.node(
            "MaxPool", [x], name, kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1]
        )

    def bottleneck(self, x: str, name: str, cin: int, width: int, stride: int) -> str:
        """1x1 reduce, 3x3 (stride), 1x1 expand, each with BN; + shortcut; relu."""
        cout = width * EXPANSION
        h_in = self.h
        y = self.relu(self.bn(self.conv(x, f"{name}.conv1", cin, width, 1, 1), f"{name}.bn1",
                              (0.7, 1.3)), f"{name}.relu1")  # fmt: skip
        y = self.relu(self.bn(self.conv(y, f"{name}.conv2", width, width, 3, stride),
                              f"{name}.bn2", (0.7, 1.3)), f"{name}.relu2")  # fmt: skip
        y = self.bn(self.conv(y, f"{name}.conv3", width, cout, 1, 1), f"{name}.bn3", (0.2, 0.5))
        h_branch = self.h
        if stride != 1 or cin != cout:
            self.h = h_in
            sc = self.bn(self.conv(x, f"{name}.proj", cin, cout, 1, stride), f"{name}.proj_bn",
                         (0.7, 1.3))  # fmt: skip
            h_sc = self.h
        else:
            sc, h_sc = x, h_in
        self.h = h_branch + h_sc
        return self.relu(self.gb.node("Add", [y, sc], f"{name}.add"), f"{name}.relu3")


def build() -> tuple[Any, dict[str, Array]]:
    """The graph builder of ResNet-50 and its parameters."""
    rng = np.random.default_rng(SEED)
    calib = preprocess(sample_images(np.random.default_rng(CALIB_SEED), CALIB_BATCH))
    b = ResNet50Builder(rng, calib)
    x = b.relu(b.bn(b.conv("input", "stem.conv", 3, 64, 7, 2), "stem.bn", (0.7, 1.3)), "stem.relu")
    x = b.maxpool(x, "stem.pool")
    cin = 64
    for s, (width, blocks, stride) in enumerate(STAGES, 1):
        for i in range(blocks):
            x = b.bottleneck(x, f"layer{s}.{i}", cin, width, stride if i == 0 else 1)
            cin = width * EXPANSION
    b.head(x, cin, NUM_CLASSES, per_class=False)
    return b.gb, b.params


def forward(params: dict[str, Array], x: Array) -> Array:
    """ResNet-50's logits for x in float64 numpy (the independent reference)."""
    p = {k: v.astype(np.float64) for k, v in params.items()}

    def cbn(h: Array, conv: str, bn: str, stride: int) -> Array:
        return conv_bn(p, h, conv, bn, stride)

    h = maxpool_3x3s2(np.maximum(cbn(x.astype(np.float64), "stem.conv", "stem.bn", 2), 0))
    for s, (_, blocks, stride) in enumerate(STAGES, 1):
        for i in range(blocks):
            n, st = f"layer{s}.{i}", stride if i == 0 else 1
            y = np.maximum(cbn(h, f"{n}.conv1", f"{n}.bn1", 1), 0)
            y = np.maximum(cbn(y, f"{n}.conv2", f"{n}.bn2", st), 0)
            y = cbn(y, f"{n}.conv3", f"{n}.bn3", 1)
            sc = cbn(h, f"{n}.proj", f"{n}.proj_bn", st) if f"{n}.proj.weight" in p else h
            h = np.maximum(y + sc, 0)
    out: Array = h.mean(axis=(2, 3)) @ p["fc.weight"].T + p["fc.bias"]
    return out


def bilinear_matrix(n_in: int, n_out: int) -> Array:
    """[n_out, n_in] weights of a half-pixel bilinear resize along one axis (no antialias).

    Output ``o`` samples input coordinate ``(o + 0.5) * n_in / n_out - 0.5``,
    clamped to the edges, from its two neighbours (PyTorch's
    ``interpolate(mode="bilinear", align_corners=False)``).
    """
    src = (np.arange(n_out) + 0.5) * (n_in / n_out) - 0.5
    src = np.clip(src, 0, n_in - 1)
    lo = np.floor(src).astype(int)
    hi = np.minimum(lo + 1, n_in - 1)
    frac = src - lo
    m = np.zeros((n_out, n_in))
    m[np.arange(n_out), lo] += 1 - frac
    m[np.arange(n_out), hi] += frac
    return m


def crop_matrices(n_in: int = IMAGE) -> tuple[Array, Array]:
    """(Ry [SIZE, n_in], Rx^T [n_in, SIZE]): resize to RESIZE then centre-crop SIZE, as matrices."""
    m = bilinear_matrix(n_in, RESIZE)
    top = (RESIZE - SIZE) // 2
    r = m[top : top + SIZE]
    return r, r.T.copy()


def preprocess(images: Array) -> Array:
    """The reference pipeline in float64: uint8 HWC -> resize, crop, normalise -> NCHW."""
    ry, rxt = crop_matrices(images.shape[1])
    x = images.astype(np.float64).transpose(0, 3, 1, 2) / 255.0
    x = ry @ x @ rxt
    return (x - MEAN[:, None, None]) / STD[:, None, None]


def sample_images(rng: np.random.Generator, n: int) -> Array:
    """n smooth random colour fields, uint8 [n, IMAGE, IMAGE, 3] (camera-like, not noise)."""
    coarse = rng.uniform(0, 255, (n, 3, 9, 9))
    up = bilinear_matrix(9, IMAGE)
    img = up @ coarse @ up.T + rng.normal(0, 6, (n, 3, IMAGE, IMAGE))
    out: Array = np.clip(np.rint(img), 0, 255).astype(np.uint8).transpose(0, 2, 3, 1)
    return np.ascontiguousarray(out)


def fingerprint() -> str:
    """This script's content hash: the outputs are remade when it changes."""
    h = hashlib.sha256()
    for f in (
        Path(__file__),
        HERE / "make_resnet.py",
        HERE / "onnx_build.py",
        HERE / "numpy_nn.py",
    ):
        h.update(f.read_bytes())
    return h.hexdigest()[:16]


def main(argv: list[str] | None = None) -> int:
    """Build the model and the sample (unless up to date)."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT, help="output directory")
    ap.add_argument("--force", action="store_true", help="rebuild even if up to date")
    args = ap.parse_args(argv)
    stamp = args.out / "resnet50.stamp"
    if not args.force and stamp.exists() and stamp.read_text().strip() == fingerprint():
        print(f"resnet50: up to date in {args.out}")
        return 0
    t0 = time.perf_counter()
    gb, params = build()
    model = gb.model("resnet50", ["N", 3, SIZE, SIZE], NUM_CLASSES)
    path = args.out / "resnet50.onnx"
    save(model, path)
    images = sample_images(np.random.default_rng(SAMPLE_SEED), SAMPLE_BATCH)
    x = preprocess(images)
    logits = forward(params, x)
    np.savez_compressed(
        args.out / "resnet50_sample.npz", images=images, x=x.astype(np.float32), logits=logits
    )
    stamp.write_text(fingerprint() + "\n")
    n_params = sum(v.size for v in params.values())
    print(
        f"resnet50.onnx: {len(model.graph.node)} nodes, {n_params} parameters, "
        f"{path.stat().st_size >> 20} MiB; sample logits max |x| {np.abs(logits).max():.3g}, "
        f"std {logits.std():.3g}; {time.perf_counter() - t0:.0f} s"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
