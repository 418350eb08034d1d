"""int8 MATMUL/LINEAR/CONV2D with int32 accumulation and REQUANT on the device,
through the runtime (npu.matmul of int8 tensors, npu.quantized_matmul,
npu.quantized_linear, npu.quantized_conv2d) and raw ioctls.

Every result must be exact. References are numpy int64:

    acc = (x - input_zero_point) @ w + bias          wrapped to int32
    out = clamp(rint(acc * scale) + output_zero_point, lo, 127)

with lo = -128, or output_zero_point under a ReLU. ``np.rint`` rounds half
to even, as the device does; acc * scale is exact in float64 here because
|acc| < 2^29 (29 + 24 significand bits fit in 53), which ``requant_ref``
asserts.
"""

from __future__ import annotations

import numpy as np
import pytest
from tensor_helpers import cap_device, mutations_not_rejected, raw_bo, raw_submit, raw_wait

import npu
from npu import _abi, ops

D = npu.DType
A = npu.ActKind


@pytest.fixture(scope="module")
def qdev():
    yield from cap_device(npu.Cap.QUANT)


def i8(rng, *shape):
    return rng.integers(-128, 128, shape).astype(np.int8)


def wrap32(x):
    return (np.asarray(x, np.int64) + (1 << 31)) % (1 << 32) - (1 << 31)


def requant_ref(acc, scale, zp, relu=False):
    acc = np.asarray(acc, np.int64)
    assert np.abs(acc).max() < 1 << 29, "float64 product would not be exact"
    q = np.rint(acc * np.asarray(scale, np.float32).astype(np.float64)) + zp
    return np.clip(q, zp if relu else -128, 127).astype(np.int64)


def conv_ref(x, w, stride, pad, groups):
    """Exact integer conv2d, NCHW, zero padding (of x - zp), dilation 1."""
    n, _, h, wd = x.shape
    o, cg, kh, kw = w.shape
    og = o // groups
    xp = np.pad(x.astype(np.int64), ((0, 0), (0, 0), (pad, pad), (pad, pad)))
    oh, ow = (h + 2 * pad - kh) // stride + 1, (wd + 2 * pad - kw) // stride + 1
    out = np.zeros((n, o, oh, ow), np.int64)
    for g in range(groups):
        for i in range(kh):
            for j in range(kw):
                patch = xp[:, g * cg:(g + 1) * cg, i:i + stride * (oh - 1) + 1:stride,
                           j:j + stride * (ow - 1) + 1:stride]  # fmt: skip
                out[:, g * og:(g + 1) * og] += np.einsum(
                    "nchw,oc->nohw", patch, w[g * og:(g + 1) * og, :, i, j].astype(np.int64)
                )  # fmt: skip
    return out


# --------------------------------------------------------------------------
# The runtime API
# --------------------------------------------------------------------------


def test_matmul_of_int8_tensors_is_numpy_exact(qdev):
    rng = np.random.default_rng(1)
    a, b = i8(rng, 2, 5, 300), i8(rng, 300, 7)
    got = npu.tensor(a) @ npu.tensor(b)
    assert got.npu_dtype is D.INT8
    np.testing.assert_array_equal(got.numpy(), a @ b)  # numpy wraps too
    at = i8(rng, 40, 9)
    np.testing.assert_array_equal(npu.matmul(npu.tensor(at).T, npu.tensor(at)).numpy(), at.T @ at)


@pytest.mark.parametrize("relu", [False, True])
@pytest.mark.parametrize("per_channel", [False, True])
def test_quantized_matmul_requant(qdev, per_channel, relu):
    rng = np.random.default_rng([2, per_channel, relu])
    a, b = i8(rng, 3, 17, 64), i8(rng, 64, 24)
    bias = rng.integers(-20000, 20000, 24).astype(np.int32)
    scale = (rng.random(24) * 0.002 + 1e-4).astype(np.float32) if per_channel else 0.00073
    got = npu.quantized_matmul(npu.tensor(a), npu.tensor(b), scale, bias=bias,
                               input_zero_point=-5, output_zero_point=7,
                               activation="relu" if relu else None)  # fmt: skip
    assert got.npu_dtype is D.INT8 and got.shape == (3, 17, 24)
    acc = wrap32((a.astype(np.int64) + 5) @ b + bias)
    np.testing.assert_array_equal(got.numpy(), requant_ref(acc, scale, 7, relu))


def test_quantized_matmul_int32_large_k(qdev):
    """K = 4096 runs as several exact fp32 blocks on the device."""
    rng = np.random.default_rng(3)
    a, b = i8(rng, 16, 4096), i8(rng, 4096, 24)
    a[0] = -128
    b[:, 0] = -128
    got = npu.quantized_matmul(a, b, input_zero_point=127)
    assert got.npu_dtype is D.INT32
    np.testing.assert_array_equal(got.numpy(), (a.astype(np.int64) - 127) @ b)
    relu = npu.quantized_matmul(a, b, bias=np.full(24, -1000, np.int32), activation="relu")
    np.testing.assert_array_equal(relu.numpy(), np.maximum(a.astype(np.int64) @ b - 1000, 0))


def test_quantized_linear_per_channel(qdev):
    rng = np.random.default_rng(4)
    x, w = i8(rng, 8, 96), i8(rng, 40, 96)
    bias = rng.integers(-5000, 5000, 40).astype(np.int32)
    scales = (rng.random(40) * 0.003 + 2e-4).astype(np.float32)
    got = npu.quantized_linear(x, npu.tensor(w), bias, npu.tensor(scales), input_zero_point=12,
                               output_zero_point=-3, activation="relu")  # fmt: skip
    acc = wrap32((x.astype(np.int64) - 12) @ w.T.astype(np.int64) + bias)
    np.testing.assert_array_equal(got.numpy(), requant_ref(acc, scales, -3, True))


@pytest.mark.parametrize("per_channel", [False, True])
def test_quantized_conv2d(qdev, per_channel):
    rng = np.random.default_rng([5, per_channel])
    x, w = i8(rng, 2, 6, 11, 9), i8(rng, 8, 3, 3, 3)
    bias = rng.integers(-3000, 3000, 8).astype(np.int32)
    zp = 25
    acc = wrap32(conv_ref(x.astype(np.int64) - zp, w, 2, 1, 2) + bias.reshape(1, 8, 1, 1))
    raw = npu.quantized_conv2d(x, w, bias, None, 2, 1, 1, 2, input_zero_point=zp)
    np.testing.assert_array_equal(raw.numpy(), acc)
    scale = (rng.random(8) * 0.002 + 1e-4).astype(np.float32) if per_channel else 0.0011
    got = npu.quantized_conv2d(x, w, bias, scale, 2, 1, 1, 2, input_zero_point=zp,
                               output_zero_point=-100, activation="relu")  # fmt: skip
    s = np.asarray(scale, np.float32).reshape(1, -1, 1, 1)
    np.testing.assert_array_equal(got.numpy(), requant_ref(acc, s, -100, True))


def test_bad_scale_values_fail_on_the_device_with_bad_quant(qdev):
    """A scale tensor is not read by the runtime: the device checks its values."""
    a, b = np.ones((2, 3), np.int8), np.ones((3, 4), np.int8)
    scale = npu.tensor(np.array([1.0, -1.0, 1.0, 1.0], np.float32))
    out = npu.quantized_matmul(a, b, scale)
    with pytest.raises(npu.NpuDeviceError) as info:
        out.numpy()
    assert info.value.status == _abi.NPU_ST_BAD_QUANT
    with pytest.raises(ValueError, match="finite and > 0"):  # host values are checked first
        npu.quantized_matmul(a, b, [1.0, 0.0, 1.0, 1.0])
    ok = npu.quantized_matmul(a, b, 0.5)  # the queue still works
    np.testing.assert_array_equal(ok.numpy(), np.full((2, 4), 2))


# --------------------------------------------------------------------------
# Raw ioctls: bad integer ops are rejected with EINVAL
# --------------------------------------------------------------------------


@pytest.fixture
def raw(fd):
    return raw_bo(fd, 16384)


def good_ops(bo):
    a = ops.tensor_ref(bo, D.INT8, (4, 8))
    b = ops.tensor_ref(bo, D.INT8, (8, 6), strides=(1, 8), offset=1024)  # transposed
    bias = ops.tensor_ref(bo, D.INT32, (1, 6), offset=2048)
    acc = ops.tensor_ref(bo, D.INT32, (4, 6), offset=4096)
    scale = ops.tensor_ref(bo, D.FP32, (1, 6), offset=3072)
    out = ops.tensor_ref(bo, D.INT8, (4, 6), offset=8192)
    x = ops.tensor_ref(bo, D.INT8, (1, 2, 5, 5))
    w = ops.tensor_ref(bo, D.INT8, (4, 2, 3, 3), offset=1024)
    cb = ops.tensor_ref(bo, D.INT32, (1, 4, 1, 1), offset=2048)
    cout = ops.tensor_ref(bo, D.INT32, (1, 4, 5, 5), offset=12288)
    return {
        "matmul": ops.matmul_op(a, b, out, A.RELU, input_zero_point=-3).pack(),
        "linear": ops.linear_op(a, b, bias, acc, A.NONE, input_zero_point=3).pack(),
        "conv": ops.conv2d_op(x, w, cb, cout, 1, 1, act=A.RELU, input_zero_point=-128).pack(),
        "requant": ops.requant_op(acc, scale, out, 5, A.RELU).pack(),
    }


def _set(arr, i, v):
    arr[i] = v


MUTATIONS = {
    "matmul zp 128": ("matmul", lambda op: _set(op.params, 0, 128)),
    "matmul zp -129": ("matmul", lambda op: _set(op.params, 0, (-129) & 0xFFFFFFFF)),
    "matmul gelu": ("matmul", lambda op: setattr(op, "kind", A.GELU)),
    "matmul relu6": ("matmul", lambda op: setattr(op, "kind", A.RELU6)),
    "matmul b fp32": ("matmul", lambda op: setattr(op.t[1], "dtype", _abi.NPU_DTYPE_FP32)),
    "matmul out fp16": ("matmul", lambda op: setattr(op.t[2], "dtype", _abi.NPU_DTYPE_FP16)),
    "matmul params[1]": ("matmul", lambda op: _set(op.params, 1, 1)),
    "linear bias int8": ("linear", lambda op: setattr(op.t[2], "dtype", _abi.NPU_DTYPE_INT8)),
    "linear bias fp32": ("linear", lambda op: setattr(op.t[2], "dtype", _abi.NPU_DTYPE_FP32)),
    "linear zp 0x80000000": ("linear", lambda op: _set(op.params, 0, 0x80000000)),
    "conv zp 200": ("conv", lambda op: _set(op.params, 7, 200)),
    "conv gelu": ("conv", lambda op: setattr(op, "kind", A.GELU)),
    "conv relu6": ("conv", lambda op: setattr(op, "kind", A.RELU6)),
    "conv accumulate": ("conv", lambda op: op.params.__setitem__(8, 1)),
    "conv weight int32": ("conv", lambda op: setattr(op.t[1], "dtype", _abi.NPU_DTYPE_INT32)),
    "conv out fp32": ("conv", lambda op: setattr(op.t[3], "dtype", _abi.NPU_DTYPE_FP32)),
    "conv params[8]": ("conv", lambda op: _set(op.params, 8, 1)),
    "requant zp 128": ("requant", lambda op: _set(op.params, 0, 128)),
    "requant gelu": ("requant", lambda op: setattr(op, "kind", A.GELU)),
    "requant acc int8": ("requant", lambda op: setattr(op.t[0], "dtype", _abi.NPU_DTYPE_INT8)),
    "requant scale fp16": ("requant", lambda op: setattr(op.t[1], "dtype", _abi.NPU_DTYPE_FP16)),
    "requant out int32": ("requant", lambda op: setattr(op.t[2], "dtype", _abi.NPU_DTYPE_INT32)),
    "requant scale 5 channels": ("requant", lambda op: _set(op.t[1].shape, 1, 5)),
    "requant scale 3 rows": ("requant", lambda op: _set(op.t[1].shape, 0, 3)),
    "requant acc shape": ("requant", lambda op: _set(op.t[0].shape, 0, 3)),
    "requant params[1]": ("requant", lambda op: _set(op.params, 1, 1)),
    "requant 4th operand": ("requant", lambda op: setattr(op.t[3], "ndim", 1)),
}  # fmt: skip


def test_driver_rejects_bad_integer_ops_with_einval(qdev, raw):
    fd, bo = raw
    good = good_ops(bo)
    # the unmodified ops are accepted (the scale memory is zero: REQUANT would fail
    # on the device, so it is not run here)
    raw_wait(fd, raw_submit(fd, [good["matmul"], good["linear"], good["conv"]]))
    failures = mutations_not_rejected(fd, good_ops, bo, MUTATIONS)
    assert not failures, failures
