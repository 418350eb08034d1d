"""Quantised int8 matmul, linear and conv2d (integer MATMUL/LINEAR/CONV2D + REQUANT).

The scheme is the common TFLite / ONNX ``QLinearMatMul``/``QLinearConv`` one:
int8 activations with a per-tensor zero point, symmetric int8 weights, an
optional int32 bias, and products summed exactly in int32 on the device.
The int32 accumulators are either the result (``scale=None``) or are
requantised to int8 by a second device op in the same submit::

    acc = sum((x - input_zero_point) * w) + bias          (exact, int32)
    out = clamp(round(acc * scale[c]) + output_zero_point, lo, 127)

``round`` is the exact product rounded to the nearest integer, ties to even;
``scale`` is one value (per tensor) or one per output channel; ``lo`` is
-128, or ``output_zero_point`` with ``activation="relu"`` (a fused ReLU is
the clamp at the zero point). With ``scale=None`` a ReLU clamps the int32
accumulators at 0.

All three functions need a device with ``Cap.QUANT`` and submit without
waiting, like the other tensor ops.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any, SupportsIndex

import numpy as np

from .. import _abi
from ..core.device import Device, default_device
from ..dtypes import DType, DTypeArg, dtype_of
from ..kernels import ops
from .nn import PairArg, pair
from .tensor import Tensor, alloc, broadcast_shapes, buffers_of, check_shape, launch, upload

__all__ = ["quantized_conv2d", "quantized_linear", "quantized_matmul"]


def _device_of(values: Sequence[Any], what: str) -> Device:
    dev = next((v.device for v in values if isinstance(v, Tensor)), None)
    dev = dev if dev is not None else default_device()
    if not dev.info.has(_abi.Cap.QUANT):
        raise ValueError(f"{what}: the device has no int8 MATMUL/CONV2D and REQUANT (Cap.QUANT)")
    return dev


def _int_operand(value: Any, dev: Device, dtype: DType, what: str, name: str) -> Tensor:
    """``value`` as a ``dtype`` (INT8 or INT32) tensor on ``dev``; no silent wrap-around."""
    if isinstance(value, Tensor):
        if value.device is not dev:
            raise ValueError(f"{what}: operands live on different devices")
        if value.npu_dtype is not dtype:
            raise ValueError(f"{what}: {name} must be {dtype.name.lower()}, not {value.dtype}")
        return value
    arr = np.asarray(value)
    if arr.dtype.kind not in "iub":
        raise TypeError(f"{what}: {name} must hold integers, not {arr.dtype}")
    info = np.iinfo(np.int8 if dtype is DType.INT8 else np.int32)
    if arr.size and (int(arr.min()) < info.min or int(arr.max()) > info.max):
        raise ValueError(f"{what}: {name} values do not fit {dtype.name.lower()}")
    return upload(arr.astype(info.dtype), dtype, dev)


def _zero_point(value: SupportsIndex, what: str, name: str) -> int:
    if isinstance(value, bool):
        raise TypeError(f"{what}: {name} must be an int, not bool")
    zp = int(value.__index__())
    if not _abi.NPU_ZP_MIN <= zp <= _abi.NPU_ZP_MAX:
        raise ValueError(f"{what}: {name}={zp} is outside [-128, 127]")
    return zp


def _act(activation: str | _abi.ActKind | None, what: str) -> _abi.ActKind:
    if activation is None:
        return _abi.ActKind.NONE
    if activation in (_abi.ActKind.NONE, _abi.ActKind.RELU):
        return _abi.ActKind(activation)
    if isinstance(activation, str) and activation.lower() in ("none", "relu"):
        return _abi.ActKind.RELU if activation.lower() == "relu" else _abi.ActKind.NONE
    raise ValueError(f"{what}: activation must be None or 'relu', not {activation!r}")


def _out_dtype(out_dtype: DTypeArg | None, scale: Any, what: str) -> DType:
    want = DType.INT32 if scale is None else DType.INT8
    if out_dtype is None:
        return want
    dt = dtype_of(out_dtype)
    if dt is not want:
        raise ValueError(
            f"{what}: out_dtype={dt.name.lower()} needs "
            + ("a scale (int8 results are requantised)" if scale is None else "scale=None")
        )
    return dt


def _scale_tensor(scale: Any, dev: Device, channels: int, shape: tuple[int, ...], axis: int,
                  what: str) -> Tensor:  # fmt: skip
    """The FP32 scale operand broadcasting to ``shape``: per tensor or per channel on ``axis``."""
    rank = len(shape)
    if isinstance(scale, Tensor):
        if scale.device is not dev:
            raise ValueError(f"{what}: operands live on different devices")
        if (
            scale.npu_dtype is not DType.FP32
            or scale.ndim != 1
            or scale.shape[0] not in (1, channels)
        ):
            raise ValueError(
                f"{what}: a scale tensor must be float32 of shape (1,) or ({channels},), "
                f"not {scale.dtype} {scale.shape}"
            )
        t = scale
    else:
        arr = np.asarray(scale, np.float64).reshape(-1)
        if arr.size not in (1, channels):
            raise ValueError(
                f"{what}: scale must be one value or {channels} (one per output channel), "
                f"not {arr.size}"
            )
        f32 = arr.astype(np.float32)
        if not np.all(np.isfinite(f32) & (f32 > 0)):
            raise ValueError(f"{what}: every scale must be finite and > 0 in float32")
        t = upload(f32, DType.FP32, dev)
    dims = [1] * rank
    strides = [0] * rank
    if t.shape[0] > 1:
        dims[axis] = channels
        strides[axis] = t.strides[0]
    return t.as_strided(tuple(dims), tuple(strides))


def _finish(batch: list[ops.AnyOp], acc: Tensor, scale: Any, dev: Device, channels: int,
            axis: int, zp_out: int, act: _abi.ActKind, inputs: tuple[Tensor, ...],
            what: str) -> Tensor:  # fmt: skip
    """Append the REQUANT of ``acc`` (unless ``scale`` is None) and launch the batch."""
    if scale is None:
        return launch(batch, acc, *inputs)
    s = _scale_tensor(scale, dev, channels, acc.shape, axis, what)
    out = alloc(dev, DType.INT8, acc.shape)
    batch.append(
        ops.requant_op(
            acc.tensor_ref(), s.tensor_ref(), out.tensor_ref(), zp_out, act, buffers_of(acc, s, out)
        )
    )
    return launch(batch, out, *inputs, s)


def _gemm(what: str, a: Tensor, b: Tensor, bias: Tensor | None, scale: Any, zp_in: int,
          zp_out: int, out_dtype: DTypeArg | None, act: _abi.ActKind,
          inputs: tuple[Tensor, ...]) -> Tensor:  # fmt: skip
    """a [..., M, K] @ b [..., K, N] (+ bias [N]), int32, then the requant."""
    _out_dtype(out_dtype, scale, what)
    if a.ndim < 2 or b.ndim < 2:
        raise ValueError(f"{what}: operands must have rank 2..4, not {a.shape} and {b.shape}")
    (m, k), (k2, n) = a.shape[-2:], b.shape[-2:]
    if k != k2:
        raise ValueError(f"{what}: K differs: {a.shape} @ {b.shape}")
    if bias is not None and bias.shape != (n,):
        raise ValueError(f"{what}: bias shape must be ({n},), not {bias.shape}")
    shape = (*broadcast_shapes(a.shape[:-2], b.shape[:-2], what), m, n)
    check_shape(shape, what)
    dev = a.device
    # Requantised results run REQUANT on exact int32 accumulators; without a
    # scale the int32 accumulators (after the bias and RELU) are the result.
    acc_act = act if scale is None else _abi.ActKind.NONE
    if math.prod(shape) == 0 or k == 0:
        raise ValueError(f"{what}: empty operands ({a.shape} @ {b.shape}) are not supported")
    rank = len(shape)
    acc = alloc(dev, DType.INT32, shape)
    batch: list[ops.AnyOp] = []
    if bias is None:
        op = ops.matmul_op(
            a.tensor_ref(rank),
            b.tensor_ref(rank),
            acc.tensor_ref(),
            acc_act,
            buffers_of(a, b, acc),
            input_zero_point=zp_in,
        )
    else:
        op = ops.linear_op(
            a.tensor_ref(rank),
            b.tensor_ref(rank),
            bias.tensor_ref(rank),
            acc.tensor_ref(),
            acc_act,
            buffers_of(a, b, bias, acc),
            input_zero_point=zp_in,
        )
    batch.append(op)
    return _finish(batch, acc, scale, dev, n, rank - 1, zp_out, act, inputs, what)


def quantized_matmul(
    a: Any,
    b: Any,
    scale: float | Sequence[float] | np.ndarray[Any, Any] | Tensor | None = None,
    *,
    bias: Any = None,
    input_zero_point: SupportsIndex = 0,
    output_zero_point: SupportsIndex = 0,
    out_dtype: DTypeArg | None = None,
    activation: str | _abi.ActKind | None = None,
) -> Tensor:
    """Quantised ``a @ b``: int8 operands, exact int32 accumulation, optional int8 requant.

    ``a`` is int8 ``[..., M, K]`` with zero point ``input_zero_point``
    (-128..127, subtracted exactly), ``b`` symmetric int8 ``[..., K, N]``
    (ranks 2..4, batch dims broadcast like numpy's), ``bias`` int32 ``[N]``.
    With ``scale=None`` the result is the int32 accumulators ``(a -
    input_zero_point) @ b + bias`` (wrapping at 32 bits; ReLU clamps at 0).
    With a ``scale`` (one float, or ``N`` floats / a float32 tensor of shape
    ``(N,)`` for per-output-channel scales) the result is int8:
    ``clamp(round_half_even(acc * scale) + output_zero_point, lo, 127)``,
    ``lo`` = -128 or, with ``activation="relu"``, ``output_zero_point``.
    ``out_dtype`` may restate the result dtype (int32 without, int8 with a
    scale). Non-tensor operands are uploaded (integers must fit the dtype).
    One submit of one or two device ops, without waiting.

    Raises:
        ValueError: a device without ``Cap.QUANT``, non-int8 operands, a
            non-int32 bias, bad shapes, a zero point outside -128..127, a
            scale that is not finite and > 0 or has the wrong length, an
            ``out_dtype`` that does not match ``scale``, or an activation
            other than None / ``"relu"``.
    """
    what = "quantized_matmul"
    dev = _device_of((a, b, bias, scale), what)
    act = _act(activation, what)
    zp_in = _zero_point(input_zero_point, what, "input_zero_point")
    zp_out = _zero_point(output_zero_point, what, "output_zero_point")
    ta = _int_operand(a, dev, DType.INT8, what, "a")
    tb = _int_operand(b, dev, DType.INT8, what, "b")
    tbias = None if bias is None else _int_operand(bias, dev, DType.INT32, what, "bias")
    inputs = tuple(t for t in (ta, tb, tbias) if t is not None)
    return _gemm(what, ta, tb, tbias, scale, zp_in, zp_out, out_dtype, act, inputs)


def quantized_linear(
    x: Any,
    weight: Any,
    bias: Any = None,
    scale: float | Sequence[float] | np.ndarray[Any, Any] | Tensor | None = None,
    *,
    input_zero_point: SupportsIndex = 0,
    output_zero_point: SupportsIndex = 0,
    out_dtype: DTypeArg | None = None,
    activation: str | _abi.ActKind | None = None,
) -> Tensor:
    """Quantised ``x @ weight.T + bias`` (``torch.nn.functional.linear`` layout).

    ``x`` is int8 ``[..., in_features]`` (rank 1..4), ``weight`` int8
    ``[out_features, in_features]`` (passed to the device as a transposed
    view, not copied), ``bias`` int32 ``[out_features]``; ``scale`` is one
    float or ``out_features`` of them. Otherwise as :func:`quantized_matmul`.

    Raises:
        ValueError: as :func:`quantized_matmul`, or ``weight`` not 2-D.
    """
    what = "quantized_linear"
    dev = _device_of((x, weight, bias, scale), what)
    act = _act(activation, what)
    zp_in = _zero_point(input_zero_point, what, "input_zero_point")
    zp_out = _zero_point(output_zero_point, what, "output_zero_point")
    tx = _int_operand(x, dev, DType.INT8, what, "x")
    tw = _int_operand(weight, dev, DType.INT8, what, "weight")
    if tw.ndim != 2:
        raise ValueError(f"{what}: weight must be 2-D [out_features, in_features], not {tw.shape}")
    if tx.ndim == 0:
        raise ValueError(f"{what}: x must not be a scalar")
    tbias = None if bias is None else _int_operand(bias, dev, DType.INT32, what, "bias")
    inputs = tuple(t for t in (tx, tw, tbias) if t is not None)
    squeeze = tx.ndim == 1
    a = tx.as_strided((1, *tx.shape), (0, *tx.strides)) if squeeze else tx
    out = _gemm(what, a, tw.T, tbias, scale, zp_in, zp_out, out_dtype, act, inputs)
    return out.view(out.shape[1:]) if squeeze else out


def quantized_conv2d(
    x: Any,
    weight: Any,
    bias: Any = None,
    scale: float | Sequence[float] | np.ndarray[Any, Any] | Tensor | None = None,
    stride: PairArg = 1,
    padding: PairArg = 0,
    dilation: PairArg = 1,
    groups: SupportsIndex = 1,
    *,
    input_zero_point: SupportsIndex = 0,
    output_zero_point: SupportsIndex = 0,
    out_dtype: DTypeArg | None = None,
    activation: str | _abi.ActKind | None = None,
) -> Tensor:
    """Quantised 2-D convolution (``QLinearConv`` / ``ConvInteger`` + requant), NCHW.

    ``x`` is int8 ``[N, C, H, W]`` (or ``[C, H, W]``) with zero point
    ``input_zero_point``; padding reads the zero point (a real 0). ``weight``
    is symmetric int8 ``[O, C / groups, KH, KW]``, ``bias`` int32 ``[O]``,
    ``scale`` one float or ``O`` of them (per output channel). ``stride``,
    ``padding`` and ``dilation`` are ints or ``(h, w)`` pairs, as in
    :func:`npu.conv2d`. The result is ``[N, O, OH, OW]``: int32 accumulators
    without ``scale``, else int8 requantised as in :func:`quantized_matmul`.

    Raises:
        ValueError: as :func:`quantized_matmul`, plus bad ranks, ``groups``
            not dividing ``C`` and ``O``, or no window fitting.
    """
    what = "quantized_conv2d"
    dev = _device_of((x, weight, bias, scale), what)
    act = _act(activation, what)
    zp_in = _zero_point(input_zero_point, what, "input_zero_point")
    zp_out = _zero_point(output_zero_point, what, "output_zero_point")
    _out_dtype(out_dtype, scale, what)
    t = _int_operand(x, dev, DType.INT8, what, "x")
    w = _int_operand(weight, dev, DType.INT8, what, "weight")
    unbatched = t.ndim == 3
    if unbatched:
        t = t.as_strided((1, *t.shape), (0, *t.strides))
    if t.ndim != 4 or w.ndim != 4:
        raise ValueError(f"{what}: x must be [N, C, H, W] and weight [O, C / groups, KH, KW]")
    sh, sw = pair(stride, f"{what}: stride", 1)
    ph, pw = pair(padding, f"{what}: padding", 0)
    dh, dw = pair(dilation, f"{what}: dilation", 1)
    g = pair(groups, f"{what}: groups", 1)[0]
    n, c, h, wd = t.shape
    o, cg, kh, kw = w.shape
    if c % g or o % g or cg != c // g:
        raise ValueError(f"{what}: x {t.shape} and weight {w.shape} do not match with groups={g}")
    oh, ow = ops.window_out(h, kh, sh, ph, dh), ops.window_out(wd, kw, sw, pw, dw)
    if not oh or not ow or not n or not o or not c:
        raise ValueError(f"{what}: no window fits, or an empty dimension: {t.shape}, {w.shape}")
    if bias is None:
        tbias = upload(np.zeros(o, np.int32), DType.INT32, dev)
    else:
        tbias = _int_operand(bias, dev, DType.INT32, what, "bias")
        if tbias.shape != (o,):
            raise ValueError(f"{what}: bias shape must be ({o},), not {tbias.shape}")
    bias4 = tbias.as_strided((1, o, 1, 1), (0, tbias.strides[0], 0, 0))
    shape = (n, o, oh, ow)
    acc = alloc(dev, DType.INT32, shape)
    acc_act = act if scale is None else _abi.ActKind.NONE
    batch: list[ops.AnyOp] = [
        ops.conv2d_op(
            t.tensor_ref(),
            w.tensor_ref(),
            bias4.tensor_ref(),
            acc.tensor_ref(),
            (sh, sw),
            (ph, pw),
            (dh, dw),
            g,
            acc_act,
            buffers_of(t, w, tbias, acc),
            input_zero_point=zp_in,
        )
    ]
    out = _finish(batch, acc, scale, dev, o, 1, zp_out, act, (t, w, tbias), what)
    return out.view(shape[1:]) if unbatched else out
