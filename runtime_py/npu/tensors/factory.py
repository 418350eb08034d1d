"""Tensor factories, as PyTorch's: ``empty``, ``zeros``, ``ones``, ``full``, the
``*_like`` forms and ``arange``.

``zeros``, ``ones`` and ``full`` write their value on the device with one
FILL on the current stream (no upload); ``empty`` leaves the memory as the
allocator gives it; ``arange`` computes its values on the host (numpy's
rules for the count) and uploads them. The default dtype is float32
(PyTorch's default); ``full`` takes the dtype of its value when none is
given (a bool -> ``npu.bool``, an int -> int32, a float -> float32).
"""

from __future__ import annotations

import math
import operator
from collections.abc import Sequence
from typing import Any, SupportsIndex

import numpy as np

from ..core.device import DeviceArg, resolve_device
from ..dtypes import INT_RANGE, DType, DTypeArg, dtype_of, to_storage
from ..kernels import ops
from .tensor import Tensor, alloc, check_shape, launch, upload

__all__ = [
    "arange",
    "empty",
    "empty_like",
    "full",
    "full_like",
    "ones",
    "ones_like",
    "zeros",
    "zeros_like",
]

SizeArg = SupportsIndex | Sequence[SupportsIndex]


def _shape(size: tuple[SizeArg, ...], what: str) -> tuple[int, ...]:
    """``size`` as PyTorch takes it: ints, or one sequence of ints."""
    if len(size) == 1 and isinstance(size[0], Sequence):
        size = tuple(size[0])
    try:
        shape = tuple(operator.index(d) for d in size)  # type: ignore[arg-type]
    except TypeError as exc:
        raise TypeError(f"{what}(): size must be ints or one sequence of ints: {size!r}") from exc
    if any(d < 0 for d in shape):
        raise ValueError(f"{what}(): negative dimension in size {shape}")
    check_shape(shape, what)
    return shape


def _dtype(dtype: DTypeArg | None) -> DType:
    return DType.FP32 if dtype is None else dtype_of(dtype)


def _filled(shape: tuple[int, ...], value: Any, dtype: DType, device: DeviceArg) -> Tensor:
    """A new tensor of ``shape`` with every element ``value``, written by one FILL."""
    dev = resolve_device(device)
    out = alloc(dev, dtype, shape)
    buf = out.buffer
    if buf is None:  # empty: nothing to write
        return out
    word = to_storage(np.asarray(value).reshape(1), dtype).tobytes() * (4 // dtype.itemsize)
    nbytes = math.prod(shape) * dtype.itemsize
    # The allocator's blocks are 512-byte aligned: rounding up to a whole
    # word stays inside this tensor's block.
    fill = ops.fill(buf, int.from_bytes(word, "little"), -(-nbytes // 4) * 4,
                    offset=out.offset * dtype.itemsize)  # fmt: skip
    return launch([fill], out)


def empty(*size: SizeArg, dtype: DTypeArg | None = None, device: DeviceArg = None) -> Tensor:
    """A new tensor whose values are whatever its memory holds (``torch.empty``)."""
    return alloc(resolve_device(device), _dtype(dtype), _shape(size, "empty"))


def zeros(*size: SizeArg, dtype: DTypeArg | None = None, device: DeviceArg = None) -> Tensor:
    """A new tensor of zeros (``torch.zeros``), written on the device."""
    return _filled(_shape(size, "zeros"), 0, _dtype(dtype), device)


def ones(*size: SizeArg, dtype: DTypeArg | None = None, device: DeviceArg = None) -> Tensor:
    """A new tensor of ones (``torch.ones``), written on the device."""
    return _filled(_shape(size, "ones"), 1, _dtype(dtype), device)


def _value_dtype(value: Any) -> DType:
    if isinstance(value, bool | np.bool_):
        return DType.BOOL
    if isinstance(value, int | np.integer):
        return DType.INT32
    return DType.FP32


def full(
    size: SizeArg, fill_value: Any, *, dtype: DTypeArg | None = None, device: DeviceArg = None
) -> Tensor:
    """A new tensor with every element ``fill_value`` (``torch.full``), written on the device.

    Raises:
        OverflowError: ``fill_value`` does not fit an integer ``dtype``.
    """
    target = _value_dtype(fill_value) if dtype is None else dtype_of(dtype)
    if target in INT_RANGE:
        lo, hi = INT_RANGE[target]
        if not lo <= int(fill_value) <= hi:
            raise OverflowError(f"full(): {fill_value} does not fit {target.name.lower()}")
    return _filled(_shape((size,), "full"), fill_value, target, device)


def _like(t: Tensor, dtype: DTypeArg | None, device: DeviceArg) -> tuple[DType, DeviceArg]:
    if not isinstance(t, Tensor):
        raise TypeError(f"expected an npu.Tensor, not {type(t).__name__}")
    return (t.npu_dtype if dtype is None else dtype_of(dtype)), (
        t.device if device is None else device
    )


def empty_like(t: Tensor, *, dtype: DTypeArg | None = None, device: DeviceArg = None) -> Tensor:
    """:func:`empty` of ``t``'s shape (and dtype and device unless given)."""
    d, dev = _like(t, dtype, device)
    return empty(t.shape, dtype=d, device=dev)


def zeros_like(t: Tensor, *, dtype: DTypeArg | None = None, device: DeviceArg = None) -> Tensor:
    """:func:`zeros` of ``t``'s shape (and dtype and device unless given)."""
    d, dev = _like(t, dtype, device)
    return zeros(t.shape, dtype=d, device=dev)


def ones_like(t: Tensor, *, dtype: DTypeArg | None = None, device: DeviceArg = None) -> Tensor:
    """:func:`ones` of ``t``'s shape (and dtype and device unless given)."""
    d, dev = _like(t, dtype, device)
    return ones(t.shape, dtype=d, device=dev)


def full_like(
    t: Tensor, fill_value: Any, *, dtype: DTypeArg | None = None, device: DeviceArg = None
) -> Tensor:
    """:func:`full` of ``t``'s shape (and dtype and device unless given)."""
    d, dev = _like(t, dtype, device)
    return full(t.shape, fill_value, dtype=d, device=dev)


def arange(
    start: float,
    end: float | None = None,
    step: float = 1,
    *,
    dtype: DTypeArg | None = None,
    device: DeviceArg = None,
) -> Tensor:
    """``[start, end)`` in steps of ``step`` (``torch.arange``; ``arange(n)`` is ``0..n-1``).

    Without ``dtype``: int32 if every argument is an int, else float32.
    Computed on the host (numpy) and uploaded.

    Raises:
        ValueError: ``step`` is 0.
    """
    if end is None:
        start, end = 0, start
    if step == 0:
        raise ValueError("arange(): step must be nonzero")
    ints = all(isinstance(v, int | np.integer) for v in (start, end, step))
    target = (DType.INT32 if ints else DType.FP32) if dtype is None else dtype_of(dtype)
    values = np.arange(start, end, step, dtype=np.int64 if ints else np.float64)
    return upload(values, target, resolve_device(device))
