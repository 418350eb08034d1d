"""Graph-structure ops on the NPU (issue 17, item 2): variadic Sum/Max/Min, LRN,
Concat, rank-5 views with a Transpose that merges adjacent axes (ShuffleNet's
channel shuffle), and Dropout with an unread mask. Each runs entirely on the
NPU (CPU backend) and matches onnx.reference exactly."""

from __future__ import annotations

import math

import numpy as np
import onnx
import pytest
from onnx import helper
from onnx.reference import ReferenceEvaluator

import npu
from onnx_models import make, rnd, vi

RNG = np.random.default_rng(17)


def _run_on_npu(model: onnx.ModelProto, feeds: dict[str, np.ndarray], device: npu.Device) -> None:
    want = ReferenceEvaluator(model).run(None, feeds)
    with npu.InferenceSession(model, device=device) as sess:
        got = sess.run(None, feeds)
        assert set(sess.placement.values()) == {"NPU"}, sess.fallbacks
    for g, w in zip(got, want, strict=True):
        assert g.shape == w.shape and g.dtype == w.dtype
        np.testing.assert_allclose(g, w, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("op", ["Sum", "Max", "Min"])
@pytest.mark.parametrize("n", [1, 3, 4])
def test_a_variadic_op_runs_as_a_chain_on_the_npu(device: npu.Device, op: str, n: int) -> None:
    names = [f"x{i}" for i in range(n)]
    shapes = [[2, 3, 4], [3, 4], [2, 1, 4], [1]][:n]
    model = make(
        [helper.make_node(op, names, ["y"])],
        [vi(nm, s) for nm, s in zip(names, shapes, strict=True)],
        [vi("y", [2, 3, 4])],
    )
    feeds = {nm: rnd(RNG, *s) for nm, s in zip(names, shapes, strict=True)}
    _run_on_npu(model, feeds, device)


@pytest.mark.parametrize(("axis", "batch"), [(1, 1), (1, 3), (0, 2), (-1, 2), (2, 2)])
def test_concat_copies_each_input_into_its_slice(device: npu.Device, axis: int, batch: int) -> None:
    shapes = [[batch, 2, 3, 4], [batch, 5, 3, 4], [batch, 1, 3, 4]]
    if axis != 1:
        shapes = [[batch, 2, 3, 4]] * 3
    ax = axis % 4
    out = list(shapes[0])
    out[ax] = sum(s[ax] for s in shapes)
    model = make(
        [
            helper.make_node("Relu", ["a"], ["ra"]),
            helper.make_node("Concat", ["ra", "b", "c"], ["y"], axis=axis),
        ],
        [vi("a", shapes[0]), vi("b", shapes[1]), vi("c", shapes[2])],
        [vi("y", out)],
    )
    feeds = {k: rnd(RNG, *s) for k, s in zip("abc", shapes, strict=True)}
    _run_on_npu(model, feeds, device)


def test_a_concat_of_too_many_blocks_runs_on_the_cpu_and_says_so(device: npu.Device) -> None:
    # 300 blocks before the axis x 2 inputs: more copies than the NPU planner takes.
    model = make(
        [helper.make_node("Concat", ["a", "b"], ["y"], axis=1)],
        [vi("a", [300, 1]), vi("b", [300, 1])],
        [vi("y", [300, 2])],
    )
    feeds = {"a": rnd(RNG, 300, 1), "b": rnd(RNG, 300, 1)}
    with npu.InferenceSession(model, device=device) as sess:
        (got,) = sess.run(None, feeds)
        assert sess.placement == {"Concat_0": "CPU"}
        assert "copies" in sess.fallbacks[0][2]
    np.testing.assert_array_equal(got, np.concatenate([feeds["a"], feeds["b"]], axis=1))


def test_a_channel_shuffle_through_rank_5_runs_on_the_npu(device: npu.Device) -> None:
    g, c = 3, 12
    shape5 = np.array([1, g, c // g, 5, 5], np.int64)
    shape4 = np.array([1, c, 5, 5], np.int64)
    model = make(
        [
            helper.make_node("Reshape", ["x", "s5"], ["r"]),
            helper.make_node("Transpose", ["r"], ["t"], perm=[0, 2, 1, 3, 4]),
            helper.make_node("Reshape", ["t", "s4"], ["y"]),
        ],
        [vi("x", [1, c, 5, 5])],
        [vi("y", [1, c, 5, 5])],
        inits={"s5": shape5, "s4": shape4},
    )
    _run_on_npu(model, {"x": rnd(RNG, 1, c, 5, 5)}, device)


def test_a_dropout_whose_mask_nobody_reads_is_dropped(device: npu.Device) -> None:
    model = make(
        [
            helper.make_node("Dropout", ["x"], ["d", "mask"], ratio=0.5),
            helper.make_node("Relu", ["d"], ["y"]),
        ],
        [vi("x", [2, 8])],
        [vi("y", [2, 8])],
        opset=9,
    )
    x = rnd(RNG, 2, 8)
    with npu.InferenceSession(model, device=device) as sess:
        (got,) = sess.run(None, {"x": x})
        assert sess.rewrites.get("drop_identities") == 1
        assert sess.placement == {"Relu_1": "NPU"}
    np.testing.assert_array_equal(got, np.maximum(x, 0))


def _lrn_spec(x: np.ndarray, size: int, alpha: float, beta: float, bias: float) -> np.ndarray:
    """The ONNX spec's LRN, channel by channel (onnx.reference 1.17 loops over the batch)."""
    y = np.empty_like(x)
    lo, hi = (size - 1) // 2, -(-(size - 1) // 2)
    for c in range(x.shape[1]):
        window = x[:, max(0, c - lo) : min(x.shape[1], c + hi + 1)].astype(np.float64)
        y[:, c] = x[:, c] / (bias + alpha / size * (window**2).sum(axis=1)) ** beta
    return y


def test_the_cpu_lrn_follows_the_spec_not_onnx_reference() -> None:
    model = make(
        [helper.make_node("LRN", ["x"], ["y"], size=3, alpha=0.5, beta=0.6, bias=2.0)],
        [vi("x", [1, 6, 2, 2])],
        [vi("y", [1, 6, 2, 2])],
    )
    x = rnd(RNG, 1, 6, 2, 2, scale=3.0)
    (got,) = npu.InferenceSession(model, providers=("CPU",)).run(None, {"x": x})
    np.testing.assert_allclose(got, _lrn_spec(x, 3, 0.5, 0.6, 2.0), rtol=1e-6)


@pytest.mark.parametrize(
    ("size", "alpha", "beta", "bias"), [(5, 1e-4, 0.75, 1.0), (3, 0.5, 0.6, 2.0)]
)
def test_lrn_runs_on_the_npu_within_float32_rounding(
    device: npu.Device, size: int, alpha: float, beta: float, bias: float
) -> None:
    model = make(
        [helper.make_node("LRN", ["x"], ["y"], size=size, alpha=alpha, beta=beta, bias=bias)],
        [vi("x", [2, 7, 4, 5])],
        [vi("y", [2, 7, 4, 5])],
    )
    x = rnd(RNG, 2, 7, 4, 5, scale=3.0)
    want = _lrn_spec(x, size, alpha, beta, bias)
    with npu.InferenceSession(model, device=device) as sess:
        (got,) = sess.run(None, {"x": x})
        assert sess.placement == {"LRN_0": "NPU"}
    # exp(-beta * log(d)) in float32: a few ulp of the power.
    np.testing.assert_allclose(got, want, rtol=2e-6, atol=1e-7)


def test_lrn_of_an_even_size_runs_on_the_cpu(device: npu.Device) -> None:
    model = make(
        [helper.make_node("LRN", ["x"], ["y"], size=4)],
        [vi("x", [1, 6, 3, 3])],
        [vi("y", [1, 6, 3, 3])],
    )
    with npu.InferenceSession(model, device=device) as sess:
        assert sess.placement == {"LRN_0": "CPU"}
        assert "odd" in sess.fallbacks[0][2]


def _single(
    op: str, shape: list[int], out: list[int], opset: int = 17, **attrs: object
) -> onnx.ModelProto:
    return make(
        [helper.make_node(op, ["x"], ["y"], **attrs)], [vi("x", shape)], [vi("y", out)], opset=opset
    )


@pytest.mark.parametrize(
    ("op", "attrs"),
    [
        ("LeakyRelu", {"alpha": 0.01}),
        ("LeakyRelu", {"alpha": 1.5}),
        ("HardSigmoid", {"alpha": 0.3, "beta": 0.4}),
        ("HardSwish", {}),
    ],
)
def test_a_composed_activation_runs_on_the_npu(device: npu.Device, op: str, attrs: dict) -> None:
    model = _single(op, [2, 3, 8], [2, 3, 8], **attrs)
    _run_on_npu(model, {"x": rnd(RNG, 2, 3, 8, scale=5.0)}, device)


def test_prelu_with_a_per_channel_slope_runs_on_the_npu(device: npu.Device) -> None:
    model = make(
        [helper.make_node("PRelu", ["x", "s"], ["y"])],
        [vi("x", [2, 3, 4, 4])],
        [vi("y", [2, 3, 4, 4])],
        inits={"s": rnd(RNG, 3, 1, 1)},
    )
    _run_on_npu(model, {"x": rnd(RNG, 2, 3, 4, 4)}, device)


@pytest.mark.parametrize("opset", [10, 13])
def test_clip_runs_on_the_npu_with_attribute_or_input_bounds(
    device: npu.Device, opset: int
) -> None:
    if opset < 11:
        model = _single("Clip", [4, 5], [4, 5], opset=opset, min=-0.5, max=0.25)
    else:
        model = make(
            [helper.make_node("Clip", ["x", "lo", "hi"], ["y"])],
            [vi("x", [4, 5])],
            [vi("y", [4, 5])],
            inits={"lo": np.array(-0.5, np.float32), "hi": np.array(0.25, np.float32)},
            opset=opset,
        )
    _run_on_npu(model, {"x": rnd(RNG, 4, 5)}, device)


def test_clip_with_only_a_lower_bound_is_a_max(device: npu.Device) -> None:
    model = make(
        [helper.make_node("Clip", ["x", "lo"], ["y"])],
        [vi("x", [6])],
        [vi("y", [6])],
        inits={"lo": np.array(0.0, np.float32)},
    )
    _run_on_npu(model, {"x": rnd(RNG, 6)}, device)


@pytest.mark.parametrize(
    ("starts", "ends", "axes", "steps"),
    [
        ([1], [3], [1], [1]),
        ([0, 1], [2, 100], [0, 2], [1, 2]),
        ([-3], [-1], [-1], [1]),
        ([0, 0, 1, 1], [1, 3, 4, 5], [0, 1, 2, 3], [1, 2, 2, 3]),
    ],
)
def test_slice_is_a_strided_copy_on_the_npu(
    device: npu.Device, starts: list, ends: list, axes: list, steps: list
) -> None:
    x = rnd(RNG, 2, 3, 4, 5)
    inits = {
        k: np.array(v, np.int64)
        for k, v in zip(("s", "e", "a", "t"), (starts, ends, axes, steps), strict=True)
    }
    node = helper.make_node("Slice", ["x", "s", "e", "a", "t"], ["y"])
    want_shape = list(
        ReferenceEvaluator(make([node], [vi("x", [2, 3, 4, 5])], [vi("y", None)], inits=inits))
        .run(None, {"x": x})[0]
        .shape
    )
    model = make([node], [vi("x", [2, 3, 4, 5])], [vi("y", want_shape)], inits=inits)
    _run_on_npu(model, {"x": x}, device)


def test_a_slice_with_a_negative_step_stays_on_the_cpu(device: npu.Device) -> None:
    inits = {
        "s": np.array([3], np.int64),
        "e": np.array([0], np.int64),
        "a": np.array([0], np.int64),
        "t": np.array([-1], np.int64),
    }
    model = make(
        [helper.make_node("Slice", ["x", "s", "e", "a", "t"], ["y"])],
        [vi("x", [5])],
        [vi("y", [3])],
        inits=inits,
    )
    with npu.InferenceSession(model, device=device) as sess:
        assert sess.placement == {"Slice_0": "CPU"}


@pytest.mark.parametrize("opset", [11, 13, 18])
def test_split_copies_each_part_on_the_npu(device: npu.Device, opset: int) -> None:
    if opset == 11:
        node = helper.make_node("Split", ["x"], ["a", "b", "c"], axis=1, split=[1, 3, 2])
        inits = {}
    elif opset == 13:
        node = helper.make_node("Split", ["x", "sp"], ["a", "b", "c"], axis=1)
        inits = {"sp": np.array([1, 3, 2], np.int64)}
    else:
        node = helper.make_node("Split", ["x"], ["a", "b", "c"], axis=1, num_outputs=3)
        inits = {}
    sizes = [2, 2, 2] if opset == 18 else [1, 3, 2]
    model = make(
        [node],
        [vi("x", [2, 6, 3])],
        [vi(n, [2, s, 3]) for n, s in zip("abc", sizes, strict=True)],
        inits=inits,
        opset=opset,
    )
    _run_on_npu(model, {"x": rnd(RNG, 2, 6, 3)}, device)


@pytest.mark.parametrize("op", ["ReduceL2", "ReduceLogSumExp"])
@pytest.mark.parametrize("keepdims", [0, 1])
def test_a_composed_reduction_runs_on_the_npu(device: npu.Device, op: str, keepdims: int) -> None:
    model = make(
        [helper.make_node(op, ["x", "axes"], ["y"], keepdims=keepdims)],
        [vi("x", [2, 3, 4])],
        [vi("y", [2, 1, 4] if keepdims else [2, 4])],
        inits={"axes": np.array([1], np.int64)},
        opset=18,
    )
    _run_on_npu(model, {"x": rnd(RNG, 2, 3, 4, scale=4.0)}, device)


def test_mean_of_three_inputs_runs_on_the_npu(device: npu.Device) -> None:
    model = make(
        [helper.make_node("Mean", ["a", "b", "c"], ["y"])],
        [vi("a", [2, 3]), vi("b", [3]), vi("c", [2, 3])],
        [vi("y", [2, 3])],
    )
    _run_on_npu(
        model, {k: rnd(RNG, *s) for k, s in (("a", (2, 3)), ("b", (3,)), ("c", (2, 3)))}, device
    )


@pytest.mark.parametrize(
    ("axis", "indices"),
    [
        (0, np.array(2)),
        (0, np.array([3, 0, 3])),
        (1, np.array([[1, 0], [2, -1]])),
        (-1, np.array([4, 1])),
    ],
)
def test_gather_of_constant_indices_copies_rows_on_the_npu(
    device: npu.Device, axis: int, indices: np.ndarray
) -> None:
    x = rnd(RNG, 4, 3, 5)
    node = helper.make_node("Gather", ["x", "i"], ["y"], axis=axis)
    inits = {"i": indices.astype(np.int64)}
    ax = axis % 3
    shape = [4, 3, 5][:ax] + list(indices.shape) + [4, 3, 5][ax + 1 :]
    model = make([node], [vi("x", [4, 3, 5])], [vi("y", shape)], inits=inits)
    _run_on_npu(model, {"x": x}, device)


@pytest.mark.parametrize("op", ["Erf", "Reciprocal"])
def test_erf_and_reciprocal_run_as_unary_ops_on_the_npu(device: npu.Device, op: str) -> None:
    model = make([helper.make_node(op, ["x"], ["y"])], [vi("x", [3, 17])], [vi("y", [3, 17])])
    x = rnd(RNG, 3, 17, scale=3.0)
    x[0, :4] = [0.0, -0.0, np.inf, -np.inf]
    _run_on_npu(model, {"x": x}, device)


def test_tensor_erf_and_reciprocal_match_the_math(default_device: npu.Device) -> None:
    x = np.array([-3.0, -0.5, 0.0, 0.25, 2.0, np.inf, -np.inf], np.float32)
    want_erf = np.array([math.erf(v) for v in x.astype(np.float64)])
    np.testing.assert_allclose(npu.erf(x).numpy(), want_erf, rtol=1e-6, atol=1e-7)
    with np.errstate(divide="ignore"):
        np.testing.assert_array_equal(npu.reciprocal(x).numpy(), np.float32(1) / x)
    assert npu.reciprocal(np.array([2, 4], np.int32)).dtype == np.float32


@pytest.mark.parametrize("op", ["Equal", "Less", "LessOrEqual", "Greater", "GreaterOrEqual"])
def test_a_comparison_runs_on_the_npu_and_gives_bool(device: npu.Device, op: str) -> None:
    model = make(
        [
            helper.make_node(op, ["a", "b"], ["c"]),
            helper.make_node("Cast", ["c"], ["y"], to=onnx.TensorProto.FLOAT),
        ],
        [vi("a", [3, 8]), vi("b", [8])],
        [vi("y", [3, 8])],
    )
    a, b = rnd(RNG, 3, 8), rnd(RNG, 8)
    a[0, :4] = [np.nan, 0.0, -0.0, np.inf]
    b[:4] = [np.nan, -0.0, 0.0, np.inf]
    a[1] = b  # equal rows
    _run_on_npu(model, {"a": a, "b": b}, device)


def test_a_cast_to_bool_treats_nan_as_true_and_zero_as_false(device: npu.Device) -> None:
    model = make(
        [helper.make_node("Cast", ["x"], ["y"], to=onnx.TensorProto.BOOL)],
        [vi("x", [6])],
        [vi("y", [6], onnx.TensorProto.BOOL)],
    )
    x = np.array([np.nan, 0.0, -0.0, 1e-30, -2.0, np.inf], np.float32)
    _run_on_npu(model, {"x": x}, device)


def test_a_partition_unplannable_for_two_shapes_is_reported_once(device: npu.Device) -> None:
    # 300 blocks before the axis x 2 inputs for any k: the same reason for both shapes.
    model = make(
        [helper.make_node("Concat", ["a", "b"], ["y"], axis=2)],
        [vi("a", [1, 300, "k"]), vi("b", [1, 300, "k"])],
        [vi("y", [1, 300, "k2"])],
    )
    with npu.InferenceSession(model, device=device) as sess:
        for k in (1, 2):
            feeds = {"a": rnd(RNG, 1, 300, k), "b": rnd(RNG, 1, 300, k)}
            (got,) = sess.run(None, feeds)
            np.testing.assert_array_equal(got, np.concatenate([feeds["a"], feeds["b"]], axis=2))
        assert len(sess.fallbacks) == 1, sess.fallbacks
        assert sess.placement == {"Concat_0": "CPU"}
