"""matmul, linear, conv2d and pooling on tensors (MATMUL, LINEAR, CONV2D, POOL2D).

:func:`matmul` falls back to the v1 GEMM on devices without ``Cap.MATMUL``.
"""

from __future__ import annotations

import logging
import math
import operator
import weakref
from collections.abc import Sequence
from typing import Any, Final, SupportsIndex, TypeAlias

import numpy as np

from .. import _abi
from ..core.device import Device, default_device
from ..dtypes import DType, float_of, promote
from ..kernels import ops
from .elementwise import add, gelu, relu
from .tensor import (
    Tensor,
    alloc,
    as_tensor,
    broadcast_shapes,
    buffers_of,
    cast_to,
    check_shape,
    empty_tensor,
    launch,
    register_operator,
    tensor,
    upload,
)

__all__ = [
    "PairArg",
    "avg_pool2d",
    "conv2d",
    "global_avg_pool2d",
    "linear",
    "matmul",
    "max_pool2d",
]

_logger = logging.getLogger("npu.tensor")


# ---------------------------------------------------------------------------
# matmul and linear (MATMUL, LINEAR; the v1 GEMM on older devices)
# ---------------------------------------------------------------------------


def _gemm_layout(t: Tensor) -> tuple[bool, int] | None:
    """``(transposed, ld)`` if GEMM can read the 2-D view directly, else None."""
    rows, cols = t.shape
    s0, s1 = t.strides
    if (cols == 1 or s1 == 1) and (rows == 1 or s0 >= cols):
        ld = s0 if rows > 1 else cols
        return (False, ld) if ld <= _abi.NPU_MAX_LD else None
    if (rows == 1 or s0 == 1) and (cols == 1 or s1 >= rows):
        ld = s1 if cols > 1 else rows
        return (True, ld) if ld <= _abi.NPU_MAX_LD else None
    return None


def _gemm_operand(t: Tensor, batch: list[ops.AnyOp]) -> tuple[Tensor, bool, int]:
    if t.npu_dtype is not DType.FP32:
        t = cast_to(t, DType.FP32, batch)
    layout = _gemm_layout(t)
    if layout is None:
        copy = alloc(t.device, DType.FP32, t.shape)
        batch.append(ops.convert(t.tensor_ref(), copy.tensor_ref(), buffers_of(t, copy)))
        t = copy
        layout = (False, t.shape[1])
    return t, layout[0], layout[1]


def _gemm_2d(a: Tensor, b: Tensor) -> Tensor:
    """``a @ b`` of 2-D tensors as a v1 fp32 GEMM (devices without ``Cap.MATMUL``)."""
    dev = a.device
    (m, k), (_, n) = a.shape, b.shape
    for name, dim in (("m", m), ("n", n), ("k", k)):
        if dim > _abi.NPU_MAX_DIM:
            raise ValueError(f"matmul: {name}={dim} exceeds NPU_MAX_DIM={_abi.NPU_MAX_DIM}")
    batch: list[ops.AnyOp] = []
    ga, trans_a, lda = _gemm_operand(a, batch)
    gb, trans_b, ldb = _gemm_operand(b, batch)
    out = alloc(dev, DType.FP32, (m, n))
    assert ga.buffer is not None and gb.buffer is not None and out.buffer is not None
    batch.append(
        ops.gemm(
            ga.buffer,
            gb.buffer,
            out.buffer,
            m,
            n,
            k,
            lda,
            ldb,
            n,
            trans_a,
            trans_b,
            a_offset=ga.offset * 4,
            b_offset=gb.offset * 4,
            c_offset=out.offset * 4,
        )
    )
    return launch(batch, out, a, b)


_ACTIVATIONS: Final[dict[str, _abi.ActKind]] = {
    "none": _abi.ActKind.NONE,
    "relu": _abi.ActKind.RELU,
    "gelu": _abi.ActKind.GELU,
}


def _activation(activation: str | _abi.ActKind | None, what: str) -> _abi.ActKind:
    if activation is None:
        return _abi.ActKind.NONE
    if isinstance(activation, _abi.ActKind) and activation in _ACTIVATIONS.values():
        return activation
    if isinstance(activation, str) and activation.lower() in _ACTIVATIONS:
        return _ACTIVATIONS[activation.lower()]
    raise ValueError(f"{what}: activation must be None, 'relu' or 'gelu', not {activation!r}")


def _matmul_operand(value: Any, dev: Device, what: str) -> Tensor:
    """``value`` as a tensor on ``dev`` of rank >= 1 (non-tensors uploaded)."""
    if isinstance(value, Tensor):
        if value.device is not dev:
            raise ValueError(f"{what}: operands live on different devices")
        t = value
    else:
        try:
            t = tensor(value, device=dev)
        except TypeError as exc:
            raise TypeError(f"{what}: unsupported operand {value!r}: {exc}") from exc
    if t.ndim == 0:
        raise ValueError(f"{what}: operands must not be scalars (rank 0)")
    return t


def _fused(
    what: str,
    a: Tensor,
    b: Tensor,
    bias: Tensor | None,
    act: _abi.ActKind,
    dtype: DType,
    squeeze: tuple[bool, bool],
    inputs: tuple[Tensor, ...],
) -> Tensor:
    """``act(a @ b [+ bias])`` as one MATMUL or LINEAR op; a and b have rank >= 2.

    ``squeeze`` drops the M (first) and N (second) axis of the result, for
    1-D operands promoted the numpy way. ``bias`` has shape ``(N,)``.
    """
    (m, k), (k2, n) = a.shape[-2:], b.shape[-2:]
    if k != k2:
        raise ValueError(
            f"{what}: shapes {a.shape} and {b.shape} are not aligned: K={k} in a, {k2} in b"
        )
    batch_shape = broadcast_shapes(a.shape[:-2], b.shape[:-2], what)
    shape = (*batch_shape, m, n)
    check_shape(shape, what)
    final = tuple(
        d
        for i, d in enumerate(shape)
        if not (squeeze[0] and i == len(shape) - 2) and not (squeeze[1] and i == len(shape) - 1)
    )
    dev = a.device
    if math.prod(shape) == 0:
        return empty_tensor(dev, dtype, final)
    batch: list[ops.AnyOp] = []
    if k == 0:  # no products: act(0 + bias), without the device op
        out = upload(np.zeros(shape, np.float32), dtype, dev)
        if bias is not None:
            out = add(out, bias.astype(dtype, copy=False))
        if act is _abi.ActKind.RELU:
            out = relu(out)
        elif act is _abi.ActKind.GELU:
            out = gelu(out)
        return out if final == shape else out.view(final)
    ca, cb = cast_to(a, dtype, batch), cast_to(b, dtype, batch)
    out = alloc(dev, dtype, shape)
    rank = len(shape)
    if bias is None:
        op = ops.matmul_op(
            ca.tensor_ref(rank), cb.tensor_ref(rank), out.tensor_ref(), act, buffers_of(ca, cb, out)
        )
    else:
        cbias = cast_to(bias, dtype, batch)
        op = ops.linear_op(
            ca.tensor_ref(rank),
            cb.tensor_ref(rank),
            cbias.tensor_ref(rank),
            out.tensor_ref(),
            act,
            buffers_of(ca, cb, cbias, out),
        )
    batch.append(op)
    launch(batch, out, *inputs)
    return out if final == shape else out.view(final)


@register_operator("matmul")
def matmul(x: Any, y: Any) -> Tensor:
    """``x @ y`` with numpy ``matmul`` semantics, as one device MATMUL op (no wait).

    Operands of rank 1..4 (non-tensors are uploaded with :func:`tensor`): a
    1-D ``x`` is treated as ``(1, K)`` and a 1-D ``y`` as ``(K, 1)``, the
    added axis being dropped from the result; the batch dims (all but the
    last two) broadcast like numpy's. The result dtype is the operands'
    common float dtype (:func:`result_type`); two int8 operands give int8
    like numpy (products summed exactly in int32 on a ``Cap.QUANT`` device,
    the result wrapping), other integer results become float32. Transposed
    and other strided views are read in place.

    On a device without ``Cap.MATMUL``, 2-D operands fall back to the v1
    fp32 GEMM (the result is then float32).

    Raises:
        ValueError: a scalar operand, K differs, batch dims do not
            broadcast, or the result has rank > 4.
    """
    what = "matmul"
    tx = x if isinstance(x, Tensor) else None
    ty = y if isinstance(y, Tensor) else None
    anchor = tx if tx is not None else ty
    dev = anchor.device if anchor is not None else default_device()
    a = _matmul_operand(x, dev, what)
    b = _matmul_operand(y, dev, what)
    dtype = promote(a.npu_dtype, b.npu_dtype)
    # int8 @ int8: the integer MATMUL (exact int32 sums, int8 wrap-around).
    if not dtype.is_float and not (dtype is DType.INT8 and dev.info.has(_abi.Cap.QUANT)):
        dtype = DType.FP32
    if not dev.info.has(_abi.Cap.MATMUL):
        if a.ndim != 2 or b.ndim != 2:
            raise ValueError(
                f"{what}: the device has no MATMUL op, and the v1 GEMM takes 2-D operands only"
            )
        if a.shape[1] != b.shape[0]:
            raise ValueError(f"{what}: shapes {a.shape} and {b.shape} are not aligned")
        if 0 in a.shape or 0 in b.shape:
            return _fused(what, a, b, None, _abi.ActKind.NONE, DType.FP32, (False, False), ())
        return _gemm_2d(a, b)
    squeeze = (a.ndim == 1, b.ndim == 1)
    a2 = a.as_strided((1, *a.shape), (0, *a.strides)) if squeeze[0] else a
    b2 = b.as_strided((*b.shape, 1), (*b.strides, 0)) if squeeze[1] else b
    return _fused(what, a2, b2, None, _abi.ActKind.NONE, dtype, squeeze, (a, b))


def linear(
    x: Any,
    weight: Any,
    bias: Any = None,
    activation: str | _abi.ActKind | None = None,
) -> Tensor:
    """``activation(x @ weight.T + bias)`` like ``torch.nn.functional.linear``, fused.

    One device op (LINEAR, or MATMUL without ``bias``) with the activation
    (``None``, ``"relu"`` or exact ``"gelu"``) applied last; submitted
    without waiting. ``x`` is ``[..., in_features]`` (rank 1..4), ``weight``
    ``[out_features, in_features]`` (its transpose is passed to the device
    as a strided view, not copied) and ``bias`` ``[out_features]``. The
    result is ``[..., out_features]`` in the common float dtype of the
    operands (float32 for integers). Non-tensors are uploaded.

    Raises:
        ValueError: bad ranks or shapes, an unknown activation, or a device
            without ``Cap.MATMUL``.
    """
    what = "linear"
    act = _activation(activation, what)
    anchor = next((v for v in (x, weight, bias) if isinstance(v, Tensor)), None)
    dev = anchor.device if anchor is not None else default_device()
    if not dev.info.has(_abi.Cap.MATMUL):
        raise ValueError(f"{what}: the device has no MATMUL/LINEAR ops (Cap.MATMUL)")
    t = _matmul_operand(x, dev, what)
    w = _matmul_operand(weight, dev, what)
    if w.ndim != 2:
        raise ValueError(f"{what}: weight must be 2-D [out_features, in_features], not {w.shape}")
    n, k = w.shape
    if t.shape[-1] != k:
        raise ValueError(
            f"{what}: x {t.shape} has {t.shape[-1]} features, weight {w.shape} takes {k}"
        )
    dtype = promote(t.npu_dtype, w.npu_dtype)
    inputs = [t, w]
    b: Tensor | None = None
    if bias is not None:
        b = _matmul_operand(bias, dev, what)
        if b.shape != (n,):
            raise ValueError(f"{what}: bias shape must be ({n},), not {b.shape}")
        dtype = promote(dtype, b.npu_dtype)
        inputs.append(b)
    if not dtype.is_float:
        dtype = DType.FP32
    squeeze = t.ndim == 1
    a2 = t.as_strided((1, *t.shape), (0, *t.strides)) if squeeze else t
    return _fused(what, a2, w.T, b, act, dtype, (squeeze, False), tuple(inputs))


# ---------------------------------------------------------------------------
# conv2d and pooling (CONV2D, POOL2D)
# ---------------------------------------------------------------------------

#: What the ``stride``/``padding``/``dilation``/``kernel_size`` arguments accept.
PairArg: TypeAlias = "SupportsIndex | Sequence[SupportsIndex]"

# Zero bias tensors of conv2d(bias=None), per device and (out_channels, dtype).
_ZERO_BIAS: weakref.WeakKeyDictionary[Device, dict[tuple[int, DType], Tensor]] = (
    weakref.WeakKeyDictionary()
)


def pair(value: PairArg, what: str, lo: int) -> tuple[int, int]:
    """An int or a pair of ints as ``(h, w)``, each ``>= lo`` (ValueError/TypeError)."""
    if isinstance(value, Sequence):
        if len(value) != 2:
            raise ValueError(f"{what} must be an int or a pair of ints, not {tuple(value)}")
        h, w = value
    else:
        h = w = value
    out = []
    for v in (h, w):
        if isinstance(v, bool):
            raise TypeError(f"{what} must be an int, not bool")
        try:
            n = operator.index(v)
        except TypeError:
            raise TypeError(f"{what} must be an int or a pair of ints, not {v!r}") from None
        if not lo <= n <= _abi.U32_MAX:
            raise ValueError(f"{what}={n} must be at least {lo}")
        out.append(n)
    return out[0], out[1]


def _nchw(value: Any, dev: Device, what: str, name: str) -> Tensor:
    """``value`` as a tensor on ``dev`` (non-tensors uploaded)."""
    if isinstance(value, Tensor):
        if value.device is not dev:
            raise ValueError(f"{what}: operands live on different devices")
        return value
    try:
        return tensor(value, device=dev)
    except TypeError as exc:
        raise TypeError(f"{what}: unsupported {name} {value!r}: {exc}") from exc


def _need_conv(dev: Device, what: str) -> None:
    if not dev.info.has(_abi.Cap.CONV):
        raise ValueError(f"{what}: the device has no CONV2D/POOL2D ops (Cap.CONV)")


def _zero_bias(dev: Device, out_channels: int, dtype: DType) -> Tensor:
    """The cached ``[1, O, 1, 1]`` zero bias of :func:`conv2d` without ``bias``."""
    cache = _ZERO_BIAS.setdefault(dev, {})
    key = (out_channels, dtype)
    bias = cache.get(key)
    if bias is None:
        bias = upload(np.zeros((1, out_channels, 1, 1), np.float32), dtype, dev)
        cache[key] = bias
        _logger.debug("conv2d: cached a zero bias of %d %s channels", out_channels, dtype.name)
    return bias


def conv2d(
    x: Any,
    weight: Any,
    bias: Any = None,
    stride: PairArg = 1,
    padding: PairArg = 0,
    dilation: PairArg = 1,
    groups: SupportsIndex = 1,
    activation: str | _abi.ActKind | None = None,
) -> Tensor:
    """2-D convolution like ``torch.nn.functional.conv2d``, plus a fused activation.

    One device CONV2D op, submitted without waiting: ``activation(conv2d(x,
    weight) + bias)`` with ``activation`` ``None``, ``"relu"`` or exact
    ``"gelu"``. ``x`` is ``[N, C, H, W]`` (or ``[C, H, W]``, giving a 3-D
    result), ``weight`` ``[O, C / groups, KH, KW]`` and ``bias`` ``[O]``;
    without ``bias`` a zero bias tensor cached per device, ``O`` and dtype is
    used. ``stride``, ``padding`` (zeros) and ``dilation`` are ints or
    ``(h, w)`` pairs. The result is ``[N, O, OH, OW]`` with ``OH = (H + 2 *
    pad_h - dilation_h * (KH - 1) - 1) // stride_h + 1`` (``OW`` likewise),
    in the operands' common float dtype (float32 for integers), accumulated
    in fp32. Non-tensors are uploaded; strided inputs are read in place.

    Raises:
        ValueError: bad ranks or shapes, ``groups`` not dividing ``C`` and
            ``O``, a stride/dilation/groups below 1, a negative padding, no
            window fitting, an unknown activation, or a device without
            ``Cap.CONV``.
    """
    what = "conv2d"
    act = _activation(activation, what)
    anchor = next((v for v in (x, weight, bias) if isinstance(v, Tensor)), None)
    dev = anchor.device if anchor is not None else default_device()
    _need_conv(dev, what)
    t = _nchw(x, dev, what, "input")
    w = _nchw(weight, dev, what, "weight")
    unbatched = t.ndim == 3
    if unbatched:
        t = t.as_strided((1, *t.shape), (0, *t.strides))
    if t.ndim != 4:
        raise ValueError(f"{what}: input must be [N, C, H, W] or [C, H, W], not {t.shape}")
    if w.ndim != 4:
        raise ValueError(f"{what}: weight must be [O, C / groups, KH, KW], not {w.shape}")
    sh, sw = pair(stride, f"{what}: stride", 1)
    ph, pw = pair(padding, f"{what}: padding", 0)
    dh, dw = pair(dilation, f"{what}: dilation", 1)
    g = pair(groups, f"{what}: groups", 1)[0]
    n, c, h, wd = t.shape
    o, cg, kh, kw = w.shape
    if c % g or o % g or cg != c // g:
        raise ValueError(
            f"{what}: input {t.shape} and weight {w.shape} do not match with groups={g} "
            f"(groups must divide C and O, and weight be [O, C / groups, KH, KW])"
        )
    if ph > _abi.NPU_MAX_PAD or pw > _abi.NPU_MAX_PAD:
        raise ValueError(f"{what}: padding ({ph}, {pw}) exceeds {_abi.NPU_MAX_PAD}")
    oh, ow = ops.window_out(h, kh, sh, ph, dh), ops.window_out(wd, kw, sw, pw, dw)
    if not oh or not ow:
        raise ValueError(
            f"{what}: the {kh}x{kw} kernel (dilation ({dh}, {dw})) does not fit the "
            f"{h}x{wd} input padded by ({ph}, {pw})"
        )
    dtype = promote(t.npu_dtype, w.npu_dtype)
    inputs = [t, w]
    b: Tensor | None = None
    if bias is not None:
        b = _nchw(bias, dev, what, "bias")
        if b.shape != (o,):
            raise ValueError(f"{what}: bias shape must be ({o},), not {b.shape}")
        dtype = promote(dtype, b.npu_dtype)
        inputs.append(b)
    if not dtype.is_float:
        dtype = DType.FP32
    shape = (n, o, oh, ow)
    final = shape[1:] if unbatched else shape
    if n == 0 or o == 0:
        return empty_tensor(dev, dtype, final)
    if c == 0:  # no products: act(bias) everywhere, without the device op
        out = upload(np.zeros(shape, np.float32), dtype, dev)
        if b is not None:
            out = add(out, b.astype(dtype, copy=False).reshape(1, o, 1, 1))
        if act is not _abi.ActKind.NONE:
            out = relu(out) if act is _abi.ActKind.RELU else gelu(out)
        return out.view(final) if unbatched else out
    batch: list[ops.AnyOp] = []
    cx, cw = cast_to(t, dtype, batch), cast_to(w, dtype, batch)
    cb = _zero_bias(dev, o, dtype) if b is None else cast_to(b, dtype, batch)
    bias_ref = cb.as_strided((1, o, 1, 1), (0, cb.strides[-1], 0, 0)) if cb.ndim == 1 else cb
    out = alloc(dev, dtype, shape)
    batch.append(
        ops.conv2d_op(
            cx.tensor_ref(),
            cw.tensor_ref(),
            bias_ref.tensor_ref(),
            out.tensor_ref(),
            (sh, sw),
            (ph, pw),
            (dh, dw),
            g,
            act,
            buffers_of(cx, cw, cb, out),
        )
    )
    launch(batch, out, *inputs)
    return out.view(final) if unbatched else out


def _pool(
    kind: _abi.PoolKind,
    x: Any,
    kernel_size: PairArg,
    stride: PairArg | None,
    padding: PairArg,
    count_include_pad: bool,
    what: str,
    dilation: PairArg = 1,
    ceil_mode: bool = False,
) -> Tensor:
    t = as_tensor(x, what)
    dev = t.device
    _need_conv(dev, what)
    unbatched = t.ndim == 3
    if unbatched:
        t = t.as_strided((1, *t.shape), (0, *t.strides))
    if t.ndim != 4:
        raise ValueError(f"{what}: input must be [N, C, H, W] or [C, H, W], not {t.shape}")
    kh, kw = pair(kernel_size, f"{what}: kernel_size", 1)
    sh, sw = (kh, kw) if stride is None else pair(stride, f"{what}: stride", 1)
    ph, pw = pair(padding, f"{what}: padding", 0)
    dh, dw = pair(dilation, f"{what}: dilation", 1)
    span_h, span_w = dh * (kh - 1) + 1, dw * (kw - 1) + 1
    if ph >= span_h or pw >= span_w:
        raise ValueError(
            f"{what}: padding ({ph}, {pw}) must be smaller than the window ({span_h}, {span_w})"
        )
    n, c, h, wd = t.shape
    oh = ops.pool_out(h, kh, sh, (ph, ph), dh, ceil_mode)
    ow = ops.pool_out(wd, kw, sw, (pw, pw), dw, ceil_mode)
    if not oh or not ow:
        raise ValueError(
            f"{what}: the {span_h}x{span_w} window does not fit the {h}x{wd} input "
            f"padded by ({ph}, {pw})"
        )
    if ((dh, dw) != (1, 1) or ceil_mode) and not dev.info.has(_abi.Cap.POOL_GEOMETRY):
        raise ValueError(f"{what}: dilation or ceil_mode needs Cap.POOL_GEOMETRY")
    dtype = float_of(t.npu_dtype)
    shape = (n, c, oh, ow)
    final = shape[1:] if unbatched else shape
    if n == 0 or c == 0:
        return empty_tensor(dev, dtype, final)
    batch: list[ops.AnyOp] = []
    src = cast_to(t, dtype, batch)
    out = alloc(dev, dtype, shape)
    batch.append(
        ops.pool2d_op(
            kind,
            src.tensor_ref(),
            out.tensor_ref(),
            (kh, kw),
            (sh, sw),
            (ph, pw),
            count_include_pad,
            buffers_of(src, out),
            dilation=(dh, dw),
            ceil_mode=ceil_mode,
        )
    )
    launch(batch, out, t)
    return out.view(final) if unbatched else out


def max_pool2d(
    x: Any,
    kernel_size: PairArg,
    stride: PairArg | None = None,
    padding: PairArg = 0,
    dilation: PairArg = 1,
    ceil_mode: bool = False,
) -> Tensor:
    """Max pooling like ``torch.nn.functional.max_pool2d``.

    One POOL2D op, submitted without waiting. ``x`` is ``[N, C, H, W]`` (or
    ``[C, H, W]``); ``kernel_size``, ``stride`` (default ``kernel_size``),
    ``padding`` and ``dilation`` are ints or ``(h, w)`` pairs; padded
    positions never win. ``ceil_mode`` rounds the output size up as torch
    does (a last window starting in the end padding is dropped). The
    result has ``x``'s float dtype (float32 for integers).

    Raises:
        ValueError: bad rank, a kernel/stride/dilation below 1, ``padding``
            not below the window span (torch asks for at most half of it),
            no window fitting, a device without ``Cap.CONV``, or dilation or
            ``ceil_mode`` on one without ``Cap.POOL_GEOMETRY``.
    """
    return _pool(
        _abi.PoolKind.MAX, x, kernel_size, stride, padding, True, "max_pool2d", dilation, ceil_mode
    )


def avg_pool2d(
    x: Any,
    kernel_size: PairArg,
    stride: PairArg | None = None,
    padding: PairArg = 0,
    count_include_pad: bool = True,
    *,
    ceil_mode: bool = False,
) -> Tensor:
    """Average pooling like ``torch.nn.functional.avg_pool2d``.

    As :func:`max_pool2d` without dilation; padded positions read zero and,
    with ``count_include_pad`` (the default), count in the divisor (the
    kernel area, less the taps of a ``ceil_mode`` window past the padding,
    as torch), else the divisor is the number of in-bounds elements.
    ``ceil_mode`` is keyword-only here: ``count_include_pad`` has held the
    fifth place since before it existed.

    Raises:
        ValueError: as :func:`max_pool2d`.
    """
    return _pool(
        _abi.PoolKind.AVG,
        x,
        kernel_size,
        stride,
        padding,
        count_include_pad,
        "avg_pool2d",
        ceil_mode=ceil_mode,
    )


def global_avg_pool2d(x: Any) -> Tensor:
    """Mean over H and W of ``[N, C, H, W]`` as ``[N, C, 1, 1]`` (one POOL2D, kernel H x W).

    Like ``torch.nn.functional.adaptive_avg_pool2d(x, 1)``; a 3-D ``[C, H,
    W]`` input gives ``[C, 1, 1]``.

    Raises:
        ValueError: bad rank, an empty H or W, or a device without ``Cap.CONV``.
    """
    what = "global_avg_pool2d"
    t = as_tensor(x, what)
    if t.ndim not in (3, 4):
        raise ValueError(f"{what}: input must be [N, C, H, W] or [C, H, W], not {t.shape}")
    h, w = t.shape[-2:]
    if not h or not w:
        raise ValueError(f"{what}: H and W must not be empty, got {t.shape}")
    return _pool(_abi.PoolKind.AVG, t, (h, w), 1, 0, True, what)
