"""Integer MATMUL/LINEAR/CONV2D and REQUANT: the Python validator twin against the
C header over generated cases, the op builders, and the quantised runtime API
(npu.quantized_matmul / quantized_linear / quantized_conv2d, npu.matmul of
int8 tensors) end to end through CpuBackend. Every result must be exact.
"""

from __future__ import annotations

import itertools
from fractions import Fraction
from typing import Any

import numpy as np
import pytest

import npu
from npu import _abi, ops
from npu.hal import CpuBackend
from test_tensor import FakeBuf, _as_params, _c_check, flush

D = npu.DType
A = npu.ActKind

pytestmark = pytest.mark.usefixtures("default_device")


# -- references ------------------------------------------------------------------


def wrap32(x: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
    out: np.ndarray[Any, Any] = (np.asarray(x, np.int64) + (1 << 31)) % (1 << 32) - (1 << 31)
    return out


def requant_ref(acc: Any, scale: Any, zp: int, relu: bool) -> np.ndarray[Any, Any]:
    """clamp(round_half_even(acc * scale) + zp, lo, 127) on exact rationals."""
    a, s = np.broadcast_arrays(np.asarray(acc, np.int64), np.asarray(scale, np.float32))
    lo = zp if relu else -128
    q = [min(max(round(Fraction(int(x)) * Fraction(float(y))) + zp, lo), 127)
         for x, y in zip(a.ravel(), s.ravel(), strict=True)]  # fmt: skip
    return np.array(q, np.int64).reshape(a.shape)


def conv_ref(x: np.ndarray[Any, Any], w: np.ndarray[Any, Any], stride: int, pad: int,
             groups: int) -> np.ndarray[Any, Any]:  # fmt: skip
    """Exact integer conv2d (NCHW, zero padding, square stride/pad, dilation 1)."""
    n, _, h, wd = x.shape
    o, cg, kh, kw = w.shape
    og = o // groups
    xp = np.pad(x.astype(np.int64), ((0, 0), (0, 0), (pad, pad), (pad, pad)))
    oh, ow = (h + 2 * pad - kh) // stride + 1, (wd + 2 * pad - kw) // stride + 1
    out = np.zeros((n, o, oh, ow), np.int64)
    for g in range(groups):
        for i in range(kh):
            for j in range(kw):
                patch = xp[:, g * cg : (g + 1) * cg, i : i + stride * (oh - 1) + 1 : stride,
                           j : j + stride * (ow - 1) + 1 : stride]  # fmt: skip
                out[:, g * og : (g + 1) * og] += np.einsum(
                    "nchw,oc->nohw", patch, w[g * og : (g + 1) * og, :, i, j].astype(np.int64)
                )
    return out


def i8(rng: np.random.Generator, *shape: int) -> np.ndarray[Any, Any]:
    return rng.integers(-128, 128, shape, dtype=np.int64).astype(np.int8)


# -- the validator twin against npu_tensor_op_check ---------------------------------


def _candidates() -> list[ops.TensorOp]:
    buf = FakeBuf(1, 1 << 20)
    r = ops.tensor_ref
    dts = (D.INT8, D.INT32, D.FP32)
    zps = (0, 127, 0xFFFF_FF80, 128, 0xFFFF_FF7F, 0x8000_0000)
    out: list[ops.TensorOp] = []
    for da, db, do, kind, zp in itertools.product(dts, dts, dts, (0, 1, 2, 3), zps):
        a, b = r(buf, da, (2, 3)), r(buf, db, (3, 4))
        for o_shape in ((2, 4), (4, 2)):
            o = r(buf, do, o_shape)
            out.append(ops.TensorOp(npu.Opcode.MATMUL, kind, (a, b, o), params=(zp,)))
        for dbias, bshape in itertools.product(dts, ((1, 4), (2, 4))):
            bias = r(buf, dbias, bshape)
            out.append(
                ops.TensorOp(
                    npu.Opcode.LINEAR, kind, (a, b, bias, r(buf, do, (2, 4))), params=(zp,)
                )
            )
        x, w = r(buf, da, (1, 2, 5, 5)), r(buf, db, (4, 2, 3, 3))
        for dbias in dts:
            conv = (x, w, r(buf, dbias, (1, 4, 1, 1)), r(buf, do, (1, 4, 5, 5)))
            out.append(
                ops.TensorOp(npu.Opcode.CONV2D, kind, conv, params=(1, 1, 1, 1, 1, 1, 1, zp))
            )
    for dacc, dsc, do, kind, zp in itertools.product(dts, dts, dts, (0, 1, 2, 3), zps):
        for s_shape in ((1, 1), (1, 4), (2, 1), (2, 4), (1, 3), (4,)):
            for a_shape, o_shape in (((2, 4), (2, 4)), ((4, 2), (2, 4))):
                t = (r(buf, dacc, a_shape), r(buf, dsc, s_shape), r(buf, do, o_shape))
                out.append(ops.TensorOp(npu.Opcode.REQUANT, kind, t, params=(zp,)))
    # unused params must be zero
    base = (r(buf, D.INT32, (2, 4)), r(buf, D.FP32, (1, 4)), r(buf, D.INT8, (2, 4)))
    out.append(ops.TensorOp(npu.Opcode.REQUANT, 0, base, params=(0, 1)))
    mm = (r(buf, D.INT8, (2, 3)), r(buf, D.INT8, (3, 4)), r(buf, D.INT32, (2, 4)))
    out.append(ops.TensorOp(npu.Opcode.MATMUL, 0, mm, params=(0, 0, 1)))
    return out


def test_python_check_agrees_with_the_header_on_integer_and_requant_ops() -> None:
    candidates = _candidates()
    python_ok = []
    for op in candidates:
        try:
            ops.check_tensor_op(op)
            python_ok.append(True)
        except ValueError:
            python_ok.append(False)
    statuses = _c_check([(int(op.opcode), op.kind, _as_params(op)) for op in candidates])
    mismatch = [
        (str(op), st)
        for op, st, ok in zip(candidates, statuses, python_ok, strict=True)
        if (st == _abi.NPU_ST_OK) != ok
    ]
    assert not mismatch, mismatch[:5]
    assert sum(python_ok) > 50 and not all(python_ok)
    # The zero-point rejections are BAD_QUANT, not BAD_ARGS.
    st = dict(zip((str(op) for op in candidates), statuses, strict=True))
    buf = FakeBuf(1, 1 << 20)
    bad = ops.TensorOp(
        npu.Opcode.REQUANT,
        0,
        (ops.tensor_ref(buf, D.INT32, (2, 4)), ops.tensor_ref(buf, D.FP32, (1, 4)),
         ops.tensor_ref(buf, D.INT8, (2, 4))),
        params=(128,),
    )  # fmt: skip
    assert st[str(bad)] == _abi.NPU_ST_BAD_QUANT


def test_builders_encode_zero_points_and_check_them() -> None:
    buf = FakeBuf(1, 1 << 16)
    a = ops.tensor_ref(buf, D.INT8, (2, 3))
    b = ops.tensor_ref(buf, D.INT8, (3, 4))
    acc = ops.tensor_ref(buf, D.INT32, (2, 4))
    op = ops.matmul_op(a, b, acc, input_zero_point=-1)
    assert op.params == (0xFFFF_FFFF,) and list(op.pack().params)[:2] == [0xFFFF_FFFF, 0]
    scale = ops.tensor_ref(buf, D.FP32, (1, 4))
    rq = ops.requant_op(acc, scale, ops.tensor_ref(buf, D.INT8, (2, 4)), -128, A.RELU)
    assert (rq.opcode, rq.kind, rq.params) == (npu.Opcode.REQUANT, 1, (0xFFFF_FF80,))
    assert str(rq).startswith("REQUANT.RELU(int32[2x4]")
    with pytest.raises(ValueError, match="int8 range"):
        ops.requant_op(acc, scale, ops.tensor_ref(buf, D.INT8, (2, 4)), 128)
    with pytest.raises(ValueError, match="NONE or RELU"):
        ops.matmul_op(a, b, acc, A.GELU)
    with pytest.raises(ValueError, match="zero point"):
        f = ops.tensor_ref(buf, D.FP32, (2, 3))
        ops.matmul_op(f, ops.tensor_ref(buf, D.FP32, (3, 4)), ops.tensor_ref(buf, D.FP32, (2, 4)),
                      input_zero_point=3)  # fmt: skip
    with pytest.raises(ValueError, match="does not broadcast"):
        ops.requant_op(
            acc, ops.tensor_ref(buf, D.FP32, (4, 1)), ops.tensor_ref(buf, D.INT8, (2, 4))
        )
    conv = ops.conv2d_op(
        ops.tensor_ref(buf, D.INT8, (1, 2, 5, 5)), ops.tensor_ref(buf, D.INT8, (4, 2, 3, 3)),
        ops.tensor_ref(buf, D.INT32, (1, 4, 1, 1)), ops.tensor_ref(buf, D.INT8, (1, 4, 3, 3)),
        input_zero_point=5,
    )  # fmt: skip
    assert conv.params[_abi.NPU_CONV_P_IN_ZP] == 5


# -- the runtime API through CpuBackend ----------------------------------------------


@pytest.mark.parametrize("relu", [False, True])
@pytest.mark.parametrize("per_channel", [False, True])
def test_quantized_matmul_requantises_exactly(per_channel: bool, relu: bool) -> None:
    rng = np.random.default_rng([1, per_channel, relu])
    a, b = i8(rng, 2, 5, 33), i8(rng, 33, 7)
    bias = rng.integers(-3000, 3000, 7).astype(np.int32)
    scale = rng.random(7) * 0.004 + 1e-4 if per_channel else 0.0021
    got = npu.quantized_matmul(a, b, scale, bias=bias, input_zero_point=-9, output_zero_point=3,
                               activation="relu" if relu else None)  # fmt: skip
    acc = wrap32((a.astype(np.int64) + 9) @ b + bias)
    want = requant_ref(acc, np.asarray(scale, np.float32), 3, relu)
    assert got.dtype == np.int8 and got.shape == (2, 5, 7)
    np.testing.assert_array_equal(got.numpy(), want)


def test_quantized_matmul_without_scale_returns_the_int32_accumulators() -> None:
    rng = np.random.default_rng(2)
    a, b = i8(rng, 4, 300), i8(rng, 300, 6)
    got = npu.quantized_matmul(npu.tensor(a), npu.tensor(b), input_zero_point=127)
    assert got.dtype == np.int32
    np.testing.assert_array_equal(got.numpy(), (a.astype(np.int64) - 127) @ b)
    relu = npu.quantized_matmul(a, b, out_dtype=np.int32, activation="relu")
    np.testing.assert_array_equal(relu.numpy(), np.maximum(a.astype(np.int64) @ b, 0))


def test_quantized_linear_is_a_linear_then_a_requant(driver: CpuBackend) -> None:
    rng = np.random.default_rng(3)
    x, w = i8(rng, 3, 16), i8(rng, 10, 16)
    bias = rng.integers(-500, 500, 10).astype(np.int32)
    scales = (rng.random(10) * 0.01 + 0.001).astype(np.float32)
    flush()
    before = len(driver.submitted_tensor)
    got = npu.quantized_linear(x, w, bias, scales, input_zero_point=4, output_zero_point=-2)
    flush()
    assert [op.opcode for op in driver.submitted_tensor[before:]] == [
        _abi.NPU_OP_LINEAR,
        _abi.NPU_OP_REQUANT,
    ]
    acc = wrap32((x.astype(np.int64) - 4) @ w.T.astype(np.int64) + bias)
    np.testing.assert_array_equal(got.numpy(), requant_ref(acc, scales, -2, False))
    one = npu.quantized_linear(x[0], w, bias, scales)  # 1-D x
    assert one.shape == (10,)
    np.testing.assert_array_equal(
        one.numpy(), requant_ref(wrap32(x[0].astype(np.int64) @ w.T + bias), scales, 0, False)
    )


@pytest.mark.parametrize("per_channel", [False, True])
def test_quantized_conv2d_exact(per_channel: bool) -> None:
    rng = np.random.default_rng([4, per_channel])
    x, w = i8(rng, 2, 4, 7, 6), i8(rng, 6, 2, 3, 3)
    bias = rng.integers(-1000, 1000, 6).astype(np.int32)
    zp = -17
    acc = npu.quantized_conv2d(x, w, bias, stride=2, padding=1, groups=2, input_zero_point=zp)
    # padding reads the zero point: the reference pads x - zp with zeros
    want = wrap32(conv_ref(x.astype(np.int64) - zp, w, 2, 1, 2) + bias.reshape(1, 6, 1, 1))
    np.testing.assert_array_equal(acc.numpy(), want)
    scale = rng.random(6) * 0.003 + 1e-4 if per_channel else [0.0007]
    got = npu.quantized_conv2d(x, w, bias, scale, 2, 1, 1, 2, input_zero_point=zp,
                               output_zero_point=10, activation="relu")  # fmt: skip
    s = np.asarray(scale, np.float32).reshape(1, -1, 1, 1)
    np.testing.assert_array_equal(got.numpy(), requant_ref(want, s, 10, True))
    unbatched = npu.quantized_conv2d(x[0], w, None, None, 1, 0, 1, 2)
    np.testing.assert_array_equal(unbatched.numpy(), conv_ref(x[:1], w, 1, 0, 2)[0])


def test_matmul_of_int8_tensors_wraps_like_numpy() -> None:
    rng = np.random.default_rng(5)
    a, b = i8(rng, 3, 4, 50), i8(rng, 50, 5)
    got = npu.matmul(npu.tensor(a), npu.tensor(b))
    assert got.dtype == np.int8
    np.testing.assert_array_equal(got.numpy(), a @ b)
    np.testing.assert_array_equal((npu.tensor(a[0]) @ b[:, 0]).numpy(), a[0] @ b[:, 0])


def test_quantized_api_rejects_bad_arguments() -> None:
    a = np.zeros((2, 3), np.int8)
    b = np.zeros((3, 4), np.int8)
    with pytest.raises(ValueError, match="input_zero_point"):
        npu.quantized_matmul(a, b, 1.0, input_zero_point=128)
    with pytest.raises(ValueError, match="output_zero_point"):
        npu.quantized_matmul(a, b, 1.0, output_zero_point=-129)
    with pytest.raises(ValueError, match="activation"):
        npu.quantized_matmul(a, b, 1.0, activation="gelu")
    with pytest.raises(ValueError, match="must be int8"):
        npu.quantized_matmul(npu.tensor(a.astype(np.float32)), b, 1.0)
    with pytest.raises(ValueError, match="do not fit int8"):
        npu.quantized_matmul(a.astype(np.int32) + 200, b, 1.0)
    with pytest.raises(ValueError, match="finite and > 0"):
        npu.quantized_matmul(a, b, [1.0, 2.0, -1.0, 1.0])
    with pytest.raises(ValueError, match="finite and > 0"):
        npu.quantized_matmul(a, b, float("nan"))
    with pytest.raises(ValueError, match="one per output channel"):
        npu.quantized_matmul(a, b, [1.0, 2.0])
    with pytest.raises(ValueError, match="needs a scale"):
        npu.quantized_matmul(a, b, out_dtype=np.int8)
    with pytest.raises(ValueError, match="needs scale=None"):
        npu.quantized_matmul(a, b, 0.5, out_dtype=np.int32)
    with pytest.raises(ValueError, match="bias shape"):
        npu.quantized_matmul(a, b, 0.5, bias=np.zeros(3, np.int32))
    with pytest.raises(ValueError, match="must be int32"):
        npu.quantized_linear(a, b.T, npu.tensor(np.zeros(4, np.int8)), 0.5)
    with pytest.raises(ValueError, match="K differs"):
        npu.quantized_matmul(a, a, 0.5)
    with pytest.raises(ValueError, match="groups"):
        npu.quantized_conv2d(np.zeros((1, 3, 4, 4), np.int8), np.zeros((2, 2, 1, 1), np.int8),
                             groups=2)  # fmt: skip


def test_quantized_api_needs_cap_quant(driver: CpuBackend) -> None:
    driver.caps &= ~_abi.NPU_INFO_CAP_QUANT
    with npu.Device(driver) as dev:
        a = npu.tensor(np.zeros((2, 3), np.int8), device=dev)
        with pytest.raises(ValueError, match=r"Cap\.QUANT"):
            npu.quantized_matmul(a, np.zeros((3, 2), np.int8), 1.0)
        # npu.matmul of int8 tensors falls back to float32 there
        assert npu.matmul(a, npu.tensor(np.zeros((3, 2), np.int8), device=dev)).dtype == np.float32
