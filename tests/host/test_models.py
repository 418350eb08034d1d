"""The committed example models (examples/models/, docs/models.md) on the host.

They load, pass onnx.checker, have the documented interface, and onnx's
reference evaluator gives the documented accuracy on the saved test split
and the saved ResNet logits. No NPU involved.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import onnx
import pytest
from onnx.reference import ReferenceEvaluator

MODELS = Path(__file__).resolve().parents[2] / "examples" / "models"
DIGITS = ("digits_mlp.onnx", "digits_cnn.onnx")


def _digits() -> tuple[npt.NDArray[np.float32], npt.NDArray[Any]]:
    with np.load(MODELS / "digits_test.npz") as d:
        return d["x"], d["y"]


def _predict(name: str, x: npt.NDArray[np.float32]) -> npt.NDArray[Any]:
    model = onnx.load(str(MODELS / name))
    dims = model.graph.input[0].type.tensor_type.shape.dim
    xin = x.reshape(len(x), *(d.dim_value for d in dims[1:]))
    (logits,) = ReferenceEvaluator(model).run(None, {"input": xin})
    return np.asarray(logits)


@pytest.mark.parametrize("name", [*DIGITS, "resnet_small.onnx"])
def test_model_loads_and_passes_checker(name: str) -> None:
    model = onnx.load(str(MODELS / name))
    onnx.checker.check_model(model, full_check=True)
    assert [o.domain for o in model.opset_import] == [""]
    assert model.opset_import[0].version == 17
    (inp,) = model.graph.input
    (out,) = model.graph.output
    assert inp.name == "input"
    assert out.name == "logits"
    assert inp.type.tensor_type.shape.dim[0].dim_param == "N"


def test_model_files_are_commit_sized() -> None:
    sizes = {p.name: p.stat().st_size for p in MODELS.glob("*.onnx")}
    assert set(sizes) >= {*DIGITS, "resnet_small.onnx"}
    assert all(size <= 1_500_000 for size in sizes.values()), sizes


def test_digits_test_split_is_stratified_and_scaled() -> None:
    x, y = _digits()
    assert x.dtype == np.float32
    assert x.shape == (360, 1, 8, 8)
    assert x.min() >= 0.0 and x.max() <= 1.0
    assert np.bincount(y, minlength=10).min() >= 35


def test_reference_cnn_accuracy_at_least_95_percent() -> None:
    x, y = _digits()
    acc = float(np.mean(_predict("digits_cnn.onnx", x).argmax(axis=1) == y))
    assert acc >= 0.95


def test_reference_mlp_accuracy_at_least_95_percent() -> None:
    x, y = _digits()
    acc = float(np.mean(_predict("digits_mlp.onnx", x).argmax(axis=1) == y))
    assert acc >= 0.95


def test_reference_resnet_reproduces_saved_logits() -> None:
    with np.load(MODELS / "resnet_sample.npz") as d:
        x, want = d["x"], d["logits"]
    (out,) = ReferenceEvaluator(str(MODELS / "resnet_small.onnx")).run(None, {"input": x})
    got = np.asarray(out)
    assert got.shape == (8, 10)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_resnet_keeps_its_batchnorm_and_residual_structure() -> None:
    model = onnx.load(str(MODELS / "resnet_small.onnx"))
    ops = [n.op_type for n in model.graph.node]
    assert ops.count("BatchNormalization") == ops.count("Conv") == 15
    assert ops.count("Add") == 6
    assert ops[-3:] == ["GlobalAveragePool", "Flatten", "Gemm"]
