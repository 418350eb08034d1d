#!/usr/bin/env python3
"""Quantise the digits CNN and the small ResNet to int8 QDQ graphs with onnxruntime.

Runs on the host (``make models``; numpy, scikit-learn, onnx and onnxruntime,
all in the project venv). Static quantisation, onnxruntime's
``quantize_static`` in QDQ format:

- activations int8 (``QInt8``, asymmetric: a per-tensor scale and zero
  point from MinMax calibration), weights int8 symmetric per output channel,
  biases int32 with scale ``input_scale * weight_scale``, as for the NPU's
  int8 path (docs/npu-spec.md, section 8.5.9);
- the digits CNN is calibrated on the training split (the same seeded
  split as train_digits.py; the test split is never seen), the small ResNet
  on a seeded batch of standard-normal images (its inputs' distribution;
  another seed than its sample and than the evaluation set of
  examples/infer_int8.py).

The script then checks the int8 models with onnxruntime on the host: the
digits CNN's test accuracy must be within 1 point of fp32's. The small
ResNet has seeded, untrained weights and no labels: its top-1 agreement
with the fp32 model is printed, not checked (about 88%: its logit margins
are small, so int8 rounding flips close calls; docs/decisions.md). The
opset imports onnxruntime's pre-processing adds are dropped again unless
a node uses them. See docs/models.md.

Writes, next to this script (or into --out)::

    digits_cnn_int8.onnx  resnet_small_int8.onnx

Usage::

    python examples/models/quantize_models.py [--out DIR] [-q]
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path
from typing import Any

for _var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ[_var] = "1"

import numpy as np  # noqa: E402
import numpy.typing as npt  # noqa: E402
import onnx  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))

from train_digits import load_split  # noqa: E402

Array = npt.NDArray[Any]

HERE = Path(__file__).resolve().parent
#: Seed of the small ResNet's calibration images (its sample uses 2, the
#: evaluation set of examples/infer_int8.py uses RESNET_EVAL_SEED).
RESNET_CALIB_SEED = 11
RESNET_CALIB_BATCH = 128
RESNET_EVAL_SEED = 12
RESNET_EVAL_BATCH = 256
CALIB_CHUNK = 16
#: The int8 model may lose at most this much accuracy (fraction) against fp32.
MAX_DROP = 0.01


class _Reader:
    """An onnxruntime CalibrationDataReader over one array, in chunks."""

    def __init__(self, x: Array) -> None:
        self.chunks = [x[i : i + CALIB_CHUNK] for i in range(0, len(x), CALIB_CHUNK)]

    def get_next(self) -> dict[str, Array] | None:
        return {"input": self.chunks.pop(0)} if self.chunks else None

    def rewind(self) -> None:  # pragma: no cover - not used by MinMax
        pass


def resnet_eval_images() -> Array:
    """The small ResNet's seeded evaluation images (float32 [256, 3, 32, 32])."""
    rng = np.random.default_rng(RESNET_EVAL_SEED)
    return rng.standard_normal((RESNET_EVAL_BATCH, 3, 32, 32)).astype(np.float32)


def quantize(src: Path, dst: Path, calib: Array) -> None:
    """Static int8 QDQ quantisation of ``src`` into ``dst``."""
    from onnxruntime.quantization import (  # type: ignore[import-untyped]
        CalibrationMethod,
        QuantFormat,
        QuantType,
        quantize_static,
    )
    from onnxruntime.quantization.shape_inference import (  # type: ignore[import-untyped]
        quant_pre_process,
    )

    with tempfile.TemporaryDirectory() as tmp:
        pre = Path(tmp) / "pre.onnx"
        quant_pre_process(str(src), str(pre), skip_symbolic_shape=True)
        quantize_static(
            str(pre),
            str(dst),
            _Reader(calib),
            quant_format=QuantFormat.QDQ,
            activation_type=QuantType.QInt8,
            weight_type=QuantType.QInt8,
            per_channel=True,
            calibrate_method=CalibrationMethod.MinMax,
            extra_options={"ActivationSymmetric": False, "WeightSymmetric": True},
        )
    model = onnx.load(str(dst))
    used = {n.domain for n in model.graph.node}
    keep = [o for o in model.opset_import if o.domain in ("", "ai.onnx") or o.domain in used]
    del model.opset_import[:]
    model.opset_import.extend(keep)
    onnx.checker.check_model(model)
    onnx.save(model, str(dst))


def predict(path: Path, x: Array) -> Array:
    """Top-1 class per row of ``x`` with onnxruntime (one thread)."""
    import onnxruntime as ort  # type: ignore[import-untyped]

    opts = ort.SessionOptions()
    opts.intra_op_num_threads = 1
    sess = ort.InferenceSession(str(path), opts, providers=["CPUExecutionProvider"])
    logits = sess.run(None, {"input": x})[0]
    return np.asarray(logits).argmax(axis=1)


def main(argv: list[str] | None = None) -> int:
    """Quantise both models, check their accuracy, write them."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", type=Path, default=HERE)
    ap.add_argument("-q", "--quiet", action="store_true")
    args = ap.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    x_tr, _, x_te, y_te = load_split()
    ok = True

    src = HERE / "digits_cnn.onnx"
    dst = args.out / "digits_cnn_int8.onnx"
    quantize(src, dst, x_tr)
    acc32 = float((predict(src, x_te) == y_te).mean())
    acc8 = float((predict(dst, x_te) == y_te).mean())
    ok &= acc32 - acc8 <= MAX_DROP
    if not args.quiet or not ok:
        print(f"{dst.name}: test accuracy int8 {acc8:.4f}, fp32 {acc32:.4f}")

    src = HERE / "resnet_small.onnx"
    dst = args.out / "resnet_small_int8.onnx"
    calib = np.random.default_rng(RESNET_CALIB_SEED).standard_normal(
        (RESNET_CALIB_BATCH, 3, 32, 32)
    )
    quantize(src, dst, calib.astype(np.float32))
    xe = resnet_eval_images()
    agree = float((predict(dst, xe) == predict(src, xe)).mean())
    if not args.quiet:
        print(f"{dst.name}: top-1 agreement with fp32 {agree:.4f} on {len(xe)} images")
    if not ok:
        print(f"the int8 digits CNN lost more than {MAX_DROP:.0%} against fp32", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
