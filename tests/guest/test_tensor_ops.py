"""Tensor ops (ELTWISE, UNARY, CONVERT) on the device, through npu.Tensor and raw ioctls.

Every result is compared with numpy, computed in float64 from the values the
device actually holds (inputs rounded to their dtype). Tolerances per result
dtype (the device computes in fp32 and rounds once to the output dtype):

    float32  rtol 1e-6 for add/sub/mul/div/max/min, 1e-5 for transcendental ops
    float16  rtol 1e-3
    bfloat16 rtol 1e-2
    int8, int32  exact (integer math wraps like numpy)

Checks are batched (one test per op family and dtype) to keep the module
under a minute of guest time.
"""

from __future__ import annotations

import errno
import itertools

import numpy as np
import pytest
from tensor_helpers import PUBLIC, Bo, cap_device, raw_bo, raw_submit, raw_wait

import npu
from npu import _abi, ops

D = npu.DType
FLOATS = [D.FP32, D.FP16, D.BF16]
INTS = [D.INT8, D.INT32]
ALL = FLOATS + INTS
NP = {D.FP32: np.float32, D.FP16: np.float16, D.INT8: np.int8, D.INT32: np.int32}
RTOL_ARITH = {D.FP32: 1e-6, D.FP16: 1e-3, D.BF16: 1e-2, D.INT8: 0, D.INT32: 0}
RTOL_TRANSC = {D.FP32: 1e-5, D.FP16: 1e-3, D.BF16: 1e-2}
ATOL = {D.FP32: 1e-7, D.FP16: 1e-4, D.BF16: 1e-3, D.INT8: 0, D.INT32: 0}
FENCES = "/sys/class/accel/accel0/device/npu/fences"


def fences() -> tuple[int, int]:
    """(last submitted, last completed) fence of queue 0, from sysfs."""
    with open(FENCES) as f:
        submitted, completed = (int(v) for v in f.read().split())
    return submitted, completed


@pytest.fixture(scope="module")
def tdev():
    yield from cap_device(npu.Cap.TENSOR)


def dtype_of(t: npu.Tensor) -> D:
    return t.npu_dtype


def check(got: npu.Tensor, want: np.ndarray, dt: D, rtol: float | None = None) -> None:
    assert dtype_of(got) is dt, f"dtype {got.dtype}, want {dt.name}"
    tol = RTOL_ARITH[dt] if rtol is None else rtol
    host = got.numpy()
    assert host.shape == want.shape
    if dt.is_float:
        np.testing.assert_allclose(host, want, rtol=tol, atol=ATOL[dt])
    else:
        np.testing.assert_array_equal(host, want.astype(NP[dt]))


def stored(t: npu.Tensor) -> np.ndarray:
    """The values the device holds, as float64 (or int64)."""
    host = t.numpy()
    return host.astype(np.float64 if dtype_of(t).is_float else np.int64)


def rand(dt: D, shape, rng, lo=-4.0, hi=4.0) -> npu.Tensor:
    if dt.is_float:
        return npu.tensor(rng.uniform(lo, hi, shape).astype(np.float32), dtype=PUBLIC[dt])
    return npu.tensor(rng.integers(int(lo) * 2, int(hi) * 2 + 1, shape), dtype=PUBLIC[dt])


# --------------------------------------------------------------------------
# ELTWISE: every kind x dtype
# --------------------------------------------------------------------------

BINARY = {
    "add": (npu.add, np.add),
    "subtract": (npu.subtract, np.subtract),
    "multiply": (npu.multiply, np.multiply),
    "divide": (npu.divide, np.divide),
    "maximum": (npu.maximum, np.maximum),
    "minimum": (npu.minimum, np.minimum),
}


@pytest.mark.parametrize("dt", ALL, ids=lambda d: d.name)
def test_every_eltwise_kind_matches_numpy(tdev, dt):
    rng = np.random.default_rng(10 + dt)
    a, b = rand(dt, (5, 33), rng), rand(dt, (5, 33), rng, 1.0, 4.0)  # b >= 1: divisor
    ha, hb = stored(a), stored(b)
    for name, (fn, ref) in BINARY.items():
        got = fn(a, b)
        out_dt = D.FP32 if name == "divide" and not dt.is_float else dt
        want = ref(ha, hb)
        if not out_dt.is_float:
            want = want.astype(np.int64)
        check(got, want, out_dt)


def test_integer_eltwise_wraps_like_numpy(tdev):
    a = np.array([100, -100, 127, -128], np.int8)
    b = np.array([100, -100, 1, -1], np.int8)
    with np.errstate(over="ignore"):
        check(npu.tensor(a) + npu.tensor(b), a + b, D.INT8)
        check(npu.tensor(a) * npu.tensor(b), a * b, D.INT8)
    x = np.array([2**31 - 1, -(2**31)], np.int32)
    with np.errstate(over="ignore"):
        check(npu.tensor(x) + 1, x + np.int32(1), D.INT32)


# --------------------------------------------------------------------------
# UNARY: every kind x dtype (float-only kinds promote integer inputs)
# --------------------------------------------------------------------------


def _gelu(x):
    from math import erf, sqrt

    return np.array([v * (1 + erf(v / sqrt(2))) / 2 for v in x.reshape(-1)]).reshape(x.shape)


UNARY = {
    "relu": (npu.relu, lambda x: np.maximum(x, 0), False),
    "gelu": (npu.gelu, _gelu, True),
    "sigmoid": (npu.sigmoid, lambda x: 1 / (1 + np.exp(-x)), True),
    "tanh": (npu.tanh, np.tanh, True),
    "exp": (npu.exp, np.exp, True),
    "log": (npu.log, np.log, True),
    "sqrt": (npu.sqrt, np.sqrt, True),
    "abs": (npu.abs, np.abs, False),
    "negative": (npu.negative, np.negative, False),
}


@pytest.mark.parametrize("dt", ALL, ids=lambda d: d.name)
def test_every_unary_kind_matches_numpy(tdev, dt):
    rng = np.random.default_rng(20 + dt)
    signed = rand(dt, (3, 17), rng, -4.0, 4.0)
    positive = rand(dt, (3, 17), rng, 1.0, 8.0)  # log, sqrt
    for name, (fn, ref, float_only) in UNARY.items():
        x = positive if name in ("log", "sqrt") else signed
        got = fn(x)
        out_dt = dt
        if float_only and not dt.is_float:
            out_dt = D.FP16 if dt is D.INT8 else D.FP32  # numpy: float16 / float64
        want = ref(stored(x))
        rtol = RTOL_TRANSC[out_dt] if float_only else RTOL_ARITH[out_dt]
        if out_dt is D.FP32 and name == "gelu":
            rtol = 1e-5
        check(got, want if out_dt.is_float else want.astype(np.int64), out_dt, rtol)


# --------------------------------------------------------------------------
# Shapes: edge sizes, broadcasting, rank 0, empty
# --------------------------------------------------------------------------

EDGE_SHAPES = [(1,), (7,), (1, 1), (1, 9), (9, 1), (3, 1, 5), (2, 3, 4, 5), (1, 1, 1, 1), (257,)]


def test_edge_shapes(tdev):
    rng = np.random.default_rng(30)
    for shape in EDGE_SHAPES:
        a = rng.standard_normal(shape).astype(np.float32)
        b = rng.standard_normal(shape).astype(np.float32)
        check(npu.tensor(a) * npu.tensor(b) + 1, a.astype(np.float64) * b + 1, D.FP32, 1e-5)


BROADCASTS = [
    ((3, 4), (4,)),
    ((3, 4), (3, 1)),
    ((3, 1), (1, 4)),
    ((1,), (2, 3, 4, 5)),
    ((5, 1, 1, 2), (1, 3, 4, 1)),
    ((2, 1, 4), (3, 1)),
    ((4, 1, 3, 1), (5, 1, 6)),
    ((), (2, 3)),
    ((2, 3, 4, 5), ()),
    ((1, 1), (1,)),
]


@pytest.mark.parametrize("dt", [D.FP32, D.INT32], ids=lambda d: d.name)
def test_broadcasting_of_all_patterns(tdev, dt):
    rng = np.random.default_rng(31)
    for sa, sb in BROADCASTS:
        a, b = rand(dt, sa, rng), rand(dt, sb, rng)
        ha, hb = stored(a), stored(b)
        check(a - b, ha - hb, dt)
        check(npu.maximum(b, a), np.maximum(hb, ha), dt)


def test_large_ops_split_into_tiles_match_numpy(tdev):
    # >= 2^20 output elements: the device spreads the op over its AI cores.
    rng = np.random.default_rng(32)
    a = rng.standard_normal((1031, 1025)).astype(np.float32)
    row = rng.standard_normal((1025,)).astype(np.float32)
    ta = npu.tensor(a)
    check(npu.tanh(ta + row), np.tanh(a.astype(np.float64) + row), D.FP32, 1e-5)
    q = rng.integers(-100, 100, (3, 700, 600)).astype(np.int8)
    with np.errstate(over="ignore"):
        check(npu.tensor(q).transpose(2, 0, 1) * 3, q.transpose(2, 0, 1) * np.int8(3), D.INT8)
    check(ta.T.astype(np.float16), a.T.astype(np.float64), D.FP16)


def test_rank0_scalars_and_python_scalars(tdev):
    s = npu.tensor(np.float32(2.5))
    assert s.shape == ()
    r = s * 4 - 1
    assert r.shape == () and r.item() == 9.0
    v = npu.tensor(np.arange(6, dtype=np.int32).reshape(2, 3))
    check(v * 3 + np.int32(1), np.arange(6).reshape(2, 3) * 3 + 1, D.INT32)
    check(10 - npu.tensor(np.int8(3)), np.array(7), D.INT8)


def test_size_zero_tensors_follow_numpy_without_the_device(tdev):
    before = fences()[0]
    e = npu.tensor(np.zeros((0, 4), np.float32))
    r = npu.exp(e * npu.tensor(np.ones(4, np.float32))).astype(np.int8)
    assert r.shape == (0, 4) and r.numpy().shape == (0, 4)
    assert fences()[0] == before


# --------------------------------------------------------------------------
# Views: transposes and permutes up to 4-D
# --------------------------------------------------------------------------


def test_every_permutation_of_a_4d_tensor(tdev):
    x = np.arange(2 * 3 * 4 * 5, dtype=np.float32).reshape(2, 3, 4, 5)
    t = npu.tensor(x)
    for perm in itertools.permutations(range(4)):
        v = t.transpose(perm)
        assert v.buffer is t.buffer
        np.testing.assert_array_equal(v.contiguous().numpy(), x.transpose(perm))
        np.testing.assert_array_equal(v.numpy(), x.transpose(perm))


def test_transposed_views_feed_ops_directly(tdev):
    rng = np.random.default_rng(40)
    x = rng.standard_normal((3, 5)).astype(np.float32)
    y = rng.standard_normal((5, 3)).astype(np.float32)
    tx, ty = npu.tensor(x), npu.tensor(y)
    check(tx.T + ty, x.T.astype(np.float64) + y, D.FP32)
    check(npu.relu(ty.T), np.maximum(y.T, 0), D.FP32)
    z = rng.standard_normal((2, 3, 4)).astype(np.float32)
    tz = npu.tensor(z)
    check(npu.permute(tz, (2, 0, 1)) * tz.transpose(2, 0, 1),
          z.transpose(2, 0, 1).astype(np.float64) ** 2, D.FP32)  # fmt: skip
    np.testing.assert_allclose(npu.matmul(tx, ty.T.T).numpy(), x @ y, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose((tx.T @ tx).numpy(), x.T @ x, rtol=1e-5, atol=1e-5)
    # int8 operand: CONVERT (tensor op) then GEMM (v1 op), split into two SUBMITs.
    q = rng.integers(-5, 5, (4, 3)).astype(np.int8)
    np.testing.assert_allclose((npu.tensor(q) @ tx).numpy(), q @ x, rtol=1e-5, atol=1e-5)


# --------------------------------------------------------------------------
# CONVERT between all dtype pairs
# --------------------------------------------------------------------------

IN_RANGE = np.array([-100.75, -7.5, -2.9, -1.0, 0.0, 0.5, 1.9, 3.0, 64.25, 127.0], np.float32)


def test_convert_between_all_dtype_pairs(tdev):
    for src, dst in itertools.product(ALL, ALL):
        t = npu.tensor(IN_RANGE, dtype=PUBLIC[src])
        host = stored(t).astype(np.float64)
        got = t.astype(PUBLIC[dst])
        want = host if dst.is_float else np.trunc(host)  # float -> int truncates toward zero
        tol = RTOL_ARITH[dst] if dst.is_float else 0
        assert dtype_of(got) is dst
        if dst.is_float:
            np.testing.assert_allclose(got.numpy(), want, rtol=tol, err_msg=f"{src}->{dst}")
        else:
            np.testing.assert_array_equal(got.numpy(), want, err_msg=f"{src}->{dst}")


def test_out_of_range_float_to_int_saturates(tdev):
    x = np.array([-1e10, -129.5, -128.9, 127.9, 128.0, 1e10, 3e9], np.float32)
    for dt in FLOATS:
        with np.errstate(over="ignore"):  # beyond float16: +-inf, which saturates too
            t = npu.tensor(x, dtype=PUBLIC[dt])
        host = stored(t)
        np.testing.assert_array_equal(t.to(np.int8).numpy(), np.clip(np.trunc(host), -128, 127))
        np.testing.assert_array_equal(
            t.to(np.int32).numpy(), np.clip(np.trunc(host), -(2**31), 2**31 - 1)
        )


# --------------------------------------------------------------------------
# Chains: no host round trip
# --------------------------------------------------------------------------


def test_a_chain_of_ops_stays_on_the_device(tdev):
    rng = np.random.default_rng(50)
    x = rng.uniform(0.5, 2.0, (16, 24)).astype(np.float32)
    t = npu.tensor(x)
    start, _ = fences()
    r = t * 2.0
    r = r - 1.0
    r = npu.relu(r)
    r = npu.exp(r)
    r = npu.sqrt(r + t)
    r = npu.maximum(r, 1.25).astype(np.float16)
    r = r.astype(npu.bfloat16).astype(np.float32) / 3
    _, completed_before_flush = fences()
    tdev.flush_deferred()  # the default stream may still hold the last few ops
    submitted, _ = fences()
    assert submitted - start >= 9  # one fence per op
    assert completed_before_flush <= submitted  # nothing waited in between
    assert r.fence is not None and r.fence <= submitted
    want = np.maximum(np.sqrt(np.exp(np.maximum(x.astype(np.float64) * 2 - 1, 0)) + x), 1.25) / 3
    np.testing.assert_allclose(r.numpy(), want, rtol=1e-2)
    _, completed = fences()
    assert completed >= submitted


def test_promotion_through_the_device(tdev):
    i8 = npu.tensor(np.array([1, -2, 3], np.int8))
    f16 = npu.tensor(np.array([0.5, 0.25, -2.0], np.float16))
    bf = npu.tensor(np.array([1.5, 2.0, -1.0], np.float32), dtype=npu.bfloat16)
    i32 = npu.tensor(np.array([7, 8, 9], np.int32))
    check(i8 * f16, np.array([0.5, -0.5, -6.0]), D.FP16)
    check(i8 + bf, np.array([2.5, 0.0, 2.0]), D.BF16)
    check(bf * f16, np.array([0.75, 0.5, 2.0]), D.FP32)
    check(i32 + i8, np.array([8, 6, 12]), D.INT32)
    check(i32 / i8, np.array([7.0, -4.0, 3.0]), D.FP32)


# --------------------------------------------------------------------------
# Raw ioctls: what the driver rejects
# --------------------------------------------------------------------------


@pytest.fixture
def raw(fd):
    return raw_bo(fd, 8192)


def _good(bo: Bo) -> _abi.NpuTensorOp:
    a = ops.tensor_ref(bo, D.FP32, (4, 8))
    b = ops.tensor_ref(bo, D.FP32, (1, 8), offset=128)
    out = ops.tensor_ref(bo, D.FP32, (4, 8), offset=4096)
    return ops.eltwise(npu.EltwiseKind.ADD, a, b, out).pack()


def _mutations():
    def set_(path, value):
        def apply(op):
            obj = op
            *parts, last = path.split(".")
            for p in parts:
                obj = obj[int(p)] if p.isdigit() else getattr(obj, p)
            if last.isdigit():
                obj[int(last)] = value
            else:
                setattr(obj, last, value)

        return apply

    def unary_on_int(op):
        op.opcode, op.kind = _abi.NPU_OP_UNARY, _abi.NPU_UNARY_EXP
        for i in (0, 1):
            op.t[i].dtype = _abi.NPU_DTYPE_INT32
        op.t[1] = op.t[2]
        op.t[1].dtype = _abi.NPU_DTYPE_INT32
        op.t[2] = _abi.NpuTensorRef()

    def div_on_int(op):
        op.kind = _abi.NPU_ELTWISE_DIV
        for i in range(3):
            op.t[i].dtype = _abi.NPU_DTYPE_INT32

    def transposed_out(op):
        op.t[2].strides[0], op.t[2].strides[1] = 1, 4

    return {
        "bad dtype": (set_("t.0.dtype", _abi.NPU_DTYPE_COUNT), errno.EINVAL),
        "ndim 0": (set_("t.0.ndim", 0), errno.EINVAL),
        "ndim 5": (set_("t.0.ndim", 5), errno.EINVAL),
        "dim beyond ndim": (set_("t.0.shape.3", 1), errno.EINVAL),
        "stride beyond ndim": (set_("t.1.strides.2", 1), errno.EINVAL),
        "zero dim": (set_("t.0.shape.1", 0), errno.EINVAL),
        "extent past BO end": (set_("t.0.offset", 8192 - 64), errno.ERANGE),
        "unknown handle": (set_("t.1.handle", 0x7FFF), errno.ENOENT),
        "non-contiguous output": (transposed_out, errno.EINVAL),
        "shape mismatch": (set_("t.0.shape.1", 7), errno.EINVAL),
        "dtype mismatch": (set_("t.1.dtype", _abi.NPU_DTYPE_FP16), errno.EINVAL),
        "div on int": (div_on_int, errno.EINVAL),
        "exp on int": (unary_on_int, errno.EINVAL),
        "kind out of range": (set_("kind", _abi.NPU_ELTWISE_COUNT), errno.EINVAL),
        "unused operand set": (set_("t.3.ndim", 1), errno.EINVAL),
        "nonzero params": (set_("params.0", 1), errno.EINVAL),
        "nonzero rsvd": (set_("rsvd", 1), errno.EINVAL),
        "nonzero ref rsvd": (set_("t.0.rsvd", 1), errno.EINVAL),
        "nonzero ref rsvd2": (set_("t.2.rsvd2", 1), errno.EINVAL),
        "a flag outside the mask": (set_("flags", 1 << 1), errno.EINVAL),
        "bad opcode": (set_("opcode", _abi.NPU_OP_GEMM), errno.EINVAL),
    }


def test_driver_rejects_bad_tensor_ops(tdev, raw):
    fd, bo = raw
    raw_wait(fd, raw_submit(fd, [_good(bo)]))  # the unmodified op is accepted
    failures = []
    for name, (mutate, want) in _mutations().items():
        op = _good(bo)
        mutate(op)
        try:
            raw_submit(fd, [_good(bo), op])
        except OSError as exc:
            if exc.errno != want:
                failures.append(
                    f"{name}: {errno.errorcode.get(exc.errno)} != {errno.errorcode[want]}"
                )
            continue
        failures.append(f"{name}: accepted")
    assert not failures, failures


def test_runtime_raises_npu_error_with_errno_for_driver_refusals(tdev):
    t = npu.tensor(np.ones(4, np.float32))
    buf = t.buffer
    out = tdev.alloc(16)
    past_end = ops.TensorRef(out.handle, D.FP32, out.alloc_size - 8, (4,), (1,))  # BO size is paged
    bad = ops.TensorOp(
        npu.Opcode.UNARY, int(npu.UnaryKind.RELU), (t.tensor_ref(), past_end), (buf, out)
    )
    with pytest.raises(npu.NpuError) as info:
        tdev.submit([bad])
    assert info.value.errno == errno.ERANGE
    assert "UNARY.RELU" in str(info.value)
