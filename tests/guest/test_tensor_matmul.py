"""MATMUL and LINEAR on the device, through npu.Tensor (``@``, npu.matmul,
npu.linear) and raw ioctls.

References are numpy in float64 computed from the values the device holds
(inputs already rounded to their dtype): ``y = act(a @ b + bias)``. The
device accumulates in float32 and rounds once to the output dtype, so the
tolerance is, element by element,

    |got - want| <= rtol * |want| + atol * (|a| @ |b| + |bias|)

with the magnitude term bounding the float32 accumulation error under
cancellation, and per output dtype:

    float32  rtol 1e-5   atol 1e-5
    float16  rtol 1e-3   atol 1e-4   (fp16 has an 11-bit significand: 4.9e-4)
    bfloat16 rtol 8e-3   atol 1e-3   (bf16 has an 8-bit significand: 3.9e-3)

GELU is the exact erf form; its references use math.erf, so GELU cases stay
small (erf in Python is slow in the guest). Results are created first and
downloaded afterwards, so device work overlaps with the host checks.
"""

from __future__ import annotations

import math

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
def mdev():
    yield from cap_device(npu.Cap.MATMUL)


def expect(a, b, bias=None, act=None):
    """(reference, magnitude) of act(a @ b + bias) from float64 host values."""
    y = np.matmul(a, b)
    mag = np.matmul(np.abs(a), np.abs(b))
    if bias is not None:
        y = y + bias
        mag = mag + np.abs(bias)
    return act_ref(y, act), mag


# --------------------------------------------------------------------------
# dtypes x activations x bias
# --------------------------------------------------------------------------


@pytest.mark.parametrize("dt", FLOATS)
def test_linear_every_dtype_activation_and_bias(mdev, dt):
    rng = np.random.default_rng(1)
    x, hx = upload(rnd(rng, (3, 17, 24)), dt)
    w, hw = upload(rnd(rng, (19, 24)), dt)
    b, hb = upload(rnd(rng, (19,)), dt)
    cases = []
    for act in ACTS:
        for with_bias in (False, True):
            got = npu.linear(x, w, b if with_bias else None, activation=act)
            cases.append((got, act, with_bias))
    for got, act, with_bias in cases:
        want, mag = expect(hx, hw.T, hb if with_bias else None, act)
        check(got, want, mag, dt, f"linear {dt.name} act={act} bias={with_bias}")


@pytest.mark.parametrize("dt", FLOATS)
def test_matmul_every_dtype(mdev, dt):
    rng = np.random.default_rng(2)
    a, ha = upload(rnd(rng, (2, 33, 40)), dt)
    b, hb = upload(rnd(rng, (40, 29)), dt)
    got = a @ b
    want, mag = expect(ha, hb)
    check(got, want, mag, dt, f"matmul {dt.name}")


def test_activation_kinds_through_ops_builders(mdev):
    rng = np.random.default_rng(3)
    x, hx = upload(rnd(rng, (9, 16)), D.FP32)
    w, hw = upload(rnd(rng, (16, 11)), D.FP32)
    b, hb = upload(rnd(rng, (1, 11)), D.FP32)
    outs = []
    with mdev.alloc(6 * 9 * 11 * 4) as buf:
        batch = []
        for i, act in enumerate((A.NONE, A.RELU, A.GELU)):
            o1 = ops.tensor_ref(buf, D.FP32, (9, 11), offset=i * 2 * 396)
            o2 = ops.tensor_ref(buf, D.FP32, (9, 11), offset=(i * 2 + 1) * 396)
            batch.append(
                ops.matmul_op(x.tensor_ref(), w.tensor_ref(), o1, act, (x.buffer, w.buffer, buf))
            )
            batch.append(
                ops.linear_op(
                    x.tensor_ref(),
                    w.tensor_ref(),
                    b.tensor_ref(),
                    o2,
                    act,
                    (x.buffer, w.buffer, buf),
                )
            )
            outs.append((act, o1, o2))
        mdev.wait(mdev.submit(batch))
        flat = buf.numpy(np.float32)
        for act, o1, o2 in outs:
            name = {A.NONE: None, A.RELU: "relu", A.GELU: "gelu"}[act]
            for ref, bias in ((o1, None), (o2, hb)):
                got = flat[ref.offset // 4 : ref.offset // 4 + 99].reshape(9, 11)
                want, mag = expect(hx, hw, bias, name)
                err = np.abs(got - want)
                assert np.all(err <= 1e-5 * np.abs(want) + 1e-5 * mag), (act, bias is None)


# --------------------------------------------------------------------------
# Ranks 1..4, broadcasting, transposes, odd and large sizes
# --------------------------------------------------------------------------

RANK_CASES = [
    ((7,), (7,)),
    ((7,), (7, 5)),
    ((4, 7), (7,)),
    ((6,), (3, 6, 2)),
    ((2, 3, 5, 6), (6,)),
    ((5, 6), (6, 4)),
    ((3, 5, 6), (6, 4)),
    ((5, 6), (3, 6, 4)),
    ((3, 5, 6), (3, 6, 4)),
    ((3, 1, 5, 6), (4, 6, 2)),
    ((1, 4, 5, 6), (2, 1, 6, 3)),
    ((2, 3, 5, 6), (2, 3, 6, 4)),
    ((3, 1, 4), (1, 3, 4, 2)),
]


@pytest.mark.parametrize("dt", FLOATS)
def test_ranks_1_to_4_with_broadcasting(mdev, dt):
    rng = np.random.default_rng(4)
    results = []
    for sa, sb in RANK_CASES:
        a, ha = upload(rnd(rng, sa), dt)
        b, hb = upload(rnd(rng, sb), dt)
        results.append((npu.matmul(a, b), ha, hb, (sa, sb)))
    for got, ha, hb, what in results:
        want, mag = expect(ha, hb)
        check(got, want, mag, dt, f"{what}")


def test_transposed_and_strided_operands(mdev):
    rng = np.random.default_rng(5)
    a, ha = upload(rnd(rng, (13, 21)), D.FP32)
    b, hb = upload(rnd(rng, (17, 21)), D.FP32)
    c, hc = upload(rnd(rng, (21, 13)), D.FP32)
    x4, hx4 = upload(rnd(rng, (2, 3, 9, 8)), D.FP16)
    cases = [
        ("a @ b.T", a @ b.T, ha, hb.T),
        ("c.T @ b.T", c.T @ b.T, hc.T, hb.T),
        ("b.T.T @ c", b.T.T @ c, hb, hc),
        ("batched x.mT @ x", x4.transpose(0, 1, 3, 2) @ x4, hx4.transpose(0, 1, 3, 2), hx4),
        ("permuted 4-D", x4.permute(1, 0, 2, 3) @ x4.permute(1, 0, 3, 2),
         hx4.transpose(1, 0, 2, 3), hx4.transpose(1, 0, 3, 2)),
    ]  # fmt: skip
    for what, got, lhs, rhs in cases:
        want, mag = expect(lhs, rhs)
        check(got, want, mag, got.npu_dtype, what)


@pytest.mark.parametrize("m,k,n", [(1, 1, 1), (1, 37, 1), (17, 31, 5), (3, 129, 257),
                                   (65, 1, 63), (127, 3, 2)])  # fmt: skip
def test_odd_sizes(mdev, m, k, n):
    rng = np.random.default_rng(m * 1000 + k * 10 + n)
    for dt in FLOATS:
        x, hx = upload(rnd(rng, (m, k)), dt)
        w, hw = upload(rnd(rng, (n, k)), dt)
        b, hb = upload(rnd(rng, (n,)), dt)
        want, mag = expect(hx, hw.T, hb, "relu")
        check(npu.linear(x, w, b, "relu"), want, mag, dt, f"{dt.name} {m}x{k}x{n}")


def test_large_linear(mdev):
    rng = np.random.default_rng(6)
    x, hx = upload(rnd(rng, (2, 160, 700)), D.FP32)
    w, hw = upload(rnd(rng, (300, 700)), D.FP32)
    b, hb = upload(rnd(rng, (300,)), D.FP32)
    got = npu.linear(x, w, b, "relu")
    got16 = npu.linear(x.astype(np.float16), w.astype(np.float16))
    want, mag = expect(hx, hw.T, hb, "relu")
    check(got, want, mag, D.FP32, "large fp32 linear")
    h16x = x.astype(np.float16).numpy().astype(np.float64)
    h16w = w.astype(np.float16).numpy().astype(np.float64)
    want16, mag16 = expect(h16x, h16w.T)
    check(got16, want16, mag16, D.FP16, "large fp16 matmul")


# --------------------------------------------------------------------------
# Chains with the other tensor ops, promotion, empties
# --------------------------------------------------------------------------


def test_chains_with_other_tensor_ops(mdev):
    rng = np.random.default_rng(7)
    x, hx = upload(rnd(rng, (4, 6, 32)), D.FP32)
    w1, hw1 = upload(rnd(rng, (48, 32), -0.5, 0.5), D.FP32)
    w2, hw2 = upload(rnd(rng, (16, 48), -0.5, 0.5), D.FP32)
    b1, hb1 = upload(rnd(rng, (48,)), D.FP32)
    h = npu.linear(x, w1, b1, "gelu")
    y = npu.layer_norm(npu.linear(h * 0.5 + 1, w2), 16)
    p = npu.softmax(x @ x.transpose(0, 2, 1) * (1 / math.sqrt(32)), axis=-1)
    z = (p @ x).sum(axis=-1)
    bf = npu.linear(x.astype(npu.bfloat16), w1.astype(npu.bfloat16), activation="relu").max(-1)

    hh = act_ref(hx @ hw1.T + hb1, "gelu")
    hy = (hh * 0.5 + 1) @ hw2.T
    hy = (hy - hy.mean(-1, keepdims=True)) / np.sqrt(hy.var(-1, keepdims=True) + 1e-5)
    s = hx @ hx.transpose(0, 2, 1) / math.sqrt(32)
    hp = np.exp(s - s.max(-1, keepdims=True))
    hp /= hp.sum(-1, keepdims=True)
    hz = (hp @ hx).sum(-1)
    np.testing.assert_allclose(y.numpy(), hy, rtol=1e-3, atol=1e-3)
    np.testing.assert_allclose(z.numpy(), hz, rtol=1e-4, atol=1e-3)
    hbf = np.maximum(hx @ hw1.T, 0).max(-1)
    np.testing.assert_allclose(bf.numpy(), hbf, rtol=2e-2, atol=5e-2)


def test_promotion_and_empty_operands(mdev):
    ai = npu.tensor(np.arange(12).reshape(3, 4), dtype=np.int32)
    bi = npu.tensor(np.arange(8).reshape(4, 2), dtype=np.int8)
    got = ai @ bi
    assert got.npu_dtype is D.FP32
    np.testing.assert_array_equal(
        got.numpy(), np.arange(12).reshape(3, 4) @ np.arange(8).reshape(4, 2)
    )
    mixed = npu.tensor(np.ones((2, 3)), dtype=np.float16) @ npu.tensor(
        np.ones((3, 2)), dtype=npu.bfloat16
    )
    assert mixed.npu_dtype is D.FP32
    np.testing.assert_array_equal(mixed.numpy(), np.full((2, 2), 3.0))
    k0 = npu.tensor(np.ones((2, 0), np.float32)) @ npu.tensor(np.ones((0, 3), np.float32))
    np.testing.assert_array_equal(k0.numpy(), np.zeros((2, 3)))
    assert (npu.tensor(np.ones((0, 4), np.float32)) @ npu.tensor(np.ones((4, 3)))).shape == (0, 3)
    # plain numpy inputs keep the v1 GEMM path and return an ndarray
    c = npu.matmul(np.ones((3, 4)), np.ones((4, 2)))
    assert isinstance(c, np.ndarray) and c.dtype == np.float32


# --------------------------------------------------------------------------
# Raw ioctls: bad ops are rejected with EINVAL
# --------------------------------------------------------------------------


@pytest.fixture
def raw(fd):
    return raw_bo(fd, 16384)


def good_ops(bo):
    a = ops.tensor_ref(bo, D.FP32, (2, 4, 8))
    b = ops.tensor_ref(bo, D.FP32, (1, 8, 6), strides=(0, 1, 8), offset=4096)  # transposed
    bias = ops.tensor_ref(bo, D.FP32, (1, 1, 6), offset=8192)
    out = ops.tensor_ref(bo, D.FP32, (2, 4, 6), offset=12288)
    return {
        "matmul": ops.matmul_op(a, b, out, A.RELU).pack(),
        "linear": ops.linear_op(a, b, bias, out, A.GELU).pack(),
    }


def _int_operands(op, n):
    for i in range(n):
        op.t[i].dtype = _abi.NPU_DTYPE_INT32


MUTATIONS = {
    "matmul mixed dtypes": ("matmul", lambda op: setattr(op.t[1], "dtype", _abi.NPU_DTYPE_FP16)),
    "linear bias dtype": ("linear", lambda op: setattr(op.t[2], "dtype", _abi.NPU_DTYPE_BF16)),
    "linear mixed out dtype": ("linear", lambda op: setattr(op.t[3], "dtype", _abi.NPU_DTYPE_FP16)),
    "matmul K mismatch": ("matmul", lambda op: op.t[1].shape.__setitem__(1, 7)),
    "linear K mismatch": ("linear", lambda op: op.t[0].shape.__setitem__(2, 7)),
    "matmul M mismatch": ("matmul", lambda op: op.t[2].shape.__setitem__(1, 3)),
    "matmul batch mismatch": ("matmul", lambda op: op.t[0].shape.__setitem__(0, 3)),
    "matmul rank mismatch": ("matmul", lambda op: (setattr(op.t[1], "ndim", 2),
                                                   op.t[1].shape.__setitem__(2, 0),
                                                   op.t[1].strides.__setitem__(2, 0),
                                                   op.t[1].shape.__setitem__(0, 8),
                                                   op.t[1].shape.__setitem__(1, 6),
                                                   op.t[1].strides.__setitem__(0, 1),
                                                   op.t[1].strides.__setitem__(1, 8))),
    "linear bias shape N-1": ("linear", lambda op: op.t[2].shape.__setitem__(2, 5)),
    "linear bias not 1 in batch": ("linear", lambda op: op.t[2].shape.__setitem__(0, 2)),
    "linear bias rank 1": ("linear", lambda op: (setattr(op.t[2], "ndim", 1),
                                                 op.t[2].shape.__setitem__(0, 6),
                                                 op.t[2].shape.__setitem__(1, 0),
                                                 op.t[2].shape.__setitem__(2, 0),
                                                 op.t[2].strides.__setitem__(1, 0),
                                                 op.t[2].strides.__setitem__(2, 0))),
    "matmul kind past the last": ("matmul", lambda op: setattr(op, "kind", _abi.NPU_ACT_COUNT)),
    "linear kind past the last": ("linear", lambda op: setattr(op, "kind", _abi.NPU_ACT_COUNT)),
    "matmul of int32": ("matmul", lambda op: _int_operands(op, 3)),
    "linear of int32": ("linear", lambda op: _int_operands(op, 4)),
    "matmul of int8 to fp32": ("matmul", lambda op: [setattr(op.t[i], "dtype",
                                                             _abi.NPU_DTYPE_INT8)
                                                     for i in range(2)]),
    "matmul nonzero params[0]": ("matmul", lambda op: op.params.__setitem__(0, 1)),
    "matmul 4th operand": ("matmul", lambda op: setattr(op.t[3], "ndim", 1)),
    "matmul strided out": ("matmul", lambda op: op.t[2].strides.__setitem__(2, 2)),
}  # fmt: skip


def test_driver_rejects_bad_matmul_and_linear_with_einval(mdev, raw):
    fd, bo = raw
    good = good_ops(bo)
    raw_wait(fd, raw_submit(fd, list(good.values())))  # the unmodified ops are accepted
    failures = mutations_not_rejected(fd, good_ops, bo, MUTATIONS)
    assert not failures, failures
    raw_wait(fd, raw_submit(fd, [good["matmul"]]))  # the queue still works
