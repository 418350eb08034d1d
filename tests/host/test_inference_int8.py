"""int8 models on the NPU (issue 17, item 3): QuantizeLinear/DequantizeLinear,
the integer ops (QLinearConv, QLinearMatMul, com.microsoft.QGemm,
ConvInteger, MatMulInteger) and the fusion of QDQ islands into them, on the
CPU backend, checked against onnxruntime (an independent implementation)
and exact integer references."""

from __future__ import annotations

import logging
from fractions import Fraction
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnx.numpy_helper
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

import npu
from npu import _abi
from npu.hal.cpu import CPU_CAPS, CpuBackend
from npu.inference.quant import requantize
from onnx_models import make, vi

RNG = np.random.default_rng(41)
MODELS = Path(__file__).resolve().parents[2] / "examples" / "models"
I8 = TensorProto.INT8
I32 = TensorProto.INT32


def _ort(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    """onnxruntime's results of the graph as written (its graph optimisations off).

    Its QDQ-fusing optimisations pick fused int8 kernels which, on x86, can
    differ from its own unfused graph by tens of steps for some inputs
    (docs/decisions.md), so the reference is the unfused graph.
    """
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = 1
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    sess = ort.InferenceSession(model.SerializeToString(), opts, providers=["CPUExecutionProvider"])
    return [np.asarray(o) for o in sess.run(None, feeds)]


def _run(
    model: onnx.ModelProto | str, feeds: dict[str, np.ndarray], device: npu.Device
) -> tuple[list[np.ndarray], dict[str, str], list[Any]]:
    src = model if isinstance(model, str) else model.SerializeToString()
    with npu.InferenceSession(src, device=device) as sess:
        out = [np.array(o) for o in sess.run(None, feeds)]
        return out, dict(sess.placement), list(sess.fallbacks)


def _run_cpu(model: onnx.ModelProto | str, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    src = model if isinstance(model, str) else model.SerializeToString()
    with npu.InferenceSession(src, providers=["CPU"]) as sess:
        return [np.array(o) for o in sess.run(None, feeds)]


def _i8(*shape: int) -> np.ndarray:
    return RNG.integers(-128, 128, shape).astype(np.int8)


def _steps(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return np.abs(a.astype(np.int64) - b.astype(np.int64))


# -- exact requantisation -------------------------------------------------------


def test_requantize_rounds_the_exact_product_half_to_even() -> None:
    accs = [int(v) for v in RNG.integers(-(2**31), 2**31, 300)]
    scales = [float(np.float32(v)) for v in np.exp(RNG.uniform(-30, 2, 300))]
    # exact ties: acc * scale = k + 0.5 for both parities of k
    accs += [5, 7, -5, -7, 3 * 2**20 + 1, 1]
    scales += [0.5, 0.5, 0.5, 0.5, 2.0**-21, 2.0**-149]
    for zp, relu in ((0, False), (-7, True), (5, False)):
        got = requantize(np.array(accs), np.array(scales, np.float32), zp, relu)
        for acc, s, g in zip(accs, scales, got, strict=True):
            exact = round(Fraction(acc) * Fraction(s)) + zp  # round(): half to even
            want = min(max(exact, zp if relu else -128), 127)
            assert int(g) == want, (acc, s, zp, relu)


# -- QuantizeLinear / DequantizeLinear --------------------------------------------


def _q_model(shape: list[int], scale: np.ndarray, zp: np.ndarray, axis: int = 1) -> Any:
    node = helper.make_node("QuantizeLinear", ["x", "s", "z"], ["q"], axis=axis)
    return make([node], [vi("x", shape)], [vi("q", shape, I8)], {"s": scale, "z": zp}, opset=19)


def _dq_model(shape: list[int], scale: np.ndarray, zp: np.ndarray, axis: int = 1) -> Any:
    node = helper.make_node("DequantizeLinear", ["q", "s", "z"], ["y"], axis=axis)
    return make([node], [vi("q", shape, I8)], [vi("y", shape)], {"s": scale, "z": zp}, opset=19)


def test_quantize_linear_on_the_npu_rounds_ties_to_even_and_saturates_like_onnxruntime(
    device: npu.Device,
) -> None:
    ties = np.array([0.5, 1.5, 2.5, -0.5, -1.5, -2.5, 126.5, -127.5], np.float32) * 0.25
    big = np.array([1e9, -1e9, np.inf, -np.inf, 3e6, -3e6, 40.0, -40.0], np.float32)
    x = np.concatenate([ties, big, RNG.normal(0, 20, 48).astype(np.float32)]).reshape(4, 16)
    model = _q_model([4, 16], np.array(0.25, np.float32), np.array(-3, np.int8))
    (got,), placement, _ = _run(model, {"x": x}, device)
    assert set(placement.values()) == {"NPU"}
    np.testing.assert_array_equal(got, _ort(model, {"x": x})[0])


def test_quantize_linear_takes_a_scale_and_zero_point_per_channel(device: npu.Device) -> None:
    x = RNG.normal(0, 2, (2, 3, 4, 5)).astype(np.float32)
    model = _q_model(
        [2, 3, 4, 5], np.array([0.01, 0.03, 0.1], np.float32), np.array([0, -5, 9], np.int8)
    )
    (got,), placement, _ = _run(model, {"x": x}, device)
    assert set(placement.values()) == {"NPU"}
    np.testing.assert_array_equal(got, _ort(model, {"x": x})[0])


@pytest.mark.parametrize("per_channel", [False, True])
def test_dequantize_linear_on_the_npu_matches_onnxruntime_bit_for_bit(
    device: npu.Device, per_channel: bool
) -> None:
    q = _i8(2, 3, 4, 5)
    if per_channel:
        s, z = np.array([0.5, 0.013, 7.0], np.float32), np.array([3, 0, -128], np.int8)
    else:
        s, z = np.array(0.0371, np.float32), np.array(-9, np.int8)
    model = _dq_model([2, 3, 4, 5], s, z)
    (got,), placement, _ = _run(model, {"q": q}, device)
    assert set(placement.values()) == {"NPU"}
    np.testing.assert_array_equal(got, _ort(model, {"q": q})[0])


# -- the integer ops ------------------------------------------------------------------


def _qlinear_conv_model(
    x_shape: list[int], w: np.ndarray, bias: np.ndarray | None, zx: int, zy: int, **attrs: Any
) -> Any:
    o = w.shape[0]
    inits = {
        "sx": np.array(0.02, np.float32),
        "zx": np.array(zx, np.int8),
        "w": w,
        "sw": RNG.uniform(0.002, 0.01, o).astype(np.float32),
        "zw": np.zeros(o, np.int8),
        "sy": np.array(0.05, np.float32),
        "zy": np.array(zy, np.int8),
    }
    ins = ["x", "sx", "zx", "w", "sw", "zw", "sy", "zy"]
    if bias is not None:
        inits["b"] = bias
        ins.append("b")
    node = helper.make_node("QLinearConv", ins, ["y"], **attrs)
    return make([node], [vi("x", x_shape, I8)], [vi("y", ["n", "o", "h", "w"], I8)], inits)


@pytest.mark.parametrize(
    "attrs",
    [
        {"pads": [1, 1, 1, 1]},
        {"strides": [2, 2], "pads": [1, 1, 1, 1], "dilations": [1, 1]},
        {"group": 4, "pads": [1, 1, 1, 1]},
    ],
    ids=["3x3", "stride2", "depthwise"],
)
def test_qlinear_conv_runs_as_integer_conv2d_and_requant(
    device: npu.Device, attrs: dict[str, Any]
) -> None:
    g = int(attrs.get("group", 1))
    w = _i8(8 if g == 1 else 4, 4 // g, 3, 3)
    bias = RNG.integers(-3000, 3000, w.shape[0]).astype(np.int32)
    model = _qlinear_conv_model([2, 4, 7, 7], w, bias, zx=-11, zy=4, **attrs)
    x = _i8(2, 4, 7, 7)
    (got,), placement, _ = _run(model, {"x": x}, device)
    assert set(placement.values()) == {"NPU"}
    # onnxruntime rounds a float product: at most one step apart, rarely.
    steps = _steps(got, _ort(model, {"x": x})[0])
    assert steps.max() <= 1 and steps.mean() < 0.01
    np.testing.assert_array_equal(got, _run_cpu(model, {"x": x})[0])


def test_qlinear_matmul_runs_as_integer_matmul_and_requant(device: npu.Device) -> None:
    inits = {
        "sa": np.array(0.03, np.float32),
        "za": np.array(7, np.int8),
        "b": _i8(16, 12),
        "sb": RNG.uniform(0.001, 0.01, 12).astype(np.float32),
        "zb": np.zeros(12, np.int8),
        "sy": np.array(0.04, np.float32),
        "zy": np.array(-20, np.int8),
    }
    node = helper.make_node("QLinearMatMul", ["a", "sa", "za", "b", "sb", "zb", "sy", "zy"], ["y"])
    model = make([node], [vi("a", [3, 5, 16], I8)], [vi("y", [3, 5, 12], I8)], inits, opset=21)
    a = _i8(3, 5, 16)
    (got,), placement, _ = _run(model, {"a": a}, device)
    assert set(placement.values()) == {"NPU"}
    steps = _steps(got, _ort(model, {"a": a})[0])
    assert steps.max() <= 1 and steps.mean() < 0.01
    np.testing.assert_array_equal(got, _run_cpu(model, {"a": a})[0])


def test_matmul_integer_gives_the_exact_int32_product(device: npu.Device) -> None:
    node = helper.make_node("MatMulInteger", ["a", "b", "za"], ["y"])
    inits = {"b": _i8(24, 6), "za": np.array(-3, np.int8)}
    model = make([node], [vi("a", [5, 24], I8)], [vi("y", [5, 6], I32)], inits)
    a = _i8(5, 24)
    (got,), placement, _ = _run(model, {"a": a}, device)
    assert set(placement.values()) == {"NPU"}
    want = (a.astype(np.int64) + 3) @ inits["b"].astype(np.int64)
    np.testing.assert_array_equal(got, want)


def _conv_ref(x: np.ndarray, w: np.ndarray, zx: int, pad: int) -> np.ndarray:
    """Exact int64 sums of a stride-1 2-D convolution, the padding reading ``zx``."""
    n, _, h, wd = x.shape
    o, _, kh, kw = w.shape
    xp = np.pad(x.astype(np.int64) - zx, ((0, 0), (0, 0), (pad, pad), (pad, pad)))
    oh, ow = h + 2 * pad - kh + 1, wd + 2 * pad - kw + 1
    out = np.zeros((n, o, oh, ow), np.int64)
    for i in range(oh):
        for j in range(ow):
            win = xp[:, :, i : i + kh, j : j + kw]
            out[:, :, i, j] = np.tensordot(win, w.astype(np.int64), ([1, 2, 3], [1, 2, 3]))
    return out


def test_conv_integer_gives_the_exact_int32_sums_with_the_zero_point_as_padding(
    device: npu.Device,
) -> None:
    w = _i8(3, 2, 3, 3)
    node = helper.make_node("ConvInteger", ["x", "w", "zx"], ["y"], pads=[1, 1, 1, 1])
    inits = {"w": w, "zx": np.array(5, np.int8)}
    model = make([node], [vi("x", [1, 2, 5, 5], I8)], [vi("y", [1, 3, 5, 5], I32)], inits)
    x = _i8(1, 2, 5, 5)
    (got,), placement, _ = _run(model, {"x": x}, device)
    assert set(placement.values()) == {"NPU"}
    np.testing.assert_array_equal(got, _conv_ref(x, w, 5, 1))


def test_uint8_qlinear_conv_runs_on_the_cpu_and_says_why(device: npu.Device) -> None:
    w = _i8(4, 3, 3, 3)
    model = _qlinear_conv_model([1, 3, 6, 6], w, None, zx=0, zy=0, pads=[1, 1, 1, 1])
    for init in model.graph.initializer:
        if init.name in ("zx", "zy"):
            init.data_type = TensorProto.UINT8
    model.graph.input[0].type.tensor_type.elem_type = TensorProto.UINT8
    model.graph.output[0].type.tensor_type.elem_type = TensorProto.UINT8
    x = RNG.integers(0, 256, (1, 3, 6, 6)).astype(np.uint8)
    (got,), placement, fallbacks = _run(model, {"x": x}, device)
    assert set(placement.values()) == {"CPU"}
    assert any("uint8" in f[2] for f in fallbacks), fallbacks
    # An exact integer reference: onnxruntime's u8s8 kernel on x86 saturates
    # 16-bit pair sums and is off by many steps for some inputs.
    inits = {i.name: onnx.numpy_helper.to_array(i) for i in model.graph.initializer}
    scale = inits["sx"].astype(np.float64) * inits["sw"] / inits["sy"]
    acc = _conv_ref(x, w, 0, 1).astype(np.float64) * scale.reshape(1, -1, 1, 1)
    want = np.clip(np.rint(acc), 0, 255)
    assert _steps(got, want).max() <= 1 and (got != want).mean() < 0.01


def test_without_cap_quant_the_integer_ops_run_on_the_cpu() -> None:
    w = _i8(4, 3, 3, 3)
    model = _qlinear_conv_model([1, 3, 6, 6], w, None, zx=1, zy=2, pads=[1, 1, 1, 1])
    x = _i8(1, 3, 6, 6)
    with npu.Device(CpuBackend(caps=CPU_CAPS & ~_abi.NPU_INFO_CAP_QUANT)) as dev:
        (got,), placement, fallbacks = _run(model, {"x": x}, dev)
    assert set(placement.values()) == {"CPU"}
    assert any("Cap.QUANT" in f[2] for f in fallbacks), fallbacks
    np.testing.assert_array_equal(got, _run_cpu(model, {"x": x})[0])


# -- QDQ fusion -------------------------------------------------------------------------


def _qdq_model(
    op: str, relu: bool, w_zero: int = 0, per_tensor: bool = False, float_bias: bool = False
) -> tuple[Any, dict[str, np.ndarray]]:
    """x -> Q -> DQ -> op(DQ(w), DQ(b)) [-> Relu] -> Q -> DQ -> y, onnxruntime's QDQ form.

    ``per_tensor``: one weight scale (the bias's scale still one per channel);
    ``float_bias``: a float32 bias initializer instead of DQ(int32).
    """
    sx, sy = np.float32(0.02), np.float32(0.03)
    if op == "Conv":
        w = _i8(6, 3, 3, 3)
        x_shape, axis, attrs = [2, 3, 6, 6], 0, {"pads": [1, 1, 1, 1]}
    elif op == "Gemm":
        w = _i8(6, 20)
        x_shape, axis, attrs = [4, 20], 0, {"transB": 1}
    else:
        w = _i8(20, 6)
        x_shape, axis, attrs = [4, 20], 1, {}
    sw = RNG.uniform(0.002, 0.01, 6).astype(np.float32)
    if per_tensor:
        sw = np.full(6, sw[0], np.float32)
    inits = {
        "sx": np.array(sx), "zx": np.array(-4, np.int8), "w": w, "sw": sw,
        "zw": np.full(6, w_zero, np.int8), "sy": np.array(sy), "zy": np.array(3, np.int8),
        "bq": RNG.integers(-2000, 2000, 6).astype(np.int32), "sb": (sx * sw).astype(np.float32),
        "zb": np.zeros(6, np.int32),
    }  # fmt: skip
    nodes = [
        helper.make_node("QuantizeLinear", ["x", "sx", "zx"], ["xq"]),
        helper.make_node("DequantizeLinear", ["xq", "sx", "zx"], ["xd"]),
        helper.make_node("DequantizeLinear", ["w", "sw", "zw"], ["wd"], axis=axis),
    ]
    ins = ["xd", "wd"]
    if per_tensor:
        inits["sw"], inits["zw"] = np.array(sw[0]), np.array(w_zero, np.int8)
    if op != "MatMul" and float_bias:
        inits["bf"] = (inits["bq"] * inits["sb"]).astype(np.float32)
        ins.append("bf")
    elif op != "MatMul":
        nodes.append(helper.make_node("DequantizeLinear", ["bq", "sb", "zb"], ["bd"], axis=0))
        ins.append("bd")
    nodes.append(helper.make_node(op, ins, ["h"], **attrs))
    last = "h"
    if relu:
        nodes.append(helper.make_node("Relu", ["h"], ["r"]))
        last = "r"
    nodes += [
        helper.make_node("QuantizeLinear", [last, "sy", "zy"], ["yq"]),
        helper.make_node("DequantizeLinear", ["yq", "sy", "zy"], ["y"]),
    ]
    out_shape = ["n", "o", "h", "w"] if op == "Conv" else ["n", "o"]
    model = make(nodes, [vi("x", x_shape)], [vi("y", out_shape)], inits, opset=19)
    return model, {"x": RNG.normal(0, 1, x_shape).astype(np.float32)}


@pytest.mark.parametrize("relu", [False, True], ids=["plain", "relu"])
@pytest.mark.parametrize(
    ("op", "fused"),
    [("Conv", "QLinearConv"), ("MatMul", "QLinearMatMul"), ("Gemm", "QGemm")],
)
def test_a_qdq_island_is_fused_into_one_integer_node_on_the_npu(
    device: npu.Device, op: str, fused: str, relu: bool
) -> None:
    model, feeds = _qdq_model(op, relu)
    with npu.InferenceSession(model.SerializeToString(), device=device) as sess:
        got = sess.run(None, feeds)[0]
        assert sess.rewrites.get("fuse_qdq") == 1
        ops = [n.op_type for n in sess.graph.nodes]
        assert ops == ["QuantizeLinear", fused, "DequantizeLinear"], ops
        assert sess.graph.nodes[1].act == ("Relu" if relu else "")
        assert set(sess.placement.values()) == {"NPU"}
    diff = np.abs(got - _ort(model, feeds)[0]) / 0.03  # in output steps (sy)
    assert diff.max() <= 1.0 + 1e-3 and (diff > 0.5).mean() < 0.02


@pytest.mark.parametrize(
    ("per_tensor", "float_bias"), [(True, False), (False, True)], ids=["per-tensor", "float-bias"]
)
def test_a_per_tensor_weight_or_a_float_bias_is_fused_too(
    device: npu.Device, per_tensor: bool, float_bias: bool
) -> None:
    model, feeds = _qdq_model("Conv", False, per_tensor=per_tensor, float_bias=float_bias)
    with npu.InferenceSession(model.SerializeToString(), device=device) as sess:
        got = sess.run(None, feeds)[0]
        assert sess.rewrites.get("fuse_qdq") == 1
        assert set(sess.placement.values()) == {"NPU"}
    diff = np.abs(got - _ort(model, feeds)[0]) / 0.03
    assert diff.max() <= 1.0 + 1e-3 and (diff > 0.5).mean() < 0.02


def test_a_weight_with_a_nonzero_zero_point_is_not_fused_and_runs_as_float_ops(
    device: npu.Device,
) -> None:
    model, feeds = _qdq_model("Conv", relu=False, w_zero=2)
    with npu.InferenceSession(model.SerializeToString(), device=device) as sess:
        got = sess.run(None, feeds)[0]
        assert "fuse_qdq" not in sess.rewrites
        assert "Conv" in [n.op_type for n in sess.graph.nodes]
        assert set(sess.placement.values()) == {"NPU"}
    np.testing.assert_allclose(got, _ort(model, feeds)[0], atol=0.03 + 1e-6)


# -- whole models ------------------------------------------------------------------------


def test_the_int8_digits_cnn_runs_as_one_npu_partition_within_a_point_of_fp32(
    device: npu.Device, caplog: pytest.LogCaptureFixture
) -> None:
    data = np.load(MODELS / "digits_test.npz")
    x, y = data["x"], data["y"]
    path = str(MODELS / "digits_cnn_int8.onnx")
    with caplog.at_level(logging.INFO, logger="npu"):
        (got,), placement, fallbacks = _run(path, {"input": x}, device)
    assert set(placement.values()) == {"NPU"}, fallbacks
    (fp32,) = _run_cpu(str(MODELS / "digits_cnn.onnx"), {"input": x})
    acc8 = float((got.argmax(1) == y).mean())
    acc32 = float((fp32.argmax(1) == y).mean())
    assert acc8 >= acc32 - 0.01, (acc8, acc32)
    np.testing.assert_array_equal(got, _run_cpu(path, {"input": x})[0])
    want = _ort(onnx.load(path), {"input": x})[0]
    assert float((got.argmax(1) == want.argmax(1)).mean()) >= 0.99
    assert float((got != want).mean()) < 0.01


def test_the_int8_small_resnet_runs_as_one_npu_partition_and_matches_onnxruntime(
    device: npu.Device,
) -> None:
    path = str(MODELS / "resnet_small_int8.onnx")
    x = np.random.default_rng(12).standard_normal((16, 3, 32, 32)).astype(np.float32)
    with npu.InferenceSession(path, device=device) as sess:
        got = sess.run(None, {"input": x})[0]
        assert [p.provider for p in sess.partitions] == ["NPU"]
        assert sess.rewrites.get("fuse_qdq") == 16
    want = _ort(onnx.load(path), {"input": x})[0]
    assert float((got.argmax(1) == want.argmax(1)).mean()) >= 0.9
    scale = float(np.abs(want).max())
    assert float(np.abs(got - want).max()) <= 0.1 * scale


def test_uint8_activations_become_int8_and_run_as_one_npu_partition(
    device: npu.Device, tmp_path: Path
) -> None:
    """onnxruntime's default static quantisation (QUInt8 activations, QInt8
    weights) runs on the NPU: the uint8 tensors are shifted to int8 exactly."""
    from onnxruntime.quantization import QuantFormat, QuantType, quantize_static

    data = np.load(MODELS / "digits_test.npz")
    x = data["x"][:64]

    class Reader:
        def __init__(self) -> None:
            self.left = [{"input": x[i : i + 16]} for i in range(0, 64, 16)]

        def get_next(self) -> dict[str, np.ndarray] | None:
            return self.left.pop() if self.left else None

    path = tmp_path / "u8.onnx"
    quantize_static(
        str(MODELS / "digits_cnn.onnx"), str(path), Reader(), quant_format=QuantFormat.QDQ,
        activation_type=QuantType.QUInt8, weight_type=QuantType.QInt8, per_channel=True,
    )  # fmt: skip
    model = onnx.load(str(path))
    assert any(i.data_type == TensorProto.UINT8 for i in model.graph.initializer)
    with npu.InferenceSession(str(path), device=device) as sess:
        got = sess.run(None, {"input": x})[0]
        assert sess.rewrites.get("signed_activations", 0) >= 5
        assert sess.rewrites.get("fuse_qdq") == 5
        assert set(sess.placement.values()) == {"NPU"}, sess.fallbacks
    want = _ort(model, {"input": x})[0]
    assert float((got.argmax(1) == want.argmax(1)).mean()) >= 0.98
    assert float((got != want).mean()) < 0.02
