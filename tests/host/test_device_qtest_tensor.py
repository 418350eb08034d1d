"""Tensor ops (ELTWISE .. LINEAR) through qtest.

Every result is checked against a numpy reference computed here with the
semantics of docs/npu-spec.md: float dtypes compute in fp32 and round once
(round to nearest even) to the output dtype, integers wrap like numpy,
float -> int conversions truncate and saturate (NaN -> 0). bfloat16 has no
numpy type: values travel as uint16 bit patterns and the reference rounds
the fp32 bit pattern to nearest even.

Most tests share one QEMU (module fixture); the MMU and multi-core tests
start their own.
"""

from __future__ import annotations

import math
import struct
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest

from qtest import (
    DATA,
    TENSOR_PARAMS_SIZE,
    TENSOR_SIZE,
    Npu,
    cmd,
    hw,
    hw_tensor,
    tensor,
    tensor_params,
)
from qtest_tensor_ref import (
    BF16,
    BOOL,
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

DTYPES = {"fp32": FP32, "fp16": FP16, "bf16": BF16, "int8": INT8, "int32": INT32}

ELTWISE = {"add": hw.ELTWISE_ADD, "sub": hw.ELTWISE_SUB, "mul": hw.ELTWISE_MUL,
           "div": hw.ELTWISE_DIV, "max": hw.ELTWISE_MAX, "min": hw.ELTWISE_MIN}  # fmt: skip
UNARY = {"relu": hw.UNARY_RELU, "gelu": hw.UNARY_GELU, "sigmoid": hw.UNARY_SIGMOID,
         "tanh": hw.UNARY_TANH, "exp": hw.UNARY_EXP, "log": hw.UNARY_LOG,
         "sqrt": hw.UNARY_SQRT, "abs": hw.UNARY_ABS, "neg": hw.UNARY_NEG,
         "erf": hw.UNARY_ERF, "reciprocal": hw.UNARY_RECIPROCAL}  # fmt: skip
INT_UNARY = {"relu", "abs", "neg"}

PARAMS = DATA  # parameter block (64-byte aligned)
HEAP = DATA + 0x1_0000  # operands, allocated upwards from here
GUARD = 0xAA  # the byte every output region starts with


# --------------------------------------------------------------------------
# Values: encoding, decoding and numpy references
# --------------------------------------------------------------------------


def random_values(rng: np.random.Generator, dtype: int, n: int, *, scale: float = 4.0,
                  specials: bool = True) -> np.ndarray:  # fmt: skip
    """n values of dtype (as float32 / int64), with the interesting ones first."""
    if dtype in FLOATS:
        x = (rng.standard_normal(n) * scale).astype(np.float32)
        if specials:
            sp = [0.0, -0.0, np.inf, -np.inf, np.nan, 1.0, -1.0, 0.5]
            sp += {FP32: [3e38, -1e-40, 1e-45], FP16: [65504.0, -6e-8, 1e-5],
                   BF16: [3e38, 1e-38, -2.5]}[dtype]  # fmt: skip
            k = min(n, len(sp))
            x[:k] = sp[:k]
        return round_to(x, dtype)
    lo, hi = INT_RANGE[dtype]
    x = rng.integers(lo, hi + 1, n, dtype=np.int64)
    if dtype == INT32:  # small values too, so that products do not always wrap
        x[n // 2 :] = rng.integers(-50000, 50000, n - n // 2)
    if specials:
        sp = [0, 1, -1, lo, hi, lo + 1, hi - 1]
        k = min(n, len(sp))
        x[:k] = sp[:k]
    return x


# --------------------------------------------------------------------------
# Running ops
# --------------------------------------------------------------------------


@dataclass
class Operand:
    dtype: int
    shape: tuple[int, ...]
    strides: tuple[int, ...] | None = None  # contiguous when None
    buf: np.ndarray | None = None  # input: flat values backing the operand
    va: int = 0

    def __post_init__(self) -> None:
        self.shape = tuple(self.shape)
        if self.strides is None:
            self.strides = contiguous(self.shape)
        self.strides = tuple(self.strides)

    @property
    def nbytes(self) -> int:
        return extent(self.shape, self.strides) * SIZE[self.dtype]

    def desc(self) -> bytes:
        return hw_tensor(self.va, self.dtype, self.shape, self.strides)


class Rig:
    """Operands and parameter blocks in guest memory; ops run on queue 0."""

    def __init__(self, npu: Npu, *, va_to_pa: Callable[[int], int] | None = None) -> None:
        self.npu = npu
        self.va_to_pa = va_to_pa
        self.fence = 0

    # Memory at device addresses (VAs when the MMU is on): page by page.
    def write(self, va: int, data: bytes) -> None:
        if self.va_to_pa is None:
            self.npu.qt.memwrite(va, data)
            return
        pos = 0
        while pos < len(data):
            n = min(len(data) - pos, 0x1000 - ((va + pos) & 0xFFF))
            self.npu.qt.memwrite(self.va_to_pa(va + pos), data[pos : pos + n])
            pos += n

    def read(self, va: int, size: int) -> bytes:
        if self.va_to_pa is None:
            return self.npu.qt.memread(va, size)
        out, pos = b"", 0
        while pos < size:
            n = min(size - pos, 0x1000 - ((va + pos) & 0xFFF))
            out += self.npu.qt.memread(self.va_to_pa(va + pos), n)
            pos += n
        return out

    def place(self, operands: Sequence[Operand], base: int = HEAP) -> None:
        """Give each operand a 4 KiB aligned VA, write inputs, fill outputs with GUARD."""
        va = base
        for i, op in enumerate(operands):
            op.va = va
            if i < len(operands) - 1:
                assert op.buf is not None and op.buf.size == op.nbytes // SIZE[op.dtype]
                self.write(va, encode(op.buf, op.dtype))
            else:
                self.write(va, bytes([GUARD]) * (op.nbytes + 64))
            va += (op.nbytes + 64 + 0xFFF) & ~0xFFF

    def submit(self, opcode: int, kind: int, block: bytes, *, params: int = PARAMS,
               rsvd: int = 0, desc: bytes | None = None, timeout: float = 30.0) -> int:  # fmt: skip
        """Write the parameter block, run the op, return its completion status."""
        if block:
            self.write(params, block)
        self.fence += 1
        d = desc if desc is not None else tensor(opcode, params, kind, rsvd=rsvd, fence=self.fence)
        cpl = self.npu.run(d, timeout)
        assert cpl.opcode == opcode
        return cpl.status

    def run(self, opcode: int, kind: int, operands: Sequence[Operand], *,
            place: bool = True, timeout: float = 30.0,
            params: Sequence[int] = ()) -> np.ndarray:  # fmt: skip
        """Place the operands, run the op (it must complete OK), return the output."""
        if place:
            self.place(operands)
        block = tensor_params([op.desc() for op in operands], params)
        status = self.submit(opcode, kind, block, timeout=timeout)
        assert status == hw.ST_OK, f"status {status}"
        out = operands[-1]
        raw = self.read(out.va, out.nbytes + 64)
        assert raw[out.nbytes :] == bytes([GUARD]) * 64, "the op wrote past its output"
        return decode(raw[: out.nbytes], out.dtype, out.shape)


@pytest.fixture(scope="module")
def shared_npu(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Npu]:
    dev = Npu(tmp_path_factory.mktemp("tensor") / "qemu.log")
    try:
        dev.start()
        yield dev
    finally:
        dev.close()


@pytest.fixture
def rig(shared_npu: Npu) -> Iterator[Rig]:
    yield Rig(shared_npu)
    shared_npu.assert_alive()
    assert not shared_npu.rd(hw.REG_STATUS) & hw.STATUS_ERROR


def operand_from(rng: np.random.Generator, dtype: int, shape: Sequence[int],
                 strides: Sequence[int] | None = None, **kw: float) -> Operand:  # fmt: skip
    op = Operand(dtype, tuple(shape), strides)
    op.buf = random_values(rng, dtype, op.nbytes // SIZE[dtype], **kw)  # type: ignore[arg-type]
    return op


def logical(op: Operand) -> np.ndarray:
    assert op.buf is not None and op.strides is not None
    return gather(op.buf, op.shape, op.strides)


# --------------------------------------------------------------------------
# References
# --------------------------------------------------------------------------


def ref_eltwise(kind: int, a: np.ndarray, b: np.ndarray, dtype: int) -> np.ndarray:
    with np.errstate(all="ignore"):
        if dtype in FLOATS:
            a, b = a.astype(np.float32), b.astype(np.float32)
            r = {hw.ELTWISE_ADD: np.add, hw.ELTWISE_SUB: np.subtract,
                 hw.ELTWISE_MUL: np.multiply, hw.ELTWISE_DIV: np.divide,
                 hw.ELTWISE_MAX: np.maximum, hw.ELTWISE_MIN: np.minimum}[kind](a, b)  # fmt: skip
            return round_to(r, dtype)
        a, b = a.astype(np.int64), b.astype(np.int64)
        r = {hw.ELTWISE_ADD: np.add, hw.ELTWISE_SUB: np.subtract,
             hw.ELTWISE_MUL: np.multiply, hw.ELTWISE_MAX: np.maximum,
             hw.ELTWISE_MIN: np.minimum}[kind](a, b)  # fmt: skip
        return wrap(r, dtype)


_erf = np.frompyfunc(math.erf, 1, 1)


def ref_unary(kind: int, x: np.ndarray, dtype: int) -> tuple[np.ndarray, float, float]:
    """(reference, rtol, atol): exact kinds compare exactly, the others within ~2 ulp."""
    with np.errstate(all="ignore"):
        if dtype not in FLOATS:
            x = x.astype(np.int64)
            r = {hw.UNARY_RELU: np.maximum(x, 0), hw.UNARY_ABS: np.abs(x),
                 hw.UNARY_NEG: -x}[kind]  # fmt: skip
            return wrap(r, dtype), 0.0, 0.0
        x32 = x.astype(np.float32)
        exact = {hw.UNARY_RELU: np.maximum(x32, np.float32(0)), hw.UNARY_SQRT: np.sqrt(x32),
                 hw.UNARY_ABS: np.abs(x32), hw.UNARY_NEG: -x32,
                 hw.UNARY_RECIPROCAL: np.float32(1) / x32}  # fmt: skip
        if kind in exact:
            return round_to(exact[kind], dtype), 0.0, 0.0
        x64 = x.astype(np.float64)
        r = {
            hw.UNARY_GELU: lambda: 0.5 * x64 * (1 + _erf(x64 / math.sqrt(2)).astype(np.float64)),
            hw.UNARY_SIGMOID: lambda: 1 / (1 + np.exp(-x64)),
            hw.UNARY_TANH: lambda: np.tanh(x64),
            hw.UNARY_EXP: lambda: np.exp(x64),
            hw.UNARY_LOG: lambda: np.log(x64),
            hw.UNARY_ERF: lambda: _erf(x64).astype(np.float64),
        }[kind]()
        rtol = {FP32: 4e-6, FP16: 2e-3, BF16: 1.6e-2}[dtype]
        return round_to(r, dtype), rtol, 2e-6


# --------------------------------------------------------------------------
# Every kind x dtype
# --------------------------------------------------------------------------


@pytest.mark.parametrize("dname", DTYPES)
@pytest.mark.parametrize("kname", ELTWISE)
def test_eltwise_every_kind_and_dtype(rig: Rig, kname: str, dname: str) -> None:
    kind, dtype = ELTWISE[kname], DTYPES[dname]
    rng = np.random.default_rng(kind * 10 + dtype)
    shape = (5, 67)
    a = operand_from(rng, dtype, shape)
    b = operand_from(rng, dtype, shape)
    assert b.buf is not None
    b.buf[:8] = b.buf[8:16]  # a's specials meet ordinary values, and vice versa
    out = Operand(dtype, shape)
    ops = [a, b, out]
    if kind == hw.ELTWISE_DIV and dtype not in FLOATS:
        rig.place(ops)
        block = tensor_params([op.desc() for op in ops])
        assert rig.submit(hw.OP_ELTWISE, kind, block) == hw.ST_BAD_ARGS
        return
    got = rig.run(hw.OP_ELTWISE, kind, ops)
    assert_matches(got, ref_eltwise(kind, logical(a), logical(b), dtype), dtype)


@pytest.mark.parametrize("dname", DTYPES)
@pytest.mark.parametrize("kname", UNARY)
def test_unary_every_kind_and_dtype(rig: Rig, kname: str, dname: str) -> None:
    kind, dtype = UNARY[kname], DTYPES[dname]
    rng = np.random.default_rng(100 + kind * 10 + dtype)
    scale = {hw.UNARY_EXP: 6.0, hw.UNARY_LOG: 30.0, hw.UNARY_SQRT: 30.0}.get(kind, 3.0)
    x = operand_from(rng, dtype, (3, 4, 55), scale=scale)
    out = Operand(dtype, (3, 4, 55))
    if dtype not in FLOATS and kname not in INT_UNARY:
        rig.place([x, out])
        block = tensor_params([x.desc(), out.desc()])
        assert rig.submit(hw.OP_UNARY, kind, block) == hw.ST_BAD_ARGS
        return
    if kind in (hw.UNARY_LOG, hw.UNARY_SQRT):
        assert x.buf is not None
        x.buf[8:] = np.abs(x.buf[8:])  # mostly in the domain; the specials stay
    got = rig.run(hw.OP_UNARY, kind, [x, out])
    want, rtol, atol = ref_unary(kind, logical(x), dtype)
    assert_matches(got, want, dtype, rtol=rtol, atol=atol)


CONVERT_SPECIALS = [np.nan, np.inf, -np.inf, 0.0, -0.0, 0.5, -0.5, 2.5, -2.5, 127.9, 128.0,
                    -128.9, -129.0, 255.0, 1e5, -1e5, 65504.0, 65519.9, 65520.0, 3e9, -3e9,
                    2147483520.0, -2147483648.0, 2.0**31, 1e-7, 6e-8, 3e-8, 1.5e-5, 1e38,
                    -3.4e38, 1.00390625, 1.005859375, 257.0, 16777217.0]  # fmt: skip


@pytest.mark.parametrize("dst_name", DTYPES)
@pytest.mark.parametrize("src_name", DTYPES)
def test_convert_every_dtype_pair(rig: Rig, src_name: str, dst_name: str) -> None:
    src, dst = DTYPES[src_name], DTYPES[dst_name]
    rng = np.random.default_rng(200 + src * 10 + dst)
    x = operand_from(rng, src, (4, 50), scale=300.0)
    assert x.buf is not None
    if src in FLOATS:
        sp = round_to(np.array(CONVERT_SPECIALS, np.float32), src)
        x.buf[: sp.size] = sp
    else:
        x.buf[7:12] = [2**24 + 2**16 + 1, -(2**24 + 2**16 + 1), 2**24 + 1, 65520, -65519]
        x.buf[:] = wrap(x.buf, src)
    out = Operand(dst, x.shape)
    got = rig.run(hw.OP_CONVERT, 0, [x, out])
    assert_matches(got, ref_convert(logical(x), src, dst), dst)


# --------------------------------------------------------------------------
# Comparisons and the BOOL dtype
# --------------------------------------------------------------------------

COMPARE = {"eq": (hw.ELTWISE_EQ, np.equal), "ne": (hw.ELTWISE_NE, np.not_equal),
           "lt": (hw.ELTWISE_LT, np.less), "le": (hw.ELTWISE_LE, np.less_equal),
           "gt": (hw.ELTWISE_GT, np.greater), "ge": (hw.ELTWISE_GE, np.greater_equal)}  # fmt: skip


@pytest.mark.parametrize("dname", DTYPES)
@pytest.mark.parametrize("kname", COMPARE)
def test_comparison_every_kind_and_dtype_writes_bool(rig: Rig, kname: str, dname: str) -> None:
    kind, fn = COMPARE[kname]
    dtype = DTYPES[dname]
    rng = np.random.default_rng(300 + kind * 10 + dtype)
    a = operand_from(rng, dtype, (5, 67))
    b = operand_from(rng, dtype, (1, 67))
    assert a.buf is not None and b.buf is not None
    a.buf[20:40] = b.buf[20:40]  # equal pairs in row 0
    got = rig.run(hw.OP_ELTWISE, kind, [a, b, Operand(BOOL, (5, 67))])
    with np.errstate(invalid="ignore"):
        want = fn(logical(a), logical(b)).astype(np.int64)
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("dname", DTYPES)
def test_convert_to_bool_is_nonzero_and_from_bool_is_one_or_zero(rig: Rig, dname: str) -> None:
    dtype = DTYPES[dname]
    rng = np.random.default_rng(400 + dtype)
    x = operand_from(rng, dtype, (3, 40))
    assert x.buf is not None
    x.buf[:4] = 0
    got = rig.run(hw.OP_CONVERT, 0, [x, Operand(BOOL, x.shape)])
    np.testing.assert_array_equal(got, (logical(x) != 0).astype(np.int64))  # NaN is true
    m = Operand(BOOL, (2, 8), buf=np.array([0, 1, 2, 255, 0, 7, 1, 0] * 2, np.int64))
    back = rig.run(hw.OP_CONVERT, 0, [m, Operand(dtype, m.shape)])
    assert_matches(back, (logical(m) != 0).astype(np.float32 if dtype in FLOATS else np.int64),
                   dtype)  # fmt: skip


@pytest.mark.parametrize(
    "case", ["add-of-bools", "compare-into-fp32", "relu-of-bool", "mixed-compare-inputs"]
)
def test_bool_outside_comparisons_and_convert_is_bad_args(rig: Rig, case: str) -> None:
    shape = (2, 3)
    opcode, kind, dtypes = {
        "add-of-bools": (hw.OP_ELTWISE, hw.ELTWISE_ADD, (BOOL, BOOL, BOOL)),
        "compare-into-fp32": (hw.OP_ELTWISE, hw.ELTWISE_LT, (FP32, FP32, FP32)),
        "relu-of-bool": (hw.OP_UNARY, hw.UNARY_RELU, (BOOL, BOOL)),
        "mixed-compare-inputs": (hw.OP_ELTWISE, hw.ELTWISE_EQ, (FP32, INT32, BOOL)),
    }[case]
    rng = np.random.default_rng(5)
    ops = [operand_from(rng, d, shape) if d != BOOL else
           Operand(BOOL, shape, buf=np.zeros(6, np.int64)) for d in dtypes]  # fmt: skip
    rig.place(ops)
    assert rig.submit(opcode, kind, tensor_params([op.desc() for op in ops])) == hw.ST_BAD_ARGS


# --------------------------------------------------------------------------
# Broadcasting, strides, special values
# --------------------------------------------------------------------------

BROADCASTS = {
    "row": ((1, 33), (7, 33), (7, 33)),
    "column": ((7, 1), (7, 33), (7, 33)),
    "both-sides": ((4, 1, 5), (1, 3, 1), (4, 3, 5)),
    "scalar": ((1, 1, 1, 1), (2, 3, 4, 5), (2, 3, 4, 5)),
    "rank-4-mixed": ((2, 1, 4, 1), (1, 3, 1, 6), (2, 3, 4, 6)),
    "1-d": ((1,), (100,), (100,)),
    "long-rows": ((1, 70001), (2, 70001), (2, 70001)),  # rows split in 64Ki units
}


@pytest.mark.parametrize("dname", ["fp32", "bf16", "int8"])
@pytest.mark.parametrize("case", BROADCASTS)
def test_eltwise_broadcasting(rig: Rig, case: str, dname: str) -> None:
    dtype = DTYPES[dname]
    sa, sb, so = BROADCASTS[case]
    rng = np.random.default_rng(len(case))
    for kind in (hw.ELTWISE_SUB, hw.ELTWISE_MUL):
        a, b = operand_from(rng, dtype, sa), operand_from(rng, dtype, sb)
        out = Operand(dtype, so)
        got = rig.run(hw.OP_ELTWISE, kind, [a, b, out])
        ref_a = np.broadcast_to(logical(a), so)
        ref_b = np.broadcast_to(logical(b), so)
        assert_matches(got, ref_eltwise(kind, ref_a, ref_b, dtype), dtype)
        # The same with the operands swapped.
        out = Operand(dtype, so)
        got = rig.run(hw.OP_ELTWISE, kind, [b, a, out])
        assert_matches(got, ref_eltwise(kind, ref_b, ref_a, dtype), dtype)


def test_eltwise_zero_strides_and_ignored_strides_of_size_1_dims(rig: Rig) -> None:
    rng = np.random.default_rng(5)
    # a: a row repeated with stride 0; b: a column whose size-1 dim has a huge stride.
    a = operand_from(rng, FP32, (6, 9), (0, 1), specials=False)
    b = operand_from(rng, FP32, (6, 1), (1, 0), specials=False)
    b_odd = Operand(FP32, (6, 1), (1, 12345), buf=b.buf)
    out = Operand(FP32, (6, 9))
    got = rig.run(hw.OP_ELTWISE, hw.ELTWISE_ADD, [a, b_odd, out])
    assert np.array_equal(got, logical(a) + np.broadcast_to(logical(b), (6, 9)))
    # The output may have any stride on a size-1 dimension, too.
    out = Operand(FP32, (6, 1, 9), (9, 777, 1))
    a3 = Operand(FP32, (6, 1, 9), (0, 0, 1), buf=a.buf)
    b3 = Operand(FP32, (6, 1, 1), (1, 0, 0), buf=b.buf)
    got = rig.run(hw.OP_ELTWISE, hw.ELTWISE_MAX, [a3, b3, out])
    want = np.maximum(logical(a3), logical(b3))
    assert np.array_equal(got, want)


STRIDED = {
    "transpose-2d": ((13, 7), (1, 13)),
    "every-other-row": ((5, 8), (16, 1)),
    "column-slice": ((9, 3), (10, 2)),
    "permute-3d": ((4, 5, 6), (1, 24, 4)),
    "reverse-of-4d": ((2, 3, 4, 5), (1, 2, 6, 24)),
    "repeated-row": ((6, 11), (0, 1)),
    "all-zero-strides": ((3, 4), (0, 0)),
}


@pytest.mark.parametrize("pair", [("fp32", "fp32"), ("fp16", "fp32"), ("int8", "bf16"),
                                  ("int32", "int32"), ("bf16", "int8")])  # fmt: skip
@pytest.mark.parametrize("case", STRIDED)
def test_convert_strided_and_transposed_inputs(rig: Rig, case: str, pair: tuple[str, str]) -> None:
    src, dst = DTYPES[pair[0]], DTYPES[pair[1]]
    shape, strides = STRIDED[case]
    x = operand_from(np.random.default_rng(len(case)), src, shape, strides, scale=50.0)
    out = Operand(dst, shape)
    got = rig.run(hw.OP_CONVERT, 0, [x, out])
    assert_matches(got, ref_convert(logical(x), src, dst), dst)


def test_unary_on_a_transposed_input(rig: Rig) -> None:
    x = operand_from(np.random.default_rng(9), FP16, (40, 30), (1, 40))
    out = Operand(FP16, (40, 30))
    got = rig.run(hw.OP_UNARY, hw.UNARY_NEG, [x, out])
    assert_matches(got, -logical(x), FP16)


def test_int_wraparound_like_numpy(rig: Rig) -> None:
    cases = [  # (dtype, kind, a, b, want)
        (INT8, hw.ELTWISE_ADD, [127, -128, 100, -100], [1, -1, 100, -100], [-128, 127, -56, 56]),
        (INT8, hw.ELTWISE_SUB, [-128, 127, 0, 0], [1, -1, -128, 127], [127, -128, -128, -127]),
        (INT8, hw.ELTWISE_MUL, [16, -128, 127, -1], [16, -1, 127, -128], [0, -128, 1, -128]),
        (INT32, hw.ELTWISE_ADD, [2**31 - 1, -(2**31), 0, 5], [1, -1, 0, -5],
         [-(2**31), 2**31 - 1, 0, 0]),
        (INT32, hw.ELTWISE_MUL, [65536, 2**31 - 1, -(2**31), 123456789], [65536, 2, -1, 1000],
         [0, -2, -(2**31), wrap(123456789000, INT32)]),
    ]  # fmt: skip
    for dtype, kind, a, b, want in cases:
        oa = Operand(dtype, (4,), buf=np.array(a, np.int64))
        ob = Operand(dtype, (4,), buf=np.array(b, np.int64))
        got = rig.run(hw.OP_ELTWISE, kind, [oa, ob, Operand(dtype, (4,))])
        assert got.tolist() == [int(w) for w in want], (dtype, kind)
    for dtype, lo in ((INT8, -128), (INT32, -(2**31))):
        x = Operand(dtype, (4,), buf=np.array([lo, -1, 0, lo + 1], np.int64))
        assert rig.run(hw.OP_UNARY, hw.UNARY_ABS, [x, Operand(dtype, (4,))]).tolist() == [
            lo, 1, 0, -(lo + 1)]  # fmt: skip
        assert rig.run(hw.OP_UNARY, hw.UNARY_NEG, [x, Operand(dtype, (4,))]).tolist() == [
            lo, 1, 0, -(lo + 1)]  # fmt: skip
        assert rig.run(hw.OP_UNARY, hw.UNARY_RELU, [x, Operand(dtype, (4,))]).tolist() == [
            0, 0, 0, 0]  # fmt: skip
    # int -> int conversions wrap like numpy's astype.
    x = Operand(INT32, (6,), buf=np.array([128, 255, 256, -129, 2**31 - 1, -(2**31)], np.int64))
    got = rig.run(hw.OP_CONVERT, 0, [x, Operand(INT8, (6,))])
    assert got.tolist() == np.array([128, 255, 256, -129, 2**31 - 1, -(2**31)]).astype(
        np.int8).tolist()  # fmt: skip


def test_float_to_int_truncates_and_saturates(rig: Rig) -> None:
    vals = [np.nan, -np.nan, np.inf, -np.inf, 1e10, -1e10, 2.0**31, -(2.0**31), 2147483520.0,
            -2147483520.0, 127.99, 128.0, -128.99, -129.0, 1.9, -1.9, -0.0]  # fmt: skip
    want = {
        INT8: [0, 0, 127, -128, 127, -128, 127, -128, 127, -128, 127, 127, -128, -128, 1, -1, 0],
        INT32: [0, 0, 2**31 - 1, -(2**31), 2**31 - 1, -(2**31), 2**31 - 1, -(2**31),
                2147483520, -2147483520, 127, 128, -128, -129, 1, -1, 0],
    }  # fmt: skip
    for dtype, expect in want.items():
        x = Operand(FP32, (len(vals),), buf=np.array(vals, np.float32))
        got = rig.run(hw.OP_CONVERT, 0, [x, Operand(dtype, (len(vals),))])
        assert got.tolist() == expect


def test_fp16_to_fp32_is_exact_for_all_65536_values(rig: Rig) -> None:
    bits = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16)
    x = Operand(FP16, (256, 256), buf=bits.view(np.float16).astype(np.float32))
    got = rig.run(hw.OP_CONVERT, 0, [x, Operand(FP32, (256, 256))])
    want = bits.view(np.float16).astype(np.float32).reshape(256, 256)
    nan = np.isnan(want)
    assert np.array_equal(np.isnan(got), nan)
    assert np.array_equal(got.view(np.uint32)[~nan], want.view(np.uint32)[~nan])  # signs too
    # ... and back: every fp16 value survives fp32 -> fp16 bit for bit (NaNs stay NaN).
    back = Operand(FP32, (256, 256), buf=want.ravel())
    raw = rig.run(hw.OP_CONVERT, 0, [back, Operand(FP16, (256, 256))])
    rbits = raw.astype(np.float16).view(np.uint16).ravel()
    assert np.array_equal(rbits[~nan.ravel()], bits[~nan.ravel()])
    assert np.all(np.isnan(raw.ravel()[nan.ravel()]))


def test_fp32_to_fp16_and_bf16_round_to_nearest_even(rig: Rig) -> None:
    rng = np.random.default_rng(77)
    u = rng.integers(0, 1 << 32, 20000, dtype=np.uint64).astype(np.uint32)
    # Ties, near-ties, the subnormal and overflow boundaries of fp16.
    edges = np.array([0x33000000, 0x33000001, 0x337FFFFF, 0x38800000, 0x387FFFFF, 0x387FE000,
                      0x387FF000, 0x477FEFFF, 0x477FF000, 0x477FE000, 0x3F801000, 0x3F803000,
                      0x3F808000, 0x3F818000, 0x3F808001, 0x7F7FFFFF, 0x7F7F8000, 0x7F7F7FFF,
                      0x7F800001, 0xFFC00000, 0x80000001, 0x00000001],
                     np.uint32)  # fmt: skip
    u[: edges.size] = edges
    f = u.view(np.float32)
    for dst in (FP16, BF16):
        x = Operand(FP32, (f.size,), buf=f)
        got = rig.run(hw.OP_CONVERT, 0, [x, Operand(dst, (f.size,))])
        assert_matches(got, round_to(f, dst), dst)


# --------------------------------------------------------------------------
# Rejections
# --------------------------------------------------------------------------

A_VA, B_VA, OUT_VA = HEAP, HEAP + 0x1000, HEAP + 0x2000


def t(va: int, dtype: int = FP32, shape: Sequence[int] = (2, 3),
      strides: Sequence[int] | None = None, **kw: int) -> bytes:  # fmt: skip
    return hw_tensor(va, dtype, shape, contiguous(shape) if strides is None else strides, **kw)


def good_unary() -> list[bytes]:
    return [t(A_VA), t(OUT_VA)]


def good_eltwise() -> list[bytes]:
    return [t(A_VA), t(B_VA), t(OUT_VA)]


def patched(block: bytes, offset: int, fmt: str, value: int) -> bytes:
    raw = bytearray(block)
    struct.pack_into(fmt, raw, offset, value)
    return bytes(raw)


OPERAND_1 = TENSOR_SIZE  # offset of t[1] in the block
BAD_OPS: dict[str, tuple[int, int, bytes, str]] = {
    # name: (opcode, kind, parameter block, status)
    "dtype-5": (hw.OP_UNARY, hw.UNARY_NEG, tensor_params([t(A_VA, 5), t(OUT_VA, 5)]), "BAD_ARGS"),
    "dtype-mismatch": (
        hw.OP_UNARY,
        hw.UNARY_NEG,
        tensor_params([t(A_VA), t(OUT_VA, FP16)]),
        "BAD_ARGS",
    ),
    "eltwise-dtype-mismatch": (
        hw.OP_ELTWISE,
        hw.ELTWISE_ADD,
        tensor_params([t(A_VA), t(B_VA, INT32), t(OUT_VA)]),
        "BAD_ARGS",
    ),
    "rank-0": (
        hw.OP_UNARY,
        hw.UNARY_NEG,
        tensor_params([t(A_VA, shape=(), strides=()), t(OUT_VA)]),
        "BAD_ARGS",
    ),
    "rank-5": (hw.OP_CONVERT, 0, tensor_params([t(A_VA, ndim=5), t(OUT_VA)]), "BAD_ARGS"),
    "shape-0": (
        hw.OP_UNARY,
        hw.UNARY_NEG,
        tensor_params([t(A_VA, shape=(2, 0)), t(OUT_VA, shape=(2, 0))]),
        "BAD_ARGS",
    ),
    "shape-2^31": (
        hw.OP_CONVERT,
        0,
        tensor_params(
            [t(A_VA, shape=(1 << 31,), strides=(1,)), t(OUT_VA, shape=(1 << 31,), strides=(1,))]
        ),
        "BAD_ARGS",
    ),
    "stride-2^31": (
        hw.OP_CONVERT,
        0,
        tensor_params([t(A_VA, strides=(1 << 31, 1)), t(OUT_VA)]),
        "BAD_ARGS",
    ),
    "too-many-elements": (
        hw.OP_CONVERT,
        0,
        tensor_params(
            [t(A_VA, shape=(1 << 14, (1 << 14) + 1)), t(OUT_VA, shape=(1 << 14, (1 << 14) + 1))]
        ),
        "BAD_ARGS",
    ),
    "extent-2^30-elements": (
        hw.OP_CONVERT,
        0,
        tensor_params([t(A_VA, shape=(2, 3), strides=(1 << 30, 1)), t(OUT_VA)]),
        "BAD_ARGS",
    ),
    "unused-dim-shape": (
        hw.OP_UNARY,
        hw.UNARY_NEG,
        patched(tensor_params(good_unary()), 16 + 4 * 3, "<I", 1),
        "BAD_RESERVED",
    ),
    "unused-dim-stride": (
        hw.OP_UNARY,
        hw.UNARY_NEG,
        patched(tensor_params(good_unary()), OPERAND_1 + 32 + 4 * 2, "<I", 1),
        "BAD_RESERVED",
    ),
    "unused-operand": (
        hw.OP_UNARY,
        hw.UNARY_NEG,
        tensor_params([*good_unary(), t(B_VA)]),
        "BAD_RESERVED",
    ),
    "unused-operand-3-byte": (
        hw.OP_ELTWISE,
        hw.ELTWISE_ADD,
        patched(tensor_params(good_eltwise()), 3 * TENSOR_SIZE + 47, "<B", 1),
        "BAD_RESERVED",
    ),
    "params-word-0": (hw.OP_UNARY, hw.UNARY_NEG, tensor_params(good_unary(), [1]), "BAD_RESERVED"),
    "params-word-15": (
        hw.OP_CONVERT,
        0,
        tensor_params(good_unary(), [0] * 15 + [1 << 31]),
        "BAD_RESERVED",
    ),
    "non-contiguous-output": (
        hw.OP_UNARY,
        hw.UNARY_NEG,
        tensor_params([t(A_VA), t(OUT_VA, strides=(1, 2))]),
        "BAD_ARGS",
    ),
    "padded-output-rows": (  # only CONVERT writes strided outputs
        hw.OP_UNARY,
        hw.UNARY_NEG,
        tensor_params([t(A_VA), t(OUT_VA, strides=(4, 1))]),
        "BAD_ARGS",
    ),
    "overlapping-convert-output": (
        hw.OP_CONVERT,
        0,
        tensor_params([t(A_VA), t(OUT_VA, strides=(2, 1))]),
        "BAD_ARGS",
    ),
    "broadcast-output": (
        hw.OP_ELTWISE,
        hw.ELTWISE_ADD,
        tensor_params([t(A_VA), t(B_VA), t(OUT_VA, strides=(0, 1))]),
        "BAD_ARGS",
    ),
    "unary-shape-mismatch": (
        hw.OP_UNARY,
        hw.UNARY_NEG,
        tensor_params([t(A_VA, shape=(3, 2)), t(OUT_VA)]),
        "BAD_ARGS",
    ),
    "unary-no-broadcast": (
        hw.OP_UNARY,
        hw.UNARY_NEG,
        tensor_params([t(A_VA, shape=(1, 3)), t(OUT_VA)]),
        "BAD_ARGS",
    ),
    "convert-rank-mismatch": (
        hw.OP_CONVERT,
        0,
        tensor_params([t(A_VA, shape=(1, 2, 3)), t(OUT_VA)]),
        "BAD_ARGS",
    ),
    "eltwise-not-broadcastable": (
        hw.OP_ELTWISE,
        hw.ELTWISE_ADD,
        tensor_params([t(A_VA, shape=(2, 2)), t(B_VA), t(OUT_VA)]),
        "BAD_ARGS",
    ),
    "eltwise-rank-mismatch": (
        hw.OP_ELTWISE,
        hw.ELTWISE_ADD,
        tensor_params([t(A_VA, shape=(3,)), t(B_VA), t(OUT_VA)]),
        "BAD_ARGS",
    ),
    "eltwise-output-broadcasts": (
        hw.OP_ELTWISE,
        hw.ELTWISE_ADD,
        tensor_params([t(A_VA), t(B_VA), t(OUT_VA, shape=(1, 3))]),
        "BAD_ARGS",
    ),
    "div-int8": (
        hw.OP_ELTWISE,
        hw.ELTWISE_DIV,
        tensor_params([t(A_VA, INT8), t(B_VA, INT8), t(OUT_VA, INT8)]),
        "BAD_ARGS",
    ),
    "div-int32": (
        hw.OP_ELTWISE,
        hw.ELTWISE_DIV,
        tensor_params([t(A_VA, INT32), t(B_VA, INT32), t(OUT_VA, INT32)]),
        "BAD_ARGS",
    ),
    "gelu-int8": (
        hw.OP_UNARY,
        hw.UNARY_GELU,
        tensor_params([t(A_VA, INT8), t(OUT_VA, INT8)]),
        "BAD_ARGS",
    ),
    "sqrt-int32": (
        hw.OP_UNARY,
        hw.UNARY_SQRT,
        tensor_params([t(A_VA, INT32), t(OUT_VA, INT32)]),
        "BAD_ARGS",
    ),
    "eltwise-kind-6": (hw.OP_ELTWISE, 6, tensor_params(good_eltwise()), "BAD_ARGS"),
    "unary-kind-count": (hw.OP_UNARY, hw.UNARY_COUNT, tensor_params(good_unary()), "BAD_ARGS"),
    "convert-kind-1": (hw.OP_CONVERT, 1, tensor_params(good_unary()), "BAD_ARGS"),
    "all-zero-block": (hw.OP_ELTWISE, 0, bytes(TENSOR_PARAMS_SIZE), "BAD_ARGS"),
    "operand-wraps-2^64": (
        hw.OP_UNARY,
        hw.UNARY_NEG,
        tensor_params([t((1 << 64) - 8), t(OUT_VA)]),
        "BAD_ADDR",
    ),
    "output-wraps-2^64": (
        hw.OP_ELTWISE,
        hw.ELTWISE_MUL,
        tensor_params([t(A_VA), t(B_VA), t((1 << 64) - 16)]),
        "BAD_ADDR",
    ),
}


C_VA = HEAP + 0x1800  # LAYERNORM beta (gamma at B_VA)
EPS = 0x3727C5AC  # 1e-5 as fp32 bits


def red(shape_in: Sequence[int] = (2, 3), shape_out: Sequence[int] = (2, 1), dtype: int = FP32,
        params: Sequence[int] = (2,), **kw: int) -> bytes:  # fmt: skip
    """A REDUCE block (the default reduces axis 1 of a (2, 3) tensor)."""
    return tensor_params([t(A_VA, dtype, shape_in), t(OUT_VA, dtype, shape_out, **kw)], params)


def ln(gamma: Sequence[int] = (1, 3), beta: Sequence[int] = (1, 3), dtype: int = FP32,
       params: Sequence[int] = (1, EPS), *, gdtype: int | None = None) -> bytes:  # fmt: skip
    """A LAYERNORM block over the last axis of a (2, 3) tensor."""
    g = t(B_VA, dtype if gdtype is None else gdtype, gamma)
    return tensor_params([t(A_VA, dtype), g, t(C_VA, dtype, beta), t(OUT_VA, dtype)], params)


def sm(axis: int = 1, dtype: int = FP32, params: Sequence[int] = ()) -> bytes:
    return tensor_params([t(A_VA, dtype), t(OUT_VA, dtype)], params or (axis,))


_R, _S, _L = hw.OP_REDUCE, hw.OP_SOFTMAX, hw.OP_LAYERNORM
BAD_OPS.update({
    "reduce-mask-0": (_R, hw.REDUCE_SUM, red(params=(0,)), "BAD_ARGS"),
    "reduce-mask-beyond-ndim": (_R, hw.REDUCE_SUM, red(params=(4,)), "BAD_ARGS"),
    "reduce-mask-3-bits-rank-2": (_R, hw.REDUCE_MAX, red(shape_out=(1, 1), params=(7,)),
                                  "BAD_ARGS"),
    "reduce-mask-bit-31": (_R, hw.REDUCE_SUM, red(params=(2 | 1 << 31,)), "BAD_ARGS"),
    "reduce-out-not-reduced": (_R, hw.REDUCE_SUM, red(shape_out=(2, 3)), "BAD_ARGS"),
    "reduce-out-wrong-axis": (_R, hw.REDUCE_SUM, red(shape_out=(1, 3)), "BAD_ARGS"),
    "reduce-out-not-keepdims": (_R, hw.REDUCE_SUM, red(shape_out=(2,)), "BAD_ARGS"),
    "reduce-out-not-contiguous": (_R, hw.REDUCE_SUM, red(strides=(2, 1)), "BAD_ARGS"),
    "reduce-mean-int8": (_R, hw.REDUCE_MEAN, red(dtype=INT8), "BAD_ARGS"),
    "reduce-mean-int32": (_R, hw.REDUCE_MEAN, red(dtype=INT32), "BAD_ARGS"),
    "reduce-kind-4": (_R, 4, red(), "BAD_ARGS"),
    "reduce-dtype-mismatch": (
        _R, hw.REDUCE_SUM,
        tensor_params([t(A_VA, FP32), t(OUT_VA, FP16, (2, 1))], (2,)), "BAD_ARGS",
    ),
    "reduce-params-1": (_R, hw.REDUCE_SUM, red(params=(2, 1)), "BAD_RESERVED"),
    "reduce-params-15": (_R, hw.REDUCE_SUM, red(params=(2,) + (0,) * 14 + (1,)), "BAD_RESERVED"),
    "reduce-operand-2": (
        _R, hw.REDUCE_SUM,
        tensor_params([t(A_VA), t(OUT_VA, shape=(2, 1)), t(B_VA)], (2,)), "BAD_RESERVED",
    ),
    "softmax-int8": (_S, hw.SOFTMAX_SOFTMAX, sm(dtype=INT8), "BAD_ARGS"),
    "softmax-int32": (_S, hw.SOFTMAX_LOG, sm(dtype=INT32), "BAD_ARGS"),
    "softmax-axis-ndim": (_S, hw.SOFTMAX_SOFTMAX, sm(axis=2), "BAD_ARGS"),
    "softmax-axis-2^31": (_S, hw.SOFTMAX_SOFTMAX, sm(axis=1 << 31), "BAD_ARGS"),
    "softmax-kind-2": (_S, 2, sm(), "BAD_ARGS"),
    "softmax-out-shape": (
        _S, hw.SOFTMAX_SOFTMAX, tensor_params([t(A_VA), t(OUT_VA, shape=(3, 2))], (1,)),
        "BAD_ARGS",
    ),
    "softmax-params-1": (_S, hw.SOFTMAX_SOFTMAX, sm(params=(1, 1)), "BAD_RESERVED"),
    "layernorm-int8": (_L, 0, ln(dtype=INT8), "BAD_ARGS"),
    "layernorm-int32": (_L, 0, ln(dtype=INT32), "BAD_ARGS"),
    "layernorm-kind-1": (_L, 1, ln(), "BAD_ARGS"),
    "layernorm-axes-0": (_L, 0, ln(params=(0, EPS)), "BAD_ARGS"),
    "layernorm-axes-beyond-ndim": (_L, 0, ln((2, 3), (2, 3), params=(3, EPS)), "BAD_ARGS"),
    "layernorm-eps-0": (_L, 0, ln(params=(1, 0)), "BAD_ARGS"),
    "layernorm-eps-minus-0": (_L, 0, ln(params=(1, 0x8000_0000)), "BAD_ARGS"),
    "layernorm-eps-negative": (_L, 0, ln(params=(1, EPS | 0x8000_0000)), "BAD_ARGS"),
    "layernorm-eps-inf": (_L, 0, ln(params=(1, 0x7F80_0000)), "BAD_ARGS"),
    "layernorm-eps-nan": (_L, 0, ln(params=(1, 0x7FC0_0000)), "BAD_ARGS"),
    "layernorm-gamma-full-shape": (_L, 0, ln(gamma=(2, 3)), "BAD_ARGS"),
    "layernorm-gamma-rank-1": (_L, 0, ln(gamma=(3,)), "BAD_ARGS"),
    "layernorm-gamma-short": (_L, 0, ln(gamma=(1, 2)), "BAD_ARGS"),
    "layernorm-beta-wrong-shape": (_L, 0, ln(beta=(1, 1)), "BAD_ARGS"),
    "layernorm-gamma-dtype": (_L, 0, ln(gdtype=FP16), "BAD_ARGS"),
    "layernorm-params-2": (_L, 0, ln(params=(1, EPS, 1)), "BAD_RESERVED"),
})  # fmt: skip


@pytest.mark.parametrize(
    ("opcode", "kind", "block", "status"), BAD_OPS.values(), ids=BAD_OPS.keys()
)
def test_bad_parameter_block_is_rejected_and_writes_nothing(
    rig: Rig, opcode: int, kind: int, block: bytes, status: str
) -> None:
    rig.npu.qt.memset(HEAP, 0x3000, GUARD)
    assert rig.submit(opcode, kind, block) == getattr(hw, "ST_" + status)
    assert rig.npu.qt.memread(HEAP, 0x3000) == bytes([GUARD]) * 0x3000


def _desc_with_byte(desc: bytes, offset: int) -> bytes:
    raw = bytearray(desc)
    raw[offset] = 1
    return bytes(raw)


BAD_DESCS: dict[str, tuple[Callable[[], bytes], str]] = {
    "rsvd": (lambda: tensor(hw.OP_UNARY, PARAMS, hw.UNARY_NEG, rsvd=1), "BAD_RESERVED"),
    "payload-byte-32": (lambda: _desc_with_byte(tensor(hw.OP_UNARY, PARAMS), 32), "BAD_RESERVED"),
    "payload-byte-127": (
        lambda: _desc_with_byte(tensor(hw.OP_CONVERT, PARAMS), 127),
        "BAD_RESERVED",
    ),
    "params-va-misaligned-8": (lambda: tensor(hw.OP_UNARY, PARAMS + 8, hw.UNARY_NEG), "BAD_ARGS"),
    "params-va-misaligned-32": (lambda: tensor(hw.OP_ELTWISE, PARAMS + 32), "BAD_ARGS"),
    "params-va-wraps-2^64": (lambda: tensor(hw.OP_CONVERT, (1 << 64) - 64), "BAD_ADDR"),
    "params-in-bar0": (lambda: tensor(hw.OP_CONVERT, 0xE000_0000), "BAD_ADDR"),
    "reduce-payload-byte-32": (
        lambda: _desc_with_byte(tensor(hw.OP_REDUCE, PARAMS), 32),
        "BAD_RESERVED",
    ),
    "softmax-payload-byte-127": (
        lambda: _desc_with_byte(tensor(hw.OP_SOFTMAX, PARAMS), 127),
        "BAD_RESERVED",
    ),
    "layernorm-rsvd": (lambda: tensor(hw.OP_LAYERNORM, PARAMS, rsvd=1), "BAD_RESERVED"),
}


@pytest.mark.parametrize(("make", "status"), BAD_DESCS.values(), ids=BAD_DESCS.keys())
def test_bad_descriptor_is_rejected(rig: Rig, make: Callable[[], bytes], status: str) -> None:
    # A valid block at PARAMS: only the descriptor is wrong.
    rig.write(PARAMS, tensor_params(good_unary()))
    rig.npu.qt.memset(OUT_VA, 0x1000, GUARD)
    desc = make()
    opcode = struct.unpack_from("<H", desc)[0]
    assert rig.submit(opcode, 0, b"", desc=desc) == getattr(hw, "ST_" + status)
    assert rig.npu.qt.memread(OUT_VA, 0x1000) == bytes([GUARD]) * 0x1000


def test_the_parameter_block_is_read_once_and_little_endian(rig: Rig) -> None:
    """A block written as little-endian words is decoded as such (a sanity check of offsets)."""
    x = Operand(INT32, (3,), buf=np.array([1, -2, 3], np.int64))
    out = Operand(INT32, (3,))
    rig.place([x, out])
    block = tensor_params([x.desc(), out.desc()])
    assert block[:8] == struct.pack("<Q", x.va) and len(block) == TENSOR_PARAMS_SIZE
    assert rig.submit(hw.OP_UNARY, hw.UNARY_NEG, block) == hw.ST_OK
    assert decode(rig.read(out.va, 12), INT32).tolist() == [-1, 2, -3]


def test_in_place_op_reads_all_inputs_before_writing(rig: Rig) -> None:
    x = Operand(FP32, (4, 300), buf=np.arange(1200, dtype=np.float32))
    rig.place([x])
    rig.write(x.va, encode(x.buf, FP32))
    out = Operand(FP32, (4, 300), va=x.va)
    # out = x + x^T-ish view of the same memory: any early write would corrupt the input.
    xt = Operand(FP32, (4, 300), (1, 4), va=x.va)
    block = tensor_params([x.desc(), xt.desc(), out.desc()])
    assert rig.submit(hw.OP_ELTWISE, hw.ELTWISE_ADD, block) == hw.ST_OK
    got = decode(rig.read(x.va, 4800), FP32, (4, 300))
    assert x.buf is not None
    assert np.array_equal(got, logical(x) + gather(x.buf, (4, 300), (1, 4)))


def test_a_burst_of_bad_tensor_ops_completes_in_order(rig: Rig) -> None:
    """A burst of rejected tensor ops, then a good one: all complete in order."""
    descs = [tensor(hw.OP_UNARY, PARAMS + 8, fence=1), tensor(hw.OP_CONVERT, PARAMS, 7, fence=2),
             cmd(hw.OP_ELTWISE, b"\0" * 16 + b"\1", fence=3)]  # fmt: skip
    rig.write(PARAMS, tensor_params(good_unary()))
    first = rig.npu.submit(*descs)[0]
    rig.npu.wait_head(first + 3)
    got = [c.status for c in rig.npu.completions(first, 3)]
    assert got == [hw.ST_BAD_ARGS, hw.ST_BAD_ARGS, hw.ST_BAD_RESERVED]


# --------------------------------------------------------------------------
# Through the device MMU
# --------------------------------------------------------------------------

L1, L2 = 0x20_0000, 0x20_1000
BACKING = 0x0100_0000  # page i of VA space lives at BACKING + perm(i) * 4 KiB
MMU_PAGES = 64
UNMAPPED_PAGE, READONLY_PAGE = 40, 50


def mmu_perm(page: int) -> int:
    return (page * 37 + 11) % MMU_PAGES  # scattered, one to one


@pytest.fixture
def mmu_rig(tmp_path: Path) -> Iterator[Rig]:
    dev = Npu(tmp_path / "qemu.log")
    try:
        qt = dev.qt
        qt.memset(L1, 0x2000, 0)
        qt.memwrite(L1, struct.pack("<Q", L2 | hw.PTE_VALID))
        for page in range(MMU_PAGES):
            if page == UNMAPPED_PAGE:
                continue
            flags = hw.PTE_VALID | (0 if page == READONLY_PAGE else hw.PTE_WRITE)
            qt.memwrite(
                L2 + page * 8, struct.pack("<Q", (BACKING + mmu_perm(page) * 0x1000) | flags)
            )
        dev.wr(hw.REG_MMU_L1_LO, L1)
        dev.wr(hw.REG_MMU_L1_HI, 0)
        dev.wr(hw.REG_MMU_L1_ENTRIES, 1)
        dev.wr(hw.REG_MMU_CONTROL, hw.MMU_ENABLE)
        dev.start()
        yield Rig(dev, va_to_pa=lambda va: BACKING + mmu_perm(va >> 12) * 0x1000 + (va & 0xFFF))
        dev.assert_alive()
    finally:
        dev.close()


def mmu_fault(npu: Npu) -> tuple[int, int]:
    return npu.rd(hw.REG_MMU_FAULT_LO) | npu.rd(hw.REG_MMU_FAULT_HI) << 32, npu.rd(
        hw.REG_MMU_FAULT_INFO
    )


def test_mmu_ops_through_scattered_pages_and_faults_in_each_operand(mmu_rig: Rig) -> None:
    rig = mmu_rig
    rng = np.random.default_rng(3)
    params_va = 0x1000
    # A good op spanning many scattered pages: a (16, 300) fp32 transposed from (300, 16).
    a = operand_from(rng, FP32, (16, 300), (1, 16), specials=False)
    b = operand_from(rng, FP32, (1, 300), specials=False)
    out = Operand(FP32, (16, 300))
    rig.place([a, b, out], base=0x2000)
    assert out.va + out.nbytes < UNMAPPED_PAGE * 0x1000
    block = tensor_params([a.desc(), b.desc(), out.desc()])
    assert rig.submit(hw.OP_ELTWISE, hw.ELTWISE_ADD, block, params=params_va) == hw.ST_OK
    got = decode(rig.read(out.va, out.nbytes), FP32, out.shape)
    assert np.array_equal(got, logical(a) + np.broadcast_to(logical(b), (16, 300)))
    assert rig.npu.rd(hw.REG_MMU_FAULTS) == 0

    hole = UNMAPPED_PAGE * 0x1000
    readonly = READONLY_PAGE * 0x1000
    small = [t(0x2000), t(0x3000), t(0x4000)]
    cases = {
        "a": ([t(hole + 0x10), small[1], small[2]], hole + 0x10, 0),
        "b": ([small[0], t(hole - 8), small[2]], hole, 0),
        "out": ([small[0], small[1], t(hole - 16)], hole, hw.FAULT_WRITE),
        "out-read-only": ([small[0], small[1], t(readonly + 0x100)], readonly + 0x100,
                          hw.FAULT_WRITE | hw.FAULT_PERM),
    }  # fmt: skip
    for n, (name, (ops, va, info)) in enumerate(cases.items(), start=1):
        status = rig.submit(hw.OP_ELTWISE, hw.ELTWISE_ADD, tensor_params(ops), params=params_va)
        assert status == hw.ST_MMU_FAULT, name
        assert mmu_fault(rig.npu) == (va, info), name
        assert rig.npu.rd(hw.REG_MMU_FAULTS) == n, name
    # The parameter block itself on an unmapped page.
    rig.write(params_va, tensor_params(small))
    assert rig.submit(hw.OP_ELTWISE, 0, b"", params=hole + 0x40) == hw.ST_MMU_FAULT
    assert mmu_fault(rig.npu) == (hole + 0x40, 0)
    # Beyond the one-entry L1 table.
    assert rig.submit(hw.OP_ELTWISE, 0, b"", params=1 << 21) == hw.ST_MMU_FAULT
    assert mmu_fault(rig.npu) == (1 << 21, hw.FAULT_RANGE)
    # The queue still works.
    assert rig.submit(hw.OP_ELTWISE, hw.ELTWISE_ADD, block, params=params_va) == hw.ST_OK


# --------------------------------------------------------------------------
# Large ops on the AI cores
# --------------------------------------------------------------------------


@pytest.mark.parametrize("cores", [1, 2, 4])
def test_large_ops_split_across_cores_are_exact(tmp_path: Path, cores: int) -> None:
    dev = Npu(tmp_path / "qemu.log", device=f"npu,cores={cores}")
    try:
        dev.start()
        rig = Rig(dev)
        rng = np.random.default_rng(cores)
        # fp32 with a broadcast row: (1031, 1033) = 1.06M elements, several row tiles.
        a = operand_from(rng, FP32, (1031, 1033), specials=False)
        b = operand_from(rng, FP32, (1, 1033), specials=False)
        out = Operand(FP32, (1031, 1033))
        got = rig.run(hw.OP_ELTWISE, hw.ELTWISE_MUL, [a, b, out])
        assert np.array_equal(got, logical(a) * logical(b))
        # A transposed fp32 -> fp16 conversion.
        x = operand_from(rng, FP32, (1100, 1000), (1, 1100), specials=False)
        got = rig.run(hw.OP_CONVERT, 0, [x, Operand(FP16, (1100, 1000))])
        assert_matches(got, round_to(logical(x), FP16), FP16)
        # One long int8 row: split in 64Ki-element units across the cores.
        n = (1 << 20) + 12345
        p, q = operand_from(rng, INT8, (n,)), operand_from(rng, INT8, (n,))
        got = rig.run(hw.OP_ELTWISE, hw.ELTWISE_ADD, [p, q, Operand(INT8, (n,))])
        assert np.array_equal(got, wrap(logical(p) + logical(q), INT8))
        # A few long rows (units end inside rows), bf16 relu on a rank-3 tensor.
        r = operand_from(rng, BF16, (3, 5, 70001), specials=False)
        got = rig.run(hw.OP_UNARY, hw.UNARY_RELU, [r, Operand(BF16, (3, 5, 70001))])
        assert_matches(got, round_to(np.maximum(logical(r), 0), BF16), BF16)
        dev.assert_alive()
    finally:
        dev.close()


# --------------------------------------------------------------------------
# Streamed and gathered ELTWISE/UNARY/CONVERT (docs/decisions.md, "Compute
# engine"): overlaps, blocked transposes, large ops, faults mid-stream
# --------------------------------------------------------------------------


@pytest.mark.parametrize("cores", [1, 2])
def test_in_place_and_overlapping_outputs(tmp_path: Path, cores: int) -> None:
    """Exact aliasing streams in place; partial overlaps read the inputs first."""
    dev = Npu(tmp_path / "qemu.log", device=f"npu,cores={cores}")
    try:
        dev.start()
        rig = Rig(dev)
        rng = np.random.default_rng(40 + cores)
        shape = (301, 1001)  # 301k elements: several units, on several cores
        n = shape[0] * shape[1]
        x = operand_from(rng, FP32, shape, specials=False)
        y = operand_from(rng, FP32, (1, 1001), specials=False)
        rig.place([x, y, Operand(FP32, (1,))])  # the last one is an output
        assert x.buf is not None and y.buf is not None
        # x += y (broadcast row), in place.
        block = tensor_params([x.desc(), y.desc(), x.desc()])
        assert rig.submit(hw.OP_ELTWISE, hw.ELTWISE_ADD, block) == hw.ST_OK
        want = logical(x) + logical(y)
        got = decode(rig.read(x.va, n * 4), FP32, shape)
        assert np.array_equal(got, want)
        # relu in place, then y = y * y with y both inputs and the output.
        assert rig.submit(hw.OP_UNARY, hw.UNARY_RELU, tensor_params([x.desc(), x.desc()])) == 0
        want = np.maximum(want, np.float32(0))
        assert np.array_equal(decode(rig.read(x.va, n * 4), FP32, shape), want)
        block = tensor_params([y.desc(), y.desc(), y.desc()])
        assert rig.submit(hw.OP_ELTWISE, hw.ELTWISE_MUL, block) == hw.ST_OK
        assert np.array_equal(decode(rig.read(y.va, 4004), FP32, (1, 1001)), logical(y) ** 2)
        # Partial overlaps, both ways: out starts 12345 elements after x, or
        # before it (y, far away, is rewritten each time).
        yv = logical(y)
        y2 = Operand(FP32, (1, 1001), va=x.va + 8 * n)
        for shift in (12345, -12345):
            rig.write(x.va, encode(want.reshape(-1), FP32))
            rig.write(y2.va, encode(yv.reshape(-1), FP32))
            out = Operand(FP32, shape, va=x.va + 4 * shift)
            if shift > 0:
                rig.write(out.va + n * 4, bytes([GUARD]) * 64)
            block = tensor_params([x.desc(), y2.desc(), out.desc()])
            assert rig.submit(hw.OP_ELTWISE, hw.ELTWISE_SUB, block) == hw.ST_OK
            got = decode(rig.read(out.va, n * 4), FP32, shape)
            assert np.array_equal(got, want - yv), shift
            assert shift < 0 or rig.read(out.va + n * 4, 64) == bytes([GUARD]) * 64
        # A same-size input that overlaps exactly but is read transposed.
        sq = (700, 700)
        z = operand_from(rng, INT32, sq)
        rig.place([z, Operand(INT32, (1,))])
        zt = Operand(INT32, sq, (1, 700), va=z.va)
        block = tensor_params([zt.desc(), Operand(INT32, sq, va=z.va).desc()])
        assert rig.submit(hw.OP_CONVERT, 0, block) == hw.ST_OK
        assert np.array_equal(decode(rig.read(z.va, 700 * 700 * 4), INT32, sq), logical(z).T)
        dev.assert_alive()
    finally:
        dev.close()


BLOCKED = {
    "fp32-square-odd": (FP32, FP32, (333, 333), (1, 333)),
    "fp32-to-fp16-wide": (FP32, FP16, (37, 2049), (1, 37)),
    "bf16-tall": (BF16, FP32, (1500, 17), (1, 1500)),
    "int8-odd": (INT8, INT32, (129, 67), (1, 129)),
    "int32-3d-permute": (INT32, INT8, (65, 33, 17), (1, 65 * 17, 65)),
    "fp16-one-long-column": (FP16, FP16, (2, 70001), (1, 2)),
}


@pytest.mark.parametrize("case", BLOCKED)
def test_blocked_transposes_of_odd_sizes(tmp_path: Path, case: str) -> None:
    src, dst, shape, strides = BLOCKED[case]
    dev = Npu(tmp_path / "qemu.log", device="npu,cores=2")
    try:
        dev.start()
        rig = Rig(dev)
        x = operand_from(np.random.default_rng(len(case)), src, shape, strides, scale=50.0)
        got = rig.run(hw.OP_CONVERT, 0, [x, Operand(dst, shape)])
        assert_matches(got, ref_convert(logical(x), src, dst), dst)
        # The same input added to a contiguous one (two inputs, one packed).
        if src == dst:
            y = operand_from(np.random.default_rng(7), src, shape)
            got = rig.run(hw.OP_ELTWISE, hw.ELTWISE_MAX, [x, y, Operand(dst, shape)])
            assert_matches(got, ref_eltwise(hw.ELTWISE_MAX, logical(x), logical(y), dst), dst)
        dev.assert_alive()
    finally:
        dev.close()


def test_streamed_misaligned_and_sliced_operands(rig: Rig) -> None:
    """Operands at odd byte offsets, sliced rows and long broadcast rows."""
    rng = np.random.default_rng(17)
    a = operand_from(rng, FP32, (64, 1000), (5000, 1), specials=False)  # sliced rows
    b = operand_from(rng, FP32, (64, 1), specials=False)  # one value per row
    out = Operand(FP32, (64, 1000))
    rig.place([a, b, out])
    for op in (a, b, out):  # move every operand 2 bytes on: no longer 4-aligned
        op.va += 2
        if op.buf is not None:
            rig.write(op.va, encode(op.buf, op.dtype))
    rig.write(out.va + out.nbytes, bytes([GUARD]) * 64)
    got = rig.run(hw.OP_ELTWISE, hw.ELTWISE_DIV, [a, b, out], place=False)
    assert_matches(got, ref_eltwise(hw.ELTWISE_DIV, logical(a), logical(b), FP32), FP32)
    h = operand_from(rng, FP16, (3, 70001))
    rig.place([h, Operand(FP16, (3, 70001))])
    h.va += 1
    rig.write(h.va, encode(h.buf, FP16))  # type: ignore[arg-type]
    ho = Operand(FP16, (3, 70001), va=h.va + 420011)
    rig.write(ho.va + ho.nbytes, bytes([GUARD]) * 64)
    got = rig.run(hw.OP_UNARY, hw.UNARY_ABS, [h, ho], place=False)
    assert_matches(got, round_to(np.abs(logical(h).astype(np.float32)), FP16), FP16)


def test_streamed_input_running_off_ram_is_dma_error(rig: Rig) -> None:
    """The part of an input in RAM is used in place, the rest fails the DMA copy."""
    from qtest import RAM_SIZE

    a = operand_from(np.random.default_rng(3), FP32, (2048,))
    out = Operand(FP32, (2048,))
    rig.place([a, out])
    b = Operand(FP32, (2048,), va=RAM_SIZE - 4096)  # its second half is not RAM
    block = tensor_params([a.desc(), b.desc(), out.desc()])
    assert rig.submit(hw.OP_ELTWISE, hw.ELTWISE_ADD, block) == hw.ST_DMA_ERROR


def test_multi_mib_ops(tmp_path: Path) -> None:
    """Ops of several MiB per operand, streamed and gathered, twice each."""
    dev = Npu(tmp_path / "qemu.log", device="npu,cores=2")
    try:
        dev.start()
        rig = Rig(dev)
        rng = np.random.default_rng(99)
        shape = (1024, 1536)  # 6 MiB per fp32 operand
        a = operand_from(rng, FP32, shape, specials=False)
        b = operand_from(rng, FP32, shape, specials=False)
        out = Operand(FP32, shape)
        rig.place([a, b, out])
        for _ in range(2):
            got = rig.run(hw.OP_ELTWISE, hw.ELTWISE_MUL, [a, b, out], place=False)
            assert np.array_equal(got, logical(a) * logical(b))
        at = Operand(FP32, (1536, 1024), (1, 1536), buf=a.buf, va=a.va)
        ob = Operand(BF16, (1536, 1024), va=out.va)
        rig.write(ob.va + ob.nbytes, bytes([GUARD]) * 64)
        for _ in range(2):
            got = rig.run(hw.OP_CONVERT, 0, [at, ob], place=False)
            assert_matches(got, round_to(logical(at), BF16), BF16)
        dev.assert_alive()
    finally:
        dev.close()


def test_mmu_fault_in_the_middle_of_a_streamed_op(mmu_rig: Rig) -> None:
    """Input faults come before any write; an output fault after the slices before it."""
    rig = mmu_rig
    rng = np.random.default_rng(23)
    hole = UNMAPPED_PAGE * 0x1000
    n = 9000  # fp32: 9 pages from 34 pages in, across the hole at page 40
    a = operand_from(rng, FP32, (n,), specials=False)
    b = operand_from(rng, FP32, (n,), specials=False)
    a.va, b.va = 34 * 0x1000 + 8, 4 * 0x1000
    out = Operand(FP32, (n,), va=16 * 0x1000)
    for op in (a, b):
        assert op.buf is not None
        pos = 0
        data = encode(op.buf, FP32)
        while pos < len(data):  # skip the hole
            k = min(len(data) - pos, 0x1000 - ((op.va + pos) & 0xFFF))
            if (op.va + pos) >> 12 != UNMAPPED_PAGE:
                rig.write(op.va + pos, data[pos : pos + k])
            pos += k
    rig.write(out.va, bytes([GUARD]) * n * 4)
    faults = rig.npu.rd(hw.REG_MMU_FAULTS)
    # a crosses the hole: nothing is written, the fault is at the hole.
    block = tensor_params([b.desc(), a.desc(), out.desc()])
    assert rig.submit(hw.OP_ELTWISE, hw.ELTWISE_ADD, block, params=0x1000) == hw.ST_MMU_FAULT
    assert mmu_fault(rig.npu) == (hole, 0)
    assert rig.npu.rd(hw.REG_MMU_FAULTS) == faults + 1
    assert rig.read(out.va, n * 4) == bytes([GUARD]) * n * 4
    # The output crosses the hole: a write fault at the hole.
    out2 = Operand(FP32, (n,), va=36 * 0x1000 + 4)
    block = tensor_params([b.desc(), b.desc(), out2.desc()])
    assert rig.submit(hw.OP_ELTWISE, hw.ELTWISE_ADD, block, params=0x1000) == hw.ST_MMU_FAULT
    assert mmu_fault(rig.npu) == (hole, hw.FAULT_WRITE)
    # The same op into a mapped output works, through the scattered pages.
    block = tensor_params([b.desc(), b.desc(), out.desc()])
    assert rig.submit(hw.OP_ELTWISE, hw.ELTWISE_ADD, block, params=0x1000) == hw.ST_OK
    got = decode(rig.read(out.va, n * 4), FP32, (n,))
    assert np.array_equal(got, logical(b) + logical(b))


# --------------------------------------------------------------------------
# REDUCE, SOFTMAX, LAYERNORM
# --------------------------------------------------------------------------
#
# The device computes these in double and rounds once to the output dtype;
# the references here compute in float64 too (another summation order, and
# numpy's exp/log), so a float result may differ by one rounding step of the
# output dtype: every comparison allows ULP[dtype] relative (2 units of the
# last place) plus TINY[dtype] absolute (the dtype's smallest subnormal, for
# results that round into the subnormal range). MAX/MIN and int results are
# exact.

REDUCE = {"sum": hw.REDUCE_SUM, "mean": hw.REDUCE_MEAN, "max": hw.REDUCE_MAX,
          "min": hw.REDUCE_MIN}  # fmt: skip
SOFTMAX = {"softmax": hw.SOFTMAX_SOFTMAX, "log": hw.SOFTMAX_LOG}
SHAPE4 = (3, 4, 5, 6)


def f32_bits(x: float) -> int:
    return struct.unpack("<I", struct.pack("<f", x))[0]


def assert_close(got: np.ndarray, want: np.ndarray, dtype: int, what: str = "") -> None:
    assert_matches(got, round_to(want, dtype), dtype, rtol=ULP[dtype], atol=TINY[dtype],
                   what=what)  # fmt: skip


def axes_of(mask: int, ndim: int) -> tuple[int, ...]:
    return tuple(d for d in range(ndim) if mask >> d & 1)


def ref_reduce(kind: int, x: np.ndarray, mask: int, dtype: int) -> np.ndarray:
    axes = axes_of(mask, x.ndim)
    with np.errstate(all="ignore"):
        if kind == hw.REDUCE_MAX:
            return np.max(x, axis=axes, keepdims=True)
        if kind == hw.REDUCE_MIN:
            return np.min(x, axis=axes, keepdims=True)
        if dtype not in FLOATS:  # SUM: int64 accumulation, numpy's wraparound
            return wrap(np.sum(x.astype(np.int64), axis=axes, keepdims=True), dtype)
        r = np.sum(x.astype(np.float64), axis=axes, keepdims=True)
        if kind == hw.REDUCE_MEAN:
            r = r / math.prod(x.shape[d] for d in axes)
        return r


def ref_softmax(kind: int, x: np.ndarray, axis: int) -> np.ndarray:
    x = x.astype(np.float64)
    with np.errstate(all="ignore"):
        z = x - np.max(x, axis=axis, keepdims=True)
        s = np.sum(np.exp(z), axis=axis, keepdims=True)
        return z - np.log(s) if kind == hw.SOFTMAX_LOG else np.exp(z) / s


def ref_layernorm(x: np.ndarray, g: np.ndarray, b: np.ndarray, n: int, eps: float) -> np.ndarray:
    x = x.astype(np.float64)
    axes = tuple(range(x.ndim - n, x.ndim))
    with np.errstate(all="ignore"):
        mean = np.mean(x, axis=axes, keepdims=True)
        var = np.mean((x - mean) ** 2, axis=axes, keepdims=True)
        return (x - mean) / np.sqrt(var + np.float64(np.float32(eps))) * g + b


def reduced_shape(shape: Sequence[int], mask: int) -> tuple[int, ...]:
    return tuple(1 if mask >> d & 1 else n for d, n in enumerate(shape))


def norm_shape(shape: Sequence[int], n: int) -> tuple[int, ...]:
    return tuple(s if d >= len(shape) - n else 1 for d, s in enumerate(shape))


@pytest.mark.parametrize("dname", DTYPES)
@pytest.mark.parametrize("kname", REDUCE)
def test_reduce_every_kind_dtype_and_axes_mask(rig: Rig, kname: str, dname: str) -> None:
    """All 15 masks of a 4-D tensor; NaN/inf specials included (NaN propagates)."""
    kind, dtype = REDUCE[kname], DTYPES[dname]
    rng = np.random.default_rng(300 + kind * 10 + dtype)
    x = operand_from(rng, dtype, SHAPE4)
    if kind == hw.REDUCE_MEAN and dtype not in FLOATS:
        out = Operand(dtype, reduced_shape(SHAPE4, 1))
        rig.place([x, out])
        block = tensor_params([x.desc(), out.desc()], [1])
        assert rig.submit(hw.OP_REDUCE, kind, block) == hw.ST_BAD_ARGS
        return
    for mask in range(1, 16):
        out = Operand(dtype, reduced_shape(SHAPE4, mask))
        got = rig.run(hw.OP_REDUCE, kind, [x, out], params=[mask])
        want = ref_reduce(kind, logical(x), mask, dtype)
        if dtype in FLOATS and kind in (hw.REDUCE_SUM, hw.REDUCE_MEAN):
            assert_close(got, want, dtype, what=f"mask {mask:#x}")
        else:
            assert_matches(got, round_to(want, dtype), dtype, what=f"mask {mask:#x}")


@pytest.mark.parametrize("dname", ["fp32", "bf16", "int32"])
def test_reduce_strided_input_and_size_1_dims(rig: Rig, dname: str) -> None:
    dtype = DTYPES[dname]
    rng = np.random.default_rng(31)
    # A transposed (6, 1, 5, 7) view of a (7, 5, 6) buffer, with a stride-0 broadcast dim.
    x = operand_from(rng, dtype, (6, 1, 5, 7), (1, 0, 6, 30), specials=False)
    for mask in (1, 2, 4, 8, 5, 10, 15, 0b1011):
        for kind in (hw.REDUCE_SUM, hw.REDUCE_MAX, hw.REDUCE_MIN):
            out = Operand(dtype, reduced_shape(x.shape, mask))
            got = rig.run(hw.OP_REDUCE, kind, [x, out], params=[mask])
            want = ref_reduce(kind, logical(x), mask, dtype)
            assert_matches(got, round_to(want, dtype), dtype, rtol=ULP.get(dtype, 0.0),
                           what=f"kind {kind} mask {mask:#x}")  # fmt: skip


def test_reduce_int_sum_wraps_like_numpy(rig: Rig) -> None:
    x8 = Operand(INT8, (2, 300), buf=np.full(600, 127, np.int64))
    got = rig.run(hw.OP_REDUCE, hw.REDUCE_SUM, [x8, Operand(INT8, (2, 1))], params=[2])
    assert got.tolist() == [[np.sum(np.full(300, 127, np.int8), dtype=np.int8)]] * 2
    big = np.array([(1 << 31) - 1] * 5 + [-(1 << 31)] * 2, np.int64)
    x32 = Operand(INT32, (7,), buf=big)
    got = rig.run(hw.OP_REDUCE, hw.REDUCE_SUM, [x32, Operand(INT32, (1,))], params=[1])
    assert got.tolist() == [int(np.sum(big.astype(np.int32), dtype=np.int32))]


def test_reduce_float_sum_is_accurate(rig: Rig) -> None:
    """Double accumulation: 1 + 2^20 * 2^-24 is exact, where a naive fp32 sum stays at 1."""
    n = 1 << 20
    buf = np.full(n + 1, 2.0**-24, np.float32)
    buf[0] = 1.0
    x = Operand(FP32, (n + 1,), buf=buf)
    got = rig.run(hw.OP_REDUCE, hw.REDUCE_SUM, [x, Operand(FP32, (1,))], params=[1])
    assert got.tolist() == [1.0 + 2.0**-4]
    got = rig.run(hw.OP_REDUCE, hw.REDUCE_MEAN, [x, Operand(FP32, (1,))], params=[1])
    assert got.tolist() == [np.float32((1.0 + 2.0**-4) / (n + 1))]


def test_reduce_max_min_nan_and_signed_zero(rig: Rig) -> None:
    buf = np.array([1.0, np.nan, 3.0, -np.inf, 0.0, -0.0, 2.0, 5.0, -1.0], np.float32)
    x = Operand(FP32, (3, 3), buf=buf)
    for kind, fn in ((hw.REDUCE_MAX, np.max), (hw.REDUCE_MIN, np.min)):
        got = rig.run(hw.OP_REDUCE, kind, [x, Operand(FP32, (3, 1))], params=[2])
        assert_matches(got, fn(buf.reshape(3, 3), axis=1, keepdims=True), FP32)
        got = rig.run(hw.OP_REDUCE, kind, [x, Operand(FP32, (1, 3))], params=[1])
        assert_matches(got, fn(buf.reshape(3, 3), axis=0, keepdims=True), FP32)


@pytest.mark.parametrize("dname", ["fp32", "fp16", "bf16"])
@pytest.mark.parametrize("kname", SOFTMAX)
def test_softmax_every_kind_dtype_and_axis(rig: Rig, kname: str, dname: str) -> None:
    kind, dtype = SOFTMAX[kname], DTYPES[dname]
    rng = np.random.default_rng(400 + kind * 10 + dtype)
    x = operand_from(rng, dtype, SHAPE4, scale=3.0)
    for axis in range(4):
        got = rig.run(hw.OP_SOFTMAX, kind, [x, Operand(dtype, SHAPE4)], params=[axis])
        assert_close(got, ref_softmax(kind, logical(x), axis), dtype, what=f"axis {axis}")
    # Rank 1, a long line, a large spread (underflowing exponentials); and a
    # transposed input.
    y = operand_from(rng, dtype, (3000,), scale=40.0, specials=False)
    got = rig.run(hw.OP_SOFTMAX, kind, [y, Operand(dtype, (3000,))], params=[0])
    assert_close(got, ref_softmax(kind, logical(y), 0), dtype, what="rank 1")
    z = operand_from(rng, dtype, (7, 9), (1, 7), specials=False)
    for axis in range(2):
        got = rig.run(hw.OP_SOFTMAX, kind, [z, Operand(dtype, (7, 9))], params=[axis])
        assert_close(got, ref_softmax(kind, logical(z), axis), dtype, what=f"T axis {axis}")


def test_softmax_of_a_size_1_axis_and_special_rows(rig: Rig) -> None:
    x = Operand(FP32, (4, 1), buf=np.array([3.0, -1e30, np.nan, -np.inf], np.float32))
    got = rig.run(hw.OP_SOFTMAX, hw.SOFTMAX_SOFTMAX, [x, Operand(FP32, (4, 1))], params=[1])
    assert_matches(got, ref_softmax(hw.SOFTMAX_SOFTMAX, logical(x), 1), FP32)
    assert got[:2].tolist() == [[1.0], [1.0]]
    rows = np.array([[0.0, 1.0, np.nan], [np.inf, 0.0, 1.0], [-np.inf, 0.0, 0.0],
                     [1e4, 0.0, -1e4]], np.float32)  # fmt: skip
    y = Operand(FP32, (4, 3), buf=rows.ravel())
    for kind in SOFTMAX.values():
        got = rig.run(hw.OP_SOFTMAX, kind, [y, Operand(FP32, (4, 3))], params=[1])
        assert_close(got, ref_softmax(kind, rows, 1), FP32, what=f"kind {kind}")


@pytest.mark.parametrize("dname", ["fp32", "fp16", "bf16"])
def test_layernorm_every_dtype_and_trailing_axes(rig: Rig, dname: str) -> None:
    dtype = DTYPES[dname]
    rng = np.random.default_rng(500 + dtype)
    x = operand_from(rng, dtype, SHAPE4, scale=3.0)
    for n in range(1, 5):
        for eps in (1e-5, 0.5):
            g = operand_from(rng, dtype, norm_shape(SHAPE4, n), specials=False, scale=1.0)
            b = operand_from(rng, dtype, norm_shape(SHAPE4, n), specials=False, scale=1.0)
            out = Operand(dtype, SHAPE4)
            got = rig.run(hw.OP_LAYERNORM, 0, [x, g, b, out], params=[n, f32_bits(eps)])
            want = ref_layernorm(logical(x), logical(g), logical(b), n, eps)
            assert_close(got, want, dtype, what=f"n {n} eps {eps}")


def test_layernorm_strided_operands_and_constant_rows(rig: Rig) -> None:
    rng = np.random.default_rng(51)
    # A transposed input; gamma with a stride-0 dim, beta with strides and
    # junk in size-1 dims.
    x = operand_from(rng, FP32, (2, 5, 8), (40, 1, 5), specials=False)
    g = operand_from(rng, FP32, (1, 5, 8), (0, 0, 1), specials=False)
    b = operand_from(rng, FP32, (1, 5, 8), (7, 16, 2), specials=False)
    out = Operand(FP32, (2, 5, 8))
    got = rig.run(hw.OP_LAYERNORM, 0, [x, g, b, out], params=[2, f32_bits(1e-3)])
    assert_close(got, ref_layernorm(logical(x), logical(g), logical(b), 2, 1e-3), FP32)
    # A constant row: variance 0, y = beta exactly; a NaN row stays NaN.
    rows = np.array([[2.5] * 4, [1.0, np.nan, 0.0, 0.0]], np.float32)
    c = Operand(FP32, (2, 4), buf=rows.ravel())
    one = Operand(FP32, (1, 4), buf=np.ones(4, np.float32))
    beta = Operand(FP32, (1, 4), buf=np.arange(4, dtype=np.float32))
    got = rig.run(hw.OP_LAYERNORM, 0, [c, one, beta, Operand(FP32, (2, 4))],
                  params=[1, f32_bits(1e-5)])  # fmt: skip
    assert got[0].tolist() == [0.0, 1.0, 2.0, 3.0]
    assert np.isnan(got[1]).all()


@pytest.mark.parametrize("cores", [1, 2])
def test_large_reductions_tiled_across_cores(tmp_path: Path, cores: int) -> None:
    dev = Npu(tmp_path / "qemu.log", device=f"npu,cores={cores}")
    try:
        dev.start()
        rig = Rig(dev)
        rng = np.random.default_rng(60 + cores)
        a = operand_from(rng, FP32, (1031, 1033), specials=False)
        for mask, kind in ((2, hw.REDUCE_SUM), (1, hw.REDUCE_MAX), (3, hw.REDUCE_MEAN)):
            out = Operand(FP32, reduced_shape(a.shape, mask))
            got = rig.run(hw.OP_REDUCE, kind, [a, out], params=[mask])
            assert_close(got, ref_reduce(kind, logical(a), mask, FP32), FP32, what=f"{mask}")
        i8 = operand_from(rng, INT8, (64, 17, 1031))
        got = rig.run(hw.OP_REDUCE, hw.REDUCE_SUM, [i8, Operand(INT8, (64, 1, 1031))],
                      params=[2])  # fmt: skip
        assert np.array_equal(got, ref_reduce(hw.REDUCE_SUM, logical(i8), 2, INT8))
        s = operand_from(rng, BF16, (1024, 1100), specials=False)
        for axis in (0, 1):
            got = rig.run(hw.OP_SOFTMAX, hw.SOFTMAX_LOG, [s, Operand(BF16, s.shape)],
                          params=[axis])  # fmt: skip
            assert_close(got, ref_softmax(hw.SOFTMAX_LOG, logical(s), axis), BF16)
        x = operand_from(rng, FP16, (4, 300, 1000), specials=False)
        g = operand_from(rng, FP16, (1, 1, 1000), specials=False, scale=1.0)
        b = operand_from(rng, FP16, (1, 1, 1000), specials=False, scale=1.0)
        got = rig.run(hw.OP_LAYERNORM, 0, [x, g, b, Operand(FP16, x.shape)],
                      params=[1, f32_bits(1e-5)])  # fmt: skip
        want = ref_layernorm(logical(x), logical(g), logical(b), 1, 1e-5)
        assert_close(got, want, FP16)
        dev.assert_alive()
    finally:
        dev.close()


def test_caps_report_reduce(rig: Rig) -> None:
    assert rig.npu.rd(hw.REG_CAPS) & hw.CAP_REDUCE
    assert rig.npu.rd(hw.REG_CAPS) & hw.CAP_TENSOR


# --------------------------------------------------------------------------
# MATMUL and LINEAR
# --------------------------------------------------------------------------
#
# The device widens the operands to fp32, multiplies with fp32 accumulation
# (BLAS, in an order of its own), adds the bias and applies the activation
# in fp32, and rounds once to the output dtype. The reference computes in
# float64 from the same (already rounded) inputs, so the tolerances are:
#   * fp32 accumulation: |error| <= 1e-5 * S, where S = |a| @ |b| (+ |bias|)
#     is the sum of the magnitudes of the terms (a K-term fp32 dot product
#     is off by at most about K * 2^-24 * S; K <= 1500 here, and BLAS sums
#     in blocks, so 1e-5 is ample). GELU has |d/dx| <= 1.13 and is computed
#     with erff, so it gets 2e-5 * S plus a few fp32 ulps of the result.
#   * the final rounding to the output dtype: half an ulp of the result,
#     allowed here as one ulp (2^-10 relative for fp16, 2^-7 for bf16), so
#     that an fp32 result a hair from a rounding boundary may round either
#     way; plus the dtype's smallest subnormal for results near zero.

ACT = {"none": hw.ACT_NONE, "relu": hw.ACT_RELU, "gelu": hw.ACT_GELU, "relu6": hw.ACT_RELU6}
MM_OPS = {"matmul": hw.OP_MATMUL, "linear": hw.OP_LINEAR}
_erf = np.vectorize(math.erf, otypes=[np.float64])


def check_accumulated(got: np.ndarray, acc: np.ndarray, mag: np.ndarray, kind: int,
                      dtype: int, what: str) -> None:  # fmt: skip
    """got vs act(acc) within the MATMUL/CONV2D tolerance of dtype (mag: sum of |terms|)."""
    want = ref_act(kind, acc)
    tol = (2e-5 if kind == hw.ACT_GELU else 1e-5) * mag + MM_REL[dtype] * np.abs(want)
    tol += TINY[dtype] + (2.0**-21 * np.abs(want) if kind == hw.ACT_GELU else 0.0)
    assert got.shape == want.shape, (got.shape, want.shape)
    err = np.abs(got.astype(np.float64) - want)
    bad = ~(err <= tol)
    assert not bad.any(), (
        f"{what}: {bad.sum()} of {bad.size} off, first at {np.argwhere(bad)[0]}: "
        f"got {got[bad][0]!r} want {want[bad][0]!r} tol {tol[bad][0]!r}"
    )


def check_matmul(got: np.ndarray, a: np.ndarray, b: np.ndarray, bias: np.ndarray | None,
                 kind: int, dtype: int, what: str = "") -> None:  # fmt: skip
    a64, b64 = a.astype(np.float64), b.astype(np.float64)
    acc, mag = np.matmul(a64, b64), np.matmul(np.abs(a64), np.abs(b64))
    if bias is not None:
        acc, mag = acc + bias.astype(np.float64), mag + np.abs(bias.astype(np.float64))
    check_accumulated(got, acc, mag, kind, dtype, what)


def run_mm(rig: Rig, opcode: int, kind: int, a: Operand, b: Operand, bias: Operand | None,
           out_shape: Sequence[int] | None = None, what: str = "") -> np.ndarray:  # fmt: skip
    """Run MATMUL/LINEAR on the operands, check it against the reference."""
    if out_shape is None:
        batch = np.broadcast_shapes(a.shape[:-2], b.shape[:-2])
        out_shape = (*batch, a.shape[-2], b.shape[-1])
    out = Operand(a.dtype, tuple(out_shape))
    ops = [a, b] + ([bias] if bias is not None else []) + [out]
    got = rig.run(opcode, kind, ops)
    check_matmul(got, logical(a), logical(b), None if bias is None else logical(bias), kind,
                 a.dtype, what)  # fmt: skip
    return got


def bias_for(rng: np.random.Generator, dtype: int, rank: int, n: int,
             stride: int = 1) -> Operand:  # fmt: skip
    shape = (*[1] * (rank - 1), n)
    strides = (*[0] * (rank - 1), stride)
    return operand_from(rng, dtype, shape, strides, specials=False)


ODD_SIZES = [(1, 1, 1), (3, 5, 7), (65, 33, 17)]


@pytest.mark.parametrize("aname", ACT)
@pytest.mark.parametrize("dname", ["fp32", "fp16", "bf16"])
@pytest.mark.parametrize("oname", MM_OPS)
def test_matmul_every_op_dtype_and_activation(rig: Rig, oname: str, dname: str,
                                              aname: str) -> None:  # fmt: skip
    opcode, dtype, kind = MM_OPS[oname], DTYPES[dname], ACT[aname]
    rng = np.random.default_rng([opcode, dtype, kind])
    for m, k, n in ODD_SIZES:
        a = operand_from(rng, dtype, (m, k), specials=False, scale=1.0)
        b = operand_from(rng, dtype, (k, n), specials=False, scale=1.0)
        bias = bias_for(rng, dtype, 2, n) if opcode == hw.OP_LINEAR else None
        run_mm(rig, opcode, kind, a, b, bias, what=f"{m}x{k}x{n}")


@pytest.mark.parametrize("dname", ["fp32", "fp16", "bf16"])
def test_matmul_batches_broadcast(rig: Rig, dname: str) -> None:
    dtype = DTYPES[dname]
    rng = np.random.default_rng(70 + dtype)
    cases = [
        ((4, 3, 5), (4, 5, 6)),  # rank 3, same batch
        ((1, 3, 5), (4, 5, 6)),  # a broadcast over b's batch
        ((4, 3, 5), (1, 5, 6)),  # b broadcast over a's batch (shared weights)
        ((2, 3, 7, 5), (2, 3, 5, 4)),  # rank 4
        ((2, 1, 7, 5), (1, 3, 5, 4)),  # rank 4, each broadcast in another dim
        ((1, 1, 7, 5), (2, 3, 5, 4)),
    ]
    for sa, sb in cases:
        a = operand_from(rng, dtype, sa, specials=False, scale=1.0)
        b = operand_from(rng, dtype, sb, specials=False, scale=1.0)
        run_mm(rig, hw.OP_MATMUL, hw.ACT_NONE, a, b, None, what=f"{sa}@{sb}")
        bias = bias_for(rng, dtype, len(sa), sb[-1])
        run_mm(rig, hw.OP_LINEAR, hw.ACT_RELU, a, b, bias, what=f"linear {sa}@{sb}")
    # Broadcast batch dims with junk strides (ignored for size-1 dims) and
    # a stride-0 batch dim of size > 1 (the same matrix repeated).
    a = operand_from(rng, dtype, (3, 4, 6), (0, 6, 1), specials=False, scale=1.0)
    b = operand_from(rng, dtype, (1, 6, 2), (999, 2, 1), specials=False, scale=1.0)
    run_mm(rig, hw.OP_MATMUL, hw.ACT_GELU, a, b, None, what="stride-0 batch")


@pytest.mark.parametrize("dname", ["fp32", "fp16", "bf16"])
def test_matmul_transposed_and_strided_operands(rig: Rig, dname: str) -> None:
    dtype = DTYPES[dname]
    rng = np.random.default_rng(80 + dtype)
    m, k, n = 13, 9, 11
    views_a = {
        "row-major": ((m, k), None),
        "transposed": ((m, k), (1, m)),
        "row-gap": ((m, k), (k + 3, 1)),
        "inner-stride-2": ((m, k), (2 * k + 1, 2)),
        "transposed-gap": ((m, k), (1, m + 5)),
        "broadcast-row": ((m, k), (0, 1)),
    }
    views_b = {
        "row-major": ((k, n), None),
        "transposed": ((k, n), (1, k)),
        "row-gap": ((k, n), (n + 2, 1)),
        "both-strided": ((k, n), (3 * n, 3)),
        "broadcast-col": ((k, n), (1, 0)),
    }
    for an, (sa, ta) in views_a.items():
        for bn, (sb, tb) in views_b.items():
            a = operand_from(rng, dtype, sa, ta, specials=False, scale=1.0)
            b = operand_from(rng, dtype, sb, tb, specials=False, scale=1.0)
            bias = bias_for(rng, dtype, 2, n, stride=3)
            run_mm(rig, hw.OP_LINEAR, hw.ACT_NONE, a, b, bias, what=f"a {an}, b {bn}")
    # Batched transposed views (rank 3, as x.transpose(-1, -2) gives them).
    a = operand_from(rng, dtype, (3, m, k), (m * k, 1, m), specials=False, scale=1.0)
    b = operand_from(rng, dtype, (3, k, n), (k * n, 1, k), specials=False, scale=1.0)
    run_mm(rig, hw.OP_MATMUL, hw.ACT_RELU, a, b, None, what="batched transposes")
    # A batch dim that is not the outermost in memory.
    a = operand_from(rng, dtype, (2, m, k), (k, 2 * k, 1), specials=False, scale=1.0)
    b = operand_from(rng, dtype, (2, k, n), specials=False, scale=1.0)
    run_mm(rig, hw.OP_MATMUL, hw.ACT_NONE, a, b, None, what="interleaved batch")
    # N == 1 and K == 1 (vectors), bias of one element.
    a = operand_from(rng, dtype, (m, 1), (5, 7), specials=False)
    b = operand_from(rng, dtype, (1, 1), (3, 3), specials=False)
    run_mm(rig, hw.OP_LINEAR, hw.ACT_GELU, a, b, bias_for(rng, dtype, 2, 1, stride=9))


def test_matmul_nan_and_inf_propagate_like_numpy(rig: Rig) -> None:
    a = Operand(FP32, (3, 2), buf=np.array([np.nan, 1, 1, 1, np.inf, 0], np.float32))
    b = Operand(FP32, (2, 2), buf=np.array([1, -1, 2, 2], np.float32))
    got = rig.run(hw.OP_MATMUL, hw.ACT_RELU, [a, b, Operand(FP32, (3, 2))])
    assert np.isnan(got[0]).all()  # RELU keeps NaN
    assert got[1].tolist() == [3.0, 1.0]
    assert got[2].tolist() == [np.inf, 0.0]  # relu(-inf) = 0


@pytest.mark.parametrize("cores", [1, 2])
def test_large_matmul_tiled_across_cores(tmp_path: Path, cores: int) -> None:
    dev = Npu(tmp_path / "qemu.log", device=f"npu,cores={cores}")
    try:
        dev.start()
        rig = Rig(dev)
        rng = np.random.default_rng(90 + cores)
        # 2^27 multiply-adds in fp32, rank 2: tiles of rows of M.
        a = operand_from(rng, FP32, (512, 512), specials=False, scale=1.0)
        b = operand_from(rng, FP32, (512, 512), specials=False, scale=1.0)
        run_mm(rig, hw.OP_MATMUL, hw.ACT_NONE, a, b, None, what="fp32 512^3")
        # bf16 LINEAR+GELU, a transposed, b shared across a batch of 3.
        a = operand_from(rng, BF16, (3, 200, 160), (160 * 200, 1, 200), specials=False,
                         scale=1.0)  # fmt: skip
        b = operand_from(rng, BF16, (1, 160, 96), specials=False, scale=1.0)
        bias = bias_for(rng, BF16, 3, 96)
        run_mm(rig, hw.OP_LINEAR, hw.ACT_GELU, a, b, bias, what="bf16 batched")
        # fp16 with K + N large enough that the 8 MiB bound splits M into
        # row blocks even on one core.
        a = operand_from(rng, FP16, (600, 1100), specials=False, scale=0.5)
        b = operand_from(rng, FP16, (1100, 1000), (1, 1100), specials=False, scale=0.5)
        run_mm(rig, hw.OP_MATMUL, hw.ACT_RELU, a, b, None, what="fp16 row blocks")
        dev.assert_alive()
    finally:
        dev.close()


BIAS_VA = HEAP + 0x1800


def mm_block(sa: Sequence[int] = (2, 3), sb: Sequence[int] = (3, 4),
             so: Sequence[int] = (2, 4), bias: Sequence[int] | None = None,
             dtypes: Sequence[int] = (FP32, FP32, FP32, FP32),
             params: Sequence[int] = ()) -> bytes:  # fmt: skip
    ops = [t(A_VA, dtypes[0], sa), t(B_VA, dtypes[1], sb)]
    if bias is not None:
        ops.append(t(BIAS_VA, dtypes[2], bias))
    ops.append(t(OUT_VA, dtypes[3], so))
    return tensor_params(ops, params)


_M, _LIN = hw.OP_MATMUL, hw.OP_LINEAR
_I32 = (INT32,) * 4
BAD_MM: dict[str, tuple[int, int, bytes, str]] = {
    "int8-out-fp32": (_M, 0, mm_block(dtypes=(INT8, INT8, INT8, FP32)), "BAD_ARGS"),
    "int32": (_M, 0, mm_block(dtypes=_I32), "BAD_ARGS"),
    "linear-int32": (_LIN, 0, mm_block(bias=(1, 4), dtypes=_I32), "BAD_ARGS"),
    "mixed-a-fp16": (_M, 0, mm_block(dtypes=(FP16, FP32, FP32, FP32)), "BAD_ARGS"),
    "mixed-out-bf16": (_M, 0, mm_block(dtypes=(FP32, FP32, FP32, BF16)), "BAD_ARGS"),
    "mixed-bias-fp16": (_LIN, 0, mm_block(bias=(1, 4), dtypes=(FP32, FP32, FP16, FP32)),
                        "BAD_ARGS"),
    "k-mismatch": (_M, 0, mm_block(sb=(2, 4)), "BAD_ARGS"),
    "m-mismatch": (_M, 0, mm_block(so=(3, 4)), "BAD_ARGS"),
    "n-mismatch": (_M, 0, mm_block(so=(2, 5)), "BAD_ARGS"),
    "out-transposed": (_M, 0, mm_block(so=(4, 2)), "BAD_ARGS"),
    "batch-mismatch-a": (_M, 0, mm_block((2, 2, 3), (3, 3, 4), (3, 2, 4)), "BAD_ARGS"),
    "batch-mismatch-b": (_M, 0, mm_block((3, 2, 3), (2, 3, 4), (3, 2, 4)), "BAD_ARGS"),
    "batch-out-1-a-2": (_M, 0, mm_block((2, 2, 3), (1, 3, 4), (1, 2, 4)), "BAD_ARGS"),
    "rank-mismatch": (_M, 0, mm_block((1, 2, 3), (3, 4), (1, 2, 4)), "BAD_ARGS"),
    "rank-1": (_M, 0, mm_block((3,), (3,), (1,)), "BAD_ARGS"),
    "bias-full": (_LIN, 0, mm_block(bias=(2, 4)), "BAD_ARGS"),
    "bias-rank-1": (_LIN, 0, mm_block(bias=(4,)), "BAD_ARGS"),
    "bias-short": (_LIN, 0, mm_block(bias=(1, 3)), "BAD_ARGS"),
    "bias-column": (_LIN, 0, mm_block(bias=(2, 1)), "BAD_ARGS"),
    "bias-rank-3-batch": (_LIN, 0, mm_block((2, 2, 3), (2, 3, 4), (2, 2, 4), bias=(2, 1, 4)),
                          "BAD_ARGS"),
    "linear-without-bias": (_LIN, 0, mm_block(), "BAD_ARGS"),
    "matmul-with-4th-operand": (_M, 0, mm_block()[: 3 * TENSOR_SIZE]
                                + t(OUT_VA) + mm_block()[4 * TENSOR_SIZE :], "BAD_RESERVED"),
    "kind-past-the-last": (_M, hw.ACT_COUNT, mm_block(), "BAD_ARGS"),
    "linear-kind-past-the-last": (_LIN, hw.ACT_COUNT, mm_block(bias=(1, 4)), "BAD_ARGS"),
    "params-0": (_M, 0, mm_block(params=(1,)), "BAD_RESERVED"),
    "out-strided": (_M, 0, tensor_params([t(A_VA), t(B_VA, shape=(3, 4)),
                                          t(OUT_VA, shape=(2, 4), strides=(8, 1))]),
                    "BAD_ARGS"),
}  # fmt: skip


@pytest.mark.parametrize(("opcode", "kind", "block", "status"), BAD_MM.values(),
                         ids=BAD_MM.keys())  # fmt: skip
def test_bad_matmul_is_rejected_and_writes_nothing(rig: Rig, opcode: int, kind: int,
                                                  block: bytes, status: str) -> None:  # fmt: skip
    rig.npu.qt.memset(HEAP, 0x3000, GUARD)
    assert rig.submit(opcode, kind, block) == getattr(hw, "ST_" + status)
    assert rig.npu.qt.memread(HEAP, 0x3000) == bytes([GUARD]) * 0x3000


def test_matmul_descriptor_payload_must_be_zero(rig: Rig) -> None:
    rig.write(PARAMS, mm_block())
    rig.npu.qt.memset(OUT_VA, 0x1000, GUARD)
    for opcode in (hw.OP_MATMUL, hw.OP_LINEAR):
        desc = _desc_with_byte(tensor(opcode, PARAMS), 32)
        assert rig.submit(opcode, 0, b"", desc=desc) == hw.ST_BAD_RESERVED
        assert rig.submit(opcode, 0, b"", desc=tensor(opcode, PARAMS, rsvd=1)) == hw.ST_BAD_RESERVED
    assert rig.npu.qt.memread(OUT_VA, 0x1000) == bytes([GUARD]) * 0x1000


def test_caps_report_matmul(rig: Rig) -> None:
    assert rig.npu.rd(hw.REG_CAPS) & hw.CAP_MATMUL


# --------------------------------------------------------------------------
# CONV2D and POOL2D
# --------------------------------------------------------------------------
#
# The CONV2D reference is a direct sum over the kernel taps in float64 on a
# zero-padded input; the tolerance is that of MATMUL (fp32 accumulation in
# another order, one rounding to the dtype). POOL2D MAX must be exact; AVG
# sums in double on the device, so the reference (float64, rounded once)
# may differ by one ulp where the mean is a hair from a rounding boundary.


def conv_geometry(x_shape: Sequence[int], w_shape: Sequence[int], stride: Sequence[int],
                  pad: Sequence[int], dil: Sequence[int]) -> tuple[int, int]:  # fmt: skip
    oh = (x_shape[2] + 2 * pad[0] - dil[0] * (w_shape[2] - 1) - 1) // stride[0] + 1
    ow = (x_shape[3] + 2 * pad[1] - dil[1] * (w_shape[3] - 1) - 1) // stride[1] + 1
    return oh, ow


def ref_conv(x: np.ndarray, w: np.ndarray, b: np.ndarray, stride: Sequence[int],
             pad: Sequence[int], dil: Sequence[int],
             groups: int) -> tuple[np.ndarray, np.ndarray]:  # fmt: skip
    """(sum, sum of magnitudes) in float64, before the activation."""
    n = x.shape[0]
    o, cg, kh, kw = w.shape
    og = o // groups
    oh, ow = conv_geometry(x.shape, w.shape, stride, pad, dil)
    xp = np.pad(x.astype(np.float64), ((0, 0), (0, 0), (pad[0],) * 2, (pad[1],) * 2))
    w64 = w.astype(np.float64)
    acc = np.zeros((n, o, oh, ow))
    mag = np.zeros((n, o, oh, ow))
    for g in range(groups):
        xg = xp[:, g * cg : (g + 1) * cg]
        for i in range(kh):
            for j in range(kw):
                h0, w0 = i * dil[0], j * dil[1]
                patch = xg[:, :, h0 : h0 + stride[0] * (oh - 1) + 1 : stride[0],
                           w0 : w0 + stride[1] * (ow - 1) + 1 : stride[1]]  # fmt: skip
                wt = w64[g * og : (g + 1) * og, :, i, j]
                acc[:, g * og : (g + 1) * og] += np.einsum("nchw,oc->nohw", patch, wt)
                mag[:, g * og : (g + 1) * og] += np.einsum("nchw,oc->nohw", np.abs(patch),
                                                           np.abs(wt))  # fmt: skip
    bias = b.astype(np.float64).reshape(1, o, 1, 1)
    return acc + bias, mag + np.abs(bias)


def check_conv(got: np.ndarray, x: np.ndarray, w: np.ndarray, b: np.ndarray, kind: int,
               dtype: int, stride: Sequence[int], pad: Sequence[int], dil: Sequence[int],
               groups: int, what: str = "") -> None:  # fmt: skip
    acc, mag = ref_conv(x, w, b, stride, pad, dil, groups)
    check_accumulated(got, acc, mag, kind, dtype, what)


def run_conv(rig: Rig, kind: int, x: Operand, w: Operand, b: Operand,
             stride: Sequence[int] = (1, 1), pad: Sequence[int] = (0, 0),
             dil: Sequence[int] = (1, 1), groups: int = 1,
             what: str = "") -> np.ndarray:  # fmt: skip
    oh, ow = conv_geometry(x.shape, w.shape, stride, pad, dil)
    out = Operand(x.dtype, (x.shape[0], w.shape[0], oh, ow))
    params = [stride[0], stride[1], pad[0], pad[1], dil[0], dil[1], groups]
    got = rig.run(hw.OP_CONV2D, kind, [x, w, b, out], params=params, timeout=60.0)
    check_conv(got, logical(x), logical(w), logical(b), kind, x.dtype, stride, pad, dil,
               groups, what)  # fmt: skip
    return got


def conv_operands(rng: np.random.Generator, dtype: int, n: int, c: int, h: int, wd: int,
                  o: int, kh: int, kw: int,
                  groups: int) -> tuple[Operand, Operand, Operand]:  # fmt: skip
    x = operand_from(rng, dtype, (n, c, h, wd), specials=False, scale=1.0)
    w = operand_from(rng, dtype, (o, c // groups, kh, kw), specials=False, scale=0.5)
    b = operand_from(rng, dtype, (1, o, 1, 1), specials=False, scale=1.0)
    return x, w, b


# (N, C, H, W, O, KH, KW, stride, pad, dilation, groups)
CONV_CASES = {
    "3x3-pad1": (1, 3, 7, 9, 4, 3, 3, (1, 1), (1, 1), (1, 1), 1),
    "1x1-groups2-batch2": (2, 4, 8, 6, 6, 1, 1, (1, 1), (0, 0), (1, 1), 2),
    "depthwise-stride2": (2, 4, 9, 11, 4, 3, 3, (2, 2), (1, 1), (1, 1), 4),
    "5x5-pad2-stride-1x2": (1, 2, 10, 12, 3, 5, 5, (1, 2), (2, 2), (1, 1), 1),
    "dilation2-pad2-groups2": (1, 4, 11, 9, 4, 3, 3, (1, 1), (2, 2), (2, 2), 2),
    "mixed-3x5": (3, 2, 5, 7, 2, 3, 5, (2, 1), (0, 1), (1, 2), 1),
    "depthwise-multiplier2": (1, 3, 6, 5, 6, 3, 3, (1, 1), (1, 1), (1, 1), 3),
    "no-pad-stride2": (1, 5, 8, 8, 7, 3, 3, (2, 2), (0, 0), (1, 1), 1),
}


@pytest.mark.parametrize("aname", ACT)
@pytest.mark.parametrize("dname", ["fp32", "fp16", "bf16"])
def test_conv2d_every_dtype_activation_and_geometry(rig: Rig, dname: str, aname: str) -> None:
    dtype, kind = DTYPES[dname], ACT[aname]
    rng = np.random.default_rng([12, dtype, kind])
    for name, (n, c, h, wd, o, kh, kw, st, pd, dl, g) in CONV_CASES.items():
        x, w, b = conv_operands(rng, dtype, n, c, h, wd, o, kh, kw, g)
        run_conv(rig, kind, x, w, b, st, pd, dl, g, what=name)


@pytest.mark.parametrize("dname", ["fp32", "fp16", "bf16"])
def test_conv2d_strided_views(rig: Rig, dname: str) -> None:
    dtype = DTYPES[dname]
    rng = np.random.default_rng(120 + dtype)
    n, c, h, wd, o = 2, 3, 6, 7, 4
    # NHWC memory seen as NCHW; OIHW weights from an HWIO layout; bias stride 3.
    x = operand_from(rng, dtype, (n, c, h, wd), (h * wd * c, 1, wd * c, c), specials=False)
    w = operand_from(rng, dtype, (o, c, 3, 3), (1, o, 3 * c * o, c * o), specials=False,
                     scale=0.5)  # fmt: skip
    b = operand_from(rng, dtype, (1, o, 1, 1), (0, 3, 0, 0), specials=False)
    run_conv(rig, hw.ACT_RELU, x, w, b, (1, 1), (1, 1), what="nhwc view")
    # Every other column and row of a larger image, junk strides of size-1 dims.
    x = operand_from(rng, dtype, (1, c, h, wd), (999, 2 * h * 2 * wd, 4 * wd, 2),
                     specials=False)  # fmt: skip
    w = operand_from(rng, dtype, (o, c, 3, 2), (40, 12, 3, 1), specials=False, scale=0.5)
    b = operand_from(rng, dtype, (1, o, 1, 1), specials=False)
    run_conv(rig, hw.ACT_NONE, x, w, b, (2, 1), (1, 0), (1, 2), what="gapped view")
    # Broadcast input (stride 0 over the batch and the channels).
    x = operand_from(rng, dtype, (2, 2, 5, 5), (0, 0, 5, 1), specials=False)
    w = operand_from(rng, dtype, (2, 2, 3, 3), specials=False, scale=0.5)
    b = operand_from(rng, dtype, (1, 2, 1, 1), specials=False)
    run_conv(rig, hw.ACT_GELU, x, w, b, (1, 1), (2, 2), (2, 2), what="stride-0 input")


def test_conv2d_nan_inf_and_padding_zeros(rig: Rig) -> None:
    x = Operand(FP32, (1, 1, 2, 2), buf=np.array([1, np.inf, 2, 3], np.float32))
    w = Operand(FP32, (1, 1, 1, 1), buf=np.array([2], np.float32))
    b = Operand(FP32, (1, 1, 1, 1), buf=np.array([-3], np.float32))
    got = rig.run(hw.OP_CONV2D, hw.ACT_RELU, [x, w, b, Operand(FP32, (1, 1, 4, 4))],
                  params=[1, 1, 1, 1, 1, 1, 1])  # fmt: skip
    # A 1x1 kernel over the padding sees only zeros: relu(0 * 2 - 3) = 0.
    assert got[0, 0].tolist() == [[0, 0, 0, 0], [0, 0, np.inf, 0], [0, 1, 3, 0], [0, 0, 0, 0]]


@pytest.mark.parametrize("cores", [1, 2])
def test_large_conv2d_tiled_across_cores(tmp_path: Path, cores: int) -> None:
    dev = Npu(tmp_path / "qemu.log", device=f"npu,cores={cores}")
    try:
        dev.start()
        rig = Rig(dev)
        rng = np.random.default_rng(130 + cores)
        x, w, b = conv_operands(rng, FP32, 8, 16, 28, 28, 32, 3, 3, 1)
        run_conv(rig, hw.ACT_RELU, x, w, b, (1, 1), (1, 1), what="fp32 8x16x28x28 -> 32")
        x, w, b = conv_operands(rng, BF16, 4, 16, 30, 26, 32, 3, 3, 2)
        run_conv(rig, hw.ACT_GELU, x, w, b, (2, 1), (1, 2), (1, 2), 2, what="bf16 groups 2")
        # C/g * KH * KW + O/g large enough that the 8 MiB bound splits each
        # image's output positions into blocks even on one core.
        x, w, b = conv_operands(rng, FP16, 1, 240, 40, 40, 16, 3, 3, 1)
        run_conv(rig, hw.ACT_NONE, x, w, b, (1, 1), (1, 1), what="fp16 position blocks")
        # Depthwise, tiled.
        x, w, b = conv_operands(rng, FP32, 4, 32, 32, 32, 32, 5, 5, 32)
        run_conv(rig, hw.ACT_NONE, x, w, b, (1, 1), (2, 2), groups=32, what="depthwise 5x5")
        dev.assert_alive()
    finally:
        dev.close()


def ref_pool(kind: int, x: np.ndarray, k: Sequence[int], stride: Sequence[int],
             pad: Sequence[int], count_pad: bool) -> np.ndarray:  # fmt: skip
    oh, ow = conv_geometry(x.shape, (0, 0, *k), stride, pad, (1, 1))
    pads = ((0, 0), (0, 0), (pad[0],) * 2, (pad[1],) * 2)
    x64 = x.astype(np.float64)
    if kind == hw.POOL_MAX:
        xp = np.pad(x64, pads, constant_values=-np.inf)
    else:
        xp = np.pad(x64, pads)
        ones = np.pad(np.ones_like(x64), pads)
    taps, counts = [], []
    for i in range(k[0]):
        for j in range(k[1]):
            sl = (slice(None), slice(None), slice(i, i + stride[0] * (oh - 1) + 1, stride[0]),
                  slice(j, j + stride[1] * (ow - 1) + 1, stride[1]))  # fmt: skip
            taps.append(xp[sl])
            if kind != hw.POOL_MAX:
                counts.append(ones[sl])
    if kind == hw.POOL_MAX:
        return np.max(np.stack(taps), axis=0)  # NaN propagates, like the device
    div = k[0] * k[1] if count_pad else np.sum(np.stack(counts), axis=0)
    return np.sum(np.stack(taps), axis=0) / div


def run_pool(rig: Rig, kind: int, x: Operand, k: Sequence[int], stride: Sequence[int],
             pad: Sequence[int] = (0, 0), count_pad: bool = False,
             what: str = "") -> np.ndarray:  # fmt: skip
    oh, ow = conv_geometry(x.shape, (0, 0, *k), stride, pad, (1, 1))
    out = Operand(x.dtype, (x.shape[0], x.shape[1], oh, ow))
    params = [k[0], k[1], stride[0], stride[1], pad[0], pad[1],
              hw.POOL_F_COUNT_PAD if count_pad else 0]  # fmt: skip
    got = rig.run(hw.OP_POOL2D, kind, [x, out], params=params, timeout=60.0)
    want = ref_pool(kind, logical(x), k, stride, pad, count_pad)
    if kind == hw.POOL_MAX:
        assert_matches(got, round_to(want, x.dtype), x.dtype, what=what)
    else:
        assert_close(got, want, x.dtype, what)
    return got


POOL = {"max": hw.POOL_MAX, "avg": hw.POOL_AVG}
# (N, C, H, W, kernel, stride, pad)
POOL_CASES = {
    "2x2-s2": (2, 3, 8, 6, (2, 2), (2, 2), (0, 0)),
    "3x3-s1-pad1": (1, 2, 7, 9, (3, 3), (1, 1), (1, 1)),
    "3x3-s2-pad1-odd": (2, 2, 9, 7, (3, 3), (2, 2), (1, 1)),
    "2x3-s-1x2-pad-1x2": (1, 3, 5, 8, (2, 3), (1, 2), (1, 2)),
    "global": (2, 4, 7, 5, (7, 5), (1, 1), (0, 0)),
    "overlapping-3x2": (1, 1, 6, 6, (3, 2), (1, 1), (0, 0)),
}


@pytest.mark.parametrize("dname", ["fp32", "fp16", "bf16"])
@pytest.mark.parametrize("kname", POOL)
def test_pool2d_every_kind_dtype_and_geometry(rig: Rig, kname: str, dname: str) -> None:
    dtype, kind = DTYPES[dname], POOL[kname]
    rng = np.random.default_rng([13, dtype, kind])
    for name, (n, c, h, wd, k, st, pd) in POOL_CASES.items():
        for count_pad in (False, True) if kind == hw.POOL_AVG else (False,):
            x = operand_from(rng, dtype, (n, c, h, wd), specials=False)
            run_pool(rig, kind, x, k, st, pd, count_pad, what=f"{name} count_pad={count_pad}")
    # A strided (NHWC) view.
    x = operand_from(rng, dtype, (2, 3, 6, 5), (90, 1, 15, 3), specials=False)
    run_pool(rig, kind, x, (3, 3), (2, 2), (1, 1), True, what="nhwc view")


def pool_size(n: int, k: int, s: int, pb: int, pe: int, d: int, ceil: bool) -> int:
    """Output size of npu_hw.h's POOL2D rule, spelled out."""
    span = d * (k - 1) + 1
    size = (n + pb + pe - span) / s + 1
    out = math.ceil(size) if ceil else math.floor(size)
    if ceil and (out - 1) * s >= n + pb:  # the last window would start in the end pad
        out -= 1
    return out


def ref_pool_geometry(kind: int, x: np.ndarray, k: Sequence[int], s: Sequence[int],
                      pads: Sequence[int], dil: Sequence[int], ceil: bool,
                      count_pad: bool) -> np.ndarray:  # fmt: skip
    """POOL2D with end pads, dilations and ceil mode: one window at a time."""
    n, c, h, w = x.shape
    oh = pool_size(h, k[0], s[0], pads[0], pads[2], dil[0], ceil)
    ow = pool_size(w, k[1], s[1], pads[1], pads[3], dil[1], ceil)
    y = np.zeros((n, c, oh, ow))
    for i in range(oh):
        rows = [i * s[0] - pads[0] + a * dil[0] for a in range(k[0])]
        for j in range(ow):
            cols = [j * s[1] - pads[1] + b * dil[1] for b in range(k[1])]
            taps = [x[:, :, r, q].astype(np.float64) for r in rows for q in cols
                    if 0 <= r < h and 0 <= q < w]  # fmt: skip
            if kind == hw.POOL_MAX:
                y[:, :, i, j] = np.max(np.stack(taps), axis=0) if taps else -np.inf
                continue
            inside = sum(1 for r in rows for q in cols
                         if r < h + pads[2] and q < w + pads[3])  # fmt: skip
            div = inside if count_pad else len(taps)
            y[:, :, i, j] = np.sum(np.stack(taps), axis=0) / div if taps else 0.0
    return y


# (N, C, H, W, kernel, stride, pads [top, left, bottom, right], dilation, ceil)
POOL_GEOMETRY_CASES = {
    "end-pads": (2, 3, 9, 9, (3, 3), (2, 2), (0, 0, 1, 1), (1, 1), False),
    "uneven-pads": (1, 2, 10, 7, (3, 3), (2, 2), (1, 0, 2, 1), (1, 1), False),
    "ceil": (2, 2, 8, 7, (3, 3), (2, 2), (0, 0, 0, 0), (1, 1), True),
    "ceil-past-pads": (1, 3, 6, 6, (3, 3), (2, 2), (1, 1, 1, 1), (1, 1), True),
    "ceil-reduced": (1, 1, 2, 2, (1, 1), (2, 2), (0, 0, 0, 0), (1, 1), True),
    "dilated": (1, 2, 6, 6, (2, 2), (1, 1), (0, 0, 0, 0), (2, 2), False),
    "dilated-padded-ceil": (2, 2, 10, 9, (2, 3), (2, 2), (1, 2, 1, 0), (3, 2), True),
}


@pytest.mark.parametrize("dname", ["fp32", "bf16"])
@pytest.mark.parametrize("kname", POOL)
def test_pool2d_end_pads_dilation_and_ceil_mode(rig: Rig, kname: str, dname: str) -> None:
    dtype, kind = DTYPES[dname], POOL[kname]
    rng = np.random.default_rng([17, dtype, kind])
    for name, (n, c, h, wd, k, st, pads, dil, ceil) in POOL_GEOMETRY_CASES.items():
        oh = pool_size(h, k[0], st[0], pads[0], pads[2], dil[0], ceil)
        ow = pool_size(wd, k[1], st[1], pads[1], pads[3], dil[1], ceil)
        for count_pad in (False, True) if kind == hw.POOL_AVG else (False,):
            x = operand_from(rng, dtype, (n, c, h, wd), specials=False)
            flags = (hw.POOL_F_GEOMETRY | (hw.POOL_F_CEIL if ceil else 0)
                     | (hw.POOL_F_COUNT_PAD if count_pad else 0))  # fmt: skip
            params = [k[0], k[1], st[0], st[1], pads[0], pads[1], flags, pads[2], pads[3],
                      dil[0], dil[1]]  # fmt: skip
            got = rig.run(hw.OP_POOL2D, kind, [x, Operand(dtype, (n, c, oh, ow))], params=params)
            want = ref_pool_geometry(kind, logical(x), k, st, pads, dil, ceil, count_pad)
            what = f"{name} count_pad={count_pad}"
            if kind == hw.POOL_MAX:
                assert_matches(got, round_to(want, dtype), dtype, what=what)
            else:
                assert_close(got, want, dtype, what)


def test_pool2d_max_ignores_padding_and_propagates_nan(rig: Rig) -> None:
    x = Operand(FP32, (1, 1, 2, 2), buf=np.array([-5, -6, np.nan, -7], np.float32))
    got = rig.run(hw.OP_POOL2D, hw.POOL_MAX, [x, Operand(FP32, (1, 1, 3, 3))],
                  params=[2, 2, 1, 1, 1, 1, 0])  # fmt: skip
    assert got[0, 0, 0].tolist() == [-5.0, -5.0, -6.0]  # not 0 from the padding
    assert got[0, 0, 1:, 2].tolist() == [-6.0, -7.0]
    assert np.isnan(got[0, 0, 1:, :2]).all()
    # AVG of the same corner with and without the padding counted.
    x = Operand(FP32, (1, 1, 2, 2), buf=np.array([4, 8, 12, 16], np.float32))
    for flags, want in ((0, 4.0), (hw.POOL_F_COUNT_PAD, 1.0)):
        got = rig.run(hw.OP_POOL2D, hw.POOL_AVG, [x, Operand(FP32, (1, 1, 3, 3))],
                      params=[2, 2, 1, 1, 1, 1, flags])  # fmt: skip
        assert got[0, 0, 0, 0] == want


@pytest.mark.parametrize("cores", [1, 2])
def test_large_pool2d_tiled_across_cores(tmp_path: Path, cores: int) -> None:
    dev = Npu(tmp_path / "qemu.log", device=f"npu,cores={cores}")
    try:
        dev.start()
        rig = Rig(dev)
        rng = np.random.default_rng(140 + cores)
        x = operand_from(rng, FP16, (4, 32, 56, 56), specials=False)
        run_pool(rig, hw.POOL_MAX, x, (3, 3), (1, 1), (1, 1), what="fp16 max")
        run_pool(rig, hw.POOL_AVG, x, (3, 3), (1, 1), (1, 1), what="fp16 avg")
        dev.assert_alive()
    finally:
        dev.close()


def conv_block(si: Sequence[int] = (1, 2, 5, 5), sw: Sequence[int] = (4, 2, 3, 3),
               sb: Sequence[int] = (1, 4, 1, 1), so: Sequence[int] = (1, 4, 5, 5),
               params: Sequence[int] = (1, 1, 1, 1, 1, 1, 1),
               dtypes: Sequence[int] = (FP32,) * 4,
               out_strides: Sequence[int] | None = None) -> bytes:  # fmt: skip
    return tensor_params([t(A_VA, dtypes[0], si), t(B_VA, dtypes[1], sw),
                          t(BIAS_VA, dtypes[2], sb), t(OUT_VA, dtypes[3], so, out_strides)],
                         params)  # fmt: skip


def pool_block(si: Sequence[int] = (1, 2, 6, 6), so: Sequence[int] = (1, 2, 3, 3),
               params: Sequence[int] = (2, 2, 2, 2, 0, 0, 0),
               dtypes: Sequence[int] = (FP32, FP32)) -> bytes:  # fmt: skip
    return tensor_params([t(A_VA, dtypes[0], si), t(OUT_VA, dtypes[1], so)], params)


_CV, _PL = hw.OP_CONV2D, hw.OP_POOL2D
BAD_CONV: dict[str, tuple[int, int, bytes, str]] = {
    "conv-out-h": (_CV, 0, conv_block(so=(1, 4, 4, 5)), "BAD_ARGS"),
    "conv-out-w": (_CV, 0, conv_block(so=(1, 4, 5, 6)), "BAD_ARGS"),
    "conv-out-channels": (_CV, 0, conv_block(so=(1, 3, 5, 5)), "BAD_ARGS"),
    "conv-out-batch": (_CV, 0, conv_block(so=(2, 4, 5, 5)), "BAD_ARGS"),
    "conv-out-strided": (_CV, 0, conv_block(out_strides=(100, 25, 5, 2)),
                         "BAD_ARGS"),
    "conv-groups-0": (_CV, 0, conv_block(params=(1, 1, 1, 1, 1, 1, 0)), "BAD_ARGS"),
    "conv-groups-not-dividing-c": (_CV, 0, conv_block((1, 3, 5, 5), (4, 1, 3, 3),
                                                      params=(1, 1, 1, 1, 1, 1, 2)), "BAD_ARGS"),
    "conv-groups-not-dividing-o": (_CV, 0, conv_block(sw=(3, 1, 3, 3), sb=(1, 3, 1, 1),
                                                      so=(1, 3, 5, 5),
                                                      params=(1, 1, 1, 1, 1, 1, 2)), "BAD_ARGS"),
    "conv-weight-c-not-c-over-g": (_CV, 0, conv_block(params=(1, 1, 1, 1, 1, 1, 2)),
                                   "BAD_ARGS"),
    "conv-stride-h-0": (_CV, 0, conv_block(params=(0, 1, 1, 1, 1, 1, 1)), "BAD_ARGS"),
    "conv-stride-w-0": (_CV, 0, conv_block(params=(1, 0, 1, 1, 1, 1, 1)), "BAD_ARGS"),
    "conv-dilation-h-0": (_CV, 0, conv_block(params=(1, 1, 1, 1, 0, 1, 1)), "BAD_ARGS"),
    "conv-dilation-w-0": (_CV, 0, conv_block(params=(1, 1, 1, 1, 1, 0, 1)), "BAD_ARGS"),
    "conv-kernel-0": (_CV, 0, conv_block(sw=(4, 2, 0, 3)), "BAD_ARGS"),
    "conv-kernel-too-big": (_CV, 0, conv_block(sw=(4, 2, 8, 3), params=(1, 1, 0, 1, 1, 1, 1)),
                            "BAD_ARGS"),
    "conv-pad-over-max": (_CV, 0, conv_block(so=(1, 4, 5 + 2 * 65536 - 2, 5),
                                             params=(1, 1, hw.MAX_PAD + 1, 1, 1, 1, 1)),
                          "BAD_ARGS"),
    "conv-int8-bias-int8": (_CV, 0, conv_block(dtypes=(INT8,) * 4), "BAD_ARGS"),
    "conv-int32": (_CV, 0, conv_block(dtypes=(INT32,) * 4), "BAD_ARGS"),
    "conv-mixed-bias": (_CV, 0, conv_block(dtypes=(FP32, FP32, FP16, FP32)), "BAD_ARGS"),
    "conv-mixed-out": (_CV, 0, conv_block(dtypes=(FP32, FP32, FP32, BF16)), "BAD_ARGS"),
    "conv-bias-rank-1": (_CV, 0, conv_block(sb=(4,)), "BAD_ARGS"),
    "conv-bias-spatial": (_CV, 0, conv_block(sb=(1, 4, 1, 2)), "BAD_ARGS"),
    "conv-bias-short": (_CV, 0, conv_block(sb=(1, 3, 1, 1)), "BAD_ARGS"),
    "conv-rank-3": (_CV, 0, conv_block(si=(2, 5, 5)), "BAD_ARGS"),
    "conv-kind-past-the-last": (_CV, hw.ACT_COUNT, conv_block(), "BAD_ARGS"),
    "conv-params-7": (_CV, 0, conv_block(params=(1, 1, 1, 1, 1, 1, 1, 1)), "BAD_RESERVED"),
    "pool-out-shape": (_PL, 0, pool_block(so=(1, 2, 3, 2)), "BAD_ARGS"),
    "pool-out-channels": (_PL, 0, pool_block(so=(1, 3, 3, 3)), "BAD_ARGS"),
    "pool-kernel-0": (_PL, 0, pool_block(params=(0, 2, 2, 2, 0, 0, 0)), "BAD_ARGS"),
    "pool-stride-0": (_PL, 0, pool_block(params=(2, 2, 2, 0, 0, 0, 0)), "BAD_ARGS"),
    "pool-pad-equals-kernel": (_PL, 0, pool_block(so=(1, 2, 5, 3),
                                                  params=(2, 2, 2, 2, 2, 0, 0)), "BAD_ARGS"),
    "pool-pad-over-kernel": (_PL, 0, pool_block(so=(1, 2, 3, 5),
                                                params=(2, 2, 2, 2, 0, 3, 0)), "BAD_ARGS"),
    "pool-flags-2": (_PL, 0, pool_block(params=(2, 2, 2, 2, 0, 0, 2)), "BAD_ARGS"),
    "pool-flags-8": (_PL, 0, pool_block(params=(2, 2, 2, 2, 0, 0, 8)), "BAD_ARGS"),
    "pool-ceil-without-geometry": (_PL, 0, pool_block(params=(2, 2, 2, 2, 0, 0, 4)), "BAD_ARGS"),
    "pool-dilation-0": (_PL, 0, pool_block(params=(2, 2, 2, 2, 0, 0, 2, 0, 0, 0, 1)), "BAD_ARGS"),
    "pool-end-pad-equals-span": (_PL, 0, pool_block(so=(1, 2, 4, 3),
                                                    params=(2, 2, 2, 2, 0, 0, 2, 2, 0, 1, 1)),
                                 "BAD_ARGS"),
    "pool-ceil-out-not-floor": (_PL, 0, pool_block(si=(1, 2, 7, 7), so=(1, 2, 3, 3),
                                                   params=(2, 2, 2, 2, 0, 0, 6, 0, 0, 1, 1)),
                                "BAD_ARGS"),
    "pool-end-pad-without-geometry": (_PL, 0, pool_block(params=(2, 2, 2, 2, 0, 0, 0, 1)),
                                      "BAD_RESERVED"),
    "pool-params-11": (_PL, 0, pool_block(params=(2, 2, 2, 2, 0, 0, 2, 0, 0, 1, 1, 1)),
                       "BAD_RESERVED"),
    "pool-kind-2": (_PL, 2, pool_block(), "BAD_ARGS"),
    "pool-int32": (_PL, 0, pool_block(dtypes=(INT32, INT32)), "BAD_ARGS"),
    "pool-int8": (_PL, 1, pool_block(dtypes=(INT8, INT8)), "BAD_ARGS"),
    "pool-mixed": (_PL, 0, pool_block(dtypes=(FP32, FP16)), "BAD_ARGS"),
    "pool-rank-2": (_PL, 0, pool_block((6, 6), (3, 3)), "BAD_ARGS"),
    "pool-params-7": (_PL, 0, pool_block(params=(2, 2, 2, 2, 0, 0, 0, 1)), "BAD_RESERVED"),
    "pool-third-operand": (_PL, 0, pool_block()[: 2 * TENSOR_SIZE] + t(B_VA)
                           + pool_block()[3 * TENSOR_SIZE :], "BAD_RESERVED"),
}  # fmt: skip


@pytest.mark.parametrize(("opcode", "kind", "block", "status"), BAD_CONV.values(),
                         ids=BAD_CONV.keys())  # fmt: skip
def test_bad_conv_or_pool_is_rejected(rig: Rig, opcode: int, kind: int, block: bytes,
                                      status: str) -> None:  # fmt: skip
    """A bad CONV2D/POOL2D completes with its status and writes nothing."""
    rig.npu.qt.memset(HEAP, 0x3000, GUARD)
    assert rig.submit(opcode, kind, block) == getattr(hw, "ST_" + status)
    assert rig.npu.qt.memread(HEAP, 0x3000) == bytes([GUARD]) * 0x3000


def test_conv_and_pool_descriptor_payload_must_be_zero(rig: Rig) -> None:
    rig.npu.qt.memset(OUT_VA, 0x1000, GUARD)
    for opcode, block in ((hw.OP_CONV2D, conv_block()), (hw.OP_POOL2D, pool_block())):
        rig.write(PARAMS, block)
        desc = _desc_with_byte(tensor(opcode, PARAMS), 32)
        assert rig.submit(opcode, 0, b"", desc=desc) == hw.ST_BAD_RESERVED
        assert rig.submit(opcode, 0, b"", desc=tensor(opcode, PARAMS, rsvd=1)) == hw.ST_BAD_RESERVED
    assert rig.npu.qt.memread(OUT_VA, 0x1000) == bytes([GUARD]) * 0x1000


def test_caps_report_conv(rig: Rig) -> None:
    assert rig.npu.rd(hw.REG_CAPS) & hw.CAP_CONV
