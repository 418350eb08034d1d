"""MATMUL and LINEAR: builders, the Python twin of the C checks, and the Tensor API
(npu.matmul / ``@`` on tensors, npu.linear) end to end through CpuBackend, which
executes the ops with numpy.

Tolerances (the CPU backend computes in float64 and rounds once to the output
dtype; the references below round the inputs the same way, so these only
cover the output rounding): float32 rtol 1e-5, float16 2e-3, bfloat16 1e-2,
with an absolute floor scaled by sqrt(K).
"""

from __future__ import annotations

import itertools
import math
from typing import Any

import numpy as np
import pytest

import npu
from npu import _abi, ops
from npu.hal import CpuBackend
from test_tensor import PUBLIC, FakeBuf, _as_params, _c_check, flush, host, rand, waits

D = npu.DType
A = npu.ActKind
FLOATS = [D.FP32, D.FP16, D.BF16]
RTOL = {D.FP32: 1e-5, D.FP16: 2e-3, D.BF16: 1e-2}
ATOL = {D.FP32: 1e-5, D.FP16: 2e-3, D.BF16: 1e-2}


pytestmark = pytest.mark.usefixtures("default_device")


def act_ref(y: np.ndarray[Any, Any], act: A) -> np.ndarray[Any, Any]:
    if act is A.RELU:
        return np.maximum(y, 0)
    if act is A.GELU:
        erf = np.vectorize(math.erf, otypes=[np.float64])
        out: np.ndarray[Any, Any] = y * (1 + erf(y / math.sqrt(2))) / 2
        return out
    return y


def close(got: npu.Tensor, want: np.ndarray[Any, Any], dt: D, k: int = 1) -> None:
    assert got.npu_dtype is dt, (got.dtype, dt)
    h = got.numpy()
    assert h.shape == want.shape, (h.shape, want.shape)
    np.testing.assert_allclose(h, want, rtol=RTOL[dt], atol=ATOL[dt] * math.sqrt(k))


# -- builders, packing and the C twin ---------------------------------------------


def test_builders_pack_operands_and_the_activation_kind() -> None:
    buf = FakeBuf(3, 1 << 16)
    a = ops.tensor_ref(buf, D.FP16, (2, 4, 3))
    b = ops.tensor_ref(buf, D.FP16, (1, 4, 5))
    out = ops.tensor_ref(buf, D.FP16, (2, 4, 5))
    op = ops.matmul_op(a, ops.tensor_ref(buf, D.FP16, (1, 3, 5), strides=(0, 1, 3)), out, A.GELU)
    raw = op.pack()
    assert (raw.opcode, raw.kind) == (_abi.NPU_OP_MATMUL, _abi.NPU_ACT_GELU)
    assert bytes(raw.t[3]) == bytes(len(bytes(raw.t[3]))) and not any(raw.params)
    assert str(op).startswith("MATMUL.GELU(fp16[2x4x3]")
    bias = ops.tensor_ref(buf, D.FP16, (1, 1, 5))
    lin = ops.linear_op(a, ops.tensor_ref(buf, D.FP16, (2, 3, 5)), bias, out)
    assert lin.pack().opcode == _abi.NPU_OP_LINEAR and lin.kind == 0
    assert list(lin.pack().t[2].shape) == [1, 1, 5, 0]
    with pytest.raises(ValueError, match="K differs"):
        ops.matmul_op(a, b, out)
    with pytest.raises(ValueError, match="bias shape"):
        ops.linear_op(a, ops.tensor_ref(buf, D.FP16, (2, 3, 5)), out, out)
    with pytest.raises(ValueError):
        ops.matmul_op(a, ops.tensor_ref(buf, D.FP16, (2, 3, 5)), out, _abi.NPU_ACT_COUNT)  # type: ignore[arg-type]
    i = ops.tensor_ref(buf, D.INT32, (2, 2))
    with pytest.raises(ValueError, match="float dtypes only"):
        ops.matmul_op(i, i, i)


def test_python_check_agrees_with_the_header_for_matmul_and_linear() -> None:
    buf = FakeBuf(1, 1 << 22)
    shapes = [
        (2, 3), (3, 4), (2, 4), (3, 2), (1, 4), (2, 1), (4,),
        (2, 2, 3), (1, 3, 4), (2, 3, 4), (2, 2, 4), (3, 2, 4), (1, 2, 4),
        (1, 1, 4), (1, 1, 3), (2, 1, 2, 3), (1, 2, 3, 4), (2, 2, 2, 4),
    ]  # fmt: skip
    refs = [ops.tensor_ref(buf, dt, s) for dt in (D.FP32, D.BF16) for s in shapes]
    refs += [ops.tensor_ref(buf, D.INT8, s) for s in ((2, 3), (3, 4), (2, 4), (1, 4))]
    refs.append(ops.tensor_ref(buf, D.FP32, (2, 4), strides=(1, 2)))  # non-contiguous
    refs.append(ops.tensor_ref(buf, D.FP32, (3, 4), strides=(1, 3)))  # transposed input
    candidates: list[ops.TensorOp] = []
    for a, b, out in itertools.product(refs, refs, refs):
        if a.ndim != b.ndim and a.ndim != out.ndim and a.dtype is b.dtype:
            continue  # thin out the hopeless rank mixes a little
        candidates.append(ops.TensorOp(npu.Opcode.MATMUL, 0, (a, b, out)))
    small = [r for r in refs if r.dtype is not D.INT8][:18] + refs[-6:]
    for a, b, out in itertools.product(small, small, small):
        for bias in (refs[12], refs[5], refs[6], refs[13], refs[18 + 13]):
            candidates.append(ops.TensorOp(npu.Opcode.LINEAR, 1, (a, b, bias, out)))
    a, b, out = refs[0], refs[1], refs[2]
    for kind in range(_abi.NPU_ACT_COUNT + 2):
        candidates.append(ops.TensorOp(npu.Opcode.MATMUL, kind, (a, b, out)))
        candidates.append(ops.TensorOp(npu.Opcode.LINEAR, kind, (a, b, refs[4], out)))
    candidates.append(ops.TensorOp(npu.Opcode.MATMUL, 0, (a, b, out), (), (1,)))
    assert len(candidates) > 50000, len(candidates)
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
    assert not mismatches, mismatches[:10]
    for opcode in (npu.Opcode.MATMUL, npu.Opcode.LINEAR):
        seen = {ok for op, ok in zip(candidates, python_ok, strict=True) if op.opcode is opcode}
        assert seen == {True, False}, opcode


# -- npu.matmul / @ on tensors --------------------------------------------------------

MATMUL_SHAPES = [
    ((3,), (3,)),
    ((3,), (3, 4)),
    ((2, 3), (3,)),
    ((4,), (2, 4, 3)),
    ((2, 5, 4), (4,)),
    ((5, 3), (3, 7)),
    ((2, 5, 3), (3, 7)),
    ((5, 3), (2, 3, 7)),
    ((2, 1, 5, 3), (4, 3, 2)),
    ((1, 3, 5, 3), (2, 1, 3, 2)),
    ((3, 1, 4), (1, 3, 4, 2)),
]


@pytest.mark.parametrize(("sa", "sb"), MATMUL_SHAPES)
@pytest.mark.parametrize("dt", FLOATS)
def test_matmul_follows_numpy_for_ranks_1_to_4(
    sa: tuple[int, ...], sb: tuple[int, ...], dt: D, driver: CpuBackend
) -> None:
    a, b = rand(sa, 1), rand(sb, 2)
    before = waits(driver)
    got = npu.tensor(a, dtype=PUBLIC[dt]) @ npu.tensor(b, dtype=PUBLIC[dt])
    assert waits(driver) == before  # submitted, not waited for
    flush()
    assert driver.submitted_tensor[-1].opcode == _abi.NPU_OP_MATMUL
    want = np.matmul(host(dt, a), host(dt, b))
    close(got, want, dt, sa[-1])


def test_matmul_reads_transposed_views_in_place(driver: CpuBackend) -> None:
    a, b = rand((6, 4), 3), rand((5, 4), 4)
    ta, tb = npu.tensor(a), npu.tensor(b)
    flush()
    n = len(driver.submitted_tensor)
    c = npu.matmul(ta, tb.T)
    flush()
    assert len(driver.submitted_tensor) == n + 1  # no CONVERT of the view
    flush()
    op = driver.submitted_tensor[-1]
    assert list(op.t[1].strides[:2]) == [1, 4]
    close(c, a.astype(np.float64) @ b.T, D.FP32, 4)
    x = rand((2, 3, 4), 5)
    tx = npu.tensor(x)
    close(tx.transpose(0, 2, 1) @ tx, x.transpose(0, 2, 1) @ x.astype(np.float64), D.FP32, 3)


def test_matmul_promotes_dtypes_and_ints_to_float32() -> None:
    a = np.arange(6).reshape(2, 3)
    b = np.arange(12).reshape(3, 4)
    got = npu.tensor(a, dtype=np.int8) @ npu.tensor(b)
    close(got, a @ b.astype(np.float64), D.FP32)
    f16 = npu.tensor(rand((2, 3), 1), dtype=np.float16)
    assert (f16 @ npu.tensor(b, dtype=np.int8)).npu_dtype is D.FP16  # like numpy
    assert (f16 @ npu.tensor(rand((3, 4), 2), dtype=npu.bfloat16)).npu_dtype is D.FP32
    assert (f16 @ f16.T).npu_dtype is D.FP16
    # Non-tensor operands are uploaded; float64 data becomes float32.
    got = npu.matmul(npu.tensor(a, dtype=np.float32), b.astype(np.float64))
    close(got, a @ b.astype(np.float64), D.FP32)
    got = np.ones((4, 2), np.float32) @ npu.tensor(a, dtype=np.float32)
    assert isinstance(got, npu.Tensor)
    close(got, np.ones((4, 2)) @ a, D.FP32)


def test_matmul_errors_follow_numpy() -> None:
    t = npu.tensor(rand((2, 3), 1))
    with pytest.raises(ValueError, match="not aligned"):
        t @ t
    with pytest.raises(ValueError, match="broadcast"):
        npu.tensor(rand((2, 2, 3), 1)) @ npu.tensor(rand((3, 3, 4), 1))
    with pytest.raises(ValueError, match="scalar"):
        npu.matmul(t, 2.0)
    with pytest.raises(ValueError, match="rank"):
        npu.matmul(npu.tensor(rand((2, 2, 2, 3), 1)), np.ones((2, 1, 1, 3, 4)))


def test_matmul_of_empty_and_k0_operands() -> None:
    z = npu.tensor(np.ones((2, 0), np.float16)) @ npu.tensor(np.ones((0, 3), np.float16))
    assert z.npu_dtype is D.FP16
    np.testing.assert_array_equal(z.numpy(), np.zeros((2, 3)))
    e = npu.tensor(np.ones((0, 2), np.float32)) @ npu.tensor(np.ones((2, 3), np.float32))
    assert e.shape == (0, 3) and e.buffer is None
    v = npu.tensor(np.ones(0, np.float32)) @ npu.tensor(np.ones(0, np.float32))
    assert v.shape == () and v.item() == 0.0


def test_matmul_chains_with_other_ops_without_waiting(driver: CpuBackend) -> None:
    x, w = rand((4, 8), 1), rand((8, 3), 2)
    tx, tw = npu.tensor(x), npu.tensor(w)
    before = waits(driver)
    y = npu.softmax(npu.relu(tx @ tw) * 2 + 1, axis=-1)
    s = y.sum(axis=-1)
    assert waits(driver) == before
    ref = np.maximum(x.astype(np.float64) @ w, 0) * 2 + 1
    ref = np.exp(ref - ref.max(-1, keepdims=True))
    ref /= ref.sum(-1, keepdims=True)
    close(y, ref, D.FP32)
    close(s, np.ones(4), D.FP32)


# -- npu.linear -------------------------------------------------------------------------


@pytest.mark.parametrize("act", [None, "relu", "gelu"])
@pytest.mark.parametrize("with_bias", [False, True])
@pytest.mark.parametrize("dt", FLOATS)
def test_linear_is_torch_linear_plus_activation(
    dt: D, with_bias: bool, act: str | None, driver: CpuBackend
) -> None:
    x, w, b = rand((2, 3, 6), 1), rand((5, 6), 2), rand((5,), 3)
    tx, tw = npu.tensor(x, dtype=PUBLIC[dt]), npu.tensor(w, dtype=PUBLIC[dt])
    tb = npu.tensor(b, dtype=PUBLIC[dt]) if with_bias else None
    flush()
    n = len(driver.submitted_tensor)
    before = waits(driver)
    got = npu.linear(tx, tw, tb, activation=act)
    assert waits(driver) == before
    flush()
    assert len(driver.submitted_tensor) == n + 1  # one fused op, weight.T not copied
    flush()
    op = driver.submitted_tensor[-1]
    assert op.opcode == (_abi.NPU_OP_LINEAR if with_bias else _abi.NPU_OP_MATMUL)
    assert op.kind == {None: 0, "relu": 1, "gelu": 2}[act]
    ref = host(dt, x) @ host(dt, w).T + (host(dt, b) if with_bias else 0)
    close(got, act_ref(ref, A[(act or "none").upper()]), dt, 6)


def test_linear_shapes_and_promotion() -> None:
    w, b = rand((4, 3), 2), rand((4,), 3)
    v = npu.linear(rand((3,), 1), w, b)  # 1-D input: [out_features]
    close(v, rand((3,), 1).astype(np.float64) @ w.T + b, D.FP32)
    x4 = rand((2, 1, 2, 3), 4)
    close(npu.linear(x4, w, b, "relu"), np.maximum(x4 @ w.T.astype(np.float64) + b, 0), D.FP32)
    got = npu.linear(npu.tensor(np.arange(6).reshape(2, 3), dtype=np.int32), w.astype(np.int8))
    assert got.npu_dtype is D.FP32
    got = npu.linear(npu.tensor(x4, dtype=np.float16), npu.tensor(w, dtype=np.float16), b)
    assert got.npu_dtype is D.FP32  # the float32 bias promotes
    assert (
        npu.linear(rand((2, 0), 1), np.ones((4, 0), np.float32), b, "relu").numpy().tolist()
        == [np.maximum(b, 0).tolist()] * 2
    )
    with pytest.raises(ValueError, match="activation"):
        npu.linear(x4, w, activation="tanh")
    with pytest.raises(ValueError, match="features"):
        npu.linear(x4, w.T)
    with pytest.raises(ValueError, match="bias shape"):
        npu.linear(x4, w, b[:3])
    with pytest.raises(ValueError, match="2-D"):
        npu.linear(x4, b)


def test_cpu_backend_rejects_bad_matmul_with_einval(device: npu.Device) -> None:
    a = npu.tensor(rand((2, 3), 1))
    assert a.buffer is not None
    good = ops.matmul_op(a.tensor_ref(), a.T.tensor_ref(), ops.tensor_ref(a.buffer, D.FP32, (2, 2)))
    device.submit([good])
    bad = ops.TensorOp(npu.Opcode.MATMUL, _abi.NPU_ACT_COUNT, good.operands, good.buffers)
    with pytest.raises(npu.NpuError) as info:
        device.submit([bad])
    assert info.value.errno == 22
