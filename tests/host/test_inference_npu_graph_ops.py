"""Graph-structure ops on the NPU (issue 17, item 2): variadic Sum/Max/Min, LRN,
Concat, rank-5 views with a Transpose that merges adjacent axes (ShuffleNet's
channel shuffle), and Dropout with an unread mask. Each runs entirely on the
NPU (CPU backend) and matches onnx.reference exactly."""

from __future__ import annotations

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
