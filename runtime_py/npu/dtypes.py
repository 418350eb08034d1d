"""Tensor dtypes: the bfloat16 marker, the numpy mapping, bf16 conversion and promotion.

bfloat16 has no numpy dtype: :data:`bfloat16` is a sentinel dtype object;
bfloat16 data is stored as ``uint16`` words (the top half of an IEEE float32).
:func:`result_type` is numpy's ``np.result_type`` over the supported dtypes,
float64 replaced by float32 and bfloat16 placed between int8 and float32.
"""

from __future__ import annotations

import logging
from typing import Any, Final, TypeAlias

import numpy as np
import numpy.typing as npt

from . import _abi

__all__ = [
    "BFloat16Type",
    "DTypeArg",
    "TensorDType",
    "bf16_to_float32",
    "bfloat16",
    "float32_to_bf16",
    "result_type",
]

_logger = logging.getLogger("npu.tensor")

DType = _abi.DType


class BFloat16Type:
    """The type of :data:`npu.bfloat16`, the bfloat16 dtype marker.

    There is a single instance. It is stored as ``uint16`` words
    (:attr:`storage`); ``itemsize`` is 2.
    """

    name: Final = "bfloat16"
    itemsize: Final = 2
    storage: Final = np.dtype(np.uint16)

    _instance: BFloat16Type | None = None

    def __new__(cls) -> BFloat16Type:
        """Return the single instance."""
        if cls._instance is None:
            cls._instance = super().__new__(cls)
        return cls._instance

    def __repr__(self) -> str:
        return "npu.bfloat16"

    def __str__(self) -> str:
        return "bfloat16"

    def __reduce__(self) -> str:
        return "bfloat16"


#: The bfloat16 dtype marker (``Tensor.dtype`` of bf16 tensors).
bfloat16: Final = BFloat16Type()


#: What :attr:`Tensor.dtype` returns: a numpy dtype or :data:`bfloat16`.
TensorDType: TypeAlias = "np.dtype[Any] | BFloat16Type"
#: What the ``dtype`` arguments accept: numpy dtype-likes, ``npu.bfloat16``
#: (or the strings ``"bfloat16"``/``"bf16"``) and :class:`npu.DType`.
DTypeArg: TypeAlias = "npt.DTypeLike | BFloat16Type | _abi.DType"


NUMPY: Final[dict[DType, np.dtype[Any]]] = {
    DType.FP32: np.dtype(np.float32),
    DType.FP16: np.dtype(np.float16),
    DType.INT8: np.dtype(np.int8),
    DType.INT32: np.dtype(np.int32),
    DType.BOOL: np.dtype(np.bool_),
}
FROM_NUMPY: Final[dict[np.dtype[Any], DType]] = {v: k for k, v in NUMPY.items()}
INT_RANGE: Final = {
    DType.INT8: (-(2**7), 2**7 - 1),
    DType.INT32: (-(2**31), 2**31 - 1),
}


def dtype_of(arg: DTypeArg) -> DType:
    """The :class:`npu.DType` of a dtype argument (TypeError if unsupported)."""
    if isinstance(arg, DType):
        return arg
    if arg is bfloat16 or (isinstance(arg, str) and arg.lower() in ("bfloat16", "bf16")):
        return DType.BF16
    if arg is None:
        raise TypeError("dtype must not be None here")
    try:
        dt = np.dtype(arg)  # type: ignore[arg-type]
    except TypeError as exc:
        raise TypeError(f"unsupported dtype {arg!r}") from exc
    try:
        return FROM_NUMPY[dt]
    except KeyError:
        raise TypeError(
            f"unsupported tensor dtype {dt}: use float32, float16, npu.bfloat16, int8, int32 "
            "or bool"
        ) from None


def public_dtype(dtype: DType) -> TensorDType:
    return bfloat16 if dtype is DType.BF16 else NUMPY[dtype]


def storage_dtype(dtype: DType) -> np.dtype[Any]:
    return BFloat16Type.storage if dtype is DType.BF16 else NUMPY[dtype]


def promote(a: DType, b: DType) -> DType:
    if a is b:
        return a
    if a is DType.BOOL or b is DType.BOOL:  # numpy: bool with any x -> x
        return b if a is DType.BOOL else a
    if a.is_float and b.is_float:
        return DType.FP32  # fp16/bf16 mixes and anything with fp32
    if not a.is_float and not b.is_float:
        return DType.INT32  # int8 with int32
    flt, integer = (a, b) if a.is_float else (b, a)
    # numpy: int8 fits every float; int32 needs float64 (-> float32 here).
    return flt if integer is DType.INT8 else DType.FP32


def result_type(a: DTypeArg, b: DTypeArg) -> TensorDType:
    """The dtype of a binary op on tensors of dtypes ``a`` and ``b``.

    numpy's ``np.result_type`` restricted to the supported dtypes, with
    float64 replaced by float32 and bfloat16 treated like float16:
    ``bf16 op bf16 -> bf16``, ``bf16 op int8 -> bf16``, bf16 with fp16,
    fp32 or int32 -> fp32.

    Raises:
        TypeError: a dtype is not supported.
    """
    return public_dtype(promote(dtype_of(a), dtype_of(b)))


def float_of(dtype: DType) -> DType:
    """The float dtype numpy computes float-only functions of ``dtype`` in."""
    if dtype.is_float:
        return dtype
    return DType.FP16 if dtype in (DType.INT8, DType.BOOL) else DType.FP32


def float32_to_bf16(x: npt.ArrayLike) -> npt.NDArray[np.uint16]:
    """Convert to bfloat16 words, rounding to nearest even (NaN stays a quiet NaN).

    The input is first converted to float32.
    """
    f = np.asarray(x, dtype=np.float32)
    u = f.view(np.uint32).astype(np.uint64)
    rounded = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)
    nan_bits = ((u >> 16) | 0x0040).astype(np.uint16)
    out: npt.NDArray[np.uint16] = np.where(np.isnan(f), nan_bits, rounded).astype(np.uint16)
    return out


def bf16_to_float32(bits: npt.ArrayLike) -> npt.NDArray[np.float32]:
    """Convert bfloat16 words to float32 (exact)."""
    # dtype= keeps uint32 for 0-d input under numpy < 2's value-based casting.
    u = np.asarray(np.left_shift(np.asarray(bits, dtype=np.uint16), 16, dtype=np.uint32))
    out: npt.NDArray[np.float32] = u.view(np.float32)
    return out


def to_storage(array: npt.NDArray[Any], dtype: DType) -> npt.NDArray[Any]:
    """``array`` converted on the host to the storage representation of ``dtype``."""
    if dtype is DType.BF16:
        return float32_to_bf16(array)
    return np.ascontiguousarray(array, dtype=NUMPY[dtype])


def infer_dtype(array: npt.NDArray[Any]) -> DType:
    """The tensor dtype of a numpy array (narrowing float64 and other ints)."""
    dt = array.dtype
    if dt in FROM_NUMPY:
        return FROM_NUMPY[dt]
    if dt == np.float64:
        _logger.debug("float64 data is stored as float32")
        return DType.FP32
    if dt.kind in "iu":
        if array.size and (array.min() < INT_RANGE[DType.INT32][0] or array.max() > 2**31 - 1):
            raise ValueError(f"{dt} values do not fit int32, the widest tensor integer dtype")
        _logger.debug("%s data is stored as int32", dt)
        return DType.INT32
    raise TypeError(
        f"unsupported dtype {dt}: tensors hold float32, float16, bfloat16, int8, int32 or bool"
    )
