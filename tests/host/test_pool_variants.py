"""Every 2-D MaxPool/AveragePool variant on the NPU (issue 17, item 2): uneven
pads, ceil mode, dilations and ``count_include_pad``, planned as one POOL2D
with ``NPU_POOL_F_GEOMETRY`` and checked against onnxruntime (an independent
implementation) on the CPU backend, plus the device-side rules of the op."""

from __future__ import annotations

import errno
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import helper

import npu
from npu import _abi, ops
from npu.hal.cpu import CPU_CAPS, CpuBackend
from onnx_models import make, rnd, vi

RNG = np.random.default_rng(23)

# (kernel, strides, pads [t, l, b, r], dilations, ceil_mode, count_include_pad), input H x W
CASES: list[tuple[Any, ...]] = [
    ((3, 3), (2, 2), (0, 0, 1, 1), (1, 1), 0, 0, (9, 9)),  # Inception's "same" pool
    ((3, 3), (2, 2), (1, 0, 2, 1), (1, 1), 0, 1, (10, 7)),
    ((3, 3), (2, 2), (0, 0, 0, 0), (1, 1), 1, 0, (8, 8)),  # ceil: one more window
    ((2, 2), (2, 2), (0, 0, 0, 0), (1, 1), 1, 0, (7, 5)),
    ((1, 1), (2, 2), (0, 0, 0, 0), (1, 1), 1, 0, (2, 2)),  # ceil: reduced by one again
    ((3, 3), (2, 2), (1, 1, 1, 1), (1, 1), 1, 1, (6, 6)),  # ceil window past the pads
    ((3, 2), (3, 2), (1, 1, 0, 1), (1, 1), 1, 1, (8, 7)),
    ((2, 2), (1, 1), (0, 0, 0, 0), (2, 2), 0, 0, (6, 6)),  # dilated
    ((3, 3), (2, 1), (2, 1, 2, 2), (2, 2), 0, 1, (9, 8)),
    ((2, 3), (2, 2), (1, 2, 1, 0), (3, 2), 1, 0, (10, 9)),
]


def _pool_model(op: str, case: tuple[Any, ...], n: int = 2, c: int = 3) -> onnx.ModelProto:
    kernel, strides, pads, dil, ceil, cip, (h, w) = case
    attrs: dict[str, Any] = {
        "kernel_shape": list(kernel),
        "strides": list(strides),
        "pads": list(pads),
        "ceil_mode": ceil,
    }
    if op == "AveragePool":
        attrs["count_include_pad"] = cip
        if dil != (1, 1):
            attrs["dilations"] = list(dil)  # opset 19
    else:
        attrs["dilations"] = list(dil)
    return make(
        [helper.make_node(op, ["x"], ["y"], **attrs)],
        [vi("x", [n, c, h, w])],
        [vi("y", ["n", "c", "oh", "ow"])],
        opset=19,
    )


def _ort(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> np.ndarray:
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    out: np.ndarray = sess.run(None, feeds)[0]
    return out


@pytest.mark.parametrize("op", ["MaxPool", "AveragePool"])
@pytest.mark.parametrize("case", CASES, ids=lambda c: "-".join(map(str, c)))
def test_a_pool_variant_runs_as_one_pool2d_and_matches_onnxruntime(
    device: npu.Device, op: str, case: tuple[Any, ...]
) -> None:
    model = _pool_model(op, case)
    x = rnd(RNG, 2, 3, *case[-1])
    with npu.InferenceSession(model, device=device) as sess:
        got = sess.run(None, {"x": x})[0]
        assert set(sess.placement.values()) == {"NPU"}, sess.fallbacks
    want = _ort(model, {"x": x})
    assert got.shape == want.shape
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)


def test_without_cap_pool_geometry_an_uneven_pool_stays_on_the_cpu_and_says_why() -> None:
    model = _pool_model("MaxPool", CASES[0])
    x = rnd(RNG, 2, 3, *CASES[0][-1])
    caps = CPU_CAPS & ~_abi.NPU_INFO_CAP_POOL_GEOMETRY
    with npu.Device(CpuBackend(caps=caps)) as dev, npu.InferenceSession(model, device=dev) as sess:
        got = sess.run(None, {"x": x})[0]
        assert set(sess.placement.values()) == {"CPU"}
        assert any("Cap.POOL_GEOMETRY" in f[2] for f in sess.fallbacks), sess.fallbacks
    np.testing.assert_allclose(got, _ort(model, {"x": x}), rtol=1e-6, atol=1e-6)


def test_a_geometry_pool2d_on_a_device_without_the_cap_fails_with_eopnotsupp() -> None:
    caps = CPU_CAPS & ~_abi.NPU_INFO_CAP_POOL_GEOMETRY
    with npu.Device(CpuBackend(caps=caps)) as dev:
        x = npu.tensor(rnd(RNG, 1, 1, 6, 6), device=dev)
        y = npu.empty((1, 1, 3, 3), device=dev)
        assert x.buffer is not None and y.buffer is not None
        op = ops.pool2d_op(
            _abi.PoolKind.MAX, x.tensor_ref(), y.tensor_ref(), 3, 2, (0, 0, 1, 1),
            buffers=(x.buffer, y.buffer),
        )  # fmt: skip
        with pytest.raises(npu.NpuError) as info:
            dev.submit([op])
        assert info.value.errno == errno.EOPNOTSUPP
        with pytest.raises(ValueError, match=r"Cap\.POOL_GEOMETRY"):
            npu.max_pool2d(x, 2, dilation=2)


@pytest.mark.parametrize(
    ("kernel", "stride", "padding", "dilation", "ceil_mode"),
    [(3, 2, 1, 1, True), (2, 1, 0, 2, False), ((3, 2), (2, 3), (1, 0), (2, 1), True)],
)
def test_tensor_pools_take_dilation_and_ceil_mode_like_torch(
    default_device: npu.Device, kernel: Any, stride: Any, padding: Any, dilation: Any,
    ceil_mode: bool,
) -> None:  # fmt: skip
    x = rnd(RNG, 2, 3, 9, 10)
    pair = lambda v: (v, v) if isinstance(v, int) else v  # noqa: E731
    (kh, kw), (sh, sw), (ph, pw), (dh, dw) = map(pair, (kernel, stride, padding, dilation))
    case = ((kh, kw), (sh, sw), (ph, pw, ph, pw), (dh, dw), int(ceil_mode), 1, (9, 10))
    got = npu.max_pool2d(x, kernel, stride, padding, dilation, ceil_mode).numpy()
    np.testing.assert_array_equal(got, _ort(_pool_model("MaxPool", case), {"x": x}))
    if (dh, dw) == (1, 1):
        got = npu.avg_pool2d(x, kernel, stride, padding, ceil_mode=ceil_mode).numpy()
        want = _ort(_pool_model("AveragePool", case), {"x": x})
        np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)
