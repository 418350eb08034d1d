"""CONV2D and POOL2D on the device, through npu.Tensor (npu.conv2d,
npu.max_pool2d, npu.avg_pool2d, npu.global_avg_pool2d) and raw ioctls.

References are numpy in float64 computed from the values the device holds
(inputs already rounded to their dtype). conv2d is im2col + matmul:
``y = act(W @ cols(x) + bias)``. The device accumulates in float32 and
rounds once to the output dtype, so the tolerance is, element by element,

    |got - want| <= rtol * |want| + atol * (conv(|x|, |w|) + |bias|)

with the magnitude term bounding the float32 accumulation error under
cancellation, and per output dtype:

    float32  rtol 1e-5   atol 1e-5
    float16  rtol 1e-3   atol 1e-4   (fp16 has an 11-bit significand: 4.9e-4)
    bfloat16 rtol 8e-3   atol 1e-3   (bf16 has an 8-bit significand: 3.9e-3)

Pooling: max is exact (a selection); avg uses the same rtol with atol times
the mean of |x| over the window. GELU is the exact erf form (math.erf in
the reference, so the GELU cases stay small). Results are created first and
downloaded afterwards, so device work overlaps with the host checks.
"""

from __future__ import annotations

import numpy as np
import pytest
from tensor_helpers import (
    act_ref,
    cap_device,
    mutations_not_rejected,
    raw_bo,
    raw_submit,
    raw_wait,
    rnd,
    upload,
)
from tensor_helpers import check_acc as check

import npu
from npu import _abi, ops

D = npu.DType
A = npu.ActKind
FLOATS = [D.FP32, D.FP16, D.BF16]
ACTS = [None, "relu", "gelu"]


@pytest.fixture(scope="module")
def cdev():
    yield from cap_device(npu.Cap.CONV)


def pair(v):
    return (v, v) if isinstance(v, int) else tuple(v)


def im2col(x, kh, kw, stride, padding, dilation):
    """cols [N, C, KH, KW, OH, OW] of zero-padded x [N, C, H, W] (float64)."""
    (sh, sw), (ph, pw), (dh, dw) = pair(stride), pair(padding), pair(dilation)
    n, c, h, w = x.shape
    oh = (h + 2 * ph - dh * (kh - 1) - 1) // sh + 1
    ow = (w + 2 * pw - dw * (kw - 1) - 1) // sw + 1
    xp = np.zeros((n, c, h + 2 * ph, w + 2 * pw))
    xp[:, :, ph : ph + h, pw : pw + w] = x
    cols = np.empty((n, c, kh, kw, oh, ow))
    for i in range(kh):
        for j in range(kw):
            cols[:, :, i, j] = xp[:, :, i * dh : i * dh + sh * (oh - 1) + 1 : sh,
                                  j * dw : j * dw + sw * (ow - 1) + 1 : sw]  # fmt: skip
    return cols


def conv_ref(x, w, b=None, stride=1, padding=0, dilation=1, groups=1):
    """(y, magnitude) of conv2d(x, w) + b by im2col + matmul per group, float64."""
    o, cg, kh, kw = w.shape
    cols = im2col(x, kh, kw, stride, padding, dilation)
    n, _, _, _, oh, ow = cols.shape
    og = o // groups
    y = np.empty((n, o, oh, ow))
    mag = np.empty((n, o, oh, ow))
    for g in range(groups):
        col = cols[:, g * cg : (g + 1) * cg].reshape(n, cg * kh * kw, oh * ow)
        wm = w[g * og : (g + 1) * og].reshape(og, cg * kh * kw)
        y[:, g * og : (g + 1) * og] = np.matmul(wm, col).reshape(n, og, oh, ow)
        mag[:, g * og : (g + 1) * og] = np.matmul(np.abs(wm), np.abs(col)).reshape(n, og, oh, ow)
    if b is not None:
        y = y + b.reshape(1, o, 1, 1)
        mag = mag + np.abs(b).reshape(1, o, 1, 1)
    return y, mag


def pool_ref(x, kind, k, stride=None, padding=0, count_include_pad=True):
    """(y, magnitude) of max/avg pooling, float64; padding never wins a max."""
    kh, kw = pair(k)
    s = (kh, kw) if stride is None else pair(stride)
    ph, pw = pair(padding)
    n, c, h, w = x.shape
    oh, ow = (h + 2 * ph - kh) // s[0] + 1, (w + 2 * pw - kw) // s[1] + 1
    y, mag = np.empty((n, c, oh, ow)), np.empty((n, c, oh, ow))
    for i in range(oh):
        for j in range(ow):
            r0, c0 = i * s[0] - ph, j * s[1] - pw
            win = x[:, :, max(r0, 0) : r0 + kh, max(c0, 0) : c0 + kw]
            if kind == "max":
                y[:, :, i, j] = win.max(axis=(2, 3))
                mag[:, :, i, j] = 0
            else:
                div = kh * kw if count_include_pad else win.shape[2] * win.shape[3]
                y[:, :, i, j] = win.sum(axis=(2, 3)) / div
                mag[:, :, i, j] = np.abs(win).sum(axis=(2, 3)) / div
    return y, mag


# --------------------------------------------------------------------------
# conv2d: dtypes x activations x bias
# --------------------------------------------------------------------------


@pytest.mark.parametrize("dt", FLOATS)
def test_conv2d_every_dtype_activation_and_bias(cdev, dt):
    rng = np.random.default_rng(1)
    x, hx = upload(rnd(rng, (2, 3, 9, 8)), dt)
    w, hw = upload(rnd(rng, (5, 3, 3, 3)), dt)
    b, hb = upload(rnd(rng, (5,)), dt)
    cases = []
    for act in ACTS:
        for with_bias in (False, True):
            got = npu.conv2d(x, w, b if with_bias else None, padding=1, activation=act)
            cases.append((got, act, with_bias))
    for got, act, with_bias in cases:
        y, mag = conv_ref(hx, hw, hb if with_bias else None, padding=1)
        check(got, act_ref(y, act), mag, dt, f"conv2d {dt.name} act={act} bias={with_bias}")


GEOMETRIES = [
    # (x shape, w shape, kwargs)
    ((2, 4, 9, 9), (6, 4, 1, 1), {}),  # 1x1
    ((1, 3, 12, 10), (4, 3, 3, 3), {}),  # 3x3 valid
    ((2, 3, 11, 13), (4, 3, 5, 5), {"padding": 2}),  # 5x5 same
    ((1, 4, 13, 10), (3, 4, 3, 3), {"stride": 2}),
    ((1, 4, 13, 10), (3, 4, 3, 3), {"stride": (2, 3), "padding": (1, 0)}),
    ((1, 2, 15, 14), (3, 2, 3, 3), {"dilation": 2, "padding": 2}),
    ((1, 2, 15, 14), (3, 2, 3, 2), {"dilation": (2, 3), "stride": (1, 2)}),
    ((3, 6, 7, 7), (4, 3, 3, 3), {"groups": 2, "padding": 1}),
    ((2, 8, 9, 7), (8, 1, 3, 3), {"groups": 8, "padding": 1}),  # depthwise
    ((2, 4, 9, 7), (8, 1, 3, 3), {"groups": 4, "stride": 2}),  # depthwise, multiplier 2
    ((4, 3, 7, 5), (2, 3, 7, 5), {}),  # the kernel covers the input: 1x1 output
    ((3, 5, 17, 1), (7, 5, 3, 1), {"padding": (1, 0)}),  # odd sizes, W = 1
    ((5, 1, 6, 6), (1, 1, 3, 3), {"padding": 65, "stride": 40}),  # padding only
]


@pytest.mark.parametrize("dt", FLOATS)
def test_conv2d_geometries(cdev, dt):
    rng = np.random.default_rng(2)
    cases = []
    for xs, ws, kw in GEOMETRIES:
        x, hx = upload(rnd(rng, xs), dt)
        w, hw = upload(rnd(rng, ws), dt)
        b, hb = upload(rnd(rng, (ws[0],)), dt)
        cases.append((npu.conv2d(x, w, b, **kw), hx, hw, hb, kw, xs, ws))
    for got, hx, hw, hb, kw, xs, ws in cases:
        y, mag = conv_ref(hx, hw, hb, **kw)
        check(got, y, mag, dt, f"conv2d {dt.name} x={xs} w={ws} {kw}")


def test_conv2d_strided_input_unbatched_and_promotion(cdev):
    rng = np.random.default_rng(3)
    xh = rnd(rng, (2, 6, 5, 3))  # NHWC
    x = npu.tensor(xh).permute(0, 3, 1, 2)
    assert not x.is_contiguous
    w, hw = upload(rnd(rng, (4, 3, 3, 3)), D.FP32)
    y, mag = conv_ref(xh.transpose(0, 3, 1, 2).astype(np.float64), hw, padding=1)
    check(npu.conv2d(x, w, padding=1), y, mag, D.FP32, "strided NHWC view")
    one = npu.conv2d(npu.tensor(xh[0].transpose(2, 0, 1).copy()), w)
    y1, mag1 = conv_ref(xh[:1].transpose(0, 3, 1, 2).astype(np.float64), hw)
    check(one, y1[0], mag1[0], D.FP32, "unbatched")
    h16, hw16 = upload(rnd(rng, (1, 3, 6, 6)), D.FP16)
    wb, hwb = upload(rnd(rng, (2, 3, 3, 3)), D.BF16)
    got = npu.conv2d(h16, wb)  # fp16 with bf16 -> float32
    assert got.dtype == np.float32
    y, mag = conv_ref(hw16, hwb)
    check(got, y, mag, D.FP32, "fp16 x bf16")


# --------------------------------------------------------------------------
# pooling
# --------------------------------------------------------------------------

POOLS = [
    # (kernel, stride, padding)
    (2, None, 0),
    (3, 2, 1),
    ((3, 2), (1, 2), (1, 0)),
    (5, 3, 2),
    ((2, 4), 1, (1, 2)),
]


@pytest.mark.parametrize("dt", FLOATS)
def test_pools_every_dtype(cdev, dt):
    rng = np.random.default_rng(4)
    x, hx = upload(rnd(rng, (2, 3, 11, 10)), dt)
    cases = []
    for k, s, p in POOLS:
        cases.append((npu.max_pool2d(x, k, s, p), pool_ref(hx, "max", k, s, p), ("max", k, s, p)))
        for cip in (True, False):
            got = npu.avg_pool2d(x, k, s, p, count_include_pad=cip)
            cases.append((got, pool_ref(hx, "avg", k, s, p, cip), ("avg", k, s, p, cip)))
    g = npu.global_avg_pool2d(x)
    cases.append((g, (hx.mean(axis=(2, 3), keepdims=True),
                      np.abs(hx).mean(axis=(2, 3), keepdims=True)), "global"))  # fmt: skip
    for got, (y, mag), what in cases:
        check(got, y, mag, dt, f"{dt.name} {what}")


def test_count_include_pad_both_ways_and_max_ignores_padding(cdev):
    x = npu.tensor(np.ones((1, 2, 4, 5), np.float32))
    with_pad = npu.avg_pool2d(x, 3, 1, 1).numpy()
    without = npu.avg_pool2d(x, 3, 1, 1, count_include_pad=False).numpy()
    assert with_pad[0, 0, 0, 0] == pytest.approx(4 / 9) and with_pad[0, 0, 1, 1] == 1
    assert with_pad[0, 0, 0, 1] == pytest.approx(6 / 9)
    np.testing.assert_allclose(without, 1.0, rtol=1e-6)
    neg = npu.max_pool2d(npu.tensor(-np.ones((1, 1, 4, 4), np.float32)), 3, 1, 1).numpy()
    np.testing.assert_array_equal(neg, -1.0)
    gl = npu.global_avg_pool2d(npu.tensor(np.arange(24, dtype=np.float32).reshape(2, 3, 4)))
    assert gl.shape == (2, 1, 1)
    np.testing.assert_allclose(gl.numpy().ravel(), [5.5, 17.5], rtol=1e-6)


# --------------------------------------------------------------------------
# A LeNet-like chain
# --------------------------------------------------------------------------


@pytest.mark.parametrize("dt", [D.FP32, D.FP16])
def test_lenet_chain(cdev, dt):
    rng = np.random.default_rng(5)
    n = 4
    x, hx = upload(rng.standard_normal((n, 1, 28, 28)).astype(np.float32), dt)
    w1, hw1 = upload(rng.standard_normal((6, 1, 5, 5)).astype(np.float32) * 0.3, dt)
    b1, hb1 = upload(rnd(rng, (6,), -0.5, 0.5), dt)
    w2, hw2 = upload(rng.standard_normal((16, 6, 5, 5)).astype(np.float32) * 0.1, dt)
    b2, hb2 = upload(rnd(rng, (16,), -0.5, 0.5), dt)
    fw, hfw = upload(rng.standard_normal((10, 400)).astype(np.float32) * 0.05, dt)
    fb, hfb = upload(rnd(rng, (10,), -0.5, 0.5), dt)
    t = npu.conv2d(x, w1, b1, padding=2, activation="relu")
    t = npu.max_pool2d(t, 2)
    t = npu.conv2d(t, w2, b2, activation="relu")
    t = npu.avg_pool2d(t, 2)
    logits = npu.linear(t.reshape(n, -1), fw, fb)
    # Reference in float64 on the device's inputs; each stage's rounding to
    # dt compounds, so the chain gets 4x the single-op tolerance.
    r = np.maximum(conv_ref(hx, hw1, hb1, padding=2)[0], 0)
    r = pool_ref(r, "max", 2)[0]
    r = np.maximum(conv_ref(r, hw2, hb2)[0], 0)
    r = pool_ref(r, "avg", 2)[0]
    r = r.reshape(n, -1)
    want = r @ hfw.T + hfb
    mag = np.abs(r) @ np.abs(hfw.T) + np.abs(hfb)
    got = logits.numpy().astype(np.float64)
    assert got.shape == (n, 10)
    err = np.abs(got - want)
    tol = {D.FP32: 1e-4, D.FP16: 2e-2}[dt]
    assert (err <= tol * (np.abs(want) + mag)).all(), float((err / (np.abs(want) + mag)).max())


# --------------------------------------------------------------------------
# Raw ioctls: bad ops are rejected with EINVAL
# --------------------------------------------------------------------------


@pytest.fixture
def raw(fd):
    return raw_bo(fd, 65536)


def good_ops(bo):
    x = ops.tensor_ref(bo, D.FP32, (2, 4, 8, 8))
    w = ops.tensor_ref(bo, D.FP32, (6, 2, 3, 3), offset=4096)
    b = ops.tensor_ref(bo, D.FP32, (1, 6, 1, 1), offset=8192)
    out = ops.tensor_ref(bo, D.FP32, (2, 6, 4, 4), offset=16384)
    pout = ops.tensor_ref(bo, D.FP32, (2, 4, 4, 4), offset=32768)
    return {
        "conv": ops.conv2d_op(x, w, b, out, 2, 1, 1, 2, A.RELU).pack(),
        "pool": ops.pool2d_op(npu.PoolKind.AVG, x, pout, 3, 2, 1, False).pack(),
    }


def _set(arr, i, v):
    arr[i] = v


def _ints(op, n, dtype=_abi.NPU_DTYPE_INT32):
    for i in range(n):
        op.t[i].dtype = dtype


MUTATIONS = {
    "conv out H wrong": ("conv", lambda op: _set(op.t[3].shape, 2, 5)),
    "conv out W wrong": ("conv", lambda op: _set(op.t[3].shape, 3, 3)),
    "conv out N wrong": ("conv", lambda op: _set(op.t[3].shape, 0, 1)),
    "conv out O wrong": ("conv", lambda op: _set(op.t[3].shape, 1, 4)),
    "conv groups not dividing C": ("conv", lambda op: _set(op.params, 6, 3)),
    "conv groups 4 with C/g weight 2": ("conv", lambda op: _set(op.params, 6, 4)),
    "conv groups 0": ("conv", lambda op: _set(op.params, 6, 0)),
    "conv weight C mismatch": ("conv", lambda op: _set(op.t[1].shape, 1, 4)),
    "conv zero stride_h": ("conv", lambda op: _set(op.params, 0, 0)),
    "conv zero stride_w": ("conv", lambda op: _set(op.params, 1, 0)),
    "conv zero dilation": ("conv", lambda op: _set(op.params, 4, 0)),
    "conv pad above NPU_MAX_PAD": ("conv", lambda op: _set(op.params, 3, _abi.NPU_MAX_PAD + 1)),
    "conv bias O-1": ("conv", lambda op: _set(op.t[2].shape, 1, 5)),
    "conv bias not 1 in N": ("conv", lambda op: _set(op.t[2].shape, 0, 2)),
    "conv bias dtype": ("conv", lambda op: setattr(op.t[2], "dtype", _abi.NPU_DTYPE_FP16)),
    "conv kind past the last": ("conv", lambda op: setattr(op, "kind", _abi.NPU_ACT_COUNT)),
    "conv of int32": ("conv", lambda op: _ints(op, 4)),
    "conv of int8": ("conv", lambda op: _ints(op, 4, _abi.NPU_DTYPE_INT8)),
    "conv params[7]": ("conv", lambda op: _set(op.params, 7, 1)),
    "conv strided out": ("conv", lambda op: _set(op.t[3].strides, 3, 2)),
    "pool pad_h == kernel": ("pool", lambda op: _set(op.params, 4, 3)),
    "pool pad_w > kernel": ("pool", lambda op: _set(op.params, 5, 4)),
    "pool out shape wrong": ("pool", lambda op: _set(op.t[1].shape, 2, 5)),
    "pool channels differ": ("pool", lambda op: _set(op.t[1].shape, 1, 2)),
    "pool zero stride": ("pool", lambda op: _set(op.params, 2, 0)),
    "pool zero kernel": ("pool", lambda op: (_set(op.params, 0, 0), _set(op.params, 4, 0))),
    "pool unknown flag": ("pool", lambda op: _set(op.params, 6, 2)),
    "pool kind 2": ("pool", lambda op: setattr(op, "kind", 2)),
    "pool of int32": ("pool", lambda op: _ints(op, 2)),
    "pool mixed dtypes": ("pool", lambda op: setattr(op.t[1], "dtype", _abi.NPU_DTYPE_BF16)),
    "pool 3rd operand": ("pool", lambda op: setattr(op.t[2], "ndim", 1)),
}


def test_driver_rejects_bad_conv_and_pool_with_einval(cdev, raw):
    fd, bo = raw
    good = good_ops(bo)
    raw_wait(fd, raw_submit(fd, list(good.values())))  # the unmodified ops are accepted
    failures = mutations_not_rejected(fd, good_ops, bo, MUTATIONS)
    assert not failures, failures
    raw_wait(fd, raw_submit(fd, [good["conv"], good["pool"]]))  # the queue still works


def test_runtime_rejects_bad_arguments_before_the_device(cdev):
    x = npu.tensor(np.ones((1, 4, 5, 5), np.float32))
    w = npu.tensor(np.ones((2, 4, 3, 3), np.float32))
    for kwargs, match in (({"groups": 3}, "groups"), ({"stride": 0}, "at least 1"),
                          ({"dilation": 3}, "does not fit")):  # fmt: skip
        with pytest.raises(ValueError, match=match):
            npu.conv2d(x, w, **kwargs)
    with pytest.raises(ValueError, match="smaller than the window"):
        npu.max_pool2d(x, 2, padding=2)
