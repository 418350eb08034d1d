"""Loading and checking models: malformed and unsupported files raise npu.ModelError."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import helper

import npu
from onnx_models import digits_cnn, make, vi


def cpu_session(model: object) -> npu.InferenceSession:
    return npu.InferenceSession(model, providers=("CPU",))  # type: ignore[arg-type]


def test_model_error_is_a_value_error_exported_from_npu() -> None:
    assert issubclass(npu.ModelError, ValueError)
    assert "ModelError" in npu.__all__ and "InferenceSession" in npu.__all__


def test_a_model_loads_from_a_path_bytes_and_a_model_proto(tmp_path: Path) -> None:
    model = digits_cnn()
    path = tmp_path / "digits.onnx"
    onnx.save(model, path)
    x = np.zeros((1, 1, 28, 28), np.float32)
    outs = [
        cpu_session(src).run(None, {"x": x})[0] for src in (str(path), path.read_bytes(), model)
    ]
    np.testing.assert_array_equal(outs[0], outs[1])
    np.testing.assert_array_equal(outs[0], outs[2])


def test_truncated_file_names_the_file_and_the_decode_error(tmp_path: Path) -> None:
    data = digits_cnn().SerializeToString()
    path = tmp_path / "cut.onnx"
    path.write_bytes(data[: len(data) // 2])
    with pytest.raises(npu.ModelError, match=r"cut\.onnx: .*(decode|truncated|invalid)"):
        cpu_session(str(path))


def test_garbage_bytes_raise_a_decode_error() -> None:
    with pytest.raises(npu.ModelError, match=r"<bytes>: not a valid ONNX model"):
        cpu_session(b"\xff\xfe this is not a protobuf \x00\x01\x02" * 10)


def test_empty_file_raises(tmp_path: Path) -> None:
    path = tmp_path / "empty.onnx"
    path.write_bytes(b"")
    with pytest.raises(npu.ModelError, match="empty model file"):
        cpu_session(str(path))


def test_missing_file_raises_model_error(tmp_path: Path) -> None:
    with pytest.raises(npu.ModelError, match="cannot read"):
        cpu_session(str(tmp_path / "nope.onnx"))


@pytest.mark.parametrize("opset", [0, 23])
def test_unsupported_opset_is_rejected(opset: int) -> None:
    model = digits_cnn()
    model.opset_import[0].version = opset
    with pytest.raises(
        npu.ModelError, match=rf"opset {opset} is not supported \(supported: 1\.\.22\)"
    ):
        cpu_session(model)


def test_model_without_any_opset_is_rejected() -> None:
    model = digits_cnn()
    del model.opset_import[:]
    with pytest.raises(npu.ModelError, match=r"imports no opset"):
        cpu_session(model)


def test_missing_initializer_names_the_node_and_the_input() -> None:
    model = digits_cnn()
    kept = [t for t in model.graph.initializer if t.name != "w2"]
    del model.graph.initializer[:]
    model.graph.initializer.extend(kept)
    with pytest.raises(
        npu.ModelError, match=r"node 'conv2' \(Conv\): input 'w2' .*missing initializer"
    ):
        cpu_session(model)


def test_shape_mismatch_names_the_node() -> None:
    model = make(
        [helper.make_node("Add", ["a", "b"], ["y"], name="bad_add")],
        [vi("a", [2, 3]), vi("b", [4, 5])],
        [vi("y", [2, 3])],
    )
    with pytest.raises(npu.ModelError, match=r"shape inference failed.*bad_add"):
        cpu_session(model)


def test_weight_shape_mismatch_in_a_conv_names_the_node() -> None:
    model = digits_cnn()
    for t in model.graph.initializer:
        if t.name == "w2":  # 16x8x3x3 -> 16x5x3x3: C no longer matches
            t.CopyFrom(onnx.numpy_helper.from_array(np.zeros((16, 5, 3, 3), np.float32), "w2"))
    with pytest.raises(npu.ModelError, match="conv2"):
        cpu_session(model)


def test_unknown_op_in_the_default_domain_is_rejected_by_the_checker() -> None:
    model = make(
        [helper.make_node("NoSuchOp", ["x"], ["y"], name="mystery")],
        [vi("x", [2])],
        [vi("y", [2])],
    )
    with pytest.raises(npu.ModelError, match=r"invalid model: .*NoSuchOp"):
        cpu_session(model)


def test_custom_op_without_reference_implementation_names_the_node() -> None:
    model = make(
        [helper.make_node("Frobnicate", ["x"], ["y"], name="frob", domain="com.example")],
        [vi("x", [2])],
        [vi("y", [2])],
    )
    model.opset_import.append(helper.make_opsetid("com.example", 1))
    with pytest.raises(
        npu.ModelError, match=r"node 'frob' \(com\.example\.Frobnicate\): no NPU support and no CPU"
    ):
        cpu_session(model)


def test_graph_output_that_no_node_produces_is_rejected() -> None:
    model = make(
        [helper.make_node("Relu", ["x"], ["y"], name="r")],
        [vi("x", [2])],
        [vi("z", [2])],
    )
    with pytest.raises(npu.ModelError, match="graph output 'z' is not produced"):
        cpu_session(model)
