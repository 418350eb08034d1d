"""Integer MATMUL/LINEAR/CONV2D and REQUANT through qtest (no guest).

Every result must be bit-exact against an integer reference computed here
with the semantics of docs/npu-spec.md:

* integer MATMUL/LINEAR/CONV2D: acc = sum((a - in_zp) * b) in exact
  integers, plus the int32 bias, wrapped to int32 (two's complement); RELU
  is max(acc, 0); an INT8 output keeps the low 8 bits (numpy's wrap);
* REQUANT: out = clamp(rne(acc * scale) + out_zp, lo, 127) where rne rounds
  the exact rational product to the nearest integer, ties to even
  (Python's ``round`` of a ``Fraction``), and lo = -128, or out_zp with RELU.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from fractions import Fraction

import numpy as np
import pytest

from qtest import hw, tensor_params
from qtest_tensor_ref import FP16, FP32, INT8, INT32, wrap
from test_device_qtest_tensor import (
    A_VA,
    B_VA,
    BIAS_VA,
    CONV_CASES,
    GUARD,
    HEAP,
    OUT_VA,
    Operand,
    Rig,
    conv_geometry,
    logical,
    ref_conv,
    rig,
    shared_npu,
    t,
)

__all__ = ["rig", "shared_npu"]  # fixtures used here

NONE, RELU, GELU = hw.ACT_NONE, hw.ACT_RELU, hw.ACT_GELU


def u32(v: int) -> int:
    """A signed params word (zero point) as the u32 the block holds."""
    return v & 0xFFFF_FFFF


def i8_operand(rng: np.random.Generator, shape: Sequence[int],
               strides: Sequence[int] | None = None) -> Operand:  # fmt: skip
    op = Operand(INT8, tuple(shape), strides)
    n = op.nbytes
    buf = rng.integers(-128, 128, n, dtype=np.int64)
    buf[: min(n, 4)] = [-128, 127, 0, -1][: min(n, 4)]
    op.buf = buf
    return op


def i32_operand(rng: np.random.Generator, shape: Sequence[int], lo: int = -(1 << 20),
                hi: int = 1 << 20, strides: Sequence[int] | None = None) -> Operand:  # fmt: skip
    op = Operand(INT32, tuple(shape), strides)
    op.buf = rng.integers(lo, hi, op.nbytes // 4, dtype=np.int64)
    return op


def ref_int_epilogue(acc: np.ndarray, bias: np.ndarray | None, kind: int,
                     odtype: int) -> np.ndarray:  # fmt: skip
    """int64 exact sums -> the int32/int8 output of the device."""
    if bias is not None:
        acc = acc + bias
    acc = wrap(acc, INT32)
    if kind == RELU:
        acc = np.maximum(acc, 0)
    return wrap(acc, odtype)


def ref_requant(acc: np.ndarray, scale: np.ndarray, zp: int, kind: int) -> np.ndarray:
    """Exact rational rounding, ties to even (Fraction.__round__), then clamp."""
    acc, scale = np.broadcast_arrays(np.asarray(acc, np.int64), np.asarray(scale, np.float32))
    lo = zp if kind == RELU else -128
    out = [min(max(round(Fraction(int(a)) * Fraction(float(s))) + zp, lo), 127)
           for a, s in zip(acc.ravel(), scale.ravel(), strict=True)]  # fmt: skip
    return np.array(out, np.int64).reshape(acc.shape)


# --------------------------------------------------------------------------
# Integer MATMUL and LINEAR
# --------------------------------------------------------------------------


def run_int_mm(rig: Rig, kind: int, a: Operand, b: Operand, bias: Operand | None,
               odtype: int, zp: int = 0, what: str = "") -> np.ndarray:  # fmt: skip
    batch = np.broadcast_shapes(a.shape[:-2], b.shape[:-2])
    out = Operand(odtype, (*batch, a.shape[-2], b.shape[-1]))
    ops = [a, b] + ([bias] if bias is not None else []) + [out]
    opcode = hw.OP_MATMUL if bias is None else hw.OP_LINEAR
    got = rig.run(opcode, kind, ops, params=[u32(zp)])
    exact = np.matmul(logical(a) - zp, logical(b))
    want = ref_int_epilogue(exact, None if bias is None else logical(bias), kind, odtype)
    np.testing.assert_array_equal(got, want, err_msg=what)
    return got


ODD_SIZES = [(1, 1, 1), (3, 5, 7), (65, 33, 17), (2, 300, 9)]


@pytest.mark.parametrize("zp", [0, -128, 37, 127])
@pytest.mark.parametrize("kind", [NONE, RELU], ids=["none", "relu"])
@pytest.mark.parametrize("odtype", [INT32, INT8], ids=["int32", "int8"])
@pytest.mark.parametrize("linear", [False, True], ids=["matmul", "linear"])
def test_int8_matmul_and_linear_are_exact(rig: Rig, linear: bool, odtype: int, kind: int,
                                          zp: int) -> None:  # fmt: skip
    rng = np.random.default_rng([40, linear, odtype, kind, zp & 0xFF])
    for m, k, n in ODD_SIZES:
        a, b = i8_operand(rng, (m, k)), i8_operand(rng, (k, n))
        bias = i32_operand(rng, (1, n)) if linear else None
        run_int_mm(rig, kind, a, b, bias, odtype, zp, what=f"{m}x{k}x{n}")


def test_int8_matmul_batches_broadcast_and_strided_views(rig: Rig) -> None:
    rng = np.random.default_rng(41)
    # batch broadcast: a [2, 1, 4, 6] @ b [1, 3, 6, 5]
    run_int_mm(rig, NONE, i8_operand(rng, (2, 1, 4, 6)), i8_operand(rng, (1, 3, 6, 5)),
               None, INT32, 5)  # fmt: skip
    # a transposed (column-major view), b with a padded row stride, bias with stride 3
    a = i8_operand(rng, (7, 9), strides=(1, 7))
    b = i8_operand(rng, (9, 4), strides=(6, 1))
    bias = i32_operand(rng, (1, 4), strides=(0, 3))
    run_int_mm(rig, RELU, a, b, bias, INT8, -3)
    # both transposed, rank 3
    a = i8_operand(rng, (2, 5, 8), strides=(40, 1, 5))
    b = i8_operand(rng, (2, 8, 3), strides=(24, 1, 8))
    run_int_mm(rig, NONE, a, b, i32_operand(rng, (1, 1, 3), strides=(0, 0, 1)), INT32, 0)


@pytest.mark.parametrize("zp", [0, 127, -128])
def test_int8_matmul_large_k_is_exact_across_fp32_blocks(rig: Rig, zp: int) -> None:
    """K = 4096: four or eight sgemm blocks; the worst-case magnitudes."""
    rng = np.random.default_rng([42, zp & 0xFF])
    m, k, n = 64, 4096, 48  # 25 M multiply-adds: split across the AI cores
    a, b = i8_operand(rng, (m, k)), i8_operand(rng, (k, n))
    assert a.buf is not None and b.buf is not None
    a.buf[:k] = -128 if zp >= 0 else 127  # row 0: every |a - zp| as large as it gets
    b.buf[0::n] = -128  # column 0 all -128
    b.buf[1::n] = 127
    run_int_mm(rig, NONE, a, b, None, INT32, zp)
    run_int_mm(rig, RELU, a, b, i32_operand(rng, (1, n)), INT32, zp)


def test_int8_matmul_accumulator_wraps_at_32_bits(rig: Rig) -> None:
    k = 140_000  # 255 * 128 * k > 2^32
    a = Operand(INT8, (1, k))
    a.buf = np.full(k, -128, np.int64)
    b = Operand(INT8, (k, 2))
    b.buf = np.tile(np.array([-128, 127], np.int64), k)
    got = run_int_mm(rig, NONE, a, b, None, INT32, 127, what="wrap")
    assert got[0, 0] == wrap(np.array(255 * 128 * k), INT32)


# --------------------------------------------------------------------------
# Integer CONV2D
# --------------------------------------------------------------------------


def run_int_conv(rig: Rig, kind: int, x: Operand, w: Operand, b: Operand, odtype: int,
                 stride: Sequence[int], pad: Sequence[int], dil: Sequence[int], groups: int,
                 zp: int, what: str = "") -> np.ndarray:  # fmt: skip
    oh, ow = conv_geometry(x.shape, w.shape, stride, pad, dil)
    out = Operand(odtype, (x.shape[0], w.shape[0], oh, ow))
    params = [stride[0], stride[1], pad[0], pad[1], dil[0], dil[1], groups, u32(zp)]
    got = rig.run(hw.OP_CONV2D, kind, [x, w, b, out], params=params, timeout=60.0)
    zero = np.zeros((1, w.shape[0], 1, 1), np.int64)
    # Padding reads in_zp, i.e. 0 after the subtraction: ref_conv pads with 0.
    acc, _ = ref_conv(logical(x) - zp, logical(w), zero, stride, pad, dil, groups)
    exact = np.rint(acc).astype(np.int64)  # integers below 2^53: float64 is exact
    want = ref_int_epilogue(exact, logical(b), kind, odtype)
    np.testing.assert_array_equal(got, want, err_msg=what)
    return got


@pytest.mark.parametrize("zp", [0, -7, 100])
@pytest.mark.parametrize("kind", [NONE, RELU], ids=["none", "relu"])
@pytest.mark.parametrize("odtype", [INT32, INT8], ids=["int32", "int8"])
def test_int8_conv2d_is_exact_for_every_geometry(rig: Rig, odtype: int, kind: int,
                                                 zp: int) -> None:  # fmt: skip
    rng = np.random.default_rng([43, odtype, kind, zp & 0xFF])
    for name, (n, c, h, wd, o, kh, kw, st, pd, dl, g) in CONV_CASES.items():
        x = i8_operand(rng, (n, c, h, wd))
        w = i8_operand(rng, (o, c // g, kh, kw))
        b = i32_operand(rng, (1, o, 1, 1))
        run_int_conv(rig, kind, x, w, b, odtype, st, pd, dl, g, zp, what=name)


def test_int8_conv2d_strided_views_and_large_k(rig: Rig) -> None:
    rng = np.random.default_rng(44)
    # NHWC storage read as NCHW, bias with a stride
    n, c, h, wd = 2, 3, 6, 5
    x = i8_operand(rng, (n, c, h, wd), strides=(h * wd * c, 1, wd * c, c))
    w = i8_operand(rng, (4, c, 3, 3))
    b = i32_operand(rng, (1, 4, 1, 1), strides=(0, 2, 0, 0))
    run_int_conv(rig, RELU, x, w, b, INT8, (1, 1), (1, 1), (1, 1), 1, -20)
    # K = C * KH * KW = 512 * 3 * 3 = 4608 terms: several fp32 blocks
    x = i8_operand(rng, (1, 512, 5, 4))
    w = i8_operand(rng, (6, 512, 3, 3))
    run_int_conv(rig, NONE, x, w, i32_operand(rng, (1, 6, 1, 1)), INT32, (1, 1), (1, 1),
                 (1, 1), 1, -128)  # fmt: skip


# --------------------------------------------------------------------------
# REQUANT
# --------------------------------------------------------------------------


def run_requant(rig: Rig, kind: int, acc: Operand, scale: Operand, zp: int,
                what: str = "") -> np.ndarray:  # fmt: skip
    out = Operand(INT8, acc.shape)
    got = rig.run(hw.OP_REQUANT, kind, [acc, scale, out], params=[u32(zp)])
    want = ref_requant(logical(acc), logical(scale), zp, kind)
    np.testing.assert_array_equal(got, want, err_msg=what)
    return got


def f32_operand(values: Sequence[float] | np.ndarray, shape: Sequence[int],
                strides: Sequence[int] | None = None) -> Operand:  # fmt: skip
    op = Operand(FP32, tuple(shape), strides)
    op.buf = np.asarray(values, np.float32).reshape(-1)
    return op


@pytest.mark.parametrize("zp", [0, -128, 5, 127])
@pytest.mark.parametrize("kind", [NONE, RELU], ids=["none", "relu"])
def test_requant_per_tensor_and_per_channel(rig: Rig, kind: int, zp: int) -> None:
    rng = np.random.default_rng([45, kind, zp & 0xFF])
    acc = i32_operand(rng, (5, 12), -40000, 40000)
    # per tensor: one scale broadcast with stride 0
    run_requant(rig, kind, acc, f32_operand([0.0031], (1, 1)), zp, "per-tensor")
    # per channel along the last axis, and along axis 1 of an NCHW tensor
    scales = (rng.random(12) * 0.01 + 1e-4).astype(np.float32)
    run_requant(rig, kind, acc, f32_operand(scales, (1, 12)), zp, "per-channel")
    acc4 = i32_operand(rng, (2, 6, 3, 4), -30000, 30000)
    run_requant(rig, kind, acc4, f32_operand(scales[:6], (1, 6, 1, 1)), zp, "per-channel nchw")
    # a strided accumulator (transposed view) and a full-shape scale
    acc_t = i32_operand(rng, (12, 5), -2000, 2000, strides=(1, 12))
    run_requant(rig, kind, acc_t, f32_operand(rng.random(60) * 0.1 + 0.01, (12, 5)), zp,
                "strided")  # fmt: skip


def test_requant_rounds_exact_products_ties_to_even(rig: Rig) -> None:
    accs = [1, 3, 5, -1, -3, -5, 7, 0, 2**31 - 1, -(2**31), 255, -255, 253, 251]
    scales = [0.5] * 8 + [2.0**-24, 2.0**-24, 0.5, 0.5, 0.5, 0.5]
    acc = Operand(INT32, (len(accs),))
    acc.buf = np.array(accs, np.int64)
    got = run_requant(rig, NONE, acc, f32_operand(scales, (len(scales),)), 0)
    assert list(got[:8]) == [0, 2, 2, 0, -2, -2, 4, 0]  # ties to even
    # A product a double cannot hold: 31-bit acc times a 24-bit mantissa,
    # exactly k + 1/2 + 2^-k' away from a tie.
    m = (1 << 23) | 1  # scale = m * 2^-49
    for a in (0x7FFFFF01, -0x7FFFFF01, (1 << 26) + 3, -(1 << 26) - 3, 123456789):
        acc = Operand(INT32, (1,))
        acc.buf = np.array([a], np.int64)
        run_requant(rig, NONE, acc, f32_operand([m * 2.0**-49], (1,)), 3, f"acc={a}")


def test_requant_saturates_and_handles_extreme_scales(rig: Rig) -> None:
    acc = Operand(INT32, (8,))
    acc.buf = np.array([1, -1, 2**31 - 1, -(2**31), 100, -100, 0, 7], np.int64)
    for s in (3e38, 1e-45, 1.17549435e-38, 1.0, 512.0, 0.999999, 2.0**-126 * 1.5):
        run_requant(rig, NONE, acc, f32_operand([s], (1,)), -5, f"scale={s}")
        run_requant(rig, RELU, acc, f32_operand([s], (1,)), 17, f"relu scale={s}")


def test_qlinear_chain_int32_then_per_channel_requant(rig: Rig) -> None:
    """The QLinearMatMul scheme: exact int32 accumulators, then per-channel requant."""
    rng = np.random.default_rng(46)
    m, k, n, zp_in, zp_out = 9, 70, 11, -13, 4
    a, b = i8_operand(rng, (m, k)), i8_operand(rng, (k, n))
    bias = i32_operand(rng, (1, n), -5000, 5000)
    acc = Operand(INT32, (m, n))
    acc.buf = run_int_mm(rig, RELU, a, b, bias, INT32, zp_in).reshape(-1)
    scales = (rng.random(n) * 0.002 + 1e-4).astype(np.float32)
    run_requant(rig, RELU, acc, f32_operand(scales, (1, n)), zp_out)


# --------------------------------------------------------------------------
# Rejections: the shared validator and the device's scale check
# --------------------------------------------------------------------------

SCALE_VA = HEAP + 0x1800


def mm_q(sa: Sequence[int] = (2, 3), sb: Sequence[int] = (3, 4), so: Sequence[int] = (2, 4),
         bias: Sequence[int] | None = None,
         dtypes: Sequence[int] = (INT8, INT8, INT32, INT32),
         zp: int = 0) -> bytes:  # fmt: skip
    ops = [t(A_VA, dtypes[0], sa), t(B_VA, dtypes[1], sb)]
    if bias is not None:
        ops.append(t(BIAS_VA, dtypes[2], bias))
    ops.append(t(OUT_VA, dtypes[3], so))
    return tensor_params(ops, [u32(zp)])


def conv_q(dtypes: Sequence[int] = (INT8, INT8, INT32, INT32), zp: int = 0,
           extra: Sequence[int] = ()) -> bytes:  # fmt: skip
    return tensor_params([t(A_VA, dtypes[0], (1, 2, 5, 5)), t(B_VA, dtypes[1], (4, 2, 3, 3)),
                          t(BIAS_VA, dtypes[2], (1, 4, 1, 1)),
                          t(OUT_VA, dtypes[3], (1, 4, 5, 5))],
                         [1, 1, 1, 1, 1, 1, 1, u32(zp), *extra])  # fmt: skip


def rq(sa: Sequence[int] = (2, 4), ss: Sequence[int] = (1, 4), so: Sequence[int] = (2, 4),
       dtypes: Sequence[int] = (INT32, FP32, INT8), zp: int = 0,
       extra: Sequence[int] = ()) -> bytes:  # fmt: skip
    return tensor_params([t(A_VA, dtypes[0], sa), t(SCALE_VA, dtypes[1], ss),
                          t(OUT_VA, dtypes[2], so)], [u32(zp), *extra])  # fmt: skip


_M, _L, _C, _R = hw.OP_MATMUL, hw.OP_LINEAR, hw.OP_CONV2D, hw.OP_REQUANT
BAD_Q: dict[str, tuple[int, int, bytes, str]] = {
    "mm-zp-128": (_M, 0, mm_q(zp=128), "BAD_QUANT"),
    "mm-zp-minus-129": (_M, 0, mm_q(zp=-129), "BAD_QUANT"),
    "mm-zp-2^31": (_M, 0, mm_q(zp=-(1 << 31)), "BAD_QUANT"),
    "linear-zp-200": (_L, 0, mm_q(bias=(1, 4), zp=200), "BAD_QUANT"),
    "mm-gelu": (_M, GELU, mm_q(), "BAD_ARGS"),
    "mm-kind-3": (_M, 3, mm_q(), "BAD_ARGS"),
    "mm-b-fp32": (_M, 0, mm_q(dtypes=(INT8, FP32, INT32, INT32)), "BAD_ARGS"),
    "mm-b-int32": (_M, 0, mm_q(dtypes=(INT8, INT32, INT32, INT32)), "BAD_ARGS"),
    "mm-a-int32-b-int8": (_M, 0, mm_q(dtypes=(INT32, INT8, INT32, INT32)), "BAD_ARGS"),
    "mm-a-fp32-b-int8": (_M, 0, mm_q(dtypes=(FP32, INT8, FP32, FP32)), "BAD_ARGS"),
    "mm-out-fp32": (_M, 0, mm_q(dtypes=(INT8, INT8, INT32, FP32)), "BAD_ARGS"),
    "mm-out-fp16": (_M, 0, mm_q(dtypes=(INT8, INT8, INT32, FP16)), "BAD_ARGS"),
    "mm-k-mismatch": (_M, 0, mm_q(sb=(2, 4)), "BAD_ARGS"),
    "linear-bias-int8": (_L, 0, mm_q(bias=(1, 4), dtypes=(INT8, INT8, INT8, INT32)), "BAD_ARGS"),
    "linear-bias-fp32": (_L, 0, mm_q(bias=(1, 4), dtypes=(INT8, INT8, FP32, INT32)), "BAD_ARGS"),
    "linear-bias-shape": (_L, 0, mm_q(bias=(2, 4)), "BAD_ARGS"),
    "fp32-mm-zp-1": (_M, 0, mm_q(dtypes=(FP32,) * 4, zp=1), "BAD_RESERVED"),
    "mm-params-1": (_M, 0, mm_q()[:-64] + tensor_params([], [0, 1])[-64:], "BAD_RESERVED"),
    "conv-zp-128": (_C, 0, conv_q(zp=128), "BAD_QUANT"),
    "conv-gelu": (_C, GELU, conv_q(), "BAD_ARGS"),
    "conv-bias-int8": (_C, 0, conv_q(dtypes=(INT8, INT8, INT8, INT32)), "BAD_ARGS"),
    "conv-weight-fp32": (_C, 0, conv_q(dtypes=(INT8, FP32, INT32, INT32)), "BAD_ARGS"),
    "conv-out-fp32": (_C, 0, conv_q(dtypes=(INT8, INT8, INT32, FP32)), "BAD_ARGS"),
    "fp32-conv-zp-1": (_C, 0, conv_q(dtypes=(FP32,) * 4, zp=1), "BAD_RESERVED"),
    "conv-params-9": (_C, 0, conv_q(extra=(0, 1)), "BAD_RESERVED"),
    "conv-accumulate": (_C, 0, conv_q(extra=(1,)), "BAD_ARGS"),
    "conv-relu6": (_C, 3, conv_q(), "BAD_ARGS"),
    "rq-zp-128": (_R, 0, rq(zp=128), "BAD_QUANT"),
    "rq-zp-minus-129": (_R, 0, rq(zp=-129), "BAD_QUANT"),
    "rq-gelu": (_R, GELU, rq(), "BAD_ARGS"),
    "rq-kind-3": (_R, 3, rq(), "BAD_ARGS"),
    "rq-acc-int8": (_R, 0, rq(dtypes=(INT8, FP32, INT8)), "BAD_ARGS"),
    "rq-acc-fp32": (_R, 0, rq(dtypes=(FP32, FP32, INT8)), "BAD_ARGS"),
    "rq-scale-fp16": (_R, 0, rq(dtypes=(INT32, FP16, INT8)), "BAD_ARGS"),
    "rq-scale-int32": (_R, 0, rq(dtypes=(INT32, INT32, INT8)), "BAD_ARGS"),
    "rq-out-int32": (_R, 0, rq(dtypes=(INT32, FP32, INT32)), "BAD_ARGS"),
    "rq-scale-wrong-channels": (_R, 0, rq(ss=(1, 3)), "BAD_ARGS"),
    "rq-scale-wrong-axis": (_R, 0, rq(ss=(4, 1)), "BAD_ARGS"),
    "rq-scale-rank-1": (_R, 0, rq(ss=(4,)), "BAD_ARGS"),
    "rq-out-shape": (_R, 0, rq(so=(4, 2)), "BAD_ARGS"),
    "rq-params-1": (_R, 0, rq(extra=(1,)), "BAD_RESERVED"),
    "rq-4th-operand": (_R, 0, rq()[: 3 * 48] + t(OUT_VA) + rq()[4 * 48 :], "BAD_RESERVED"),
    "rq-out-strided": (_R, 0, tensor_params([t(A_VA, INT32, (2, 4)), t(SCALE_VA, FP32, (1, 4)),
                                             t(OUT_VA, INT8, (2, 4), (8, 1))]), "BAD_ARGS"),
}  # fmt: skip


@pytest.mark.parametrize(("opcode", "kind", "block", "status"), BAD_Q.values(), ids=BAD_Q.keys())
def test_bad_quantised_op_is_rejected_and_writes_nothing(
    rig: Rig, opcode: int, kind: int, block: bytes, status: str
) -> None:
    rig.npu.qt.memset(HEAP, 0x3000, GUARD)
    assert rig.submit(opcode, kind, block) == getattr(hw, "ST_" + status)
    assert rig.npu.qt.memread(HEAP, 0x3000) == bytes([GUARD]) * 0x3000


BAD_SCALES: dict[str, Callable[[], list[float]]] = {
    "zero": lambda: [0.5, 0.0, 1.0, 2.0],
    "negative-zero": lambda: [-0.0, 1.0, 1.0, 1.0],
    "negative": lambda: [0.5, 0.5, 0.5, -0.25],
    "inf": lambda: [float("inf"), 1.0, 1.0, 1.0],
    "nan": lambda: [1.0, float("nan"), 1.0, 1.0],
}


@pytest.mark.parametrize("values", BAD_SCALES.values(), ids=BAD_SCALES.keys())
def test_requant_scale_values_not_finite_positive_fail_with_bad_quant(
    rig: Rig, values: Callable[[], list[float]]
) -> None:
    acc = Operand(INT32, (2, 4))
    acc.buf = np.arange(8, dtype=np.int64)
    scale = f32_operand(values(), (1, 4))
    out = Operand(INT8, (2, 4))
    rig.place([acc, scale, out])
    block = tensor_params([op.desc() for op in (acc, scale, out)], [0])
    assert rig.submit(hw.OP_REQUANT, 0, block) == hw.ST_BAD_QUANT
    assert rig.read(out.va, out.nbytes) == bytes([GUARD]) * out.nbytes


def test_requant_ignores_scale_memory_it_does_not_read(rig: Rig) -> None:
    """A broadcast scale (stride 0) reads one element; the rest may hold anything."""
    acc = Operand(INT32, (3, 4))
    acc.buf = np.arange(12, dtype=np.int64) * 100
    scale = f32_operand([0.25, float("nan")], (3, 4), strides=(0, 0))
    scale.buf = scale.buf[:1]
    run_requant(rig, NONE, acc, scale, 0)


def test_caps_report_quant(rig: Rig) -> None:
    assert rig.npu.rd(hw.REG_CAPS) & hw.CAP_QUANT
