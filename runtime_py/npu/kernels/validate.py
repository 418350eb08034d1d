"""The Python twin of the tensor-op validator of ``include/npu_tensor.h``.

:func:`check_tensor_op` applies the rules of ``npu_tensor_op_check`` to a
:class:`npu.ops.TensorOp`; :func:`window_out` is ``npu_window_out``,
:func:`pool_out` ``npu_pool_out``, :func:`tensor_op_supported`
``npu_tensor_op_supported`` and :func:`tensor_op_features`
``npu_tensor_op_features``. The op builders
of :mod:`npu.ops` call :func:`check_tensor_op` and re-export these functions.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from typing import TYPE_CHECKING

from .. import _abi

if TYPE_CHECKING:
    from .descriptors import TensorOp, TensorRef

__all__ = [
    "check_tensor_op",
    "f32_bits",
    "pool_out",
    "tensor_op_features",
    "tensor_op_supported",
    "unary_float_only",
    "window_out",
    "zero_point_word",
]

_OPERANDS = {
    _abi.Opcode.ELTWISE: 3,
    _abi.Opcode.UNARY: 2,
    _abi.Opcode.CONVERT: 2,
    _abi.Opcode.REDUCE: 2,
    _abi.Opcode.SOFTMAX: 2,
    _abi.Opcode.LAYERNORM: 4,
    _abi.Opcode.MATMUL: 3,
    _abi.Opcode.LINEAR: 4,
    _abi.Opcode.CONV2D: 4,
    _abi.Opcode.POOL2D: 2,
    _abi.Opcode.REQUANT: 3,
    _abi.Opcode.SELECT: 4,
}
# Params each opcode uses (npu_tensor_op_params; POOL2D's 7..10 only with
# NPU_POOL_F_GEOMETRY); the others must be zero.
_PARAMS = {
    _abi.Opcode.REDUCE: 1,
    _abi.Opcode.SOFTMAX: 1,
    _abi.Opcode.LAYERNORM: 2,
    _abi.Opcode.MATMUL: 1,
    _abi.Opcode.LINEAR: 1,
    _abi.Opcode.CONV2D: 9,
    _abi.Opcode.POOL2D: 11,
    _abi.Opcode.REQUANT: 1,
}
# Capability bit each tensor opcode needs (npu_tensor_op_supported).
_CAPS = {
    _abi.Opcode.ELTWISE: _abi.Cap.TENSOR,
    _abi.Opcode.UNARY: _abi.Cap.TENSOR,
    _abi.Opcode.CONVERT: _abi.Cap.TENSOR,
    _abi.Opcode.REDUCE: _abi.Cap.REDUCE,
    _abi.Opcode.SOFTMAX: _abi.Cap.REDUCE,
    _abi.Opcode.LAYERNORM: _abi.Cap.REDUCE,
    _abi.Opcode.MATMUL: _abi.Cap.MATMUL,
    _abi.Opcode.LINEAR: _abi.Cap.MATMUL,
    _abi.Opcode.CONV2D: _abi.Cap.CONV,
    _abi.Opcode.POOL2D: _abi.Cap.CONV,
    _abi.Opcode.REQUANT: _abi.Cap.QUANT,
    _abi.Opcode.SELECT: _abi.Cap.SELECT,
}


def tensor_op_supported(opcode: int, caps: int) -> bool:
    """``npu_tensor_op_supported``: does a device with ``caps`` implement tensor op ``opcode``?

    The driver fails a SUBMIT with ``EOPNOTSUPP`` for an op the device lacks.
    """
    try:
        cap = _CAPS[_abi.Opcode(opcode)]
    except (ValueError, KeyError):
        return False
    return bool(caps & cap)


def unary_float_only(kind: int) -> bool:
    """``npu_unary_float_only``: does UNARY ``kind`` take float dtypes only?"""
    return kind not in (_abi.UnaryKind.RELU, _abi.UnaryKind.ABS, _abi.UnaryKind.NEG)


def tensor_op_features(
    opcode: int, params: Sequence[int], out_contiguous: bool = True, kind: int = 0
) -> int:
    """``npu_tensor_op_features``: capability bits an op needs beyond its opcode's.

    ``out_contiguous`` says whether the op's output is row-major and dense
    (a CONVERT into a strided view needs ``Cap.STRIDED_OUT``); ``kind`` is
    the op's kind (MATMUL, LINEAR and CONV2D with RELU6 need
    ``Cap.ACT_RELU6``).
    """
    if (
        opcode in (_abi.Opcode.MATMUL, _abi.Opcode.LINEAR, _abi.Opcode.CONV2D)
        and kind == _abi.ActKind.RELU6
    ):
        return int(_abi.Cap.ACT_RELU6)
    if opcode == _abi.Opcode.POOL2D and params[_abi.NPU_POOL_P_FLAGS] & (
        _abi.NPU_POOL_F_GEOMETRY | _abi.NPU_POOL_F_CEIL
    ):
        return int(_abi.Cap.POOL_GEOMETRY)
    if opcode == _abi.Opcode.CONVERT and not out_contiguous:
        return int(_abi.Cap.STRIDED_OUT)
    if opcode == _abi.Opcode.CONV2D and params[_abi.NPU_CONV_P_FLAGS] & _abi.NPU_CONV_F_ACCUMULATE:
        return int(_abi.Cap.CONV_ACCUMULATE)
    return 0


def pool_out(
    size: int, k: int, stride: int, pad: tuple[int, int], dilation: int = 1, ceil: bool = False
) -> int:
    """``npu_pool_out``: POOL2D output size along one axis; 0 if invalid.

    ``size`` elements padded by ``pad`` (begin, end), ``k`` taps
    ``dilation`` apart moved by ``stride``; ``ceil`` rounds up, less one if
    the last window would start past the input and the begin padding (as
    PyTorch and onnxruntime). 0 also when a pad reaches the window's span.
    """
    span = dilation * (k - 1) + 1
    pb, pe = pad
    if not k or not stride or not dilation or span > size + pb + pe or max(pb, pe) >= span:
        return 0
    q, r = divmod(size + pb + pe - span, stride)
    return q + 2 if ceil and r and (q + 1) * stride < size + pb else q + 1


def window_out(size: int, k: int, stride: int, pad: int, dilation: int = 1) -> int:
    """``npu_window_out``: positions of a ``k``-tap window (taps ``dilation`` apart).

    The window moves by ``stride`` over ``size`` elements padded by ``pad`` on
    both sides; 0 if it does not fit (or ``k``, ``stride`` or ``dilation`` is 0).
    """
    span = dilation * (k - 1) + 1
    padded = size + 2 * pad
    if not k or not stride or not dilation or span > padded:
        return 0
    return (padded - span) // stride + 1


def f32_bits(value: float) -> int:
    """The IEEE fp32 bit pattern of ``value`` (rounded to fp32), as a u32."""
    bits: int = struct.unpack("<I", struct.pack("<f", value))[0]
    return bits


def zero_point_word(value: int) -> int:
    """A zero point (-128..127) as the 32-bit two's complement params word.

    Raises:
        ValueError: ``value`` is outside ``NPU_ZP_MIN..NPU_ZP_MAX``.
    """
    if not _abi.NPU_ZP_MIN <= value <= _abi.NPU_ZP_MAX:
        raise ValueError(
            f"zero point {value} is outside the int8 range [{_abi.NPU_ZP_MIN}, {_abi.NPU_ZP_MAX}]"
        )
    return value & _abi.U32_MAX


def _zp_ok(word: int) -> bool:
    """``npu_zp_ok``: is the params word a zero point in -128..127?"""
    return word <= _abi.NPU_ZP_MAX or word >= _abi.NPU_ZP_MIN & _abi.U32_MAX


def _check_mm_dtypes(op: TensorOp, inputs: list[TensorRef], out: TensorRef, zp: int) -> None:
    """``npu_tensor_mm_dtypes``: float (one dtype, no zero point) or int8 operands."""
    name = op.opcode.name
    if inputs[0].dtype is not _abi.DType.INT8:
        if zp:
            raise ValueError(f"{op}: {name} with float operands takes no zero point")
        if any(t.dtype is not out.dtype for t in inputs):
            raise ValueError(f"{op}: {name} operands must have one dtype")
        _abi.ActKind(op.kind)  # ValueError if out of range
        if not out.dtype.is_float:
            raise ValueError(f"{op}: {name} takes float dtypes only, or int8 a and b")
        return
    if inputs[1].dtype is not _abi.DType.INT8:
        raise ValueError(f"{op}: integer {name} takes int8 a (input) and b (weight)")
    if op.opcode is not _abi.Opcode.MATMUL and inputs[2].dtype is not _abi.DType.INT32:
        raise ValueError(f"{op}: integer {name} takes an int32 bias")
    if out.dtype not in (_abi.DType.INT32, _abi.DType.INT8):
        raise ValueError(f"{op}: integer {name} writes int32 or int8, not {out.dtype.name}")
    if op.kind not in (_abi.ActKind.NONE, _abi.ActKind.RELU):
        raise ValueError(f"{op}: integer {name} takes activation NONE or RELU only")


def _check_zp(op: TensorOp, word: int) -> None:
    if not _zp_ok(word):
        raise ValueError(f"{op}: zero point word {word:#x} is not in -128..127")


def _positive_finite_f32(bits: int) -> bool:
    """``npu_f32_bits_positive_finite``: a finite fp32 above zero."""
    return not bits & 0x80000000 and bits != 0 and (bits & 0x7F800000) != 0x7F800000


# Signatures that passed check_tensor_op: what it reads of an op, without
# the buffer handles and offsets (it never looks at them). Bounded: cleared
# when full. Only successes are kept, so every bad op is refused each time
# with its own message.
_CHECKED: dict[tuple[object, ...], None] = {}
_CHECKED_MAX = 4096


def check_tensor_op(op: TensorOp) -> None:
    """Apply the checks of ``npu_tensor_op_check`` (``include/npu_tensor.h``) to ``op``.

    An op whose signature (opcode, kind, params, and each operand's dtype,
    shape and strides) passed before is not checked again.

    Raises:
        ValueError: the driver would reject the op with ``EINVAL``: wrong
            operand count, nonzero unused params, a non-contiguous output
            (other than a non-overlapping CONVERT output),
            dtype or shape mismatch, a kind out of range, a float-only kind
            on an integer dtype, bad REDUCE/SOFTMAX/LAYERNORM params,
            MATMUL/LINEAR shapes that do not chain (see :func:`matmul_op`),
            a zero point outside -128..127 (or one on float operands), or a
            REQUANT scale that does not broadcast to the output.
    """
    key = (
        op.opcode,
        op.kind,
        op.params,
        *((t.dtype, t.shape, t.strides) for t in op.operands),
    )
    if key in _CHECKED:
        return
    _check_tensor_op(op)
    if len(_CHECKED) >= _CHECKED_MAX:
        _CHECKED.clear()
    _CHECKED[key] = None


def _check_tensor_op(op: TensorOp) -> None:
    n = _OPERANDS.get(op.opcode)
    if n is None:
        raise ValueError(f"{op.opcode.name} is not a tensor op")
    if len(op.operands) != n:
        raise ValueError(f"{op.opcode.name} takes {n} operands, not {len(op.operands)}")
    params = op.params + (0,) * (_abi.TENSOR_OP_PARAMS - len(op.params))
    used = _PARAMS.get(op.opcode, 0)
    if op.opcode is _abi.Opcode.POOL2D and not params[_abi.NPU_POOL_P_FLAGS] & (
        _abi.NPU_POOL_F_GEOMETRY
    ):
        used = 7
    if any(params[used:]):
        raise ValueError(f"{op}: {op.opcode.name} uses {used} params, the others must be zero")
    *inputs, out = op.operands
    if not out.contiguous:
        if op.opcode is not _abi.Opcode.CONVERT:
            raise ValueError(f"{op}: the output must be contiguous (row-major, dense)")
        if not out.disjoint:
            raise ValueError(f"{op}: a strided CONVERT output must not overlap itself")
    compare = op.opcode is _abi.Opcode.ELTWISE and op.kind >= _abi.EltwiseKind.EQ
    bool_ok = compare or op.opcode in (_abi.Opcode.CONVERT, _abi.Opcode.SELECT)
    if not bool_ok and any(t.dtype is _abi.DType.BOOL for t in op.operands):
        raise ValueError(f"{op}: BOOL operands are for comparisons, CONVERT and SELECT only")
    if op.opcode is _abi.Opcode.ELTWISE:
        kind = _abi.EltwiseKind(op.kind)  # ValueError if out of range
        if compare and out.dtype is not _abi.DType.BOOL:
            raise ValueError(f"{op}: a comparison's output is BOOL")
        for t in inputs:
            if t.dtype is not (inputs[0].dtype if compare else out.dtype):
                raise ValueError(f"{op}: ELTWISE inputs must have the output's dtype")
            if t.ndim != out.ndim or any(
                d not in (o, 1) for d, o in zip(t.shape, out.shape, strict=True)
            ):
                raise ValueError(f"{op}: input shape {t.shape} does not broadcast to {out.shape}")
        if kind is _abi.EltwiseKind.DIV and not out.dtype.is_float:
            raise ValueError(f"{op}: DIV takes float dtypes only")
    elif op.opcode is _abi.Opcode.UNARY:
        ukind = _abi.UnaryKind(op.kind)
        (t,) = inputs
        if t.dtype is not out.dtype or t.shape != out.shape:
            raise ValueError(f"{op}: UNARY input and output must have the same dtype and shape")
        if unary_float_only(ukind) and not out.dtype.is_float:
            raise ValueError(f"{op}: {ukind.name} takes float dtypes only")
    elif op.opcode is _abi.Opcode.REDUCE:
        rkind = _abi.ReduceKind(op.kind)
        (t,) = inputs
        if t.dtype is not out.dtype:
            raise ValueError(f"{op}: REDUCE input and output must have the same dtype")
        axes = params[0]
        if not axes or axes >= 1 << t.ndim:
            raise ValueError(f"{op}: axes mask {axes:#x} is not a nonempty subset of {t.ndim} axes")
        want = tuple(1 if axes >> d & 1 else dim for d, dim in enumerate(t.shape))
        if out.shape != want:
            raise ValueError(f"{op}: the output shape must be {want} (keepdims), not {out.shape}")
        if rkind is _abi.ReduceKind.MEAN and not out.dtype.is_float:
            raise ValueError(f"{op}: MEAN takes float dtypes only")
    elif op.opcode is _abi.Opcode.SOFTMAX:
        _abi.SoftmaxKind(op.kind)
        (t,) = inputs
        if t.dtype is not out.dtype or t.shape != out.shape:
            raise ValueError(f"{op}: SOFTMAX input and output must have the same dtype and shape")
        if not out.dtype.is_float:
            raise ValueError(f"{op}: SOFTMAX takes float dtypes only")
        if params[0] >= out.ndim:
            raise ValueError(f"{op}: axis {params[0]} is not below ndim={out.ndim}")
    elif op.opcode is _abi.Opcode.LAYERNORM:
        x, gamma, beta = inputs
        if op.kind != 0:
            raise ValueError(f"{op}: LAYERNORM kind must be 0")
        if any(t.dtype is not out.dtype for t in inputs):
            raise ValueError(f"{op}: LAYERNORM operands must have one dtype")
        if not out.dtype.is_float:
            raise ValueError(f"{op}: LAYERNORM takes float dtypes only")
        if x.shape != out.shape:
            raise ValueError(f"{op}: LAYERNORM input and output must have the same shape")
        naxes = params[0]
        if not 1 <= naxes <= out.ndim:
            raise ValueError(f"{op}: {naxes} normalised axes is not in 1..{out.ndim}")
        want = tuple(dim if d + naxes >= out.ndim else 1 for d, dim in enumerate(out.shape))
        for name, p in (("gamma", gamma), ("beta", beta)):
            if p.shape != want:
                raise ValueError(f"{op}: {name} shape must be {want}, not {p.shape}")
        if not _positive_finite_f32(params[1]):
            raise ValueError(f"{op}: eps (fp32 bits {params[1]:#x}) must be finite and > 0")
    elif op.opcode in (_abi.Opcode.MATMUL, _abi.Opcode.LINEAR):
        _check_matmul(op, inputs, out, params)
    elif op.opcode is _abi.Opcode.CONV2D:
        _check_conv(op, inputs, out, params)
    elif op.opcode is _abi.Opcode.POOL2D:
        _check_pool(op, inputs[0], out, params)
    elif op.opcode is _abi.Opcode.REQUANT:
        _check_requant(op, inputs, out, params)
    elif op.opcode is _abi.Opcode.SELECT:
        _check_select(op, inputs, out)
    else:
        (t,) = inputs
        if op.kind != 0:
            raise ValueError(f"{op}: CONVERT kind must be 0")
        if t.shape != out.shape:
            raise ValueError(f"{op}: CONVERT input and output must have the same shape")


def _check_matmul(
    op: TensorOp, inputs: list[TensorRef], out: TensorRef, params: tuple[int, ...]
) -> None:
    """The MATMUL/LINEAR rules of ``npu_tensor_op_check`` (``npu_tensor_matmul_shapes``)."""
    _check_mm_dtypes(op, inputs, out, params[_abi.NPU_MM_P_IN_ZP])
    a, b = inputs[0], inputs[1]
    r = out.ndim
    if r < 2 or a.ndim != r or b.ndim != r:
        raise ValueError(f"{op}: a, b and out must have one rank >= 2")
    if a.shape[-2] != out.shape[-2] or b.shape[-1] != out.shape[-1]:
        raise ValueError(f"{op}: out {out.shape} is not [..., M, N] of a {a.shape} @ b {b.shape}")
    if a.shape[-1] != b.shape[-2]:
        raise ValueError(f"{op}: K differs: a {a.shape} and b {b.shape}")
    for d in range(r - 2):
        for t in (a, b):
            if t.shape[d] not in (out.shape[d], 1):
                raise ValueError(
                    f"{op}: batch dim {d} of {t.shape} is neither {out.shape[d]} nor 1"
                )
    if op.opcode is _abi.Opcode.LINEAR:
        want = (1,) * (r - 1) + (out.shape[-1],)
        if inputs[2].shape != want:
            raise ValueError(f"{op}: bias shape must be {want}, not {inputs[2].shape}")
    _check_zp(op, params[_abi.NPU_MM_P_IN_ZP])


def _check_conv(
    op: TensorOp, inputs: list[TensorRef], out: TensorRef, params: tuple[int, ...]
) -> None:
    """The CONV2D rules of ``npu_tensor_op_check`` (``npu_tensor_conv_ok``)."""
    x, w, bias = inputs
    _check_mm_dtypes(op, inputs, out, params[_abi.NPU_CONV_P_IN_ZP])
    if any(t.ndim != 4 for t in op.operands):
        raise ValueError(f"{op}: CONV2D operands must all be 4-D (NCHW)")
    sh, sw, ph, pw, dh, dw, g = params[:7]
    if not g or x.shape[1] % g or w.shape[0] % g or w.shape[1] != x.shape[1] // g:
        raise ValueError(
            f"{op}: groups={g} must divide C={x.shape[1]} and O={w.shape[0]}, "
            f"and weight must be [O, C / groups, KH, KW]"
        )
    if ph > _abi.NPU_MAX_PAD or pw > _abi.NPU_MAX_PAD:
        raise ValueError(f"{op}: padding ({ph}, {pw}) exceeds NPU_MAX_PAD={_abi.NPU_MAX_PAD}")
    o = w.shape[0]
    if bias.shape != (1, o, 1, 1):
        raise ValueError(f"{op}: bias shape must be (1, {o}, 1, 1), not {bias.shape}")
    want = (
        x.shape[0],
        o,
        window_out(x.shape[2], w.shape[2], sh, ph, dh),
        window_out(x.shape[3], w.shape[3], sw, pw, dw),
    )
    if out.shape != want:
        raise ValueError(
            f"{op}: the output shape must be {want} (0 = no window fits), not {out.shape}"
        )
    flags = params[_abi.NPU_CONV_P_FLAGS]
    if flags & ~_abi.NPU_CONV_F_MASK:
        raise ValueError(f"{op}: unknown CONV2D flags {flags:#x}")
    if flags & _abi.NPU_CONV_F_ACCUMULATE and not out.dtype.is_float:
        raise ValueError(f"{op}: accumulate=True needs a float output, not {out.dtype.name}")
    _check_zp(op, params[_abi.NPU_CONV_P_IN_ZP])


def _check_requant(
    op: TensorOp, inputs: list[TensorRef], out: TensorRef, params: tuple[int, ...]
) -> None:
    """The REQUANT rules of ``npu_tensor_op_check``."""
    acc, scale = inputs
    if op.kind not in (_abi.ActKind.NONE, _abi.ActKind.RELU):
        raise ValueError(f"{op}: REQUANT takes activation NONE or RELU only")
    if (acc.dtype, scale.dtype, out.dtype) != (_abi.DType.INT32, _abi.DType.FP32, _abi.DType.INT8):
        raise ValueError(f"{op}: REQUANT takes an int32 acc and an fp32 scale to int8")
    if acc.shape != out.shape:
        raise ValueError(f"{op}: REQUANT acc and out must have one shape")
    if scale.ndim != out.ndim or any(
        d not in (o, 1) for d, o in zip(scale.shape, out.shape, strict=True)
    ):
        raise ValueError(f"{op}: scale shape {scale.shape} does not broadcast to {out.shape}")
    _check_zp(op, params[_abi.NPU_REQUANT_P_OUT_ZP])


def _check_select(op: TensorOp, inputs: list[TensorRef], out: TensorRef) -> None:
    """The SELECT rules of ``npu_tensor_op_check``."""
    cond, x, y = inputs
    if op.kind != 0:
        raise ValueError(f"{op}: SELECT kind must be 0")
    if cond.dtype is not _abi.DType.BOOL:
        raise ValueError(f"{op}: the SELECT condition must be BOOL, not {cond.dtype.name}")
    if x.dtype is not out.dtype or y.dtype is not out.dtype:
        raise ValueError(f"{op}: SELECT x, y and out must have one dtype")
    for t in inputs:
        if t.ndim != out.ndim or any(
            d not in (o, 1) for d, o in zip(t.shape, out.shape, strict=True)
        ):
            raise ValueError(f"{op}: input shape {t.shape} does not broadcast to {out.shape}")


def _check_pool(op: TensorOp, x: TensorRef, out: TensorRef, params: tuple[int, ...]) -> None:
    """The POOL2D rules of ``npu_tensor_op_check`` (``npu_tensor_pool_ok``)."""
    _abi.PoolKind(op.kind)  # ValueError if out of range
    if x.dtype is not out.dtype or not out.dtype.is_float:
        raise ValueError(f"{op}: POOL2D input and output must have one float dtype")
    if x.ndim != 4 or out.ndim != 4:
        raise ValueError(f"{op}: POOL2D operands must be 4-D (NCHW)")
    kh, kw, sh, sw, ph, pw, flags, peh, pew, dh, dw = params[:11]
    if flags & ~_abi.NPU_POOL_F_MASK:
        raise ValueError(f"{op}: unknown POOL2D flags {flags:#x}")
    if not flags & _abi.NPU_POOL_F_GEOMETRY:
        if flags & _abi.NPU_POOL_F_CEIL:
            raise ValueError(f"{op}: POOL2D ceil mode needs NPU_POOL_F_GEOMETRY")
        peh, pew, dh, dw = ph, pw, 1, 1
    spans = (dh * (kh - 1) + 1, dw * (kw - 1) + 1)
    if max(ph, peh) >= spans[0] or max(pw, pew) >= spans[1]:
        raise ValueError(
            f"{op}: padding ({ph}, {pw}, {peh}, {pew}) must be below the window span {spans}"
        )
    ceil = bool(flags & _abi.NPU_POOL_F_CEIL)
    want = (
        x.shape[0],
        x.shape[1],
        pool_out(x.shape[2], kh, sh, (ph, peh), dh, ceil),
        pool_out(x.shape[3], kw, sw, (pw, pew), dw, ceil),
    )
    if out.shape != want:
        raise ValueError(
            f"{op}: the output shape must be {want} (0 = no window fits), not {out.shape}"
        )
