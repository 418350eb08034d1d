"""Small ONNX models built with onnx.helper for the model-runner tests.

A plain module (no tests): the host tests import it directly and the guest
tests (tests/guest/test_inference.py) add tests/host to sys.path for it.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

OPSET = 17
F = TensorProto.FLOAT


def make(
    nodes: list[onnx.NodeProto],
    inputs: list[onnx.ValueInfoProto],
    outputs: list[onnx.ValueInfoProto],
    inits: dict[str, np.ndarray] | None = None,
    opset: int = OPSET,
    name: str = "test",
) -> onnx.ModelProto:
    """A model of ``nodes`` with the given inputs, outputs and initializers."""
    init = [numpy_helper.from_array(np.asarray(v), k) for k, v in (inits or {}).items()]
    graph = helper.make_graph(nodes, name, inputs, outputs, init)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 8
    return model


def vi(name: str, shape: list[Any] | None, elem: int = F) -> onnx.ValueInfoProto:
    """A tensor value info."""
    return helper.make_tensor_value_info(name, elem, shape)


def rnd(rng: np.random.Generator, *shape: int, scale: float = 1.0) -> np.ndarray:
    """float32 uniform in [-scale, scale)."""
    return (rng.uniform(-1.0, 1.0, shape) * scale).astype(np.float32)


def bn_params(rng: np.random.Generator, c: int, prefix: str) -> dict[str, np.ndarray]:
    """Scale, bias, mean and var of a BatchNormalization over ``c`` channels."""
    return {
        f"{prefix}_s": rng.uniform(0.5, 1.5, c).astype(np.float32),
        f"{prefix}_b": rnd(rng, c, scale=0.2),
        f"{prefix}_m": rnd(rng, c, scale=0.2),
        f"{prefix}_v": rng.uniform(0.5, 1.5, c).astype(np.float32),
    }


def bn(x: str, y: str, prefix: str) -> onnx.NodeProto:
    """A BatchNormalization node reading the ``bn_params`` of ``prefix``."""
    return helper.make_node(
        "BatchNormalization",
        [x, f"{prefix}_s", f"{prefix}_b", f"{prefix}_m", f"{prefix}_v"],
        [y],
        name=prefix,
        epsilon=1e-5,
    )


def digits_cnn(batch: Any = "N", seed: int = 0, middle: str | None = None) -> onnx.ModelProto:
    """A LeNet-like digits CNN on [batch, 1, 28, 28] -> [batch, 10] probabilities.

    ``middle`` inserts an op the NPU lacks (e.g. ``"Softplus"``, ``"Sin"``,
    ``"Floor"``) after the first pooling.
    """
    rng = np.random.default_rng(seed)
    inits: dict[str, np.ndarray] = {
        "w1": rnd(rng, 8, 1, 3, 3, scale=0.5),
        "b1": rnd(rng, 8, scale=0.1),
        "w2": rnd(rng, 16, 8, 3, 3, scale=0.2),
        "w3": rnd(rng, 64, 16 * 7 * 7, scale=0.05),
        "b3": rnd(rng, 64, scale=0.1),
        "w4": rnd(rng, 64, 10, scale=0.2),
        "b4": rnd(rng, 10, scale=0.1),
    }
    inits.update(bn_params(rng, 8, "bn1"))
    inits.update(bn_params(rng, 16, "bn2"))
    p1 = "p1"
    nodes = [
        helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], name="conv1", pads=[1, 1, 1, 1]),
        bn("c1", "n1", "bn1"),
        helper.make_node("Relu", ["n1"], ["r1"], name="relu1"),
        helper.make_node(
            "MaxPool", ["r1"], ["p1"], name="pool1", kernel_shape=[2, 2], strides=[2, 2]
        ),
    ]
    if middle is not None:
        nodes.append(helper.make_node(middle, ["p1"], ["mid"], name="middle"))
        p1 = "mid"
    nodes += [
        helper.make_node("Conv", [p1, "w2"], ["c2"], name="conv2", pads=[1, 1, 1, 1]),
        bn("c2", "n2", "bn2"),
        helper.make_node("Relu", ["n2"], ["r2"], name="relu2"),
        helper.make_node(
            "MaxPool", ["r2"], ["p2"], name="pool2", kernel_shape=[2, 2], strides=[2, 2]
        ),
        helper.make_node("Flatten", ["p2"], ["f"], name="flatten", axis=1),
        helper.make_node("Gemm", ["f", "w3", "b3"], ["g1"], name="fc1", transB=1),
        helper.make_node("Relu", ["g1"], ["h"], name="relu3"),
        helper.make_node("MatMul", ["h", "w4"], ["mm"], name="fc2"),
        helper.make_node("Add", ["mm", "b4"], ["logits"], name="fc2_bias"),
        helper.make_node("Softmax", ["logits"], ["probs"], name="softmax", axis=-1),
    ]
    return make(nodes, [vi("x", [batch, 1, 28, 28])], [vi("probs", [batch, 10])], inits)


def resnet_like(
    batch: Any = "N", seed: int = 0, width: int = 16, size: int = 32
) -> onnx.ModelProto:
    """A small ResNet: stem conv-bn-relu, two basic blocks (one strided), GAP, FC."""
    rng = np.random.default_rng(seed)
    inits: dict[str, np.ndarray] = {}
    nodes: list[onnx.NodeProto] = []

    def conv_bn(x: str, y: str, cin: int, cout: int, name: str, stride: int = 1, k: int = 3,
                relu: bool = True) -> None:  # fmt: skip
        inits[f"{name}_w"] = rnd(rng, cout, cin, k, k, scale=(2.0 / (cin * k * k)) ** 0.5)
        pad = k // 2
        nodes.append(helper.make_node("Conv", [x, f"{name}_w"], [f"{name}_c"], name=name,
                                      pads=[pad] * 4, strides=[stride, stride]))  # fmt: skip
        inits.update(bn_params(rng, cout, f"{name}_bn"))
        nodes.append(bn(f"{name}_c", y if not relu else f"{name}_n", f"{name}_bn"))
        if relu:
            nodes.append(helper.make_node("Relu", [f"{name}_n"], [y], name=f"{name}_relu"))

    conv_bn("x", "s", 3, width, "stem")
    # block 1 (identity shortcut)
    conv_bn("s", "b1a", width, width, "b1c1")
    conv_bn("b1a", "b1b", width, width, "b1c2", relu=False)
    nodes.append(helper.make_node("Add", ["b1b", "s"], ["b1s"], name="b1_add"))
    nodes.append(helper.make_node("Relu", ["b1s"], ["b1"], name="b1_relu"))
    # block 2 (strided, 1x1 projection shortcut)
    conv_bn("b1", "b2a", width, 2 * width, "b2c1", stride=2)
    conv_bn("b2a", "b2b", 2 * width, 2 * width, "b2c2", relu=False)
    conv_bn("b1", "b2p", width, 2 * width, "b2proj", stride=2, k=1, relu=False)
    nodes.append(helper.make_node("Add", ["b2b", "b2p"], ["b2s"], name="b2_add"))
    nodes.append(helper.make_node("Relu", ["b2s"], ["b2"], name="b2_relu"))
    nodes.append(helper.make_node("GlobalAveragePool", ["b2"], ["gap"], name="gap"))
    nodes.append(helper.make_node("Flatten", ["gap"], ["feat"], name="flatten"))
    inits["fc_w"] = rnd(rng, 10, 2 * width, scale=0.3)
    inits["fc_b"] = rnd(rng, 10, scale=0.1)
    nodes.append(helper.make_node("Gemm", ["feat", "fc_w", "fc_b"], ["logits"], name="fc",
                                  transB=1))  # fmt: skip
    return make(nodes, [vi("x", [batch, 3, size, size])], [vi("logits", [batch, 10])], inits)


def inception_like(
    batch: Any = "N", seed: int = 0, width: int = 8, size: int = 16
) -> onnx.ModelProto:
    """A small Inception block: a stem conv, then four branches of the stem's
    output (1x1; 1x1 then 3x3; 1x1 then two 3x3; 3x3 max pool then 1x1),
    concatenated along channels, then GAP and an FC layer."""
    rng = np.random.default_rng(seed)
    inits: dict[str, np.ndarray] = {}
    nodes: list[onnx.NodeProto] = []

    def conv(x: str, y: str, cin: int, cout: int, k: int) -> None:
        inits[f"{y}_w"] = rnd(rng, cout, cin, k, k, scale=(2.0 / (cin * k * k)) ** 0.5)
        inits[f"{y}_b"] = rnd(rng, cout, scale=0.1)
        nodes.append(helper.make_node("Conv", [x, f"{y}_w", f"{y}_b"], [f"{y}_c"], name=y,
                                      pads=[k // 2] * 4))  # fmt: skip
        nodes.append(helper.make_node("Relu", [f"{y}_c"], [y], name=f"{y}_relu"))

    conv("x", "stem", 3, width, 3)
    conv("stem", "b1", width, width, 1)
    conv("stem", "b2a", width, width, 1)
    conv("b2a", "b2", width, width, 3)
    conv("stem", "b3a", width, width, 1)
    conv("b3a", "b3b", width, width, 3)
    conv("b3b", "b3", width, width, 3)
    nodes.append(helper.make_node("MaxPool", ["stem"], ["b4a"], name="b4_pool",
                                  kernel_shape=[3, 3], pads=[1, 1, 1, 1]))  # fmt: skip
    conv("b4a", "b4", width, width, 1)
    nodes.append(helper.make_node("Concat", ["b1", "b2", "b3", "b4"], ["cat"], name="cat", axis=1))
    nodes.append(helper.make_node("GlobalAveragePool", ["cat"], ["gap"], name="gap"))
    nodes.append(helper.make_node("Flatten", ["gap"], ["feat"], name="flatten"))
    inits["fc_w"] = rnd(rng, 10, 4 * width, scale=0.3)
    nodes.append(helper.make_node("Gemm", ["feat", "fc_w"], ["logits"], name="fc", transB=1))
    return make(nodes, [vi("x", [batch, 3, size, size])], [vi("logits", [batch, 10])], inits)


def reference(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    """The outputs of onnx.reference.ReferenceEvaluator."""
    from onnx.reference import ReferenceEvaluator

    return [np.asarray(o) for o in ReferenceEvaluator(model).run(None, feeds)]


def single(
    op: str,
    shapes: list[list[int]],
    out_shape: list[Any] | None = None,
    inits: dict[str, np.ndarray] | None = None,
    opset: int = OPSET,
    seed: int = 0,
    positive: bool = False,
    elem: int = F,
    out_elem: int = F,
    **attrs: Any,
) -> tuple[onnx.ModelProto, dict[str, np.ndarray]]:
    """A one-node model of ``op`` on random inputs ``x0, x1, ...`` (then ``inits``)."""
    rng = np.random.default_rng(seed)
    names = [f"x{i}" for i in range(len(shapes))]
    feeds = {}
    for n, s in zip(names, shapes, strict=True):
        v = rng.uniform(0.1 if positive else -2.0, 2.0, s).astype(
            helper.tensor_dtype_to_np_dtype(elem)
        )
        feeds[n] = v
    node = helper.make_node(op, names + list((inits or {}).keys()), ["y"], name=op.lower(), **attrs)
    ins = [vi(n, list(s), elem) for n, s in zip(names, shapes, strict=True)]
    model = make([node], ins, [vi("y", out_shape, out_elem)], inits, opset)
    if out_shape is None:  # the checker wants output shapes: take the reference's
        y = reference(model, feeds)[0]
        model = make([node], ins, [vi("y", list(y.shape), out_elem)], inits, opset)
    return model, feeds


def op_cases() -> dict[str, tuple[onnx.ModelProto, dict[str, np.ndarray]]]:
    """One small model per op (and per interesting attribute) the runner covers."""
    rng = np.random.default_rng(42)
    w = rnd(rng, 6, 4, 3, 3)
    wg = rnd(rng, 6, 2, 3, 3)
    cases: dict[str, tuple[onnx.ModelProto, dict[str, np.ndarray]]] = {}
    for op in ("Add", "Sub", "Mul", "Div", "Max", "Min"):
        cases[op] = single(op, [[2, 3, 4, 5], [3, 1, 5]], positive=op == "Div")
    cases["Add_scalar_const"] = single("Add", [[4, 5]], inits={"c": np.array(1.5, np.float32)})
    for op in ("Relu", "Sigmoid", "Tanh", "Exp", "Abs", "Neg"):
        cases[op] = single(op, [[2, 3, 8]])
    cases["Log"] = single("Log", [[2, 3, 8]], positive=True)
    cases["Sqrt"] = single("Sqrt", [[2, 3, 8]], positive=True)
    cases["Gelu"] = single("Gelu", [[4, 16]], opset=20)
    cases["Conv"] = single("Conv", [[2, 4, 9, 9]], inits={"w": w}, pads=[1, 1, 1, 1])
    cases["Conv_stride_dil_bias"] = single(
        "Conv", [[2, 4, 11, 11]], inits={"w": w, "b": rnd(rng, 6)}, strides=[2, 2],
        dilations=[2, 2], pads=[2, 2, 2, 2],
    )  # fmt: skip
    cases["Conv_groups"] = single("Conv", [[1, 4, 8, 8]], inits={"w": wg}, group=2)
    cases["Conv_depthwise"] = single(
        "Conv", [[2, 4, 7, 7]], inits={"w": rnd(rng, 4, 1, 3, 3)}, group=4, auto_pad="SAME_UPPER"
    )
    cases["Conv_asym_pads"] = single("Conv", [[1, 4, 6, 6]], inits={"w": w}, pads=[0, 1, 1, 0])
    cases["MaxPool"] = single("MaxPool", [[2, 3, 8, 8]], kernel_shape=[2, 2], strides=[2, 2])
    cases["MaxPool_pad"] = single(
        "MaxPool", [[2, 3, 9, 9]], kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1]
    )
    cases["AveragePool"] = single("AveragePool", [[2, 3, 8, 8]], kernel_shape=[3, 3])
    cases["AveragePool_pad_excl"] = single(
        "AveragePool", [[2, 3, 7, 7]], kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1]
    )
    cases["AveragePool_pad_incl"] = single(
        "AveragePool", [[2, 3, 7, 7]], kernel_shape=[3, 3], pads=[1, 1, 1, 1], count_include_pad=1
    )
    cases["AveragePool_1d_cpu"] = single(
        "AveragePool", [[2, 3, 9]], kernel_shape=[3], strides=[2], pads=[1, 1]
    )
    cases["GlobalAveragePool"] = single("GlobalAveragePool", [[2, 5, 6, 7]])
    cases["GlobalMaxPool"] = single("GlobalMaxPool", [[2, 5, 6, 7]])
    cases["Gemm"] = single("Gemm", [[5, 7]], inits={"b": rnd(rng, 7, 3), "c": rnd(rng, 3)})
    cases["Gemm_transAB"] = single(
        "Gemm", [[7, 5]], inits={"b": rnd(rng, 3, 7), "c": rnd(rng, 1, 3)}, transA=1, transB=1
    )
    cases["Gemm_alpha_beta"] = single(
        "Gemm", [[5, 7]], inits={"b": rnd(rng, 7, 3), "c": rnd(rng, 5, 3)}, alpha=0.5, beta=2.0
    )
    cases["Gemm_C_full"] = single(
        "Gemm", [[5, 7]], inits={"b": rnd(rng, 7, 3), "c": rnd(rng, 5, 3)}
    )
    cases["MatMul"] = single("MatMul", [[2, 3, 4, 5], [5, 6]])
    cases["MatMul_batched"] = single("MatMul", [[2, 3, 4, 5], [2, 1, 5, 6]])
    cases["MatMul_vec"] = single("MatMul", [[5], [2, 5, 3]])
    cases["Softmax"] = single("Softmax", [[3, 4, 5]], axis=1)
    cases["LogSoftmax"] = single("LogSoftmax", [[3, 4, 5]])
    cases["Softmax_opset11"] = single("Softmax", [[3, 4, 5]], opset=11, axis=1)
    cases["LayerNormalization"] = single(
        "LayerNormalization", [[2, 3, 8]], inits={"s": rnd(rng, 8), "b": rnd(rng, 8)}
    )
    cases["LayerNormalization_2axes_nobias"] = single(
        "LayerNormalization", [[2, 3, 8]], inits={"s": rnd(rng, 3, 8)}, axis=1, epsilon=1e-3
    )
    for op in ("ReduceSum", "ReduceMean", "ReduceMax", "ReduceMin"):
        if op == "ReduceSum":
            cases[op] = single(op, [[2, 3, 4]], inits={"axes": np.array([1], np.int64)})
        else:
            cases[op] = single(op, [[2, 3, 4]], axes=[0, 2], keepdims=0)
    cases["ReduceMean_all"] = single("ReduceMean", [[2, 3, 4]])
    cases["Transpose"] = single("Transpose", [[2, 3, 4, 5]], perm=[0, 2, 3, 1])
    cases["Cast_int32"] = single("Cast", [[3, 4]], to=TensorProto.INT32, out_elem=TensorProto.INT32)
    cases["Cast_f16"] = single(
        "Cast", [[3, 4]], to=TensorProto.FLOAT16, out_elem=TensorProto.FLOAT16
    )
    cases["Flatten"] = single("Flatten", [[2, 3, 4, 5]], axis=2)
    cases["Reshape"] = single("Reshape", [[2, 3, 4]], inits={"s": np.array([0, -1], np.int64)})
    cases["Squeeze"] = single("Squeeze", [[2, 1, 4]], inits={"a": np.array([1], np.int64)})
    cases["Unsqueeze"] = single("Unsqueeze", [[2, 4]], inits={"a": np.array([0, 3], np.int64)})
    cases["Identity"] = single("Identity", [[2, 4]])
    cases["BatchNormalization"] = single(
        "BatchNormalization", [[2, 3, 4, 4]], inits=dict(
            zip(["s", "b", "m", "v"], bn_params(rng, 3, "p").values(), strict=True)),
    )  # fmt: skip
    cases["LeakyRelu"] = single("LeakyRelu", [[3, 4]], alpha=0.1)
    cases["Softplus_reference"] = single("Softplus", [[3, 4]])
    return cases
