"""REDUCE, SOFTMAX and LAYERNORM: builders, the Python twin of the C checks, and the
Tensor API (npu.sum/mean/max/min, softmax, log_softmax, layer_norm) end to end
through CpuBackend, which executes the ops with numpy.

Tolerances (the CPU backend computes in float64 and rounds once to the output
dtype, so these only cover the output rounding): float32 rtol 1e-5, float16
1e-2, bfloat16 2e-2; integers exact.
"""

from __future__ import annotations

import itertools
from typing import Any

import numpy as np
import pytest

import npu
from npu import _abi, ops
from npu.hal import CpuBackend
from test_tensor import PUBLIC, FakeBuf, _as_params, _c_check, flush, waits

D = npu.DType
ALL = [D.FP32, D.FP16, D.BF16, D.INT8, D.INT32]
FLOATS = [D.FP32, D.FP16, D.BF16]
RTOL = {D.FP32: 1e-5, D.FP16: 1e-2, D.BF16: 2e-2}
ATOL = {D.FP32: 1e-6, D.FP16: 1e-3, D.BF16: 1e-2}


pytestmark = pytest.mark.usefixtures("default_device")


def rand(dt: D, shape: tuple[int, ...], seed: int = 0) -> npu.Tensor:
    rng = np.random.default_rng(seed)
    if dt.is_float:
        return npu.tensor(rng.uniform(-3, 3, shape).astype(np.float32), dtype=PUBLIC[dt])
    return npu.tensor(rng.integers(-100, 100, shape), dtype=PUBLIC[dt])


def close(got: npu.Tensor, want: np.ndarray[Any, Any], dt: D) -> None:
    assert got.npu_dtype is dt, (got.dtype, dt)
    host = got.numpy()
    assert host.shape == want.shape
    if dt.is_float:
        np.testing.assert_allclose(host, want, rtol=RTOL[dt], atol=ATOL[dt])
    else:
        np.testing.assert_array_equal(host, want)


# -- builders, packing and the C twin -------------------------------------------


def test_reduce_packs_the_axes_mask_in_params_0() -> None:
    buf = FakeBuf(2, 1 << 16)
    x = ops.tensor_ref(buf, D.FP32, (2, 3, 4))
    out = ops.tensor_ref(buf, D.FP32, (1, 3, 1), offset=4096)
    op = ops.reduce(npu.ReduceKind.MAX, x, out, (2, 0))
    raw = op.pack()
    assert (raw.opcode, raw.kind) == (_abi.NPU_OP_REDUCE, _abi.NPU_REDUCE_MAX)
    assert list(raw.params) == [0b101] + [0] * 11
    assert "REDUCE.MAX" in str(op) and "params=[0x5]" in str(op)


def test_softmax_and_layernorm_pack_their_params() -> None:
    buf = FakeBuf(2, 1 << 16)
    x = ops.tensor_ref(buf, D.FP16, (2, 3, 4))
    out = ops.tensor_ref(buf, D.FP16, (2, 3, 4), offset=4096)
    raw = ops.softmax(npu.SoftmaxKind.LOG, x, out, 1).pack()
    assert (raw.opcode, raw.kind, raw.params[0], raw.params[1]) == (8, 1, 1, 0)
    g = ops.tensor_ref(buf, D.FP16, (1, 3, 4), offset=8192)
    raw = ops.layernorm(x, g, g, out, 2, 1e-5).pack()
    assert (raw.opcode, raw.kind, raw.params[0]) == (_abi.NPU_OP_LAYERNORM, 0, 2)
    assert raw.params[1] == ops.f32_bits(1e-5) == int(np.float32(1e-5).view(np.uint32))
    assert list(raw.params[2:]) == [0] * 10
    assert raw.t[3].offset == 4096


def test_builders_reject_bad_params() -> None:
    buf = FakeBuf(2, 1 << 16)
    x = ops.tensor_ref(buf, D.FP32, (2, 3))
    keep0 = ops.tensor_ref(buf, D.FP32, (1, 3), offset=4096)
    with pytest.raises(ValueError, match="axis"):
        ops.reduce(npu.ReduceKind.SUM, x, keep0, (2,))
    with pytest.raises(ValueError, match="axes mask"):
        ops.reduce(npu.ReduceKind.SUM, x, keep0, ())
    with pytest.raises(ValueError, match="keepdims"):
        ops.reduce(npu.ReduceKind.SUM, x, ops.tensor_ref(buf, D.FP32, (3,)), (0,))
    i = ops.tensor_ref(buf, D.INT32, (2, 3))
    with pytest.raises(ValueError, match="MEAN"):
        ops.reduce(npu.ReduceKind.MEAN, i, ops.tensor_ref(buf, D.INT32, (1, 3)), (0,))
    with pytest.raises(ValueError, match="float"):
        ops.softmax(npu.SoftmaxKind.SOFTMAX, i, i, 0)
    with pytest.raises(ValueError, match="below ndim"):
        ops.softmax(npu.SoftmaxKind.SOFTMAX, x, x, 2)
    g = ops.tensor_ref(buf, D.FP32, (1, 3))
    for eps in (0.0, -1.0, float("inf"), float("nan"), 1e-60):
        with pytest.raises(ValueError, match="eps"):
            ops.layernorm(x, g, g, x, 1, eps)
    with pytest.raises(ValueError, match="normalised axes"):
        ops.layernorm(x, g, g, x, 3, 1e-5)
    with pytest.raises(ValueError, match="gamma"):
        ops.layernorm(x, x, g, x, 1, 1e-5)
    with pytest.raises(ValueError, match="params"):
        ops.TensorOp(npu.Opcode.REDUCE, 0, (x, keep0), (), (1,) * 13)
    with pytest.raises(ValueError, match="the others must be zero"):
        ops.check_tensor_op(ops.TensorOp(npu.Opcode.REDUCE, 0, (x, keep0), (), (1, 1)))
    with pytest.raises(ValueError, match="the others must be zero"):
        ops.check_tensor_op(ops.TensorOp(npu.Opcode.ELTWISE, 0, (x, x, x), (), (1,)))


def _verdicts(candidates: list[ops.TensorOp]) -> list[bool]:
    verdicts = []
    for op in candidates:
        try:
            ops.check_tensor_op(op)
            verdicts.append(True)
        except ValueError:
            verdicts.append(False)
    return verdicts


def test_python_check_agrees_with_the_header_for_reduce_softmax_layernorm() -> None:
    buf = FakeBuf(1, 1 << 20)
    shapes = [(2, 3), (1, 3), (2, 1), (1, 1), (3,), (1,), (2, 3, 4), (1, 3, 4), (1, 1, 4)]
    refs = [ops.tensor_ref(buf, dt, s) for dt in (D.FP32, D.INT8, D.BF16) for s in shapes]
    refs.append(ops.tensor_ref(buf, D.FP32, (3, 2), strides=(1, 3)))  # non-contiguous
    candidates: list[ops.TensorOp] = []
    for a, out in itertools.product(refs, refs):
        for kind in range(_abi.NPU_REDUCE_COUNT + 1):
            for mask in (0, 1, 2, 3, 4, 5, 7, 8):
                candidates.append(ops.TensorOp(npu.Opcode.REDUCE, kind, (a, out), (), (mask,)))
        candidates.append(ops.TensorOp(npu.Opcode.REDUCE, 0, (a, out), (), (1, 1)))
        for kind in range(_abi.NPU_SOFTMAX_COUNT + 1):
            for axis in (0, 1, 2, 3):
                candidates.append(ops.TensorOp(npu.Opcode.SOFTMAX, kind, (a, out), (), (axis,)))
        candidates.append(ops.TensorOp(npu.Opcode.SOFTMAX, 0, (a, out), (), (0, 0, 1)))
    one = ops.f32_bits(1e-5)
    eps_bits = [one, 0, 0x80000000 | one, 0x7F800000, 0x7FC00000, 1, 0x7F7FFFFF]
    for x, g, b in itertools.product(refs[:9] + refs[18:27], refs[:9], refs[:9]):
        for n in range(5):
            candidates.append(ops.TensorOp(npu.Opcode.LAYERNORM, 0, (x, g, b, x), (), (n, one)))
    x3 = refs[6]
    g3 = refs[7]
    for bits, kind in itertools.product(eps_bits, (0, 1)):
        candidates.append(ops.TensorOp(npu.Opcode.LAYERNORM, kind, (x3, g3, g3, x3), (), (2, bits)))
    candidates.append(ops.TensorOp(npu.Opcode.LAYERNORM, 0, (x3, g3, g3, x3), (), (2, one, 1)))
    assert len(candidates) > 5000
    python_ok = _verdicts(candidates)
    statuses = _c_check([(int(op.opcode), op.kind, _as_params(op)) for op in candidates])
    mismatches = [
        str(op)
        for op, st, ok in zip(candidates, statuses, python_ok, strict=True)
        if (st == _abi.NPU_ST_OK) != ok
    ]
    assert not mismatches, mismatches[:10]
    for opcode in (npu.Opcode.REDUCE, npu.Opcode.SOFTMAX, npu.Opcode.LAYERNORM):
        seen = {ok for op, ok in zip(candidates, python_ok, strict=True) if op.opcode is opcode}
        assert seen == {True, False}, opcode


# -- reductions through the Tensor API ------------------------------------------------


def _axes_combos(ndim: int) -> list[Any]:
    combos: list[Any] = [None]
    for r in range(ndim + 1):
        combos += list(itertools.combinations(range(ndim), r))
    return combos


@pytest.mark.parametrize("dt", ALL, ids=lambda d: d.name)
@pytest.mark.parametrize("name", ["sum", "mean", "max", "min"])
def test_every_reduction_over_every_axis_combination_matches_numpy(name: str, dt: D) -> None:
    x = rand(dt, (3, 4, 5), seed=dt)
    host = x.numpy().astype(np.float64 if dt.is_float else np.int64)
    fn = getattr(npu, name)
    ref = {"sum": np.sum, "mean": np.mean, "max": np.max, "min": np.min}[name]
    out_dt = dt
    if name == "sum" and not dt.is_float:
        out_dt = D.INT32
    if name == "mean" and not dt.is_float:
        out_dt = D.FP32
    for axis, keepdims in itertools.product(_axes_combos(3), (False, True)):
        want = ref(host, axis=axis, keepdims=keepdims)
        want = np.asarray(want if out_dt.is_float else want.astype(np.int32))
        close(fn(x, axis=axis, keepdims=keepdims), want, out_dt)
        close(getattr(x, name)(axis, keepdims), want, out_dt)


def test_negative_axes_and_4d_inputs() -> None:
    x = rand(D.FP32, (2, 3, 4, 5), seed=3)
    h = x.numpy().astype(np.float64)
    for axis in [-1, -4, (-1, 0), (1, -2), (0, 1, 2, 3), (-3,)]:
        close(npu.sum(x, axis=axis), np.sum(h, axis=axis), D.FP32)
        close(x.max(axis, keepdims=True), np.max(h, axis=axis, keepdims=True), D.FP32)


def test_reductions_of_views_and_rank0() -> None:
    x = rand(D.FP32, (4, 6), seed=4)
    h = x.numpy().astype(np.float64)
    close(x.T.sum(axis=1), h.T.sum(axis=1), D.FP32)
    close(x.T.mean(axis=0, keepdims=True), h.T.mean(axis=0, keepdims=True), D.FP32)
    s = npu.tensor(np.float32(2.5))
    assert npu.sum(s).shape == () and npu.sum(s).item() == 2.5
    assert npu.mean(npu.tensor(np.int8(3))).dtype == np.float32
    assert npu.sum(x, axis=()).shape == (4, 6)


def test_int_sum_is_int32_and_wraps_like_numpy_with_dtype_int32() -> None:
    big = np.full((4, 3), 2**30, np.int32)
    got = npu.sum(npu.tensor(big), axis=0)
    assert got.dtype == np.int32
    np.testing.assert_array_equal(got.numpy(), np.sum(big, axis=0, dtype=np.int32))
    i8 = np.full((300,), 100, np.int8)
    got = npu.sum(npu.tensor(i8))
    assert got.dtype == np.int32 and got.item() == 30000  # no int8 wrap: summed in int32


def test_reduction_errors_follow_numpy() -> None:
    x = rand(D.FP32, (2, 3))
    with pytest.raises(np.exceptions.AxisError):
        npu.sum(x, axis=2)
    with pytest.raises(np.exceptions.AxisError):
        npu.mean(x, axis=(-3,))
    with pytest.raises(ValueError, match="duplicate"):
        npu.max(x, axis=(0, -2))
    empty = npu.tensor(np.zeros((0, 3), np.float32))
    with pytest.raises(ValueError, match="identity"):
        npu.max(empty, axis=0)
    assert npu.max(empty, axis=1).shape == (0,)
    np.testing.assert_array_equal(npu.sum(empty, axis=0).numpy(), np.zeros(3))
    assert np.isnan(npu.mean(empty, axis=0).numpy()).all()


def test_ops_submit_without_waiting(driver: CpuBackend) -> None:
    x = rand(D.FP32, (8, 8))
    before = waits(driver)
    y = npu.softmax(npu.layer_norm(x, 8).sum(axis=0, keepdims=True), axis=1)
    z = npu.log_softmax(x.mean(axis=1))
    assert waits(driver) == before
    assert y.fence is not None and z.fence is not None
    y.numpy()
    assert waits(driver) == before + 1


def test_non_tensor_inputs_are_uploaded() -> None:
    close(npu.sum([[1, 2], [3, 4]], axis=0), np.array([4, 6], np.int32), D.INT32)
    close(npu.softmax(np.zeros(4)), np.full(4, 0.25), D.FP32)


# -- softmax / log_softmax --------------------------------------------------------


def _softmax(h: np.ndarray[Any, Any], axis: int) -> np.ndarray[Any, Any]:
    e = np.exp(h - h.max(axis=axis, keepdims=True))
    out: np.ndarray[Any, Any] = e / e.sum(axis=axis, keepdims=True)
    return out


@pytest.mark.parametrize("dt", ALL, ids=lambda d: d.name)
def test_softmax_and_log_softmax_over_each_axis(dt: D) -> None:
    x = rand(dt, (3, 4, 5), seed=7)
    h = x.numpy().astype(np.float64)
    out_dt = dt if dt.is_float else D.FP32
    for axis in range(-3, 3):
        sm = _softmax(h, axis)
        close(npu.softmax(x, axis=axis), sm, out_dt)
        close(x.log_softmax(axis), np.log(sm), out_dt)
    close(x.softmax(), _softmax(h, -1), out_dt)
    with pytest.raises(np.exceptions.AxisError):
        npu.softmax(x, axis=3)


def test_softmax_of_rank0_and_empty() -> None:
    assert npu.softmax(npu.tensor(np.float32(5))).item() == 1.0
    assert npu.log_softmax(npu.tensor(np.zeros((0, 4), np.float32))).shape == (0, 4)


# -- layer_norm -----------------------------------------------------------------------


def _layer_norm(h: np.ndarray[Any, Any], n: int, w: Any, b: Any, eps: float) -> Any:
    axes = tuple(range(h.ndim - n, h.ndim))
    mu = h.mean(axis=axes, keepdims=True)
    var = h.var(axis=axes, keepdims=True)
    y = (h - mu) / np.sqrt(var + eps)
    if w is not None:
        y = y * w
    if b is not None:
        y = y + b
    return y


@pytest.mark.parametrize("dt", [*FLOATS, D.INT32], ids=lambda d: d.name)
@pytest.mark.parametrize("n", [1, 2, 3])
def test_layer_norm_over_trailing_axes_with_and_without_affine(dt: D, n: int) -> None:
    x = rand(dt, (2, 3, 4, 5), seed=n)
    h = x.numpy().astype(np.float64)
    out_dt = dt if dt.is_float else D.FP32
    norm = x.shape[4 - n :]
    rng = np.random.default_rng(n)
    w = rng.uniform(0.5, 2, norm).astype(np.float32)
    b = rng.uniform(-1, 1, norm).astype(np.float32)
    wq = npu.tensor(w, dtype=PUBLIC[out_dt]).numpy().astype(np.float64)
    bq = npu.tensor(b, dtype=PUBLIC[out_dt]).numpy().astype(np.float64)
    close(npu.layer_norm(x, norm), _layer_norm(h, n, None, None, 1e-5), out_dt)
    close(npu.layer_norm(x, norm, w, b), _layer_norm(h, n, wq, bq, 1e-5), out_dt)
    close(npu.layer_norm(x, norm, weight=w), _layer_norm(h, n, wq, None, 1e-5), out_dt)
    tw = npu.tensor(w, dtype=PUBLIC[out_dt])
    close(npu.layer_norm(x, list(norm), tw, None, 0.1), _layer_norm(h, n, wq, None, 0.1), out_dt)


def test_layer_norm_accepts_an_int_shape_and_tensors_of_other_dtypes(driver: CpuBackend) -> None:
    x = rand(D.FP16, (4, 6), seed=1)
    w = npu.tensor(np.linspace(0.5, 1.5, 6, dtype=np.float32))  # fp32: converted to fp16
    y = npu.layer_norm(x, 6, w)
    assert y.dtype == np.float16
    flush()
    lo = driver.submitted_tensor[-1]
    assert lo.opcode == _abi.NPU_OP_LAYERNORM and lo.t[1].ndim == 2
    assert list(lo.t[1].shape[:2]) == [1, 6]
    h = x.numpy().astype(np.float64)
    wq = w.numpy().astype(np.float16).astype(np.float64)
    close(y, _layer_norm(h, 1, wq, None, 1e-5), D.FP16)


def test_layer_norm_rejects_bad_arguments() -> None:
    x = rand(D.FP32, (2, 3))
    with pytest.raises(ValueError, match="normalized_shape"):
        npu.layer_norm(x, (2,))
    with pytest.raises(ValueError, match="normalized_shape"):
        npu.layer_norm(x, ())
    with pytest.raises(ValueError, match="normalized_shape"):
        npu.layer_norm(x, (1, 2, 3))
    with pytest.raises(ValueError, match="is not normalized_shape"):
        npu.layer_norm(x, 3, np.ones(4))
    for eps in (0.0, -1e-5, float("inf"), 1e-50):
        with pytest.raises(ValueError, match="eps"):
            npu.layer_norm(x, 3, eps=eps)
    assert npu.layer_norm(npu.tensor(np.zeros((0, 3), np.float32)), 3).shape == (0, 3)


def test_cpu_backend_rejects_bad_params_with_einval(device: npu.Device) -> None:
    x = rand(D.FP32, (2, 3))
    assert x.buffer is not None
    out = device.alloc(64)
    good = ops.reduce(npu.ReduceKind.SUM, x.tensor_ref(), ops.tensor_ref(out, D.FP32, (1, 3)), (0,))
    bad = ops.TensorOp(good.opcode, good.kind, good.operands, (x.buffer, out), (1, 4))
    with pytest.raises(npu.NpuError) as info:
        device.submit([bad])
    assert info.value.errno == 22


def test_pytorchs_dim_and_keepdim_are_aliases_of_axis_and_keepdims(
    default_device: npu.Device,
) -> None:
    x_np = np.arange(24, dtype=np.float32).reshape(2, 3, 4)
    x = npu.tensor(x_np)
    for fn, ref in ((npu.sum, np.sum), (npu.mean, np.mean), (npu.max, np.max), (npu.min, np.min)):
        np.testing.assert_allclose(fn(x, dim=1).numpy(), ref(x_np, axis=1))
        np.testing.assert_allclose(
            fn(x, dim=(0, 2), keepdim=True).numpy(), ref(x_np, axis=(0, 2), keepdims=True)
        )
    np.testing.assert_allclose(x.sum(dim=-1).numpy(), x_np.sum(axis=-1))
    np.testing.assert_allclose(x.softmax(dim=0).numpy(), npu.softmax(x, axis=0).numpy())
    np.testing.assert_allclose(
        npu.log_softmax(x, dim=1).numpy(), npu.log_softmax(x, axis=1).numpy()
    )


def test_a_name_and_its_alias_together_raise_type_error(default_device: npu.Device) -> None:
    x = npu.tensor(np.ones((2, 3), np.float32))
    for call in (
        lambda: npu.sum(x, axis=0, dim=0),
        lambda: x.mean(keepdims=True, keepdim=True),
        lambda: npu.softmax(x, axis=0, dim=0),
    ):
        with pytest.raises(TypeError, match="alias"):
            call()
