"""numpy references for the tensor ops run through qtest, shared by
test_device_qtest_tensor.py and test_device_qtest_hypothesis.py.

A plain module (not a test file). The semantics are those of docs/npu-spec.md:
float dtypes compute in fp32 and round once (round to nearest even) to the
output dtype, integers wrap like numpy, float -> int conversions truncate and
saturate (NaN -> 0); bfloat16 values travel as uint16 bit patterns.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from qtest import hw

FP32, FP16, BF16, INT8, INT32 = (hw.DTYPE_FP32, hw.DTYPE_FP16, hw.DTYPE_BF16,
                                 hw.DTYPE_INT8, hw.DTYPE_INT32)  # fmt: skip
BOOL = hw.DTYPE_BOOL  # one byte, 0 or 1: a comparison's output
FLOATS = (FP32, FP16, BF16)
SIZE = {FP32: 4, FP16: 2, BF16: 2, INT8: 1, INT32: 4, BOOL: 1}
STORAGE = {FP32: np.float32, FP16: np.float16, BF16: np.uint16, INT8: np.int8, INT32: np.int32,
           BOOL: np.uint8}  # fmt: skip
INT_RANGE = {INT8: (-(1 << 7), (1 << 7) - 1), INT32: (-(1 << 31), (1 << 31) - 1)}
ULP = {FP32: 2.0**-22, FP16: 2.0**-9, BF16: 2.0**-6}
TINY = {FP32: 2.0**-149, FP16: 2.0**-24, BF16: 2.0**-133}
MM_REL = {FP32: 2.0**-22, FP16: 2.0**-10, BF16: 2.0**-7}


def bf16_bits(x: np.ndarray) -> np.ndarray:
    """fp32 -> bfloat16 bit patterns, round to nearest even; NaN stays NaN."""
    x = np.asarray(x, np.float32)
    u = x.view(np.uint32).astype(np.uint64)
    r = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)
    nan = np.isnan(x)
    r[nan] = ((u[nan] >> 16) | 0x40).astype(np.uint16)
    return r


def bf16_value(bits: np.ndarray) -> np.ndarray:
    return (np.asarray(bits, np.uint16).astype(np.uint32) << 16).view(np.float32)


def wrap(x: np.ndarray, dtype: int) -> np.ndarray:
    """Two's-complement wraparound of integers to dtype."""
    lo, hi = INT_RANGE[dtype]
    return ((np.asarray(x, np.int64) - lo) % (hi - lo + 1) + lo).astype(np.int64)


def round_to(x: np.ndarray, dtype: int) -> np.ndarray:
    """Values (float or int) as dtype would hold them: float32 or int64 arrays."""
    with np.errstate(all="ignore"):
        if dtype == FP32:
            return np.asarray(x).astype(np.float32)
        if dtype == FP16:
            return np.asarray(x).astype(np.float32).astype(np.float16).astype(np.float32)
        if dtype == BF16:
            return bf16_value(bf16_bits(np.asarray(x).astype(np.float32)))
    return wrap(x, dtype)


def encode(values: np.ndarray, dtype: int) -> bytes:
    """Values already representable in dtype -> little-endian bytes."""
    if dtype == BF16:
        return bf16_bits(values).astype("<u2").tobytes()
    return np.asarray(values).astype(np.dtype(STORAGE[dtype]).newbyteorder("<")).tobytes()


def decode(raw: bytes, dtype: int, shape: Sequence[int] = (-1,)) -> np.ndarray:
    """Bytes -> float32 (float dtypes) or int64 (int dtypes) array."""
    arr = np.frombuffer(raw, np.dtype(STORAGE[dtype]).newbyteorder("<"))
    if dtype == BF16:
        out = bf16_value(arr)
    elif dtype in FLOATS:
        out = arr.astype(np.float32)
    else:
        out = arr.astype(np.int64)
    return out.reshape(tuple(shape))


def assert_matches(got: np.ndarray, want: np.ndarray, dtype: int, *, rtol: float = 0.0,
                   atol: float = 0.0, what: str = "") -> None:  # fmt: skip
    assert got.shape == want.shape, (got.shape, want.shape)
    if dtype in FLOATS:
        np.testing.assert_allclose(got, want.astype(np.float32), rtol=rtol, atol=atol,
                                   equal_nan=True, err_msg=what)  # fmt: skip
    else:
        np.testing.assert_array_equal(got, want, err_msg=what)


def gather(buf: np.ndarray, shape: Sequence[int], strides: Sequence[int]) -> np.ndarray:
    """The logical tensor of shape/strides (elements) over the flat buffer buf."""
    off = np.zeros(tuple(shape), np.int64)
    for d, (n, s) in enumerate(zip(shape, strides, strict=True)):
        idx = [1] * len(shape)
        idx[d] = n
        off = off + (np.arange(n) * s).reshape(idx)
    return buf[off]


def contiguous(shape: Sequence[int]) -> tuple[int, ...]:
    strides, acc = [], 1
    for n in reversed(shape):
        strides.append(acc)
        acc *= n
    return tuple(reversed(strides))


def extent(shape: Sequence[int], strides: Sequence[int]) -> int:
    """Elements from [0, ...] to the furthest element, inclusive."""
    return sum((n - 1) * s for n, s in zip(shape, strides, strict=True)) + 1


def int_to_bf16_exact(v: int) -> float:
    """An integer rounded once, to nearest even, to bfloat16's 8 significant bits."""
    a = abs(v)
    if a < 256:
        return float(v)
    sh = a.bit_length() - 8
    q, rem = divmod(a, 1 << sh)
    half = 1 << (sh - 1)
    if rem > half or (rem == half and q & 1):
        q += 1
    return math.copysign(float(q << sh), v)


def ref_convert(x: np.ndarray, src: int, dst: int) -> np.ndarray:
    """x holds src values (float32 / int64)."""
    if dst in FLOATS:
        if src in FLOATS or dst == FP32:
            return round_to(x.astype(np.float32), dst)  # int -> fp32: one rounding
        if dst == FP16:  # |x| < 2^24 is exact in fp32; larger is inf in fp16 anyway
            return round_to(x.astype(np.float64), dst)
        return np.array([int_to_bf16_exact(int(v)) for v in x.ravel()],
                        np.float32).reshape(x.shape)  # fmt: skip
    if src in FLOATS:
        lo, hi = INT_RANGE[dst]
        with np.errstate(invalid="ignore"):
            t = np.clip(np.trunc(x.astype(np.float64)), lo, hi)
        return np.where(np.isnan(x), 0, t).astype(np.int64)
    return wrap(x, dst)


_erf = np.vectorize(math.erf, otypes=[np.float64])


def ref_act(kind: int, x: np.ndarray) -> np.ndarray:
    if kind == hw.ACT_RELU:
        return np.where(x < 0, 0.0, x)
    if kind == hw.ACT_GELU:
        return 0.5 * x * (1.0 + _erf(x / math.sqrt(2.0)))
    if kind == hw.ACT_RELU6:
        return np.where(x < 0, 0.0, np.where(x > 6, 6.0, x))
    return x
