#!/usr/bin/env python3
"""Train the digits MLP and CNN in plain numpy and export them to ONNX.

Runs on the host (``make models``; needs numpy, scikit-learn and onnx, all
in the project venv). scikit-learn's digits dataset (1797 8x8 grey images,
shipped inside scikit-learn: nothing is downloaded) is split 80/20,
stratified, with a fixed seed; pixels are scaled to [0, 1] float32. Both
models are trained with hand-written forward and backward passes and Adam,
seeded, then written as opset-17 ONNX graphs with input ``input``
([N, 64] for the MLP, [N, 1, 8, 8] for the CNN) and output ``logits``
([N, 10]). The script checks each file with onnx.checker and checks that
onnx's ReferenceEvaluator reproduces the numpy forward pass (same
predictions on the test split, logits within 1e-4). See docs/models.md.

Writes, next to this script (or into --out)::

    digits_mlp.onnx  digits_cnn.onnx  digits_test.npz (x [360, 1, 8, 8] float32, y int64)

Usage::

    python examples/models/train_digits.py [--out DIR] [--epochs-cnn N] [-q]
"""

from __future__ import annotations

import argparse
import itertools
import os
import sys
import time
from pathlib import Path
from typing import Any

# One BLAS thread: OpenBLAS's results (and so the trained weights, bit for
# bit) depend on its thread count; with one thread they depend only on the CPU.
for _var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ[_var] = "1"

import numpy as np  # noqa: E402
import numpy.typing as npt  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))

import numpy_nn as nn  # noqa: E402
from onnx_build import GraphBuilder, reference_run, save  # noqa: E402

Array = npt.NDArray[Any]
Params = dict[str, Array]

HERE = Path(__file__).resolve().parent
SEED = 0
SPLIT_SEED = 0
TEST_SIZE = 0.2
MLP_EPOCHS = 60
CNN_EPOCHS = 20
BATCH = 32
LR = 1e-3
# ReferenceEvaluator against the numpy forward pass: fp32 rounding only.
REF_ATOL = 1e-4


def load_split() -> tuple[Array, Array, Array, Array]:
    """(x_train, y_train, x_test, y_test): x float32 [N, 1, 8, 8] in [0, 1], y int64."""
    from sklearn.datasets import load_digits  # type: ignore[import-untyped]
    from sklearn.model_selection import train_test_split  # type: ignore[import-untyped]

    digits = load_digits()
    x = (digits.images / 16.0).astype(np.float32)[:, None, :, :]
    y = digits.target.astype(np.int64)
    x_tr, x_te, y_tr, y_te = train_test_split(
        x, y, test_size=TEST_SIZE, stratify=y, random_state=SPLIT_SEED
    )
    return x_tr, y_tr, x_te, y_te


def he(rng: np.random.Generator, shape: tuple[int, ...], fan_in: int) -> Array:
    """He-normal initial weights (float32)."""
    return (rng.standard_normal(shape) * float(np.sqrt(2.0 / fan_in))).astype(np.float32)


# ---------------------------------------------------------------------------
# MLP 64 -> 128 -> 64 -> 10 (Gemm weights are [out, in], transB = 1)
# ---------------------------------------------------------------------------


def mlp_init(rng: np.random.Generator) -> Params:
    """Initial MLP parameters."""
    dims = [64, 128, 64, 10]
    p: Params = {}
    for i, (a, b) in enumerate(itertools.pairwise(dims), 1):
        p[f"fc{i}.weight"] = he(rng, (b, a), a)
        p[f"fc{i}.bias"] = np.zeros(b, dtype=np.float32)
    return p


def mlp_forward(p: Params, x: Array) -> tuple[Array, list[Array]]:
    """Logits of x [N, 64] and the activations for backward."""
    acts = [x]
    h = x
    for i in (1, 2, 3):
        h = h @ p[f"fc{i}.weight"].T + p[f"fc{i}.bias"]
        if i < 3:
            h = np.maximum(h, 0)
        acts.append(h)
    return h, acts


def mlp_backward(p: Params, acts: list[Array], dlogits: Array) -> Params:
    """Gradients of the loss with respect to every MLP parameter."""
    g: Params = {}
    d = dlogits
    for i in (3, 2, 1):
        a_in = acts[i - 1]
        g[f"fc{i}.weight"] = d.T @ a_in
        g[f"fc{i}.bias"] = d.sum(axis=0)
        if i > 1:
            d = (d @ p[f"fc{i}.weight"]) * (a_in > 0)
    return g


def mlp_onnx(p: Params) -> GraphBuilder:
    """The MLP as an ONNX graph: Gemm, Relu, Gemm, Relu, Gemm."""
    gb = GraphBuilder()
    h = "input"
    for i in (1, 2, 3):
        w = gb.const(f"fc{i}.weight", p[f"fc{i}.weight"])
        b = gb.const(f"fc{i}.bias", p[f"fc{i}.bias"])
        out = "logits" if i == 3 else f"fc{i}"
        h = gb.node("Gemm", [h, w, b], out, transB=1)
        if i < 3:
            h = gb.node("Relu", [h], f"relu{i}")
    return gb


# ---------------------------------------------------------------------------
# CNN: conv 1->32, relu, conv 32->64, relu, maxpool, conv 64->64, relu,
# maxpool, flatten (256), Gemm 256->128, relu, Gemm 128->10. 3x3 convs, pad 1.
# ---------------------------------------------------------------------------

CONVS = (("conv1", 1, 32), ("conv2", 32, 64), ("conv3", 64, 64))
POOL_AFTER = {"conv2", "conv3"}


def cnn_init(rng: np.random.Generator) -> Params:
    """Initial CNN parameters."""
    p: Params = {}
    for name, cin, cout in CONVS:
        p[f"{name}.weight"] = he(rng, (cout, cin, 3, 3), cin * 9)
        p[f"{name}.bias"] = np.zeros(cout, dtype=np.float32)
    p["fc1.weight"] = he(rng, (128, 256), 256)
    p["fc1.bias"] = np.zeros(128, dtype=np.float32)
    p["fc2.weight"] = he(rng, (10, 128), 128)
    p["fc2.bias"] = np.zeros(10, dtype=np.float32)
    return p


def cnn_forward(p: Params, x: Array) -> tuple[Array, dict[str, Any]]:
    """Logits of x [N, 1, 8, 8] and what backward needs."""
    cache: dict[str, Any] = {}
    h = x
    for name, _, _ in CONVS:
        cache[f"{name}.in"] = h
        h = np.maximum(nn.conv2d(h, p[f"{name}.weight"], p[f"{name}.bias"], pad=1), 0)
        cache[f"{name}.out"] = h
        if name in POOL_AFTER:
            h, cache[f"{name}.pool"] = nn.maxpool2(h)
    cache["flat.shape"] = h.shape
    f0 = h.reshape(h.shape[0], -1)
    f1 = np.maximum(f0 @ p["fc1.weight"].T + p["fc1.bias"], 0)
    logits = f1 @ p["fc2.weight"].T + p["fc2.bias"]
    cache["f0"], cache["f1"] = f0, f1
    return logits, cache


def cnn_backward(p: Params, c: dict[str, Any], dlogits: Array) -> Params:
    """Gradients of the loss with respect to every CNN parameter."""
    g: Params = {}
    g["fc2.weight"] = dlogits.T @ c["f1"]
    g["fc2.bias"] = dlogits.sum(axis=0)
    d = (dlogits @ p["fc2.weight"]) * (c["f1"] > 0)
    g["fc1.weight"] = d.T @ c["f0"]
    g["fc1.bias"] = d.sum(axis=0)
    d = (d @ p["fc1.weight"]).reshape(c["flat.shape"])
    for name, _, _ in reversed(CONVS):
        if name in POOL_AFTER:
            d = nn.maxpool2_backward(d, c[f"{name}.pool"])
        d = d * (c[f"{name}.out"] > 0)
        dx, g[f"{name}.weight"], g[f"{name}.bias"] = nn.conv2d_backward(
            c[f"{name}.in"], p[f"{name}.weight"], d, pad=1
        )
        d = dx
    return g


def cnn_onnx(p: Params) -> GraphBuilder:
    """The CNN as an ONNX graph (Conv, Relu, MaxPool, Flatten, Gemm)."""
    gb = GraphBuilder()
    h = "input"
    for name, _, _ in CONVS:
        w = gb.const(f"{name}.weight", p[f"{name}.weight"])
        b = gb.const(f"{name}.bias", p[f"{name}.bias"])
        h = gb.node("Conv", [h, w, b], name, kernel_shape=[3, 3], pads=[1, 1, 1, 1])
        h = gb.node("Relu", [h], f"{name}.relu")
        if name in POOL_AFTER:
            h = gb.node("MaxPool", [h], f"{name}.pool", kernel_shape=[2, 2], strides=[2, 2])
    h = gb.node("Flatten", [h], "flatten", axis=1)
    for name, out in (("fc1", "fc1"), ("fc2", "logits")):
        w = gb.const(f"{name}.weight", p[f"{name}.weight"])
        h = gb.node("Gemm", [h, w, gb.const(f"{name}.bias", p[f"{name}.bias"])], out, transB=1)
        if name == "fc1":
            h = gb.node("Relu", [h], "fc1.relu")
    return gb


# ---------------------------------------------------------------------------
# training loop
# ---------------------------------------------------------------------------


def train(
    name: str,
    params: Params,
    forward: Any,
    backward: Any,
    data: tuple[Array, Array, Array, Array],
    epochs: int,
    rng: np.random.Generator,
    quiet: bool,
) -> tuple[float, float]:
    """Train params in place with Adam (cosine-decayed lr); (train acc, test acc)."""
    x_tr, y_tr, x_te, y_te = data
    opt = nn.Adam(params, LR)
    n = len(x_tr)
    steps = epochs * ((n + BATCH - 1) // BATCH)
    t0 = time.perf_counter()
    for epoch in range(epochs):
        order = rng.permutation(n)
        total = 0.0
        for start in range(0, n, BATCH):
            idx = order[start : start + BATCH]
            logits, cache = forward(params, x_tr[idx])
            loss, dlogits = nn.softmax_xent(logits, y_tr[idx])
            total += loss * len(idx)
            opt.lr = LR * 0.5 * (1.0 + np.cos(np.pi * opt.t / steps))
            opt.step(backward(params, cache, dlogits))
        if not quiet and (epoch + 1) % max(1, epochs // 10) == 0:
            acc = accuracy(forward(params, x_te)[0], y_te)
            print(
                f"{name}: epoch {epoch + 1:3d}  loss {total / n:.4f}  test acc {acc:.4f}  "
                f"({time.perf_counter() - t0:.1f} s)",
                file=sys.stderr,
            )
    return accuracy(forward(params, x_tr)[0], y_tr), accuracy(forward(params, x_te)[0], y_te)


def accuracy(logits: Array, y: Array) -> float:
    """Fraction of argmax(logits) equal to y."""
    return float(np.mean(np.argmax(logits, axis=1) == y))


def export_and_check(
    gb: GraphBuilder,
    name: str,
    input_shape: list[int | str],
    forward: Any,
    params: Params,
    x_te: Array,
    path: Path,
) -> float:
    """Write the model, check it with onnx.checker and the reference evaluator; ref accuracy."""
    model = gb.model(name, input_shape, 10)
    save(model, path)
    want = forward(params, x_te)[0].astype(np.float32)
    got = reference_run(model, x_te)
    err = float(np.max(np.abs(got - want)))
    if not np.array_equal(got.argmax(1), want.argmax(1)) or err > REF_ATOL:
        raise SystemExit(f"{path.name}: ReferenceEvaluator differs from numpy (max err {err:.3g})")
    return err


def main(argv: list[str] | None = None) -> int:
    """Train both models, export and check them; print a summary."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=HERE, help="output directory")
    ap.add_argument("--epochs-mlp", type=int, default=MLP_EPOCHS)
    ap.add_argument("--epochs-cnn", type=int, default=CNN_EPOCHS)
    ap.add_argument("-q", "--quiet", action="store_true", help="no per-epoch progress")
    args = ap.parse_args(argv)

    x_tr, y_tr, x_te, y_te = load_split()
    args.out.mkdir(parents=True, exist_ok=True)
    np.savez_compressed(args.out / "digits_test.npz", x=x_te, y=y_te)

    rng = np.random.default_rng(SEED)
    mlp = mlp_init(rng)
    flat = (x_tr.reshape(len(x_tr), -1), y_tr, x_te.reshape(len(x_te), -1), y_te)
    tr_acc, te_acc = train(
        "mlp", mlp, mlp_forward, mlp_backward, flat, args.epochs_mlp, rng, args.quiet
    )
    err = export_and_check(
        mlp_onnx(mlp),
        "digits_mlp",
        ["N", 64],
        mlp_forward,
        mlp,
        flat[2],
        args.out / "digits_mlp.onnx",
    )
    print(f"digits_mlp.onnx: train acc {tr_acc:.4f}  test acc {te_acc:.4f}  ref max err {err:.2e}")

    cnn = cnn_init(rng)
    data = (x_tr, y_tr, x_te, y_te)
    tr_acc, te_acc = train(
        "cnn", cnn, cnn_forward, cnn_backward, data, args.epochs_cnn, rng, args.quiet
    )
    err = export_and_check(
        cnn_onnx(cnn),
        "digits_cnn",
        ["N", 1, 8, 8],
        cnn_forward,
        cnn,
        x_te,
        args.out / "digits_cnn.onnx",
    )
    print(f"digits_cnn.onnx: train acc {tr_acc:.4f}  test acc {te_acc:.4f}  ref max err {err:.2e}")
    if te_acc < 0.95:
        print("CNN test accuracy below 95%", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
