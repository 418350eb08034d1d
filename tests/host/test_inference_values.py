"""Values and models the ONNX conformance suite brought in: old opsets, other
domains, rank-0 constants, bfloat16 and float8, sequences and optionals,
subgraphs reading outer-scope values, empty reductions (docs/inference.md,
"Values and types"). Each test failed before the fix it names."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper
from onnx.reference import ReferenceEvaluator

import npu
from onnx_models import make, vi

F = TensorProto.FLOAT


def test_an_opset_6_model_runs_every_node_with_the_reference(device: npu.Device) -> None:
    model = make(
        [helper.make_node("Relu", ["x"], ["r"]), helper.make_node("Sigmoid", ["r"], ["y"])],
        [vi("x", [2, 3])],
        [vi("y", [2, 3])],
        opset=6,
    )
    x = np.linspace(-2, 2, 6, dtype=np.float32).reshape(2, 3)
    with npu.InferenceSession(model, device=device) as sess:
        (got,) = sess.run(None, {"x": x})
        assert set(sess.placement.values()) == {"CPU"}
        assert all("opset 6" in why for _, _, why in sess.fallbacks)
    np.testing.assert_allclose(got, 1 / (1 + np.exp(-np.maximum(x, 0))), rtol=1e-6)


def test_a_model_of_only_the_ml_domain_runs_with_the_reference() -> None:
    node = helper.make_node("Binarizer", ["x"], ["y"], domain="ai.onnx.ml", threshold=0.5)
    graph = helper.make_graph([node], "ml", [vi("x", [4])], [vi("y", [4])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("ai.onnx.ml", 1)])
    model.ir_version = 8
    x = np.array([0.1, 0.6, 0.5, 2.0], np.float32)
    (got,) = npu.InferenceSession(model, providers=("CPU",)).run(None, {"x": x})
    np.testing.assert_array_equal(got, [0, 1, 0, 1])


def test_a_rank_0_constant_keeps_rank_0_on_the_npu(device: npu.Device) -> None:
    # np.ascontiguousarray made the uploaded scalar [1], so min(x) came back as [1].
    model = make(
        [
            helper.make_node("ReduceMin", ["x"], ["m"], keepdims=0),
            helper.make_node("Max", ["m", "zero"], ["y"]),
        ],
        [vi("x", [6])],
        [vi("y", [])],
        inits={"zero": np.array(0.0, np.float32)},
    )
    x = np.array([3, -1, 2, 5, 4, 1], np.float32)
    with npu.InferenceSession(model, device=device) as sess:
        (got,) = sess.run(None, {"x": x})
        assert sess.placement == {"ReduceMin_0": "NPU", "Max_1": "NPU"}
    assert got.shape == () and got == 0.0


@pytest.mark.parametrize("axis", [-1, -2, -3, -4])
def test_flatten_with_a_negative_axis_counts_from_the_end(device: npu.Device, axis: int) -> None:
    model = make(
        [
            helper.make_node("Flatten", ["x"], ["f"], axis=axis),
            helper.make_node("Relu", ["f"], ["y"]),
        ],
        [vi("x", [2, 3, 4, 5])],
        [vi("y", [None, None])],
    )
    x = np.arange(120, dtype=np.float32).reshape(2, 3, 4, 5)
    (want,) = ReferenceEvaluator(model).run(None, {"x": x})
    with npu.InferenceSession(model, device=device) as sess:
        (got,) = sess.run(None, {"x": x})
    assert got.shape == want.shape
    np.testing.assert_array_equal(got, want)


def test_bfloat16_fed_as_raw_uint16_bits_casts_to_float() -> None:
    model = make(
        [helper.make_node("Cast", ["x"], ["y"], to=F)],
        [vi("x", [3], TensorProto.BFLOAT16)],
        [vi("y", [3])],
    )
    bits = np.array([0x3F80, 0x4000, 0xBF00], np.uint16)  # 1.0, 2.0, -0.5
    (got,) = npu.InferenceSession(model, providers=("CPU",)).run(None, {"x": bits})
    np.testing.assert_array_equal(got, [1.0, 2.0, -0.5])


def test_a_cast_to_float8_returns_float8_bits() -> None:
    model = make(
        [helper.make_node("Cast", ["x"], ["y"], to=TensorProto.FLOAT8E4M3FN)],
        [vi("x", [2])],
        [vi("y", [2], TensorProto.FLOAT8E4M3FN)],
        opset=19,
    )
    (got,) = npu.InferenceSession(model, providers=("CPU",)).run(
        None, {"x": np.array([1.0, -2.0], np.float32)}
    )
    assert got.dtype.names == ("e4m3fn",)
    assert got.view(np.uint8).tolist() == [0x38, 0xC0]


def test_a_sequence_output_is_a_list_of_arrays() -> None:
    model = make(
        [helper.make_node("SplitToSequence", ["x"], ["s"], axis=0, keepdims=0)],
        [vi("x", [3, 2])],
        [helper.make_tensor_sequence_value_info("s", F, None)],
    )
    x = np.arange(6, dtype=np.float32).reshape(3, 2)
    (got,) = npu.InferenceSession(model, providers=("CPU",)).run(None, {"x": x})
    assert isinstance(got, list) and len(got) == 3
    np.testing.assert_array_equal(got[2], [4.0, 5.0])


def test_an_empty_optional_input_is_fed_as_none() -> None:
    opt = helper.make_optional_type_proto(helper.make_tensor_type_proto(F, [2]))
    model = make(
        [helper.make_node("OptionalHasElement", ["o"], ["y"])],
        [helper.make_value_info("o", opt)],
        [vi("y", [], TensorProto.BOOL)],
        opset=18,
    )
    (got,) = npu.InferenceSession(model, providers=("CPU",)).run(None, {"o": None})
    assert got.shape == () and not bool(got)


def test_an_if_branch_reads_a_value_from_the_outer_graph(device: npu.Device) -> None:
    then_g = helper.make_graph([helper.make_node("Relu", ["h"], ["t"])], "then", [], [vi("t", [2])])
    else_g = helper.make_graph([helper.make_node("Neg", ["h"], ["e"])], "else", [], [vi("e", [2])])
    model = make(
        [
            helper.make_node("Add", ["x", "x"], ["h"]),
            helper.make_node("If", ["c"], ["y"], then_branch=then_g, else_branch=else_g),
        ],
        [vi("x", [2]), vi("c", [], TensorProto.BOOL)],
        [vi("y", [2])],
    )
    x = np.array([-1.0, 2.0], np.float32)
    with npu.InferenceSession(model, device=device) as sess:
        (yes,) = sess.run(None, {"x": x, "c": np.array(True)})
        (no,) = sess.run(None, {"x": x, "c": np.array(False)})
    np.testing.assert_array_equal(yes, [0.0, 4.0])
    np.testing.assert_array_equal(no, [2.0, -4.0])


@pytest.mark.parametrize(("op", "want"), [("ReduceMax", -np.inf), ("ReduceMin", np.inf)])
def test_an_empty_max_or_min_reduction_gives_the_identity(op: str, want: float) -> None:
    model = make(
        [helper.make_node(op, ["x", "axes"], ["y"], keepdims=1)],
        [vi("x", [2, 0, 4])],
        [vi("y", [2, 1, 4])],
        inits={"axes": np.array([1], np.int64)},
        opset=18,
    )
    (got,) = npu.InferenceSession(model, providers=("CPU",)).run(
        None, {"x": np.zeros((2, 0, 4), np.float32)}
    )
    assert got.shape == (2, 1, 4) and (got == want).all()


def test_a_loop_stacks_scalar_scan_outputs_as_a_vector() -> None:
    body = helper.make_graph(
        [
            helper.make_node("Identity", ["cond_in"], ["cond_out"]),
            helper.make_node("Add", ["acc_in", "one"], ["acc_out"]),
            helper.make_node("Identity", ["acc_out"], ["scan"]),
        ],
        "body",
        [
            vi("i", [], TensorProto.INT64),
            vi("cond_in", [], TensorProto.BOOL),
            vi("acc_in", []),
        ],
        [vi("cond_out", [], TensorProto.BOOL), vi("acc_out", []), vi("scan", [])],
        [numpy_helper.from_array(np.array(1.0, np.float32), "one")],
    )
    model = make(
        [helper.make_node("Loop", ["n", "c", "a0"], ["a", "s"], body=body)],
        [vi("n", [], TensorProto.INT64), vi("c", [], TensorProto.BOOL), vi("a0", [])],
        [vi("a", []), vi("s", [3])],
    )
    feeds = {"n": np.array(3, np.int64), "c": np.array(True), "a0": np.array(0.0, np.float32)}
    _, scan = npu.InferenceSession(model, providers=("CPU",)).run(None, feeds)
    assert scan.shape == (3,)
    np.testing.assert_array_equal(scan, [1.0, 2.0, 3.0])


def test_model_proto_is_unchanged_by_loading() -> None:
    model = make([helper.make_node("Relu", ["x"], ["y"])], [vi("x", [2])], [vi("y", [2])])
    before = model.SerializeToString()
    npu.InferenceSession(model, providers=("CPU",))
    assert onnx.load_from_string(before) == model
