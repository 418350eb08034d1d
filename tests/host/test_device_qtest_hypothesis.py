"""Hypothesis-generated shapes for the tensor ops, run on the device model through qtest.

No guest: one QEMU per module (``-accel qtest``) whose NPU translates every
operand address through its MMU, so that the random parameter blocks of the
validator property may point anywhere and the worst they get is an MMU fault.
The numeric references follow tests/host/test_device_qtest_tensor.py (fp32
compute rounded once to the output dtype, integer wraparound, float -> int
truncation with saturation, round to nearest even for fp16/bf16); the status
of a random parameter block is what the C validator ``npu_tensor_op_check``
of include/npu_tensor.h computes, compiled here with gcc.
"""

from __future__ import annotations

import ctypes
import math
import shutil
import struct
import subprocess
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

import hypothesis
import numpy as np
import pytest

from qtest import REPO, Npu, hw, hw_tensor, tensor, tensor_params
from qtest_tensor_ref import (
    BF16,
    FLOATS,
    FP16,
    FP32,
    INT8,
    INT32,
    INT_RANGE,
    MM_REL,
    SIZE,
    TINY,
    ULP,
    assert_matches,
    contiguous,
    decode,
    encode,
    extent,
    gather,
    ref_act,
    ref_convert,
    round_to,
    wrap,
)

st = hypothesis.strategies
HealthCheck = hypothesis.HealthCheck

SETTINGS = hypothesis.settings(
    max_examples=40,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=list(HealthCheck),
)

DTYPES = (FP32, FP16, BF16, INT8, INT32)
ELTWISE_KINDS = (hw.ELTWISE_ADD, hw.ELTWISE_SUB, hw.ELTWISE_MUL, hw.ELTWISE_DIV,
                 hw.ELTWISE_MAX, hw.ELTWISE_MIN)  # fmt: skip
REDUCE_KINDS = (hw.REDUCE_SUM, hw.REDUCE_MEAN, hw.REDUCE_MAX, hw.REDUCE_MIN)
ACTS = (hw.ACT_NONE, hw.ACT_RELU, hw.ACT_GELU)
# The tensor ops param_blocks() knows (OPERANDS); REQUANT has its own tests
# (test_device_qtest_quant.py) and SIGNAL/WAIT are not tensor ops.
TENSOR_OPS = tuple(range(hw.OP_ELTWISE, hw.OP_REQUANT))

# Device VA space: one L1 entry (2 MiB). Page i lives at BACKING + i * 4 KiB.
# Pages below READONLY_FIRST are writable, then read-only ones, then a hole.
L1, L2 = 0x20_0000, 0x20_1000
BACKING = 0x0100_0000
VA_PAGES = hw.MMU_L2_ENTRIES
READONLY_FIRST, HOLE_FIRST = 496, 504
VA_SPACE = VA_PAGES << 12
PARAMS_VA = 0x0  # the parameter block
HEAP_VA = 0x1000  # operands, allocated upwards from here
GUARD = 0xAA


# --------------------------------------------------------------------------
# Values and references (as in test_device_qtest_tensor.py)
# --------------------------------------------------------------------------


def random_values(rng: np.random.Generator, dtype: int, n: int, *, scale: float = 4.0,
                  specials: bool = True) -> np.ndarray:  # fmt: skip
    if dtype in FLOATS:
        x = (rng.standard_normal(n) * scale).astype(np.float32)
        if specials:
            sp = [0.0, -0.0, np.inf, -np.inf, np.nan, 1.0, -1.0, 0.5]
            sp += {FP32: [3e38, -1e-40, 1e-45], FP16: [65504.0, -6e-8, 1e-5],
                   BF16: [3e38, 1e-38, -2.5]}[dtype]  # fmt: skip
            # Scattered over the buffer rather than all in front.
            pos = rng.choice(n, size=min(n, len(sp)), replace=False)
            x[pos] = sp[: pos.size]
        return round_to(x, dtype)
    lo, hi = INT_RANGE[dtype]
    x = rng.integers(lo, hi + 1, n, dtype=np.int64)
    if dtype == INT32:
        x[n // 2 :] = rng.integers(-50000, 50000, n - n // 2)
    if specials:
        sp = [0, 1, -1, lo, hi, lo + 1, hi - 1]
        pos = rng.choice(n, size=min(n, len(sp)), replace=False)
        x[pos] = sp[: pos.size]
    return x


def ref_eltwise(kind: int, a: np.ndarray, b: np.ndarray, dtype: int) -> np.ndarray:
    fn = {hw.ELTWISE_ADD: np.add, hw.ELTWISE_SUB: np.subtract, hw.ELTWISE_MUL: np.multiply,
          hw.ELTWISE_DIV: np.divide, hw.ELTWISE_MAX: np.maximum,
          hw.ELTWISE_MIN: np.minimum}[kind]  # fmt: skip
    with np.errstate(all="ignore"):
        if dtype in FLOATS:
            return round_to(fn(a.astype(np.float32), b.astype(np.float32)), dtype)
        return wrap(fn(a.astype(np.int64), b.astype(np.int64)), dtype)


def ref_reduce(kind: int, x: np.ndarray, mask: int, dtype: int) -> np.ndarray:
    axes = tuple(d for d in range(x.ndim) if mask >> d & 1)
    with np.errstate(all="ignore"):
        if kind == hw.REDUCE_MAX:
            return np.max(x, axis=axes, keepdims=True)
        if kind == hw.REDUCE_MIN:
            return np.min(x, axis=axes, keepdims=True)
        if dtype not in FLOATS:
            return wrap(np.sum(x.astype(np.int64), axis=axes, keepdims=True), dtype)
        r = np.sum(x.astype(np.float64), axis=axes, keepdims=True)
        if kind == hw.REDUCE_MEAN:
            r = r / math.prod(x.shape[d] for d in axes)
        return r


def check_matmul(got: np.ndarray, a: np.ndarray, b: np.ndarray, kind: int, dtype: int) -> None:
    """The bound of test_device_qtest_tensor.py: 1e-5 of sum |a||b| plus an ulp."""
    a64, b64 = a.astype(np.float64), b.astype(np.float64)
    acc, mag = np.matmul(a64, b64), np.matmul(np.abs(a64), np.abs(b64))
    want = ref_act(kind, acc)
    tol = (2e-5 if kind == hw.ACT_GELU else 1e-5) * mag + MM_REL[dtype] * np.abs(want)
    tol += TINY[dtype] + (2.0**-21 * np.abs(want) if kind == hw.ACT_GELU else 0.0)
    assert got.shape == want.shape, (got.shape, want.shape)
    bad = ~(np.abs(got.astype(np.float64) - want) <= tol)
    assert not bad.any(), (
        f"{bad.sum()} of {bad.size} off, first at {np.argwhere(bad)[0]}: "
        f"got {got[bad][0]!r} want {want[bad][0]!r} tol {tol[bad][0]!r}"
    )


# --------------------------------------------------------------------------
# The device: one QEMU, MMU on, operands in a flat 2 MiB VA space
# --------------------------------------------------------------------------


@dataclass
class Operand:
    dtype: int
    shape: tuple[int, ...]
    strides: tuple[int, ...]
    buf: np.ndarray | None = None  # inputs: the flat values behind the view
    va: int = 0

    @property
    def nbytes(self) -> int:
        return extent(self.shape, self.strides) * SIZE[self.dtype]

    def logical(self) -> np.ndarray:
        assert self.buf is not None
        return gather(self.buf, self.shape, self.strides)


def make_input(rng: np.random.Generator, dtype: int, shape: Sequence[int],
               strides: Sequence[int] | None = None, **kw: float) -> Operand:  # fmt: skip
    shape = tuple(shape)
    op = Operand(dtype, shape, tuple(strides) if strides is not None else contiguous(shape))
    op.buf = random_values(rng, dtype, op.nbytes // SIZE[dtype], **kw)  # type: ignore[arg-type]
    return op


def make_output(dtype: int, shape: Sequence[int]) -> Operand:
    return Operand(dtype, tuple(shape), contiguous(shape))


class Rig:
    def __init__(self, npu: Npu) -> None:
        self.npu = npu
        self.fence = 0

    def write(self, va: int, data: bytes) -> None:
        assert va + len(data) <= READONLY_FIRST << 12
        self.npu.qt.memwrite(BACKING + va, data)

    def read(self, va: int, size: int) -> bytes:
        return self.npu.qt.memread(BACKING + va, size)

    def submit(self, opcode: int, kind: int, block: bytes) -> int:
        self.write(PARAMS_VA, block)
        self.fence += 1
        cpl = self.npu.run(tensor(opcode, PARAMS_VA, kind, fence=self.fence), 30.0)
        assert cpl.opcode == opcode
        return cpl.status

    def run(self, opcode: int, kind: int, operands: Sequence[Operand],
            params: Sequence[int] = ()) -> np.ndarray:  # fmt: skip
        """Place the inputs and a guarded output, run the op (it must be OK), read it."""
        va = HEAP_VA
        for op in operands:
            op.va = va
            if op is operands[-1]:
                self.write(va, bytes([GUARD]) * (op.nbytes + 64))
            else:
                self.write(va, encode(op.buf, op.dtype))  # type: ignore[arg-type]
            va += (op.nbytes + 64 + 0xFFF) & ~0xFFF
        block = tensor_params(
            [hw_tensor(op.va, op.dtype, op.shape, op.strides) for op in operands], params
        )
        status = self.submit(opcode, kind, block)
        assert status == hw.ST_OK, f"status {status}"
        out = operands[-1]
        raw = self.read(out.va, out.nbytes + 64)
        assert raw[out.nbytes :] == bytes([GUARD]) * 64, "the op wrote past its output"
        return decode(raw[: out.nbytes], out.dtype, out.shape)

    def check_alive(self) -> None:
        self.npu.assert_alive()
        assert not self.npu.rd(hw.REG_STATUS) & hw.STATUS_ERROR


@pytest.fixture(scope="module")
def rig(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Rig]:
    dev = Npu(tmp_path_factory.mktemp("hypothesis") / "qemu.log")
    try:
        qt = dev.qt
        qt.memset(L1, 0x2000, 0)
        qt.memwrite(L1, struct.pack("<Q", L2 | hw.PTE_VALID))
        ptes = [
            0 if page >= HOLE_FIRST
            else (BACKING + (page << 12)) | hw.PTE_VALID
            | (hw.PTE_WRITE if page < READONLY_FIRST else 0)
            for page in range(VA_PAGES)
        ]  # fmt: skip
        qt.memwrite(L2, struct.pack(f"<{VA_PAGES}Q", *ptes))
        qt.memset(BACKING, VA_SPACE, 0)
        dev.wr(hw.REG_MMU_L1_LO, L1)
        dev.wr(hw.REG_MMU_L1_HI, 0)
        dev.wr(hw.REG_MMU_L1_ENTRIES, 1)
        dev.wr(hw.REG_MMU_CONTROL, hw.MMU_ENABLE)
        dev.start()
        r = Rig(dev)
        yield r
        r.check_alive()
    finally:
        dev.close()


# --------------------------------------------------------------------------
# The C validator, compiled from include/npu_tensor.h
# --------------------------------------------------------------------------

VALIDATOR_C = """
#include "npu_tensor.h"
unsigned check(unsigned opcode, unsigned kind, const void *block)
{
	return npu_tensor_op_check(opcode, kind, (const struct npu_tensor_params *)block);
}
"""


@pytest.fixture(scope="module")
def c_check(tmp_path_factory: pytest.TempPathFactory) -> Callable[[int, int, bytes], int]:
    gcc = shutil.which("gcc")
    if gcc is None:
        pytest.fail("gcc is not installed (scripts/deps.sh installs build-essential)")
    tmp = tmp_path_factory.mktemp("validator")
    src, lib = tmp / "check.c", tmp / "libcheck.so"
    src.write_text(VALIDATOR_C)
    subprocess.run([gcc, "-shared", "-fPIC", "-O1", "-Wall", "-Werror",
                    f"-I{REPO / 'include'}", "-o", str(lib), str(src)], check=True)  # fmt: skip
    fn = ctypes.CDLL(str(lib)).check
    fn.argtypes = [ctypes.c_uint32, ctypes.c_uint32, ctypes.c_char_p]
    fn.restype = ctypes.c_uint32
    return fn


# --------------------------------------------------------------------------
# Strategies
# --------------------------------------------------------------------------

seeds = st.integers(0, 2**32 - 1)


def shapes(min_rank: int = 1, max_rank: int = 4, max_dim: int = 9) -> st.SearchStrategy:
    return st.lists(st.integers(1, max_dim), min_size=min_rank, max_size=max_rank).map(tuple)


@st.composite
def views(draw: st.DrawFn, shape: Sequence[int]) -> tuple[int, ...]:
    """Strides of a permuted layout of shape, maybe padded along one axis, maybe spaced."""
    rank = len(shape)
    perm = draw(st.permutations(range(rank)))
    alloc = [shape[p] for p in perm]
    if draw(st.booleans()):  # a gap at the end of one layout axis
        alloc[draw(st.integers(0, rank - 1))] += draw(st.integers(1, 3))
    step = draw(st.sampled_from((1, 1, 2, 3)))  # a gap between elements
    layout = [s * step for s in contiguous(alloc)]
    strides = [0] * rank
    for i, p in enumerate(perm):
        strides[p] = layout[i]
    return tuple(strides)


@st.composite
def broadcast_pair(draw: st.DrawFn) -> tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...]]:
    out = draw(shapes())
    ones = st.sampled_from((False, False, True))
    a = tuple(1 if draw(ones) else n for n in out)
    b = tuple(1 if draw(ones) else n for n in out)
    # The output is what a and b broadcast to (a dim may be 1 on both sides).
    return a, b, tuple(np.broadcast_shapes(a, b))


# --------------------------------------------------------------------------
# Properties
# --------------------------------------------------------------------------


@SETTINGS
@hypothesis.given(
    shp=broadcast_pair(),
    dtype=st.sampled_from(DTYPES),
    kind=st.sampled_from(ELTWISE_KINDS),
    seed=seeds,
)
def test_eltwise_of_broadcast_shapes_matches_numpy(
    rig: Rig, shp: tuple[tuple[int, ...], ...], dtype: int, kind: int, seed: int
) -> None:
    if dtype not in FLOATS and kind == hw.ELTWISE_DIV:
        kind = hw.ELTWISE_MUL  # DIV is float-only
    sa, sb, so = shp
    rng = np.random.default_rng(seed)
    a, b = make_input(rng, dtype, sa), make_input(rng, dtype, sb)
    got = rig.run(hw.OP_ELTWISE, kind, [a, b, make_output(dtype, so)])
    want = ref_eltwise(kind, np.broadcast_to(a.logical(), so), np.broadcast_to(b.logical(), so),
                       dtype)  # fmt: skip
    assert_matches(got, want, dtype, what=f"{sa} {kind} {sb}")
    rig.check_alive()


@st.composite
def convert_case(draw: st.DrawFn) -> tuple[tuple[int, ...], tuple[int, ...]]:
    shape = draw(shapes(max_dim=7))
    return shape, draw(views(shape))


@SETTINGS
@hypothesis.given(
    view=convert_case(), src=st.sampled_from(DTYPES), dst=st.sampled_from(DTYPES), seed=seeds
)
def test_convert_of_permuted_strided_views_matches_numpy(
    rig: Rig, view: tuple[tuple[int, ...], tuple[int, ...]], src: int, dst: int, seed: int
) -> None:
    shape, strides = view
    x = make_input(np.random.default_rng(seed), src, shape, strides, scale=300.0)
    got = rig.run(hw.OP_CONVERT, 0, [x, make_output(dst, shape)])
    assert_matches(got, ref_convert(x.logical(), src, dst), dst, what=f"{shape} {strides}")
    rig.check_alive()


@st.composite
def reduce_case(draw: st.DrawFn) -> tuple[tuple[int, ...], tuple[int, ...], int]:
    shape = draw(shapes(max_dim=7))
    strides = draw(views(shape)) if draw(st.booleans()) else contiguous(shape)
    mask = draw(st.integers(1, (1 << len(shape)) - 1))
    return shape, strides, mask


@SETTINGS
@hypothesis.given(
    case=reduce_case(),
    dtype=st.sampled_from(DTYPES),
    kind=st.sampled_from(REDUCE_KINDS),
    seed=seeds,
)
def test_reduce_over_random_axes_matches_numpy(
    rig: Rig, case: tuple[tuple[int, ...], tuple[int, ...], int], dtype: int, kind: int,
    seed: int,
) -> None:  # fmt: skip
    if dtype not in FLOATS and kind == hw.REDUCE_MEAN:
        kind = hw.REDUCE_SUM  # MEAN is float-only
    shape, strides, mask = case
    sums = kind in (hw.REDUCE_SUM, hw.REDUCE_MEAN)
    x = make_input(np.random.default_rng(seed), dtype, shape, strides,
                   specials=not (sums and dtype in FLOATS))  # fmt: skip
    out = make_output(dtype, tuple(1 if mask >> d & 1 else n for d, n in enumerate(shape)))
    got = rig.run(hw.OP_REDUCE, kind, [x, out], params=[mask])
    want = ref_reduce(kind, x.logical(), mask, dtype)
    what = f"{shape} {strides} mask {mask:#x}"
    if dtype in FLOATS and sums:
        assert_matches(got, round_to(want, dtype), dtype, rtol=ULP[dtype], atol=TINY[dtype],
                       what=what)  # fmt: skip
    else:
        assert_matches(got, round_to(want, dtype), dtype, what=what)
    rig.check_alive()


@st.composite
def matmul_case(draw: st.DrawFn) -> tuple[tuple[int, ...], tuple[int, ...]]:
    m, k, n = (draw(st.integers(1, 33)) for _ in range(3))
    batch = draw(shapes(min_rank=0, max_rank=2, max_dim=3))
    ones = st.sampled_from((False, False, True))
    ba = tuple(1 if draw(ones) else d for d in batch)
    bb = tuple(1 if draw(ones) else d for d in batch)
    return (*ba, m, k), (*bb, k, n)


@SETTINGS
@hypothesis.given(shp=matmul_case(), act=st.sampled_from(ACTS), seed=seeds)
def test_matmul_of_random_sizes_and_batches_matches_numpy(
    rig: Rig, shp: tuple[tuple[int, ...], tuple[int, ...]], act: int, seed: int
) -> None:
    sa, sb = shp
    rng = np.random.default_rng(seed)
    a = make_input(rng, FP32, sa, specials=False, scale=1.0)
    b = make_input(rng, FP32, sb, specials=False, scale=1.0)
    so = (*np.broadcast_shapes(sa[:-2], sb[:-2]), sa[-2], sb[-1])
    got = rig.run(hw.OP_MATMUL, act, [a, b, make_output(FP32, so)])
    check_matmul(got, a.logical(), b.logical(), act, FP32)
    rig.check_alive()


# -- random parameter blocks against the C validator ------------------------

# Mostly small values, with the boundaries of every field mixed in.
DIMS = st.one_of(
    st.integers(1, 5), st.sampled_from((0, 1 << 16, 0x7FFF_FFFF, 1 << 31, 0xFFFF_FFFF))
)
STRIDES = st.one_of(st.integers(0, 8), st.sampled_from((64, 0x7FFF_FFFF, 1 << 31, 0xFFFF_FFFF)))
VAS = st.one_of(
    st.integers(HEAP_VA, 0x2_0000).map(lambda v: v & ~3),  # mapped, writable
    st.integers(HEAP_VA, 0x2_0000),  # mapped, maybe misaligned
    st.integers(READONLY_FIRST << 12, VA_SPACE - 1),  # read-only pages, then the hole
    st.sampled_from((VA_SPACE, VA_SPACE + 0x1000, 1 << 40)),  # beyond the L1 table
)


def rarely(draw: st.DrawFn, one_in: int, noisy: bool = True) -> bool:
    return noisy and draw(st.integers(0, one_in - 1)) == 0


OPERANDS = {hw.OP_ELTWISE: 3, hw.OP_UNARY: 2, hw.OP_CONVERT: 2, hw.OP_REDUCE: 2,
            hw.OP_SOFTMAX: 2, hw.OP_LAYERNORM: 4, hw.OP_MATMUL: 3, hw.OP_LINEAR: 4,
            hw.OP_CONV2D: 4, hw.OP_POOL2D: 2}  # fmt: skip


@st.composite
def hw_tensors(draw: st.DrawFn, dtype: int, shape: tuple[int, ...], noisy: bool,
               out: bool) -> bytes:  # fmt: skip
    """An operand of dtype and shape; when noisy, each field is mutated now and then."""
    ndim = len(shape)
    if rarely(draw, 8, noisy):
        dtype = draw(st.integers(0, hw.DTYPE_COUNT))
    if rarely(draw, 10, noisy):
        ndim = draw(st.integers(0, hw.MAX_RANK + 1))
    nd = min(ndim, hw.MAX_RANK)
    dims = [draw(DIMS) if rarely(draw, 6, noisy) else d for d in [*shape, 1, 1, 1, 1][:nd]]
    if (out and not rarely(draw, 4, noisy)) or draw(st.booleans()):
        strides = list(contiguous([max(d, 1) for d in dims]))
    else:
        strides = [draw(STRIDES) for _ in range(nd)]
    va = draw(VAS) if noisy or rarely(draw, 3) else draw(st.integers(1, 0x40)) << 10
    raw = bytearray(hw_tensor(va, dtype, [d & 0xFFFF_FFFF for d in dims],
                              [s & 0xFFFF_FFFF for s in strides], ndim=ndim))  # fmt: skip
    if nd < hw.MAX_RANK and rarely(draw, 10, noisy):  # junk in an unused dim
        d = draw(st.integers(nd, hw.MAX_RANK - 1))
        struct.pack_into("<I", raw, 16 + 4 * hw.MAX_RANK * draw(st.integers(0, 1)) + 4 * d, 1)
    return bytes(raw)


@st.composite
def param_blocks(draw: st.DrawFn) -> tuple[int, int, bytes]:
    """A tensor op whose block is close to valid, with random faults mixed in."""
    opcode = draw(st.sampled_from(TENSOR_OPS))
    noisy = draw(st.booleans())
    if rarely(draw, 8, noisy):
        kind = draw(st.integers(0, 0xFFFF_FFFF))
    else:
        kind = draw(st.sampled_from((0, 0, 0, 1, 2)))
    mm = opcode in (hw.OP_MATMUL, hw.OP_LINEAR)
    window = opcode in (hw.OP_CONV2D, hw.OP_POOL2D)
    rank = 4 if window else draw(st.integers(2 if mm else 1, hw.MAX_RANK))
    dtype = draw(st.sampled_from((FP32, FP16, BF16, INT8, INT32, FP32, FP16)))
    shape = draw(shapes(rank, rank, 5))
    shp = [shape] * OPERANDS[opcode]
    if mm:  # a [.., M, K] @ b [.., K, N] -> [.., M, N]
        m, k, nn = (draw(st.integers(1, 5)) for _ in range(3))
        shp = [(*shape[:-2], m, k), (*shape[:-2], k, nn)]
        shp += [(*[1] * (rank - 1), nn)] * (opcode == hw.OP_LINEAR) + [(*shape[:-2], m, nn)]
    elif opcode == hw.OP_LAYERNORM:
        shp[1] = shp[2] = (*[1] * (rank - 1), shape[-1])
    elif window:  # NCHW, kernel 1..3, stride 1..2, no padding, one group
        kh, kw, sh, sw = (draw(st.integers(1, 3)) for _ in range(4))
        kh, kw, sh, sw = min(kh, shape[2]), min(kw, shape[3]), (sh + 1) // 2, (sw + 1) // 2
        oh, ow = (shape[2] - kh) // sh + 1, (shape[3] - kw) // sw + 1
        if opcode == hw.OP_CONV2D:
            o = draw(st.integers(1, 3))
            shp = [shape, (o, shape[1], kh, kw), (1, o, 1, 1), (shape[0], o, oh, ow)]
        else:
            shp = [shape, (*shape[:2], oh, ow)]
        wparams = [sh, sw, 0, 0, 1, 1, 1] if opcode == hw.OP_CONV2D else [kh, kw, sh, sw, 0, 0, 0]
    n = draw(st.integers(0, hw.TENSOR_OPERANDS)) if rarely(draw, 8, noisy) else OPERANDS[opcode]
    shp += [shape] * hw.TENSOR_OPERANDS
    if opcode == hw.OP_REDUCE:
        mask = draw(st.integers(1, (1 << rank) - 1))
        shp[1] = tuple(1 if mask >> d & 1 else s for d, s in enumerate(shape))
    ops = [draw(hw_tensors(dtype, shp[i], noisy, i == n - 1)) for i in range(n)]
    if rarely(draw, 4, noisy):
        params = [draw(st.one_of(st.integers(0, 3), st.integers(0, 0xFFFF_FFFF)))
                  for _ in range(draw(st.integers(0, 7)))]  # fmt: skip
    elif opcode == hw.OP_REDUCE:
        params = [mask]
    elif opcode == hw.OP_SOFTMAX:
        params = [draw(st.integers(0, rank - 1))]
    elif opcode == hw.OP_LAYERNORM:
        params = [draw(st.integers(1, rank)), 0x3727C5AC]  # eps 1e-5
    elif window:
        params = wparams
    else:
        params = []
    if rarely(draw, 10, noisy):  # a stray word further on
        params += [0] * (draw(st.integers(7, hw.TENSOR_PARAMS - 1)) - len(params)) + [1]
    return opcode, kind, tensor_params(ops, params)


@SETTINGS
@hypothesis.given(case=param_blocks())
def test_random_parameter_block_gets_the_validators_status(
    rig: Rig, c_check: Callable[[int, int, bytes], int], case: tuple[int, int, bytes]
) -> None:
    opcode, kind, block = case
    want = c_check(opcode, kind, block)
    got = rig.submit(opcode, kind, block)
    rig.check_alive()
    if want == hw.ST_OK:
        # Operands may point anywhere: the op runs, or faults on an unmapped page.
        assert got in (hw.ST_OK, hw.ST_MMU_FAULT), f"opcode {opcode} kind {kind}: {got}"
    else:
        assert got == want, f"opcode {opcode} kind {kind}: got {got}, validator {want}"
