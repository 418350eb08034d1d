"""REDUCE, SOFTMAX and LAYERNORM on the device, through npu.Tensor and raw ioctls.

References are numpy in float64 computed from the values the device holds
(inputs already rounded to their dtype). Tolerances per result dtype:

    float32  rtol 1e-5
    float16  rtol 1e-2
    bfloat16 rtol 2e-2
    int8, int32  exact (int sums are int32 and wrap like numpy with dtype=int32)

For sums and means the absolute tolerance is rtol times the sum (mean) of
|x| over the reduced elements, so cancellation near zero is not counted as
error; softmax, log_softmax and layer_norm use atol = rtol (their outputs
are O(1)). Results of a test are created first and downloaded afterwards,
so most of the device work overlaps with the host checks.
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from tensor_helpers import PUBLIC, cap_device, mutations_not_rejected, raw_bo, raw_submit, raw_wait

import npu
from npu import _abi, ops

D = npu.DType
FLOATS = [D.FP32, D.FP16, D.BF16]
INTS = [D.INT8, D.INT32]
ALL = FLOATS + INTS
RTOL = {D.FP32: 1e-5, D.FP16: 1e-2, D.BF16: 2e-2}
REF = {"sum": np.sum, "mean": np.mean, "max": np.max, "min": np.min}


@pytest.fixture(scope="module")
def rdev():
    yield from cap_device(npu.Cap.REDUCE)


def rand(dt, shape, rng, lo=-4.0, hi=4.0):
    if dt.is_float:
        return npu.tensor(rng.uniform(lo, hi, shape).astype(np.float32), dtype=PUBLIC[dt])
    return npu.tensor(rng.integers(-100, 101, shape), dtype=PUBLIC[dt])


def held(t):
    """The values the device holds, as float64 (or int64)."""
    return t.numpy().astype(np.float64 if t.npu_dtype.is_float else np.int64)


def out_dtype(name, dt):
    if name == "sum" and not dt.is_float:
        return D.INT32
    if name == "mean" and not dt.is_float:
        return D.FP32
    return dt


def check(got, want, dt, atol=None, what=""):
    assert got.npu_dtype is dt, f"{what}: dtype {got.dtype}, want {dt.name}"
    host = got.numpy()
    assert host.shape == np.shape(want), f"{what}: shape {host.shape} != {np.shape(want)}"
    if dt.is_float:
        tol = RTOL[dt] if atol is None else atol  # atol may be an array (numpy 1.24 safe)
        want = np.asarray(want, np.float64)
        err = np.abs(host.astype(np.float64) - want)
        bad = ~(err <= tol + RTOL[dt] * np.abs(want))
        if bad.any():
            i = np.unravel_index(np.argmax(np.where(bad, err, -1)), bad.shape) if bad.ndim else ()
            raise AssertionError(
                f"{what}: {int(bad.sum())}/{bad.size} elements off; e.g. at {i}: "
                f"got {host[i]!r}, want {want[i]!r}"
            )
    else:
        np.testing.assert_array_equal(host, np.asarray(want).astype(np.int64), err_msg=what)


def axis_combos(ndim):
    return [None] + [c for r in range(1, ndim + 1) for c in itertools.combinations(range(ndim), r)]


def reduction_cases(x, name):
    """(axis, keepdims, result, reference, atol) for every axis combination."""
    h = held(x)
    dt = out_dtype(name, x.npu_dtype)
    cases = []
    for axis, keepdims in itertools.product(axis_combos(x.ndim), (False, True)):
        got = getattr(npu, name)(x, axis=axis, keepdims=keepdims)
        want = REF[name](h, axis=axis, keepdims=keepdims)
        if dt is D.INT32 and name == "sum":
            want = np.asarray(want).astype(np.int32)  # wraps like numpy with dtype=int32
        atol = None
        if dt.is_float and name in ("sum", "mean"):
            atol = RTOL[dt] * REF[name](np.abs(h), axis=axis, keepdims=keepdims) + 1e-6
        cases.append((axis, keepdims, got, np.asarray(want), atol))
    return dt, cases


# --------------------------------------------------------------------------
# Reductions: every op x dtype x axis combination x keepdims
# --------------------------------------------------------------------------


@pytest.mark.parametrize("dt", ALL, ids=lambda d: d.name)
@pytest.mark.parametrize("name", list(REF))
@pytest.mark.parametrize("shape", [(3, 4, 5), (2, 3, 4, 5)], ids=["3d", "4d"])
def test_every_reduction_over_every_axis_combination(rdev, dt, name, shape):
    rng = np.random.default_rng([int(dt), list(REF).index(name), len(shape)])
    x = rand(dt, shape, rng)
    out_dt, cases = reduction_cases(x, name)
    for axis, keepdims, got, want, atol in cases:
        check(got, want, out_dt, atol, f"{name} axis={axis} keepdims={keepdims}")


def test_methods_negative_axes_and_strided_inputs(rdev):
    rng = np.random.default_rng(1)
    x = rand(D.FP32, (4, 6, 8), rng)
    h = held(x)
    check(x.sum(-1), h.sum(-1), D.FP32, 1e-4)
    check(x.max((-1, 0), keepdims=True), h.max((-1, 0), keepdims=True), D.FP32)
    check(x.min(-2), h.min(-2), D.FP32)
    check(x.mean((-3, -1)), h.mean((-3, -1)), D.FP32, 1e-5)
    xt = x.transpose(2, 0, 1)  # a strided view feeds REDUCE directly
    check(xt.sum(axis=1), h.transpose(2, 0, 1).sum(axis=1), D.FP32, 1e-4)
    check(npu.max(xt), h.max(), D.FP32)
    with pytest.raises(ValueError):
        npu.sum(x, axis=3)
    with pytest.raises(ValueError):
        npu.sum(x, axis=(0, -3))


def test_int_sums_are_int32_and_wrap(rdev):
    big = np.full((5, 3), 2**30, np.int32)
    got = npu.sum(npu.tensor(big), axis=0)
    check(got, np.sum(big, axis=0, dtype=np.int32), D.INT32)
    i8 = np.full((1000,), 127, np.int8)
    check(npu.sum(npu.tensor(i8)), np.int64(127000), D.INT32)  # int8 sums don't wrap at int8
    check(npu.mean(npu.tensor(i8)), np.float64(127.0), D.FP32)


def test_large_reductions(rdev):
    rng = np.random.default_rng(2)
    x = rand(D.FP32, (1024, 1280), rng)  # 1.3M elements
    h = held(x)
    absh = np.abs(h)
    results = [
        (npu.sum(x), h.sum(), 1e-5 * absh.sum()),
        (npu.sum(x, axis=0), h.sum(0), 1e-5 * absh.sum(0) + 1e-6),
        (x.sum(axis=1, keepdims=True), h.sum(1, keepdims=True), 1e-5 * absh.sum(1, keepdims=True)),
        (npu.mean(x), h.mean(), 1e-5 * absh.mean()),
        (npu.max(x, axis=1), h.max(1), None),
        (npu.min(x), h.min(), None),
    ]
    for i, (got, want, atol) in enumerate(results):
        check(got, np.asarray(want), D.FP32, atol, f"large #{i}")
    for dt in (D.FP16, D.BF16, D.INT32):
        y = rand(dt, (1 << 20,), rng)
        hy = held(y)
        check(npu.max(y), hy.max(), dt)
        if dt.is_float:
            check(npu.mean(y), hy.mean(), dt, RTOL[dt] * np.abs(hy).mean())
        else:
            check(npu.sum(y), hy.sum(), dt)
    x4 = rand(D.FP32, (4, 8, 128, 256), rng)  # 1M, 4-D
    h4 = held(x4)
    check(npu.sum(x4, axis=(0, 2)), h4.sum((0, 2)), D.FP32, 1e-5 * np.abs(h4).sum((0, 2)))


# --------------------------------------------------------------------------
# softmax / log_softmax
# --------------------------------------------------------------------------


def np_softmax(h, axis):
    e = np.exp(h - h.max(axis=axis, keepdims=True))
    return e / e.sum(axis=axis, keepdims=True)


def np_log_softmax(h, axis):
    s = h - h.max(axis=axis, keepdims=True)
    return s - np.log(np.exp(s).sum(axis=axis, keepdims=True))


@pytest.mark.parametrize("dt", ALL, ids=lambda d: d.name)
def test_softmax_and_log_softmax_over_each_axis(rdev, dt):
    rng = np.random.default_rng(3 + dt)
    out_dt = dt if dt.is_float else D.FP32
    for shape in ((3, 4, 5), (2, 3, 4, 5)):
        x = rand(dt, shape, rng)
        h = held(x)
        results = []
        for axis in range(-len(shape), len(shape)):
            results.append((npu.softmax(x, axis), np_softmax(h, axis), f"softmax {axis}"))
            results.append((x.log_softmax(axis), np_log_softmax(h, axis), f"log {axis}"))
        results.append((npu.softmax(x), np_softmax(h, -1), "default axis"))
        for got, want, what in results:
            check(got, want, out_dt, RTOL.get(out_dt), f"{shape} {what}")


def test_softmax_is_stable_for_large_logits_and_large_inputs(rdev):
    h = np.array([[1000.0, 1001.0, 1002.0], [-1000.0, 0.0, 1000.0]], np.float32)
    x = npu.tensor(h)
    check(npu.softmax(x), np_softmax(h.astype(np.float64), -1), D.FP32, 1e-6)
    check(npu.log_softmax(x), np_log_softmax(h.astype(np.float64), -1), D.FP32, 1e-4)
    rng = np.random.default_rng(4)
    big = rand(D.FP32, (1024, 1024), rng)
    hb = held(big)
    check(npu.softmax(big, axis=0), np_softmax(hb, 0), D.FP32, 1e-7)
    check(npu.log_softmax(big, axis=1), np_log_softmax(hb, 1), D.FP32, 1e-5)


# --------------------------------------------------------------------------
# layer_norm
# --------------------------------------------------------------------------


def np_layer_norm(h, n, w=None, b=None, eps=1e-5):
    axes = tuple(range(h.ndim - n, h.ndim))
    mu = h.mean(axis=axes, keepdims=True)
    var = ((h - mu) ** 2).mean(axis=axes, keepdims=True)
    y = (h - mu) / np.sqrt(var + eps)
    if w is not None:
        y = y * w
    if b is not None:
        y = y + b
    return y


@pytest.mark.parametrize("dt", [*FLOATS, D.INT32], ids=lambda d: d.name)
def test_layer_norm_over_1_to_3_trailing_axes(rdev, dt):
    rng = np.random.default_rng(5 + dt)
    out_dt = dt if dt.is_float else D.FP32
    x = rand(dt, (2, 3, 4, 16), rng)
    h = held(x)
    tol = {D.FP32: 1e-4, D.FP16: 1e-2, D.BF16: 5e-2}[out_dt]  # outputs up to ~|3|
    results = []
    for n in (1, 2, 3):
        norm = x.shape[4 - n :]
        w = rng.uniform(0.5, 2.0, norm).astype(np.float32)
        b = rng.uniform(-1.0, 1.0, norm).astype(np.float32)
        wt, bt = npu.tensor(w, dtype=PUBLIC[out_dt]), npu.tensor(b, dtype=PUBLIC[out_dt])
        wq, bq = held(wt), held(bt)
        results += [
            (npu.layer_norm(x, norm), np_layer_norm(h, n), f"n={n}"),
            (npu.layer_norm(x, norm, w, b), np_layer_norm(h, n, wq, bq), f"n={n} w,b"),
            (npu.layer_norm(x, norm, wt), np_layer_norm(h, n, wq), f"n={n} w tensor"),
            (npu.layer_norm(x, norm, bias=bt, eps=0.5), np_layer_norm(h, n, None, bq, 0.5),
             f"n={n} b eps=0.5"),
        ]  # fmt: skip
    for got, want, what in results:
        check(got, want, out_dt, tol, what)


def test_large_layer_norm(rdev):
    rng = np.random.default_rng(6)
    x = rand(D.FP32, (1024, 1024), rng, 0.0, 10.0)
    w = rng.uniform(0.5, 2.0, 1024).astype(np.float32)
    h = held(x)
    check(npu.layer_norm(x, 1024, w, w), np_layer_norm(h, 1, w, w), D.FP32, 1e-4)
    check(npu.layer_norm(x, (1024, 1024)), np_layer_norm(h, 2), D.FP32, 1e-4)


# --------------------------------------------------------------------------
# Raw ioctls: bad params are rejected with EINVAL
# --------------------------------------------------------------------------


@pytest.fixture
def raw(fd):
    return raw_bo(fd, 16384)


def good_ops(bo):
    x = ops.tensor_ref(bo, D.FP32, (4, 8))
    red = ops.reduce(npu.ReduceKind.SUM, x, ops.tensor_ref(bo, D.FP32, (1, 8), offset=4096), (0,))
    sm = ops.softmax(npu.SoftmaxKind.SOFTMAX, x, ops.tensor_ref(bo, D.FP32, (4, 8), offset=4096), 1)
    g = ops.tensor_ref(bo, D.FP32, (1, 8), offset=8192)
    ln = ops.layernorm(x, g, g, ops.tensor_ref(bo, D.FP32, (4, 8), offset=12288), 1, 1e-5)
    return {"reduce": red.pack(), "softmax": sm.pack(), "layernorm": ln.pack()}


def _f32(value):
    return int(np.float32(value).view(np.uint32))


def _int_operands(op, n):
    for i in range(n):
        op.t[i].dtype = _abi.NPU_DTYPE_INT32


MUTATIONS = {
    "reduce mask 0": ("reduce", lambda op: op.params.__setitem__(0, 0)),
    "reduce mask beyond ndim": ("reduce", lambda op: op.params.__setitem__(0, 0b101)),
    "reduce wrong out shape": ("reduce", lambda op: op.t[1].shape.__setitem__(1, 1)),
    "reduce out shape for other axes": ("reduce", lambda op: op.params.__setitem__(0, 2)),
    "reduce nonzero params[1]": ("reduce", lambda op: op.params.__setitem__(1, 1)),
    "reduce nonzero params[11]": ("reduce", lambda op: op.params.__setitem__(11, 1)),
    "reduce kind out of range": ("reduce", lambda op: setattr(op, "kind", _abi.NPU_REDUCE_COUNT)),
    "reduce dtype mismatch": ("reduce", lambda op: setattr(op.t[1], "dtype", _abi.NPU_DTYPE_FP16)),
    "mean of int": ("reduce", lambda op: (setattr(op, "kind", _abi.NPU_REDUCE_MEAN),
                                          _int_operands(op, 2))),
    "softmax axis == ndim": ("softmax", lambda op: op.params.__setitem__(0, 2)),
    "softmax axis huge": ("softmax", lambda op: op.params.__setitem__(0, 0xFFFFFFFF)),
    "softmax nonzero params[1]": ("softmax", lambda op: op.params.__setitem__(1, 1)),
    "softmax of int": ("softmax", lambda op: _int_operands(op, 2)),
    "softmax kind out of range": ("softmax", lambda op: setattr(op, "kind", 2)),
    "softmax shape mismatch": ("softmax", lambda op: op.t[1].shape.__setitem__(0, 2)),
    "layernorm eps 0": ("layernorm", lambda op: op.params.__setitem__(1, 0)),
    "layernorm eps -0": ("layernorm", lambda op: op.params.__setitem__(1, 0x80000000)),
    "layernorm eps < 0": ("layernorm", lambda op: op.params.__setitem__(1, _f32(-1e-5))),
    "layernorm eps inf": ("layernorm", lambda op: op.params.__setitem__(1, 0x7F800000)),
    "layernorm eps nan": ("layernorm", lambda op: op.params.__setitem__(1, 0x7FC00000)),
    "layernorm 0 axes": ("layernorm", lambda op: op.params.__setitem__(0, 0)),
    "layernorm axes > ndim": ("layernorm", lambda op: op.params.__setitem__(0, 3)),
    "layernorm gamma shape": ("layernorm", lambda op: op.t[1].shape.__setitem__(0, 4)),
    "layernorm beta rank": ("layernorm", lambda op: setattr(op.t[2], "ndim", 1)),
    "layernorm nonzero params[2]": ("layernorm", lambda op: op.params.__setitem__(2, 1)),
    "layernorm kind 1": ("layernorm", lambda op: setattr(op, "kind", 1)),
    "layernorm of int": ("layernorm", lambda op: _int_operands(op, 4)),
    "layernorm gamma dtype": ("layernorm", lambda op: setattr(op.t[1], "dtype", 1)),
    "layernorm out shape": ("layernorm", lambda op: op.t[3].shape.__setitem__(1, 4)),
}  # fmt: skip


def test_driver_rejects_bad_params_with_einval(rdev, raw):
    fd, bo = raw
    good = good_ops(bo)
    raw_wait(fd, raw_submit(fd, list(good.values())))  # the unmodified ops are accepted
    failures = mutations_not_rejected(fd, good_ops, bo, MUTATIONS)
    assert not failures, failures
    raw_wait(fd, raw_submit(fd, [good["reduce"]]))  # the queue still works
