"""Graph rewrites of the model runner: each keeps the result and changes the graph as promised."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import helper

import npu
from npu.inference.graph import Node
from npu.inference.loader import load_model
from npu.inference.rewrite import rewrite
from onnx_models import bn, bn_params, digits_cnn, make, reference, resnet_like, rnd, vi


def run_cpu(
    model: onnx.ModelProto, feeds: dict[str, np.ndarray]
) -> tuple[list[np.ndarray], npu.InferenceSession]:
    sess = npu.InferenceSession(model, providers=("CPU",))
    return sess.run(None, feeds), sess


def op_types(sess: npu.InferenceSession) -> list[str]:
    return [n.op_type for n in sess.graph.nodes]


def test_batchnorm_folds_into_the_preceding_conv_exactly() -> None:
    rng = np.random.default_rng(0)
    inits = {"w": rnd(rng, 6, 3, 3, 3), "b": rnd(rng, 6), **bn_params(rng, 6, "bn")}
    model = make(
        [
            helper.make_node("Conv", ["x", "w", "b"], ["c"], name="conv", pads=[1, 1, 1, 1]),
            bn("c", "y", "bn"),
        ],
        [vi("x", [2, 3, 8, 8])],
        [vi("y", [2, 6, 8, 8])],
        inits,
    )
    x = rnd(rng, 2, 3, 8, 8)
    (got,), sess = run_cpu(model, {"x": x})
    assert op_types(sess) == ["Conv"]
    assert sess.graph.nodes[0].fused == ["bn"]
    np.testing.assert_allclose(got, reference(model, {"x": x})[0], rtol=1e-5, atol=1e-5)


def test_batchnorm_without_a_conv_becomes_a_channel_scale_and_shift() -> None:
    rng = np.random.default_rng(1)
    model = make([bn("x", "y", "bn")], [vi("x", [2, 4, 5, 5])], [vi("y", [2, 4, 5, 5])],
                 bn_params(rng, 4, "bn"))  # fmt: skip
    x = rnd(rng, 2, 4, 5, 5)
    (got,), sess = run_cpu(model, {"x": x})
    assert op_types(sess) == ["Mul", "Add"]
    np.testing.assert_allclose(got, reference(model, {"x": x})[0], rtol=1e-5, atol=1e-5)


def test_batchnorm_of_a_conv_output_read_twice_is_not_folded_into_it() -> None:
    rng = np.random.default_rng(2)
    inits = {"w": rnd(rng, 4, 4, 1, 1), **bn_params(rng, 4, "bn")}
    model = make(
        [
            helper.make_node("Conv", ["x", "w"], ["c"], name="conv"),
            bn("c", "n", "bn"),
            helper.make_node("Add", ["n", "c"], ["y"], name="add"),
        ],
        [vi("x", [1, 4, 3, 3])],
        [vi("y", [1, 4, 3, 3])],
        inits,
    )
    x = rnd(rng, 1, 4, 3, 3)
    (got,), sess = run_cpu(model, {"x": x})
    assert op_types(sess) == ["Conv", "Mul", "Add", "Add"]
    np.testing.assert_allclose(got, reference(model, {"x": x})[0], rtol=1e-5, atol=1e-5)


def test_identity_and_dropout_are_dropped() -> None:
    model = make(
        [
            helper.make_node("Identity", ["x"], ["a"], name="id"),
            helper.make_node("Dropout", ["a"], ["b"], name="drop"),
            helper.make_node("Relu", ["b"], ["y"], name="relu"),
        ],
        [vi("x", [3])],
        [vi("y", [3])],
    )
    x = np.array([-1, 0, 2], np.float32)
    (got,), sess = run_cpu(model, {"x": x})
    assert op_types(sess) == ["Relu"]
    np.testing.assert_array_equal(got, [0, 0, 2])


def test_conv_relu_and_gemm_relu_fuse_into_the_producer() -> None:
    sess = npu.InferenceSession(digits_cnn(), providers=("CPU",))
    nodes = {n.name: n for n in sess.graph.nodes}
    assert nodes["conv1"].act == "Relu" and nodes["conv1"].fused == ["bn1", "relu1"]
    assert nodes["fc1"].act == "Relu" and nodes["fc1"].fused == ["relu3"]
    assert "relu1" not in nodes and "relu3" not in nodes


def test_matmul_add_fuses_into_a_matmul_with_bias() -> None:
    sess = npu.InferenceSession(digits_cnn(), providers=("CPU",))
    nodes = {n.name: n for n in sess.graph.nodes}
    assert nodes["fc2"].fused == ["fc2_bias"] and len(nodes["fc2"].inputs) == 3
    assert "fc2_bias" not in nodes


def test_erf_gelu_pattern_becomes_one_gelu() -> None:
    c = {k: np.array(v, np.float32) for k, v in {"s2": 2**0.5, "one": 1.0, "half": 0.5}.items()}
    model = make(
        [
            helper.make_node("Div", ["x", "s2"], ["d"], name="div"),
            helper.make_node("Erf", ["d"], ["e"], name="erf"),
            helper.make_node("Add", ["e", "one"], ["a"], name="add"),
            helper.make_node("Mul", ["x", "a"], ["m"], name="mul"),
            helper.make_node("Mul", ["m", "half"], ["y"], name="half"),
        ],
        [vi("x", [4, 8])],
        [vi("y", [4, 8])],
        c,
    )
    x = rnd(np.random.default_rng(3), 4, 8, scale=3.0)
    (got,), sess = run_cpu(model, {"x": x})
    assert op_types(sess) == ["Gelu"]
    np.testing.assert_allclose(got, reference(model, {"x": x})[0], rtol=1e-5, atol=1e-6)


def test_shape_derived_reshape_target_is_folded_to_a_constant() -> None:
    model = make(
        [
            helper.make_node("Shape", ["x"], ["s"], name="shape"),
            helper.make_node("Gather", ["s", "zero"], ["n"], name="gather", axis=0),
            helper.make_node("Unsqueeze", ["n", "ax"], ["n1"], name="unsq"),
            helper.make_node("Concat", ["n1", "minus1"], ["target"], name="concat", axis=0),
            helper.make_node("Reshape", ["x", "target"], ["y"], name="reshape"),
        ],
        [vi("x", [2, 3, 4])],
        [vi("y", [2, 12])],
        {
            "zero": np.array(0, np.int64),
            "ax": np.array([0], np.int64),
            "minus1": np.array([-1], np.int64),
        },
    )
    x = rnd(np.random.default_rng(4), 2, 3, 4)
    (got,), sess = run_cpu(model, {"x": x})
    assert op_types(sess) == ["Reshape"]
    np.testing.assert_array_equal(sess.graph.initializers["target"], [2, -1])
    np.testing.assert_array_equal(got, x.reshape(2, 12))


def test_gemm_alpha_and_beta_fold_into_constant_operands() -> None:
    rng = np.random.default_rng(5)
    model = make(
        [helper.make_node("Gemm", ["a", "b", "c"], ["y"], name="gemm", alpha=0.5, beta=3.0)],
        [vi("a", [4, 5])],
        [vi("y", [4, 6])],
        {"b": rnd(rng, 5, 6), "c": rnd(rng, 6)},
    )
    a = rnd(rng, 4, 5)
    (got,), sess = run_cpu(model, {"a": a})
    attrs = sess.graph.nodes[0].attrs
    assert attrs["alpha"] == 1.0 and attrs["beta"] == 1.0
    np.testing.assert_allclose(got, reference(model, {"a": a})[0], rtol=1e-5, atol=1e-6)


def test_constant_nodes_become_initializers_and_unused_ones_are_pruned() -> None:
    model = make(
        [
            helper.make_node("Constant", [], ["k"], name="k", value_float=2.0),
            helper.make_node("Mul", ["x", "k"], ["y"], name="mul"),
        ],
        [vi("x", [3])],
        [vi("y", [3])],
        {"unused": np.zeros(3, np.float32)},
    )
    graph = load_model(model)
    done = rewrite(graph)
    assert done["constants_to_initializers"] == 1
    assert set(graph.initializers) == {"k"}


# -- fuse_residual: Add(Conv(x), r) into the Conv (CONV2D accumulating) -------


def rewritten(model: onnx.ModelProto, residual: bool) -> tuple[dict[str, int], dict[str, Node]]:
    graph = load_model(model)
    counts = rewrite(graph, residual=residual)
    return counts, {n.name: n for n in graph.nodes}


def test_a_residual_add_and_its_relu_fuse_into_the_later_conv() -> None:
    counts, nodes = rewritten(resnet_like(), residual=True)
    assert counts["fuse_residual"] == 2
    c2 = nodes["b1c2"]  # identity shortcut: the stem's output is the residual
    assert c2.residual and c2.inputs[3] == "s" and c2.act == "Relu"
    assert c2.outputs == ["b1"] and c2.fused == ["b1c2_bn", "b1_add", "b1_relu"]
    # projection shortcut: the projection conv comes later, the other is its residual
    proj = nodes["b2proj"]
    assert proj.residual and proj.inputs[3] == "b2b" and proj.act == "Relu"
    assert not nodes["b2c2"].residual
    assert "b1_add" not in nodes and "b2_add" not in nodes


def test_residuals_are_not_fused_unless_asked() -> None:
    counts, nodes = rewritten(resnet_like(), residual=False)
    assert "fuse_residual" not in counts
    assert "b1_add" in nodes and not any(n.residual for n in nodes.values())


def test_an_add_of_a_conv_output_read_elsewhere_or_broadcast_is_not_fused() -> None:
    rng = np.random.default_rng(30)
    inits = {"w": rnd(rng, 4, 4, 3, 3), "bias": rnd(rng, 1, 4, 1, 1)}
    nodes = [
        helper.make_node("Conv", ["x", "w"], ["c"], name="conv", pads=[1] * 4),
        helper.make_node("Add", ["c", "x"], ["y"], name="add"),
        helper.make_node("Add", ["c", "bias"], ["z"], name="add_bias"),  # a constant
    ]
    model = make(nodes, [vi("x", [1, 4, 6, 6])], [vi("y", [1, 4, 6, 6]), vi("z", [1, 4, 6, 6])],
                 inits)  # fmt: skip
    counts, got = rewritten(model, residual=True)
    assert "fuse_residual" not in counts  # c has two readers
    assert not got["conv"].residual


def test_fused_residual_results_match_the_reference_on_the_cpu_kernels() -> None:
    model = resnet_like()
    x = rnd(np.random.default_rng(31), 2, 3, 32, 32)
    graph = load_model(model)
    rewrite(graph, residual=True)
    from npu.inference.cpu import cpu_kernel

    env: dict[str, np.ndarray] = {"x": x, **graph.initializers}
    for node in graph.nodes:
        outs = cpu_kernel(node, graph)(node, [env[i] if i else None for i in node.inputs], 17)
        env.update(zip(node.outputs, outs, strict=False))
    np.testing.assert_allclose(env["logits"], reference(model, {"x": x})[0], rtol=1e-4, atol=1e-5)


# -- ReLU6: Clip to [0, 6] after a Conv, fused when the NPU has Cap.ACT_RELU6 --


def conv_clip(lo: float, hi: float) -> onnx.ModelProto:
    rng = np.random.default_rng(32)
    inits = {"w": rnd(rng, 4, 3, 3, 3, scale=2.0), "lo": np.float32(lo), "hi": np.float32(hi)}
    nodes = [
        helper.make_node("Conv", ["x", "w"], ["c"], name="conv", pads=[1] * 4),
        helper.make_node("Clip", ["c", "lo", "hi"], ["y"], name="clip"),
    ]
    inits = {k: np.asarray(v) for k, v in inits.items()}
    return make(nodes, [vi("x", [1, 3, 6, 6])], [vi("y", [1, 4, 6, 6])], inits)


def test_a_clip_to_0_6_after_a_conv_fuses_as_relu6_when_asked() -> None:
    graph = load_model(conv_clip(0.0, 6.0))
    assert rewrite(graph, relu6=True)["fuse_activation"] == 1
    (conv,) = graph.nodes
    assert conv.act == "Relu6" and conv.fused == ["clip"] and conv.outputs == ["y"]


def test_other_clips_and_unasked_relu6_stay_clips() -> None:
    for model, relu6 in ((conv_clip(0.0, 6.0), False), (conv_clip(-1.0, 6.0), True)):
        graph = load_model(model)
        rewrite(graph, relu6=relu6)
        assert [n.op_type for n in graph.nodes] == ["Conv", "Clip"]


def test_a_fused_relu6_conv_matches_the_reference_on_the_cpu_kernels() -> None:
    model = conv_clip(0.0, 6.0)
    x = rnd(np.random.default_rng(33), 1, 3, 6, 6, scale=3.0)
    graph = load_model(model)
    rewrite(graph, relu6=True)
    from npu.inference.cpu import cpu_kernel

    (conv,) = graph.nodes
    (got,) = cpu_kernel(conv, graph)(conv, [x, graph.initializers["w"], None], 17)
    want = reference(model, {"x": x})[0]
    assert (want == 6).any() and (want == 0).any()  # both bounds matter
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
