"""Reductions, softmax and layer norm on tensors (REDUCE, SOFTMAX, LAYERNORM)."""

from __future__ import annotations

import builtins
import logging
import math
import operator
from collections.abc import Sequence
from typing import Any, SupportsIndex

import numpy as np

from .. import _abi
from ..kernels import ops

try:
    from numpy.exceptions import AxisError
except ImportError:  # numpy < 1.25, as in the guest's Debian 12
    from numpy import AxisError  # type: ignore[attr-defined,no-redef]

from ..dtypes import DType
from .tensor import (
    AxisArg,
    Tensor,
    alloc,
    as_tensor,
    buffers_of,
    cast_to,
    empty_tensor,
    launch,
    register_operator,
    upload,
)

__all__ = [
    "layer_norm",
    "log_softmax",
    "max",
    "mean",
    "min",
    "softmax",
    "sum",
]

_logger = logging.getLogger("npu.tensor")


def _axis(axis: SupportsIndex, ndim: int, what: str) -> int:
    """A non-negative axis number (numpy's AxisError is a ValueError too)."""
    a = operator.index(axis)
    if not -ndim <= a < ndim:
        raise AxisError(a, ndim, what)
    return a + ndim if a < 0 else a


def _axes(axis: AxisArg, ndim: int, what: str) -> tuple[int, ...]:
    """The sorted reduced axes of ``axis`` (None: all); duplicates raise ValueError."""
    if axis is None:
        return tuple(range(ndim))
    seq: Sequence[SupportsIndex] = axis if isinstance(axis, Sequence) else (axis,)
    axes = [_axis(a, ndim, what) for a in seq]
    if len(set(axes)) != len(axes):
        raise ValueError(f"{what}: duplicate value in 'axis': {tuple(seq)}")
    return tuple(sorted(axes))


def _reduce(kind: _abi.ReduceKind, x: Any, axis: AxisArg, keepdims: bool, what: str) -> Tensor:
    t = as_tensor(x, what)
    axes = _axes(axis, t.ndim, what)
    dtype = t.npu_dtype
    if dtype is DType.BOOL and kind in (_abi.ReduceKind.MAX, _abi.ReduceKind.MIN):
        # any() / all(), as numpy's max / min of bool: in int8, back to bool.
        return _reduce(kind, t.astype(DType.INT8), axis, keepdims, what).astype(DType.BOOL)
    if kind is _abi.ReduceKind.SUM and not dtype.is_float:
        dtype = DType.INT32  # numpy: int64; the device accumulates and wraps in int32
    elif kind is _abi.ReduceKind.MEAN and not dtype.is_float:
        dtype = DType.FP32  # numpy: float64
    keep = tuple(1 if d in axes else n for d, n in enumerate(t.shape))
    shape = keep if keepdims else tuple(n for d, n in enumerate(t.shape) if d not in axes)
    if not axes:  # axis=() or a rank-0 tensor: no reduction, only the dtype rule
        return t.astype(dtype)
    if t.size == 0:
        return _reduce_empty(kind, t, dtype, shape, what)
    batch: list[ops.AnyOp] = []
    src = cast_to(t, dtype, batch)
    out = alloc(t.device, dtype, keep)
    batch.append(ops.reduce(kind, src.tensor_ref(), out.tensor_ref(), axes, buffers_of(src, out)))
    launch(batch, out, t)
    return out if keepdims else out.view(shape)


def _reduce_empty(
    kind: _abi.ReduceKind, t: Tensor, dtype: DType, shape: tuple[int, ...], what: str
) -> Tensor:
    """A reduction of an empty tensor, on the host (numpy's results)."""
    if math.prod(shape) == 0:
        return empty_tensor(t.device, dtype, shape)
    if kind is _abi.ReduceKind.SUM:
        return upload(np.zeros(shape, np.float32), dtype, t.device)
    if kind is _abi.ReduceKind.MEAN:
        _logger.warning("%s: mean of an empty slice is NaN", what)
        return upload(np.full(shape, np.nan, np.float32), dtype, t.device)
    raise ValueError(f"zero-size array to reduction operation {what} which has no identity")


def _torch_names(
    axis: Any, keepdims: bool, dim: Any, keepdim: bool | None, what: str
) -> tuple[Any, bool]:
    """``axis``/``keepdims`` (numpy's names) or ``dim``/``keepdim`` (PyTorch's), not both."""
    if dim is not None:
        if axis is not None:
            raise TypeError(f"{what}() got both 'axis' and its alias 'dim'")
        axis = dim
    if keepdim is not None:
        if keepdims:
            raise TypeError(f"{what}() got both 'keepdims' and its alias 'keepdim'")
        keepdims = keepdim
    return axis, keepdims


@register_operator("sum")
def sum(
    x: Any,
    axis: AxisArg = None,
    keepdims: bool = False,
    *,
    dim: AxisArg = None,
    keepdim: bool | None = None,
) -> Tensor:
    """Sum over ``axis`` (None: all axes; an int or a tuple; negative counts from the end).

    Like ``np.sum`` but integer inputs (int8, int32) give **int32**, summed
    on the device and wrapping at int32 (numpy gives int64, or wraps the same
    way with ``dtype=np.int32``). Float inputs keep their dtype. With
    ``keepdims=False`` the result is a view of the keepdims-form output.
    PyTorch's ``dim`` and ``keepdim`` are accepted as aliases (as
    ``torch.sum`` accepts numpy's names); so for :func:`mean`, :func:`max`
    and :func:`min`.

    Raises:
        TypeError: a name and its alias both given.
        AxisError: an axis is out of range (numpy's, a ValueError).
        ValueError: duplicate axes.
    """
    axis, keepdims = _torch_names(axis, keepdims, dim, keepdim, "sum")
    return _reduce(_abi.ReduceKind.SUM, x, axis, keepdims, "sum")


@register_operator("mean")
def mean(
    x: Any,
    axis: AxisArg = None,
    keepdims: bool = False,
    *,
    dim: AxisArg = None,
    keepdim: bool | None = None,
) -> Tensor:
    """Arithmetic mean over ``axis`` (see :func:`sum`); integer inputs give float32."""
    axis, keepdims = _torch_names(axis, keepdims, dim, keepdim, "mean")
    return _reduce(_abi.ReduceKind.MEAN, x, axis, keepdims, "mean")


@register_operator("max")
def max(
    x: Any,
    axis: AxisArg = None,
    keepdims: bool = False,
    *,
    dim: AxisArg = None,
    keepdim: bool | None = None,
) -> Tensor:
    """Maximum over ``axis`` (see :func:`sum`); keeps the dtype.

    Raises:
        ValueError: a reduced axis of an empty tensor (no identity), or as :func:`sum`.
    """
    axis, keepdims = _torch_names(axis, keepdims, dim, keepdim, "max")
    return _reduce(_abi.ReduceKind.MAX, x, axis, keepdims, "maximum")


@register_operator("min")
def min(
    x: Any,
    axis: AxisArg = None,
    keepdims: bool = False,
    *,
    dim: AxisArg = None,
    keepdim: bool | None = None,
) -> Tensor:
    """Minimum over ``axis`` (see :func:`max`)."""
    axis, keepdims = _torch_names(axis, keepdims, dim, keepdim, "min")
    return _reduce(_abi.ReduceKind.MIN, x, axis, keepdims, "minimum")


def _softmax(kind: _abi.SoftmaxKind, x: Any, axis: SupportsIndex, what: str) -> Tensor:
    t = as_tensor(x, what)
    ax = _axis(axis, builtins.max(1, t.ndim), what)  # rank 0 is stored as (1,)
    dtype = t.npu_dtype if t.npu_dtype.is_float else DType.FP32
    if t.size == 0:
        return empty_tensor(t.device, dtype, t.shape)
    batch: list[ops.AnyOp] = []
    src = cast_to(t, dtype, batch)
    out = alloc(t.device, dtype, t.shape)
    batch.append(ops.softmax(kind, src.tensor_ref(), out.tensor_ref(), ax, buffers_of(src, out)))
    return launch(batch, out, t)


@register_operator("softmax")
def softmax(x: Any, axis: SupportsIndex = -1, *, dim: SupportsIndex | None = None) -> Tensor:
    """``exp(x) / sum(exp(x), axis)`` along one axis (default the last), on the device.

    Float inputs keep their dtype; integer inputs are converted to float32.
    ``dim`` is PyTorch's name for ``axis``.
    """
    if dim is not None:
        if axis != -1:
            raise TypeError("softmax() got both 'axis' and its alias 'dim'")
        axis = dim
    return _softmax(_abi.SoftmaxKind.SOFTMAX, x, axis, "softmax")


@register_operator("log_softmax")
def log_softmax(x: Any, axis: SupportsIndex = -1, *, dim: SupportsIndex | None = None) -> Tensor:
    """``log(softmax(x, axis))``, computed stably on the device (see :func:`softmax`)."""
    if dim is not None:
        if axis != -1:
            raise TypeError("log_softmax() got both 'axis' and its alias 'dim'")
        axis = dim
    return _softmax(_abi.SoftmaxKind.LOG, x, axis, "log_softmax")


def _norm_param(
    value: Any, default: float, dtype: DType, norm: tuple[int, ...], t: Tensor, what: str
) -> Tensor:
    """weight/bias as a tensor of shape ``norm`` in ``dtype`` (uploaded if not a Tensor)."""
    if value is None:
        return upload(np.full(norm, default, np.float32), dtype, t.device)
    if isinstance(value, Tensor):
        if value.device is not t.device:
            raise ValueError(f"{what}: operands live on different devices")
        p = value
    else:
        p = upload(np.asarray(value, dtype=np.float32), dtype, t.device)
    if p.shape != norm:
        raise ValueError(f"{what}: shape {p.shape} is not normalized_shape {norm}")
    return p


def layer_norm(
    x: Any,
    normalized_shape: SupportsIndex | Sequence[SupportsIndex],
    weight: Any = None,
    bias: Any = None,
    eps: float = 1e-5,
) -> Tensor:
    """Layer normalisation like ``torch.nn.functional.layer_norm``, on the device.

    Normalises over the trailing ``len(normalized_shape)`` axes, which must
    equal ``normalized_shape``: ``(x - mean) / sqrt(var + eps) * weight +
    bias`` with the biased variance. ``weight`` and ``bias`` (numpy arrays,
    lists or tensors of shape ``normalized_shape``) default to ones and
    zeros (uploaded); they are converted to the result dtype, which is
    ``x``'s float dtype (float32 for integer ``x``). ``eps`` is rounded to
    fp32 and must stay positive and finite.

    Raises:
        ValueError: ``normalized_shape`` is empty or does not match the
            trailing dims of ``x``, a weight/bias shape differs, or a bad eps.
    """
    what = "layer_norm"
    t = as_tensor(x, what)
    seq: Sequence[SupportsIndex] = (
        normalized_shape if isinstance(normalized_shape, Sequence) else (normalized_shape,)
    )
    norm = tuple(operator.index(d) for d in seq)
    if not norm or len(norm) > t.ndim or t.shape[t.ndim - len(norm) :] != norm:
        raise ValueError(
            f"{what}: normalized_shape {norm} does not match the trailing dims of {t.shape}"
        )
    if not math.isfinite(eps) or eps <= 0 or ops.f32_bits(eps) & 0x7FFFFFFF == 0:
        raise ValueError(f"{what}: eps={eps} must be positive and finite in float32")
    dtype = t.npu_dtype if t.npu_dtype.is_float else DType.FP32
    if t.size == 0:
        return empty_tensor(t.device, dtype, t.shape)
    batch: list[ops.AnyOp] = []
    gamma = cast_to(_norm_param(weight, 1.0, dtype, norm, t, what), dtype, batch)
    beta = cast_to(_norm_param(bias, 0.0, dtype, norm, t, what), dtype, batch)
    src = cast_to(t, dtype, batch)
    out = alloc(t.device, dtype, t.shape)
    rank = t.ndim
    batch.append(
        ops.layernorm(
            src.tensor_ref(),
            gamma.tensor_ref(rank),
            beta.tensor_ref(rank),
            out.tensor_ref(),
            len(norm),
            eps,
            buffers_of(src, gamma, beta, out),
        )
    )
    inputs = [t] + [p for p in (weight, bias) if isinstance(p, Tensor)]
    return launch(batch, out, *inputs)
