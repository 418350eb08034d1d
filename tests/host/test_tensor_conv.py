"""CONV2D and POOL2D: builders, the Python twin of the C checks, and the Tensor API
(npu.conv2d, npu.max_pool2d, npu.avg_pool2d, npu.global_avg_pool2d) end to end
through CpuBackend, which executes the ops with numpy.

The reference here is an independent im2col + matmul in float64 (the fake
driver sums one tensordot per kernel tap). Tolerances: the CPU backend
computes in float64 and rounds once to the output dtype, and the reference
rounds the inputs the same way, so they only cover the output rounding:
float32 rtol 1e-5, float16 2e-3, bfloat16 1e-2 (atol the same, scaled by
sqrt(C/groups * KH * KW)).
"""

from __future__ import annotations

import errno
import itertools
import math
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import npu
from npu import _abi, ops
from npu.hal import CpuBackend
from npu.hal.cpu import CPU_CAPS
from test_tensor import PUBLIC, REPO, FakeBuf, _as_params, _c_check, flush, host, rand, waits

D = npu.DType
A = npu.ActKind
P = npu.PoolKind
FLOATS = [D.FP32, D.FP16, D.BF16]
TOL = {D.FP32: 1e-5, D.FP16: 2e-3, D.BF16: 1e-2}


pytestmark = pytest.mark.usefixtures("default_device")


def act_ref(y: np.ndarray[Any, Any], act: str | None) -> np.ndarray[Any, Any]:
    if act == "relu":
        return np.maximum(y, 0)
    if act == "gelu":
        erf = np.vectorize(math.erf, otypes=[np.float64])
        out: np.ndarray[Any, Any] = y * (1 + erf(y / math.sqrt(2))) / 2
        return out
    return y


def conv_ref(
    x: np.ndarray[Any, Any],
    w: np.ndarray[Any, Any],
    b: np.ndarray[Any, Any] | None = None,
    stride: tuple[int, int] = (1, 1),
    padding: tuple[int, int] = (0, 0),
    dilation: tuple[int, int] = (1, 1),
    groups: int = 1,
) -> np.ndarray[Any, Any]:
    """conv2d by im2col + matmul in float64."""
    x, w = x.astype(np.float64), w.astype(np.float64)
    n, c, h, wd = x.shape
    o, cg, kh, kw = w.shape
    (sh, sw), (ph, pw), (dh, dw) = stride, padding, dilation
    oh = (h + 2 * ph - dh * (kh - 1) - 1) // sh + 1
    ow = (wd + 2 * pw - dw * (kw - 1) - 1) // sw + 1
    xp = np.pad(x, ((0, 0), (0, 0), (ph, ph), (pw, pw)))
    cols = np.empty((n, c, kh, kw, oh, ow))
    for i in range(kh):
        for j in range(kw):
            cols[:, :, i, j] = xp[:, :, i * dh : i * dh + sh * (oh - 1) + 1 : sh,
                                  j * dw : j * dw + sw * (ow - 1) + 1 : sw]  # fmt: skip
    og = o // groups
    y = np.empty((n, o, oh, ow))
    for g in range(groups):
        col = cols[:, g * cg : (g + 1) * cg].reshape(n, cg * kh * kw, oh * ow)
        wm = w[g * og : (g + 1) * og].reshape(og, cg * kh * kw)
        y[:, g * og : (g + 1) * og] = (wm @ col).reshape(n, og, oh, ow)
    if b is not None:
        y += b.astype(np.float64).reshape(1, o, 1, 1)
    return y


def pool_ref(
    x: np.ndarray[Any, Any],
    kind: str,
    k: tuple[int, int],
    s: tuple[int, int],
    p: tuple[int, int],
    count_pad: bool = True,
) -> np.ndarray[Any, Any]:
    """max/avg pooling with explicit loops over the output (float64)."""
    x = x.astype(np.float64)
    n, c, h, w = x.shape
    oh, ow = (h + 2 * p[0] - k[0]) // s[0] + 1, (w + 2 * p[1] - k[1]) // s[1] + 1
    y = np.empty((n, c, oh, ow))
    for i, j in itertools.product(range(oh), range(ow)):
        r0, c0 = i * s[0] - p[0], j * s[1] - p[1]
        win = x[:, :, max(r0, 0) : r0 + k[0], max(c0, 0) : c0 + k[1]]
        if kind == "max":
            y[:, :, i, j] = win.max(axis=(2, 3))
        else:
            div = k[0] * k[1] if count_pad else win.shape[2] * win.shape[3]
            y[:, :, i, j] = win.sum(axis=(2, 3)) / div
    return y


def close(t: npu.Tensor, ref: np.ndarray[Any, Any], dt: D, terms: int = 1) -> None:
    got = t.numpy().astype(np.float64)
    assert got.shape == ref.shape
    scale = math.sqrt(terms)
    np.testing.assert_allclose(got, ref, rtol=TOL[dt], atol=TOL[dt] * scale)


# -- ABI helpers and the C twin -----------------------------------------------------


def test_window_out_matches_the_formula() -> None:
    assert ops.window_out(5, 3, 1, 1) == 5
    assert ops.window_out(7, 3, 2, 0, 2) == 2
    assert ops.window_out(2, 3, 1, 0) == 0
    assert ops.window_out(4, 0, 1, 0) == 0 and ops.window_out(4, 1, 0, 0) == 0


def test_builders_pack_params_and_kind() -> None:
    buf = FakeBuf(3, 1 << 20)
    x = ops.tensor_ref(buf, D.FP16, (2, 4, 9, 9))
    w = ops.tensor_ref(buf, D.FP16, (6, 2, 3, 3))
    b = ops.tensor_ref(buf, D.FP16, (1, 6, 1, 1))
    out = ops.tensor_ref(buf, D.FP16, (2, 6, 4, 5))
    op = ops.conv2d_op(x, w, b, out, (2, 2), (0, 1), 1, 2, A.GELU)
    raw = op.pack()
    assert raw.opcode == _abi.NPU_OP_CONV2D and raw.kind == _abi.NPU_ACT_GELU
    assert list(raw.params) == [2, 2, 0, 1, 1, 1, 2] + [0] * 5
    assert "CONV2D.GELU" in str(op)
    pooled = ops.tensor_ref(buf, D.FP16, (2, 4, 5, 5))
    pop = ops.pool2d_op(P.AVG, x, pooled, 3, 2, 1, count_include_pad=False)
    assert list(pop.pack().params) == [3, 3, 2, 2, 1, 1, 0] + [0] * 5
    assert pop.pack().kind == _abi.NPU_POOL_AVG and "POOL2D.AVG" in str(pop)
    assert ops.pool2d_op(P.MAX, x, ops.tensor_ref(buf, D.FP16, (2, 4, 3, 3)), 3).params[2:4] == (
        3,
        3,
    )
    with pytest.raises(ValueError, match="stride"):
        ops.conv2d_op(x, w, b, out, 0, 0, 1, 2)
    with pytest.raises(ValueError, match="output shape"):
        ops.conv2d_op(x, w, b, out, 1, 0, 1, 2)
    with pytest.raises(ValueError, match="groups"):
        ops.conv2d_op(x, w, b, out, (2, 2), (0, 1), 1, 1)
    with pytest.raises(ValueError, match="below the window span"):
        ops.pool2d_op(P.MAX, x, pooled, 3, 2, 3)


def test_python_check_agrees_with_the_header_for_conv2d_and_pool2d() -> None:
    buf = FakeBuf(1, 1 << 24)
    ins = [(1, 4, 6, 6), (2, 4, 5, 7), (2, 2, 6, 6), (4, 6, 6)]
    weights = [(4, 4, 3, 3), (4, 2, 3, 3), (4, 1, 1, 1), (6, 2, 2, 3), (4, 4, 1, 3), (4, 3, 3)]
    biases = [(1, 4, 1, 1), (1, 6, 1, 1), (4, 1, 1, 1), (4,)]
    outs = [(1, 4, 4, 4), (1, 4, 6, 6), (2, 4, 3, 5), (2, 4, 5, 7), (1, 4, 2, 2), (2, 6, 2, 3),
            (1, 4, 3, 3), (2, 4, 2, 3), (2, 2, 3, 3), (1, 4, 5, 6), (2, 4, 4, 6)]  # fmt: skip
    paramsets = [(1, 1, 0, 0, 1, 1, 1), (1, 1, 1, 1, 1, 1, 1), (2, 2, 0, 0, 1, 1, 1),
                 (1, 1, 0, 0, 2, 2, 1), (1, 1, 0, 0, 1, 1, 2), (1, 1, 0, 0, 1, 1, 4),
                 (0, 1, 0, 0, 1, 1, 1), (1, 1, 0, 0, 0, 1, 1), (1, 1, 0, 0, 1, 1, 0),
                 (1, 1, 65536, 0, 1, 1, 1), (2, 1, 1, 0, 1, 2, 2),
                 (1, 1, 0, 0, 1, 1, 3)]  # fmt: skip
    candidates: list[ops.TensorOp] = []
    for dt in (D.FP32, D.BF16):
        for x, w, b, o, p in itertools.product(ins, weights, biases, outs, paramsets):
            refs = tuple(ops.tensor_ref(buf, dt, s) for s in (x, w, b, o))
            candidates.append(ops.TensorOp(npu.Opcode.CONV2D, 1, refs, (), p))
    base = [ops.tensor_ref(buf, D.FP32, s) for s in ((1, 4, 6, 6), (4, 4, 3, 3), (1, 4, 1, 1))]
    good_out = ops.tensor_ref(buf, D.FP32, (1, 4, 4, 4))
    conv_p = (1, 1, 0, 0, 1, 1, 1)
    for kind in range(_abi.NPU_ACT_COUNT + 1):
        candidates.append(ops.TensorOp(npu.Opcode.CONV2D, kind, (*base, good_out), (), conv_p))
    for i in range(3):  # one operand of another dtype / int dtypes
        mixed = list(base)
        mixed[i] = ops.tensor_ref(buf, D.FP16, base[i].shape)
        candidates.append(ops.TensorOp(npu.Opcode.CONV2D, 0, (*mixed, good_out), (), conv_p))
    ints = [ops.tensor_ref(buf, D.INT8, r.shape) for r in (*base, good_out)]
    candidates.append(ops.TensorOp(npu.Opcode.CONV2D, 0, tuple(ints), (), conv_p))
    strided = ops.tensor_ref(buf, D.FP32, (1, 4, 4, 4), (64, 1, 4, 16))
    candidates.append(ops.TensorOp(npu.Opcode.CONV2D, 0, (*base, strided), (), conv_p))
    candidates.append(
        ops.TensorOp(npu.Opcode.CONV2D, 0, (strided, *base[1:], good_out), (), conv_p)
    )
    candidates.append(ops.TensorOp(npu.Opcode.CONV2D, 0, (*base, good_out), (), (*conv_p, 1)))
    pool_outs = [(1, 4, 6, 6), (1, 4, 3, 3), (1, 4, 2, 2), (1, 4, 4, 4), (2, 4, 2, 3), (1, 4, 5, 5),
                 (1, 4, 1, 1), (2, 4, 3, 4), (1, 2, 3, 3), (4, 6, 6), (2, 4, 3, 3), (2, 4, 2, 4),
                 (2, 2, 3, 3), (2, 4, 1, 2)]  # fmt: skip
    pool_p = [(3, 3, 1, 1, 1, 1, 0), (2, 2, 2, 2, 0, 0, 1), (3, 3, 2, 2, 0, 0, 0),
              (3, 3, 3, 3, 1, 1, 1), (2, 3, 2, 2, 1, 1, 1), (3, 3, 1, 1, 3, 0, 0),
              (0, 3, 1, 1, 0, 0, 0), (3, 3, 0, 1, 0, 0, 0), (6, 6, 1, 1, 0, 0, 1),
              (2, 2, 2, 2, 0, 0, 2), (2, 2, 1, 1, 1, 1, 0), (7, 7, 1, 1, 0, 0, 0),
              (3, 2, 3, 2, 2, 1, 1),
              # NPU_POOL_F_GEOMETRY (2) and NPU_POOL_F_CEIL (4): end pads, dilations
              (3, 3, 2, 2, 0, 0, 2, 1, 1, 1, 1), (3, 3, 2, 2, 0, 0, 6, 0, 0, 1, 1),
              (3, 3, 2, 2, 1, 1, 7, 1, 1, 1, 1), (2, 2, 1, 1, 0, 0, 2, 0, 0, 2, 2),
              (2, 2, 1, 1, 2, 0, 2, 0, 0, 2, 1), (2, 2, 1, 1, 3, 0, 2, 0, 0, 2, 1),
              (2, 2, 2, 2, 0, 0, 6, 1, 0, 1, 1), (3, 3, 2, 2, 0, 0, 4),
              (3, 3, 1, 1, 0, 0, 0, 1), (3, 3, 1, 1, 0, 0, 2, 0, 0, 0, 1),
              (1, 1, 2, 2, 0, 0, 6, 0, 0, 1, 1), (3, 3, 2, 2, 0, 0, 10, 0, 0, 1, 1)]  # fmt: skip
    for dt in (D.FP32, D.FP16, D.INT32):
        for x, o, p in itertools.product(ins, pool_outs, pool_p):
            for kind in (0, 1):
                refs = (ops.tensor_ref(buf, dt, x), ops.tensor_ref(buf, dt, o))
                candidates.append(ops.TensorOp(npu.Opcode.POOL2D, kind, refs, (), p))
    pin, pout = ops.tensor_ref(buf, D.FP32, (1, 4, 6, 6)), ops.tensor_ref(buf, D.FP32, (1, 4, 3, 3))
    for kind in range(_abi.NPU_POOL_COUNT + 1):
        candidates.append(ops.TensorOp(npu.Opcode.POOL2D, kind, (pin, pout), (), (2,) * 4))
    pout16 = ops.tensor_ref(buf, D.FP16, (1, 4, 3, 3))
    candidates.append(ops.TensorOp(npu.Opcode.POOL2D, 0, (pin, pout16), (), (2,) * 4))
    python_ok = []
    for op in candidates:
        try:
            ops.check_tensor_op(op)
            python_ok.append(True)
        except ValueError:
            python_ok.append(False)
    statuses = _c_check([(int(op.opcode), op.kind, _as_params(op)) for op in candidates])
    mismatches = [
        str(op)
        for op, st, ok in zip(candidates, statuses, python_ok, strict=True)
        if (st == _abi.NPU_ST_OK) != ok
    ]
    assert not mismatches, mismatches[:5]
    conv_ok = sum(ok for op, ok in zip(candidates, python_ok, strict=True) if op.opcode == 12)
    pool_ok = sum(ok for op, ok in zip(candidates, python_ok, strict=True) if op.opcode == 13)
    assert conv_ok >= 20 and pool_ok >= 20, (conv_ok, pool_ok)
    assert not all(python_ok)


def test_tensor_op_supported_agrees_with_the_header() -> None:
    gcc = shutil.which("gcc")
    if gcc is None:
        pytest.fail("gcc is not installed (scripts/deps.sh installs build-essential)")
    src = r"""
#include <stdio.h>
#include <linux/types.h>
#include "npu_tensor.h"
int main(void) {
    for (unsigned op = 0; op < 20; op++)
        for (unsigned caps = 0; caps < 1024; caps += 64)
            printf("%d\n", npu_tensor_op_supported(op, caps));
    for (unsigned op = 0; op < 20; op++)
        for (unsigned flags = 0; flags < 8; flags++) {
            __u32 params[NPU_TENSOR_PARAMS] = { [NPU_POOL_P_FLAGS] = flags };
            struct npu_hw_tensor out = { .ndim = 1, .shape = { 4 }, .strides = { 1 } };
            printf("%u\n", npu_tensor_op_features(op, 0, params, &out));
            params[NPU_POOL_P_FLAGS] = 0;
            params[NPU_CONV_P_FLAGS] = flags;
            printf("%u\n", npu_tensor_op_features(op, 0, params, &out));
            params[NPU_CONV_P_FLAGS] = 0;
            printf("%u\n", npu_tensor_op_features(op, flags, params, &out));
        }
    return 0;
}
"""
    with tempfile.TemporaryDirectory() as tmp:
        c, exe = Path(tmp) / "sup.c", Path(tmp) / "sup"
        c.write_text(src)
        subprocess.run(
            [gcc, "-std=gnu11", "-Wall", "-I", str(REPO / "include"), "-o", str(exe), str(c)],
            check=True,
            capture_output=True,
        )
        out = subprocess.run([str(exe)], check=True, capture_output=True).stdout
    words = [int(v) for v in out.split()]
    want, want_features = [bool(v) for v in words[: 20 * 16]], words[20 * 16 :]
    got = [ops.tensor_op_supported(op, caps) for op in range(20) for caps in range(0, 1024, 64)]
    assert got == want and any(got)
    features = [
        ops.tensor_op_features(op, params, kind=kind)
        for op in range(20)
        for flags in range(8)
        for params, kind in (
            ((0,) * _abi.NPU_POOL_P_FLAGS + (flags,) + (0,) * 9, 0),
            ((0,) * _abi.NPU_CONV_P_FLAGS + (flags,) + (0,) * 7, 0),
            ((0,) * 16, flags),
        )
    ]
    assert features == want_features and _abi.NPU_CAP_POOL_GEOMETRY in features
    assert _abi.NPU_CAP_CONV_ACCUMULATE in features and _abi.NPU_CAP_ACT_RELU6 in features


def test_an_accumulating_conv2d_needs_a_float_output_and_the_cap() -> None:
    i8 = _abi.DType.INT8
    x = ops.tensor_ref(FakeBuf(1, 1 << 20), i8, (1, 2, 4, 4))
    w = ops.tensor_ref(FakeBuf(1, 1 << 20), i8, (3, 2, 3, 3))
    b = ops.tensor_ref(FakeBuf(1, 1 << 20), _abi.DType.INT32, (1, 3, 1, 1))
    out = ops.tensor_ref(FakeBuf(1, 1 << 20), _abi.DType.INT32, (1, 3, 2, 2))
    with pytest.raises(ValueError, match="accumulate=True needs a float output"):
        ops.conv2d_op(x, w, b, out, accumulate=True)
    f32 = _abi.DType.FP32
    xf, wf, bf, of = (ops.tensor_ref(FakeBuf(1, 1 << 20), f32, t.shape) for t in (x, w, b, out))
    op = ops.conv2d_op(xf, wf, bf, of, accumulate=True)
    assert op.params[_abi.NPU_CONV_P_FLAGS] == _abi.NPU_CONV_F_ACCUMULATE
    assert ops.tensor_op_features(op.opcode, op.params) == _abi.Cap.CONV_ACCUMULATE


def test_an_accumulating_conv2d_on_a_device_without_the_cap_fails_with_eopnotsupp() -> None:
    caps = CPU_CAPS & ~_abi.NPU_INFO_CAP_CONV_ACCUMULATE
    with npu.Device(CpuBackend(caps=caps)) as dev:
        x = npu.tensor(np.ones((1, 2, 4, 4), np.float32), device=dev)
        w = npu.tensor(np.ones((3, 2, 3, 3), np.float32), device=dev)
        b = npu.tensor(np.ones((1, 3, 1, 1), np.float32), device=dev)
        y = npu.empty((1, 3, 2, 2), device=dev)
        bufs = tuple(t.buffer for t in (x, w, b, y))
        refs = [t.tensor_ref() for t in (x, w, b, y)]
        op = ops.conv2d_op(*refs, buffers=bufs, accumulate=True)  # type: ignore[arg-type]
        with pytest.raises(npu.NpuError) as info:
            dev.submit([op])
        assert info.value.errno == errno.EOPNOTSUPP


# -- npu.conv2d ---------------------------------------------------------------------------


@pytest.mark.parametrize("act", [None, "relu", "gelu"])
@pytest.mark.parametrize("with_bias", [False, True])
@pytest.mark.parametrize("dt", FLOATS)
def test_conv2d_matches_im2col(dt: D, with_bias: bool, act: str | None) -> None:
    x, w, b = rand((2, 3, 7, 6), 1), rand((4, 3, 3, 3), 2), rand((4,), 3)
    tx, tw = npu.tensor(x, PUBLIC[dt]), npu.tensor(w, PUBLIC[dt])
    tb = npu.tensor(b, PUBLIC[dt]) if with_bias else None
    y = npu.conv2d(tx, tw, tb, padding=1, activation=act)
    assert y.npu_dtype is dt and y.shape == (2, 4, 7, 6)
    ref = conv_ref(host(dt, x), host(dt, w), host(dt, b) if with_bias else None, padding=(1, 1))
    close(y, act_ref(ref, act), dt, 27)


@pytest.mark.parametrize(
    ("xs", "ws", "kw"),
    [
        ((1, 4, 9, 9), (6, 4, 1, 1), {}),
        ((2, 4, 9, 11), (6, 4, 5, 5), {"padding": 2}),
        ((1, 4, 10, 9), (2, 4, 3, 3), {"stride": 2}),
        ((1, 4, 10, 9), (2, 4, 3, 3), {"stride": (2, 3), "padding": (1, 0)}),
        ((1, 2, 11, 12), (3, 2, 3, 3), {"dilation": 2, "padding": 2}),
        ((1, 2, 11, 12), (3, 2, 3, 2), {"dilation": (2, 3)}),
        ((3, 6, 7, 7), (4, 3, 3, 3), {"groups": 2, "padding": 1}),
        ((2, 8, 7, 5), (8, 1, 3, 3), {"groups": 8, "padding": 1}),  # depthwise
        ((2, 4, 7, 5), (8, 1, 3, 3), {"groups": 4, "stride": 2}),  # depthwise, multiplier 2
        ((1, 3, 5, 5), (2, 3, 5, 5), {}),  # 1x1 output
    ],
)
def test_conv2d_geometry(xs: Any, ws: Any, kw: dict[str, Any]) -> None:
    x, w, b = rand(xs, 4), rand(ws, 5), rand((ws[0],), 6)
    y = npu.conv2d(x, w, b, **kw)

    def two(v: Any) -> tuple[int, int]:
        return (v, v) if isinstance(v, int) else tuple(v)

    ref = conv_ref(
        x,
        w,
        b,
        two(kw.get("stride", 1)),
        two(kw.get("padding", 0)),
        two(kw.get("dilation", 1)),
        kw.get("groups", 1),
    )
    close(y, ref, D.FP32, ws[1] * ws[2] * ws[3])


def test_conv2d_reads_strided_input_and_unbatched() -> None:
    x, w = rand((2, 5, 6, 3), 7), rand((4, 3, 3, 3), 8)
    t = npu.tensor(x).permute(0, 3, 1, 2)  # NHWC storage viewed as NCHW
    assert not t.is_contiguous
    close(
        npu.conv2d(t, w, padding=1),
        conv_ref(x.transpose(0, 3, 1, 2), w, padding=(1, 1)),
        D.FP32,
        27,
    )
    y = npu.conv2d(x[0].transpose(2, 0, 1), w)
    assert y.shape == (4, 3, 4)
    close(y, conv_ref(x[:1].transpose(0, 3, 1, 2), w)[0], D.FP32, 27)


def test_conv2d_zero_bias_is_cached_per_device_channels_and_dtype(driver: CpuBackend) -> None:
    def bias_at() -> tuple[int, int]:
        flush()
        ref = driver.submitted_tensor[-1].t[2]
        return (ref.handle, ref.offset)  # tensors share segments: the place is both

    x, w = npu.tensor(rand((1, 2, 4, 4), 1)), npu.tensor(rand((3, 2, 1, 1), 2))
    y1 = npu.conv2d(x, w)
    flush()
    first = driver.submitted_tensor[-1].t[2]
    assert tuple(first.shape) == (1, 3, 1, 1) and tuple(first.strides) == (0, 1, 0, 0)
    cached = bias_at()
    y2 = npu.conv2d(x, w, activation="relu")
    assert bias_at() == cached  # cached, not re-uploaded
    np.testing.assert_allclose(np.maximum(y1.numpy(), 0), y2.numpy())
    npu.conv2d(x.astype(np.float16), w.astype(np.float16))
    assert bias_at() != cached  # another dtype
    npu.conv2d(x, npu.tensor(rand((5, 2, 1, 1), 3)))
    assert bias_at() != cached  # another O
    npu.conv2d(x, w)
    assert bias_at() == cached


def test_conv2d_promotes_to_a_common_float_dtype() -> None:
    x, w = rand((1, 2, 5, 5), 1), rand((2, 2, 3, 3), 2)
    y = npu.conv2d(npu.tensor(x, np.float16), npu.tensor(w, npu.bfloat16))
    assert y.dtype == np.float32
    y = npu.conv2d(npu.tensor(x, np.float16), w.astype(np.float16), npu.tensor([1, 2], np.int8))
    assert y.dtype == np.float16
    xi = np.arange(50, dtype=np.int32).reshape(1, 2, 5, 5)
    y = npu.conv2d(xi, np.ones((1, 2, 3, 3), np.int8))
    assert y.dtype == np.float32
    close(y, conv_ref(xi, np.ones((1, 2, 3, 3))), D.FP32, 18)


def test_conv2d_submits_without_waiting_and_chains(driver: CpuBackend) -> None:
    x, w = rand((2, 3, 8, 8), 1), rand((4, 3, 3, 3), 2)
    tx, tw = npu.tensor(x), npu.tensor(w)
    before = waits(driver)
    y = npu.max_pool2d(npu.conv2d(tx, tw, padding=1, activation="relu"), 2)
    z = npu.global_avg_pool2d(y)
    assert waits(driver) == before
    ref = pool_ref(np.maximum(conv_ref(x, w, padding=(1, 1)), 0), "max", (2, 2), (2, 2), (0, 0))
    close(y, ref, D.FP32, 27)
    close(z, ref.mean(axis=(2, 3), keepdims=True), D.FP32, 27)


def test_conv2d_errors() -> None:
    x, w = rand((1, 4, 5, 5), 1), rand((2, 4, 3, 3), 2)
    with pytest.raises(ValueError, match="groups"):
        npu.conv2d(x, w, groups=3)
    with pytest.raises(ValueError, match="groups"):
        npu.conv2d(x, rand((3, 2, 3, 3), 3), groups=2)  # O not divisible
    with pytest.raises(ValueError, match="at least 1"):
        npu.conv2d(x, w, stride=0)
    with pytest.raises(ValueError, match="at least 0"):
        npu.conv2d(x, w, padding=-1)
    with pytest.raises(ValueError, match="does not fit"):
        npu.conv2d(x, w, dilation=3)
    with pytest.raises(ValueError, match="bias shape"):
        npu.conv2d(x, w, np.zeros(3))
    with pytest.raises(ValueError, match="activation"):
        npu.conv2d(x, w, activation="tanh")
    with pytest.raises(ValueError, match="weight must be"):
        npu.conv2d(x, w[0])
    with pytest.raises(ValueError, match="input must be"):
        npu.conv2d(x[0, 0], w)
    with pytest.raises(ValueError, match="pair"):
        npu.conv2d(x, w, stride=(1, 1, 1))
    with pytest.raises(TypeError):
        npu.conv2d(x, w, stride=1.5)  # type: ignore[arg-type]


def test_conv2d_of_empty_batch_and_zero_channels() -> None:
    y = npu.conv2d(np.zeros((0, 2, 5, 5), np.float32), rand((3, 2, 3, 3), 1))
    assert y.shape == (0, 3, 3, 3)
    b = np.array([1.0, -2.0], np.float32)
    y = npu.conv2d(np.zeros((1, 0, 4, 4), np.float32), np.zeros((2, 0, 3, 3), np.float32), b,
                   activation="relu")  # fmt: skip
    np.testing.assert_array_equal(
        y.numpy(), np.broadcast_to(np.maximum(b, 0).reshape(1, 2, 1, 1), (1, 2, 2, 2))
    )


# -- pooling --------------------------------------------------------------------------------


@pytest.mark.parametrize("dt", FLOATS)
@pytest.mark.parametrize(
    ("k", "s", "p"),
    [
        ((2, 2), None, (0, 0)),
        ((3, 3), (2, 2), (1, 1)),
        ((3, 2), (1, 2), (1, 0)),
        ((5, 5), (3, 3), (2, 2)),
    ],
)
def test_pools_match_loops(dt: D, k: Any, s: Any, p: Any) -> None:
    x = rand((2, 3, 9, 8), 9)
    t = npu.tensor(x, PUBLIC[dt])
    xs = host(dt, x)
    stride = k if s is None else s
    close(npu.max_pool2d(t, k, s, p), pool_ref(xs, "max", k, stride, p), dt)
    for cip in (True, False):
        ref = pool_ref(xs, "avg", k, stride, p, cip)
        close(npu.avg_pool2d(t, k, s, p, count_include_pad=cip), ref, dt)


def test_count_include_pad_makes_a_difference() -> None:
    x = np.ones((1, 1, 4, 4), np.float32)
    with_pad = npu.avg_pool2d(x, 3, 1, 1).numpy()
    without = npu.avg_pool2d(x, 3, 1, 1, count_include_pad=False).numpy()
    assert with_pad[0, 0, 0, 0] == pytest.approx(4 / 9)
    np.testing.assert_allclose(without, 1.0)
    m = npu.max_pool2d(-np.ones((1, 1, 4, 4), np.float32), 3, 1, 1).numpy()
    np.testing.assert_array_equal(m, -1.0)  # padding never wins a max


def test_global_avg_pool_and_int_inputs() -> None:
    x = rand((2, 5, 7, 3), 3)
    g = npu.global_avg_pool2d(x)
    assert g.shape == (2, 5, 1, 1)
    close(g, x.astype(np.float64).mean(axis=(2, 3), keepdims=True), D.FP32)
    g3 = npu.global_avg_pool2d(x[0])
    assert g3.shape == (5, 1, 1)
    xi = np.arange(32, dtype=np.int32).reshape(1, 2, 4, 4)
    m = npu.max_pool2d(xi, 2)
    assert m.dtype == np.float32
    close(m, pool_ref(xi, "max", (2, 2), (2, 2), (0, 0)), D.FP32)


def test_pool_errors() -> None:
    x = rand((1, 2, 5, 5), 1)
    with pytest.raises(ValueError, match="smaller than the window"):
        npu.max_pool2d(x, 2, padding=2)
    with pytest.raises(ValueError, match="does not fit"):
        npu.avg_pool2d(x, 6)
    with pytest.raises(ValueError, match="at least 1"):
        npu.avg_pool2d(x, 2, stride=0)
    with pytest.raises(ValueError, match="input must be"):
        npu.max_pool2d(x[0, 0], 2)
    with pytest.raises(ValueError, match="input must be"):
        npu.global_avg_pool2d(x[0, 0])


# -- the CPU backend's checks and caps ------------------------------------------------------------


def test_cpu_backend_rejects_bad_conv_with_einval(device: npu.Device) -> None:
    x = npu.tensor(rand((1, 2, 5, 5), 1))
    w = npu.tensor(rand((2, 2, 3, 3), 2))
    y = npu.conv2d(x, w)
    assert x.buffer is not None and y.buffer is not None
    good = ops.pool2d_op(P.MAX, x.tensor_ref(), ops.tensor_ref(y.buffer, D.FP32, (1, 2, 2, 2)), 2)
    device.submit([good])
    bad = ops.TensorOp(npu.Opcode.POOL2D, 0, good.operands, good.buffers, (2, 2, 2, 2, 2, 0, 0))
    with pytest.raises(npu.NpuError) as info:
        device.submit([bad])
    assert info.value.errno == 22


def test_device_without_cap_conv() -> None:
    caps = 0x1F | _abi.NPU_INFO_CAP_TENSOR | _abi.NPU_INFO_CAP_REDUCE | _abi.NPU_INFO_CAP_MATMUL
    with npu.Device(CpuBackend(caps=caps)) as dev:
        x = npu.tensor(rand((1, 1, 4, 4), 1), device=dev)
        with pytest.raises(ValueError, match=r"Cap\.CONV"):
            npu.conv2d(x, npu.tensor(rand((1, 1, 3, 3), 2), device=dev))
        with pytest.raises(ValueError, match=r"Cap\.CONV"):
            npu.max_pool2d(x, 2)
        assert x.buffer is not None
        op = ops.TensorOp(
            npu.Opcode.POOL2D,
            0,
            (x.tensor_ref(), ops.tensor_ref(x.buffer, D.FP32, (1, 1, 2, 2))),
            (x.buffer,),
            (2, 2, 2, 2, 0, 0, 0),
        )
        with pytest.raises(npu.NpuError) as info:
            dev.submit([op])
        assert info.value.errno == 95  # EOPNOTSUPP


# -- a LeNet-like chain -----------------------------------------------------------------------


def test_lenet_chain_matches_numpy() -> None:
    rng = np.random.default_rng(0)
    x = rng.standard_normal((3, 1, 28, 28)).astype(np.float32)
    w1, b1 = rng.standard_normal((6, 1, 5, 5)).astype(np.float32) * 0.2, rand((6,), 1)
    w2, b2 = rng.standard_normal((16, 6, 5, 5)).astype(np.float32) * 0.1, rand((16,), 2)
    fw, fb = rng.standard_normal((10, 16 * 5 * 5)).astype(np.float32) * 0.05, rand((10,), 3)
    t = npu.conv2d(x, w1, b1, padding=2, activation="relu")
    t = npu.max_pool2d(t, 2)
    t = npu.conv2d(t, w2, b2, activation="relu")
    t = npu.avg_pool2d(t, 2)
    logits = npu.linear(t.reshape(3, -1), fw, fb)
    r = pool_ref(np.maximum(conv_ref(x, w1, b1, padding=(2, 2)), 0), "max", (2, 2), (2, 2), (0, 0))
    r = pool_ref(np.maximum(conv_ref(r, w2, b2), 0), "avg", (2, 2), (2, 2), (0, 0))
    ref = r.reshape(3, -1) @ fw.T.astype(np.float64) + fb
    close(logits, ref, D.FP32, 400)


def test_a_relu6_op_on_a_device_without_the_cap_fails_with_eopnotsupp() -> None:
    caps = CPU_CAPS & ~_abi.NPU_INFO_CAP_ACT_RELU6
    with npu.Device(CpuBackend(caps=caps)) as dev:
        a = npu.tensor(np.ones((4, 4), np.float32), device=dev)
        y = npu.empty((4, 4), device=dev)
        refs = [t.tensor_ref() for t in (a, a, y)]
        op = ops.matmul_op(*refs, _abi.ActKind.RELU6, (a.buffer, y.buffer))  # type: ignore[arg-type]
        with pytest.raises(npu.NpuError) as info:
            dev.submit([op])
        assert info.value.errno == errno.EOPNOTSUPP


def test_relu6_is_refused_for_integer_matmuls() -> None:
    i8, i32 = _abi.DType.INT8, _abi.DType.INT32
    a = ops.tensor_ref(FakeBuf(1, 1 << 20), i8, (4, 4))
    out = ops.tensor_ref(FakeBuf(1, 1 << 20), i32, (4, 4))
    with pytest.raises(ValueError):
        ops.matmul_op(a, a, out, _abi.ActKind.RELU6)
