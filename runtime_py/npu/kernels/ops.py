"""Building the operations of a SUBMIT (``struct npu_op`` and ``struct npu_tensor_op``).

Each builder validates its arguments in Python (raising :class:`ValueError`)
and returns an immutable :class:`Op` (NOP, COPY, FILL, GEMM) or
:class:`TensorOp` (ELTWISE, UNARY, CONVERT, REDUCE, SOFTMAX, LAYERNORM,
MATMUL, LINEAR, CONV2D, POOL2D, REQUANT);
:meth:`npu.Device.submit` packs
a sequence of them into arrays of ``struct npu_op`` / ``struct npu_tensor_op``.

Tensor operands are :class:`TensorRef` (handle, dtype, byte offset, shape and
strides in elements), built with :func:`tensor_ref`;
:func:`check_tensor_op` applies the rules of ``include/npu_tensor.h``
(:func:`window_out` is ``npu_window_out``, :func:`tensor_op_supported` is
``npu_tensor_op_supported``); they live in :mod:`npu.kernels.validate` and are
re-exported here.

Buffers are passed as anything with integer ``handle`` and ``size``
attributes (:class:`BufferLike`), normally :class:`npu.Buffer`. Each op refers
to byte ranges of buffers (:class:`BufRef`: handle, offset, size); a range must
lie inside ``buffer.size``.
"""

from __future__ import annotations

import math
import operator
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import SupportsIndex, TypeAlias

from .. import _abi
from .descriptors import BufferLike, TensorOp, TensorRef
from .descriptors import check_range as _check_range
from .validate import (
    check_tensor_op,
    f32_bits,
    pool_out,
    tensor_op_features,
    tensor_op_supported,
    window_out,
    zero_point_word,
)

__all__ = [
    "AnyOp",
    "BufRef",
    "BufferLike",
    "Op",
    "TensorOp",
    "TensorRef",
    "check_tensor_op",
    "conv2d_op",
    "convert",
    "copy",
    "eltwise",
    "f32_bits",
    "fill",
    "gemm",
    "gemm_extent",
    "layernorm",
    "linear_op",
    "matmul_op",
    "nop",
    "pool2d_op",
    "pool_out",
    "reduce",
    "requant_op",
    "select",
    "softmax",
    "tensor_op_features",
    "tensor_op_supported",
    "tensor_ref",
    "unary",
    "window_out",
    "zero_point_word",
]

_FP32_BYTES = 4


@dataclass(frozen=True, slots=True)
class BufRef:
    """A byte range of a buffer object (``struct npu_buf_ref``)."""

    handle: int
    offset: int
    size: int

    def __post_init__(self) -> None:
        _check_range("handle", self.handle, 0, _abi.U32_MAX)
        _check_range("offset", self.offset, 0, _abi.U64_MAX)
        _check_range("size", self.size, 0, _abi.U64_MAX)

    def pack(self) -> _abi.NpuBufRef:
        """Return the ``struct npu_buf_ref`` for this range."""
        return _abi.NpuBufRef(handle=self.handle, rsvd=0, offset=self.offset, size=self.size)


@dataclass(frozen=True, slots=True)
class Op:
    """One operation of a SUBMIT: opcode, buffer ranges and 32-bit params.

    Build ops with :func:`nop`, :func:`copy`, :func:`fill` and :func:`gemm`
    rather than directly. ``buffers`` holds the buffer objects the ranges were
    taken from so that :meth:`npu.Device.submit` can check they are still
    alive and belong to the device; it is not part of equality.
    """

    opcode: _abi.Opcode
    bufs: tuple[BufRef, ...] = ()
    params: tuple[int, ...] = ()
    buffers: tuple[BufferLike, ...] = field(default=(), compare=False, repr=False)

    def __post_init__(self) -> None:
        if len(self.bufs) > _abi.NPU_OP_MAX_BUFS:
            raise ValueError(
                f"{self.opcode.name}: {len(self.bufs)} buffers, at most {_abi.NPU_OP_MAX_BUFS}"
            )
        if len(self.params) > _abi.NPU_OP_MAX_PARAMS:
            raise ValueError(
                f"{self.opcode.name}: {len(self.params)} params, at most {_abi.NPU_OP_MAX_PARAMS}"
            )
        for i, value in enumerate(self.params):
            _check_range(f"{self.opcode.name} params[{i}]", value, 0, _abi.U32_MAX)
        for ref in self.bufs:
            if not isinstance(ref, BufRef):
                raise TypeError(
                    f"{self.opcode.name}: bufs must be BufRef, not {type(ref).__name__}"
                )

    def pack(self) -> _abi.NpuOp:
        """Return the ``struct npu_op`` for this operation (unused fields zero)."""
        raw = _abi.NpuOp()
        raw.opcode = int(self.opcode)
        raw.flags = 0
        raw.num_bufs = len(self.bufs)
        for i, ref in enumerate(self.bufs):
            raw.bufs[i] = ref.pack()
        for i, value in enumerate(self.params):
            raw.params[i] = value
        raw.rsvd = 0
        return raw

    def __str__(self) -> str:
        if self.opcode is _abi.Opcode.GEMM and len(self.params) == _abi.NPU_OP_MAX_PARAMS:
            m, n, k, lda, ldb, ldc, _dtype, flags = self.params
            trans = "".join(
                name
                for bit, name in (
                    (_abi.NPU_GEMM_TRANS_A, ",trans_a"),
                    (_abi.NPU_GEMM_TRANS_B, ",trans_b"),
                )
                if flags & bit
            )
            return f"GEMM(m={m},n={n},k={k},lda={lda},ldb={ldb},ldc={ldc}{trans})"
        refs = ",".join(f"{r.handle}@{r.offset}+{r.size}" for r in self.bufs)
        params = ",".join(f"{p:#x}" for p in self.params)
        return f"{self.opcode.name}(bufs=[{refs}],params=[{params}])"


def nop() -> Op:
    """Return a NOP: no buffers, no params; completes immediately."""
    return Op(_abi.Opcode.NOP)


def copy(
    src: BufferLike,
    dst: BufferLike,
    nbytes: SupportsIndex,
    src_offset: SupportsIndex = 0,
    dst_offset: SupportsIndex = 0,
) -> Op:
    """Return a COPY of ``nbytes`` bytes from ``src[src_offset:]`` to ``dst[dst_offset:]``.

    Raises:
        ValueError: ``nbytes`` is not in ``1..NPU_MAX_XFER``, a range does not
            fit its buffer, or the two ranges overlap (same buffer).
    """
    nbytes = _check_range("COPY nbytes", nbytes, 1, _abi.NPU_MAX_XFER)
    s = _ref("COPY src", src, src_offset, nbytes)
    d = _ref("COPY dst", dst, dst_offset, nbytes)
    if s.handle == d.handle and s.offset < d.offset + nbytes and d.offset < s.offset + nbytes:
        raise ValueError(
            f"COPY: source [{s.offset}, {s.offset + nbytes}) and destination "
            f"[{d.offset}, {d.offset + nbytes}) overlap in buffer {s.handle}"
        )
    return Op(_abi.Opcode.COPY, (s, d), (), (src, dst))


def fill(
    dst: BufferLike, pattern_u32: SupportsIndex, nbytes: SupportsIndex, offset: SupportsIndex = 0
) -> Op:
    """Return a FILL of ``dst[offset:offset + nbytes]`` with a 32-bit pattern.

    The pattern is stored little endian, repeated every 4 bytes.

    Raises:
        ValueError: ``nbytes`` is not a positive multiple of 4 up to
            ``NPU_MAX_XFER``, the pattern is not a u32, or the range does not
            fit ``dst``.
    """
    nbytes = _check_range("FILL nbytes", nbytes, 4, _abi.NPU_MAX_XFER)
    if nbytes % 4:
        raise ValueError(f"FILL nbytes={nbytes} is not a multiple of 4")
    pattern_u32 = _check_range("FILL pattern_u32", pattern_u32, 0, _abi.U32_MAX)
    ref = _ref("FILL dst", dst, offset, nbytes)
    return Op(_abi.Opcode.FILL, (ref,), (pattern_u32,), (dst,))


def gemm_extent(rows: int, cols: int, ld: int) -> int:
    """Bytes spanned by a row-major fp32 matrix of ``rows x cols`` with row stride ``ld``.

    This is ``((rows - 1) * ld + cols) * 4``: the last row is not padded.
    """
    return ((rows - 1) * ld + cols) * _FP32_BYTES


def gemm(
    a: BufferLike,
    b: BufferLike,
    c: BufferLike,
    m: SupportsIndex,
    n: SupportsIndex,
    k: SupportsIndex,
    lda: SupportsIndex | None = None,
    ldb: SupportsIndex | None = None,
    ldc: SupportsIndex | None = None,
    trans_a: bool = False,
    trans_b: bool = False,
    *,
    a_offset: SupportsIndex = 0,
    b_offset: SupportsIndex = 0,
    c_offset: SupportsIndex = 0,
) -> Op:
    """Return a GEMM computing ``C[m][n] = op(A) x op(B)`` in fp32, row major.

    ``A`` is stored as ``m x k`` (``k x m`` when ``trans_a``), ``B`` as
    ``k x n`` (``n x k`` when ``trans_b``) and ``C`` as ``m x n``. ``lda``,
    ``ldb`` and ``ldc`` are row strides in elements of the *stored* matrices
    and default to their column counts (tightly packed). Each buffer range
    starts at its ``*_offset`` and is exactly :func:`gemm_extent` bytes long.

    Raises:
        ValueError: a dimension is not in ``1..NPU_MAX_DIM``, a stride is
            smaller than the stored row length or not a u32, or a matrix does
            not fit its buffer.
    """
    m = _check_range("GEMM m", m, 1, _abi.NPU_MAX_DIM)
    n = _check_range("GEMM n", n, 1, _abi.NPU_MAX_DIM)
    k = _check_range("GEMM k", k, 1, _abi.NPU_MAX_DIM)
    a_rows, a_cols = (k, m) if trans_a else (m, k)
    b_rows, b_cols = (n, k) if trans_b else (k, n)
    lda = _stride("lda", lda, a_cols)
    ldb = _stride("ldb", ldb, b_cols)
    ldc = _stride("ldc", ldc, n)
    ra = _ref("GEMM A", a, a_offset, gemm_extent(a_rows, a_cols, lda))
    rb = _ref("GEMM B", b, b_offset, gemm_extent(b_rows, b_cols, ldb))
    rc = _ref("GEMM C", c, c_offset, gemm_extent(m, n, ldc))
    flags = (_abi.NPU_GEMM_TRANS_A if trans_a else 0) | (_abi.NPU_GEMM_TRANS_B if trans_b else 0)
    params = (m, n, k, lda, ldb, ldc, int(_abi.DType.FP32), flags)
    return Op(_abi.Opcode.GEMM, (ra, rb, rc), params, (a, b, c))


def _stride(name: str, ld: SupportsIndex | None, cols: int) -> int:
    if ld is None:
        return cols
    value = _check_range(f"GEMM {name}", ld, 1, _abi.U32_MAX)
    if value < cols:
        raise ValueError(f"GEMM {name}={value} is smaller than the stored row length {cols}")
    return value


def _ref(what: str, buf: BufferLike, offset_: SupportsIndex, nbytes: int) -> BufRef:
    offset = _check_range(f"{what} offset", offset_, 0, _abi.U64_MAX)
    size = buf.size
    if offset + nbytes > size:
        raise ValueError(
            f"{what}: range [{offset}, {offset + nbytes}) does not fit the buffer "
            f"of {size} bytes (handle {buf.handle})"
        )
    return BufRef(buf.handle, offset, nbytes)


# ---------------------------------------------------------------------------
# Tensor ops (struct npu_tensor_op)
# ---------------------------------------------------------------------------


#: Either kind of op :meth:`npu.Device.submit` accepts.
AnyOp: TypeAlias = Op | TensorOp


def tensor_ref(
    buf: BufferLike,
    dtype: _abi.DType,
    shape: Sequence[SupportsIndex],
    strides: Sequence[SupportsIndex] | None = None,
    offset: SupportsIndex = 0,
) -> TensorRef:
    """Return a :class:`TensorRef` into ``buf``; ``strides`` default to row-major.

    Raises:
        ValueError: bad rank, shape or stride, or the view's extent does not
            fit ``buf.size`` (the driver's ``ERANGE``).
    """
    dims = tuple(operator.index(d) for d in shape)
    if strides is None:
        steps: list[int] = []
        acc = 1
        for dim in reversed(dims):
            steps.append(acc)
            acc *= dim
        strides_t = tuple(reversed(steps))
    else:
        strides_t = tuple(operator.index(s) for s in strides)
    ref = TensorRef(buf.handle, _abi.DType(dtype), operator.index(offset), dims, strides_t)
    if ref.offset + ref.extent > buf.size:
        raise ValueError(
            f"tensor {ref}: bytes [{ref.offset}, {ref.offset + ref.extent}) do not fit the "
            f"buffer of {buf.size} bytes"
        )
    return ref


def eltwise(
    kind: _abi.EltwiseKind,
    a: TensorRef,
    b: TensorRef,
    out: TensorRef,
    buffers: tuple[BufferLike, ...] = (),
) -> TensorOp:
    """Return an ELTWISE op ``out = a <kind> b`` (inputs broadcast to ``out``).

    Raises:
        ValueError: the op breaks a rule of :func:`check_tensor_op`.
    """
    op = TensorOp(_abi.Opcode.ELTWISE, int(kind), (a, b, out), buffers)
    check_tensor_op(op)
    return op


def unary(
    kind: _abi.UnaryKind, x: TensorRef, out: TensorRef, buffers: tuple[BufferLike, ...] = ()
) -> TensorOp:
    """Return a UNARY op ``out = kind(x)``.

    Raises:
        ValueError: the op breaks a rule of :func:`check_tensor_op`.
    """
    op = TensorOp(_abi.Opcode.UNARY, int(kind), (x, out), buffers)
    check_tensor_op(op)
    return op


def convert(x: TensorRef, out: TensorRef, buffers: tuple[BufferLike, ...] = ()) -> TensorOp:
    """Return a CONVERT op: ``out = x`` element by element, any strides and dtypes.

    Float to int truncates toward zero, saturates at the integer range and
    turns NaN into 0 (device semantics). ``out`` may be a strided view whose
    elements do not overlap (``Cap.STRIDED_OUT``): only its elements are
    written, the bytes between them keep their values.

    Raises:
        ValueError: the op breaks a rule of :func:`check_tensor_op`.
    """
    op = TensorOp(_abi.Opcode.CONVERT, 0, (x, out), buffers)
    check_tensor_op(op)
    return op


def select(
    cond: TensorRef,
    x: TensorRef,
    y: TensorRef,
    out: TensorRef,
    buffers: tuple[BufferLike, ...] = (),
) -> TensorOp:
    """Return a SELECT op: ``out = cond ? x : y`` element by element (``Cap.SELECT``).

    ``cond`` is BOOL (any nonzero byte is true); ``x``, ``y`` and ``out``
    share one dtype; the three inputs broadcast to ``out``. The chosen
    element's bits are copied unchanged (NaN payloads, signed zeros).

    Raises:
        ValueError: the op breaks a rule of :func:`check_tensor_op`.
    """
    op = TensorOp(_abi.Opcode.SELECT, 0, (cond, x, y, out), buffers)
    check_tensor_op(op)
    return op


def reduce(
    kind: _abi.ReduceKind,
    x: TensorRef,
    out: TensorRef,
    axes: Sequence[SupportsIndex],
    buffers: tuple[BufferLike, ...] = (),
) -> TensorOp:
    """Return a REDUCE op: ``out`` = ``kind`` of ``x`` over ``axes`` (keepdims form).

    ``axes`` are non-negative axis numbers of ``x`` (packed as the bit mask
    ``params[0]``); ``out`` has ``x``'s rank with 1 in the reduced dims.

    Raises:
        ValueError: an axis is out of range, ``axes`` is empty, or the op
            breaks a rule of :func:`check_tensor_op`.
    """
    mask = 0
    for a in axes:
        axis = _check_range("REDUCE axis", a, 0, x.ndim - 1)
        mask |= 1 << axis
    op = TensorOp(_abi.Opcode.REDUCE, int(kind), (x, out), buffers, (mask,))
    check_tensor_op(op)
    return op


def softmax(
    kind: _abi.SoftmaxKind,
    x: TensorRef,
    out: TensorRef,
    axis: SupportsIndex,
    buffers: tuple[BufferLike, ...] = (),
) -> TensorOp:
    """Return a SOFTMAX op: (log-)softmax of ``x`` along ``axis`` (non-negative).

    Raises:
        ValueError: the op breaks a rule of :func:`check_tensor_op`.
    """
    ax = _check_range("SOFTMAX axis", axis, 0, _abi.U32_MAX)
    op = TensorOp(_abi.Opcode.SOFTMAX, int(kind), (x, out), buffers, (ax,))
    check_tensor_op(op)
    return op


def layernorm(
    x: TensorRef,
    gamma: TensorRef,
    beta: TensorRef,
    out: TensorRef,
    naxes: SupportsIndex,
    eps: float,
    buffers: tuple[BufferLike, ...] = (),
) -> TensorOp:
    """Return a LAYERNORM op over the last ``naxes`` axes of ``x``.

    ``out = (x - mean) / sqrt(var + eps) * gamma + beta`` with the biased
    variance; ``gamma`` and ``beta`` have ``x``'s rank, ``x``'s size in the
    normalised axes and 1 elsewhere. ``eps`` is rounded to fp32.

    Raises:
        ValueError: ``eps`` is not finite and positive in fp32, or the op
            breaks a rule of :func:`check_tensor_op`.
    """
    n = _check_range("LAYERNORM naxes", naxes, 0, _abi.U32_MAX)
    if not math.isfinite(eps) or eps <= 0:
        raise ValueError(f"LAYERNORM eps={eps} must be finite and > 0")
    try:
        bits = f32_bits(eps)
    except OverflowError:
        raise ValueError(f"LAYERNORM eps={eps} overflows fp32") from None
    op = TensorOp(_abi.Opcode.LAYERNORM, 0, (x, gamma, beta, out), buffers, (n, bits))
    check_tensor_op(op)
    return op


def matmul_op(
    a: TensorRef,
    b: TensorRef,
    out: TensorRef,
    act: _abi.ActKind = _abi.ActKind.NONE,
    buffers: tuple[BufferLike, ...] = (),
    input_zero_point: int = 0,
) -> TensorOp:
    """Return a MATMUL op: ``out = act(a @ b)``, batched, fp32 accumulation.

    ``a`` is ``[..., M, K]``, ``b`` ``[..., K, N]`` and ``out`` ``[..., M, N]``,
    all of one rank ``r`` (2..4) and one float dtype; each of the ``r - 2``
    batch dims of ``a`` and ``b`` is ``out``'s or 1 (broadcast). ``a`` and
    ``b`` may have any strides (a transposed operand is a strided view);
    ``out`` must be contiguous.

    Integer form (``Cap.QUANT``): ``a`` and ``b`` INT8, ``out`` INT32 or
    INT8; ``out = act((a - input_zero_point) @ b)`` summed exactly in int32
    (wrapping), an INT8 ``out`` keeping the low 8 bits; ``act`` NONE or
    RELU. ``input_zero_point`` (-128..127) must be 0 for float operands.

    Raises:
        ValueError: the op breaks a rule of :func:`check_tensor_op`.
    """
    params = (zero_point_word(input_zero_point),)
    op = TensorOp(_abi.Opcode.MATMUL, int(act), (a, b, out), buffers, params)
    check_tensor_op(op)
    return op


def linear_op(
    a: TensorRef,
    b: TensorRef,
    bias: TensorRef,
    out: TensorRef,
    act: _abi.ActKind = _abi.ActKind.NONE,
    buffers: tuple[BufferLike, ...] = (),
    input_zero_point: int = 0,
) -> TensorOp:
    """Return a LINEAR op: ``out = act(a @ b + bias)`` (see :func:`matmul_op`).

    ``bias`` has ``out``'s rank and dtype, ``N`` in the last dim and 1
    elsewhere (``[1, ..., 1, N]``); any strides. In the integer form
    ``bias`` is INT32, added to the int32 sums before ``act``.

    Raises:
        ValueError: the op breaks a rule of :func:`check_tensor_op`.
    """
    params = (zero_point_word(input_zero_point),)
    op = TensorOp(_abi.Opcode.LINEAR, int(act), (a, b, bias, out), buffers, params)
    check_tensor_op(op)
    return op


def _pair(what: str, value: SupportsIndex | Sequence[SupportsIndex], lo: int) -> tuple[int, int]:
    """An int or a pair of ints, as ``(h, w)``, each at least ``lo`` and a u32."""
    if isinstance(value, Sequence):
        if len(value) != 2:
            raise ValueError(f"{what} must be an int or a pair, not {tuple(value)}")
        h, w = value
    else:
        h = w = value
    return (
        _check_range(f"{what}[0]", h, lo, _abi.U32_MAX),
        _check_range(f"{what}[1]", w, lo, _abi.U32_MAX),
    )


def conv2d_op(
    x: TensorRef,
    weight: TensorRef,
    bias: TensorRef,
    out: TensorRef,
    stride: SupportsIndex | Sequence[SupportsIndex] = 1,
    padding: SupportsIndex | Sequence[SupportsIndex] = 0,
    dilation: SupportsIndex | Sequence[SupportsIndex] = 1,
    groups: SupportsIndex = 1,
    act: _abi.ActKind = _abi.ActKind.NONE,
    buffers: tuple[BufferLike, ...] = (),
    input_zero_point: int = 0,
    *,
    accumulate: bool = False,
) -> TensorOp:
    """Return a CONV2D op: ``out = act(conv2d(x, weight) + bias)``, NCHW, fp32 accumulation.

    ``x`` is ``[N, C, H, W]``, ``weight`` ``[O, C / groups, KH, KW]``,
    ``bias`` ``[1, O, 1, 1]`` (always present) and ``out`` ``[N, O, OH, OW]``
    with ``OH = (H + 2 * pad_h - dilation_h * (KH - 1) - 1) // stride_h + 1``
    (:func:`window_out`), ``OW`` likewise; one float dtype. ``stride``,
    ``padding`` and ``dilation`` are ints or ``(h, w)`` pairs; padding reads
    zeros. Inputs may have any strides; ``out`` must be contiguous.

    Integer form (``Cap.QUANT``): ``x`` and ``weight`` INT8, ``bias`` INT32,
    ``out`` INT32 or INT8, ``act`` NONE or RELU; the products of ``x -
    input_zero_point`` and ``weight`` are summed exactly in int32 and the
    padding reads ``input_zero_point`` (contributes 0), as in ONNX
    ``ConvInteger``/``QLinearConv``.

    ``accumulate`` (float only, ``Cap.CONV_ACCUMULATE``) adds the values
    ``out`` holds before the op too, before the activation: ``out =
    act(conv2d(x, weight) + bias + out)``, a residual add fused into the
    convolution (``NPU_CONV_F_ACCUMULATE``).

    Raises:
        ValueError: a stride, dilation or ``groups`` below 1, or the op breaks
            a rule of :func:`check_tensor_op`.
    """
    sh, sw = _pair("CONV2D stride", stride, 1)
    ph, pw = _pair("CONV2D padding", padding, 0)
    dh, dw = _pair("CONV2D dilation", dilation, 1)
    g = _check_range("CONV2D groups", groups, 1, _abi.U32_MAX)
    flags = _abi.NPU_CONV_F_ACCUMULATE if accumulate else 0
    params = (sh, sw, ph, pw, dh, dw, g, zero_point_word(input_zero_point), flags)
    op = TensorOp(_abi.Opcode.CONV2D, int(act), (x, weight, bias, out), buffers, params)
    check_tensor_op(op)
    return op


def pool2d_op(
    kind: _abi.PoolKind,
    x: TensorRef,
    out: TensorRef,
    kernel_size: SupportsIndex | Sequence[SupportsIndex],
    stride: SupportsIndex | Sequence[SupportsIndex] | None = None,
    padding: SupportsIndex | Sequence[SupportsIndex] = 0,
    count_include_pad: bool = True,
    buffers: tuple[BufferLike, ...] = (),
    *,
    dilation: SupportsIndex | Sequence[SupportsIndex] = 1,
    ceil_mode: bool = False,
) -> TensorOp:
    """Return a POOL2D op: max or average pooling of ``x`` ``[N, C, H, W]``.

    ``padding`` is one value, ``(pad_h, pad_w)`` or, as ONNX's ``pads``,
    ``(top, left, bottom, right)``; every pad is below the window's span
    ``dilation * (kernel_size - 1) + 1``. ``stride`` defaults to
    ``kernel_size``. ``out`` is ``[N, C, OH, OW]`` with the output size of
    :func:`pool_out` (``ceil_mode`` rounds it up, as PyTorch). MAX takes
    the largest in-bounds tap; AVG divides the sum of the in-bounds taps by
    the taps inside the padded extent with ``count_include_pad``
    (``NPU_POOL_F_COUNT_PAD``), else by the in-bounds ones. Uneven pads, a
    dilation or ``ceil_mode`` set ``NPU_POOL_F_GEOMETRY`` and need
    ``Cap.POOL_GEOMETRY``. One float dtype.

    Raises:
        ValueError: a kernel size, stride or dilation below 1, a padding of
            other than 1, 2 or 4 values, or the op breaks a rule of
            :func:`check_tensor_op`.
    """
    kh, kw = _pair("POOL2D kernel_size", kernel_size, 1)
    sh, sw = (kh, kw) if stride is None else _pair("POOL2D stride", stride, 1)
    dh, dw = _pair("POOL2D dilation", dilation, 1)
    if isinstance(padding, Sequence) and len(padding) == 4:
        ph, pw, peh, pew = (
            _check_range(f"POOL2D padding[{i}]", p, 0, _abi.U32_MAX) for i, p in enumerate(padding)
        )
    else:
        ph, pw = _pair("POOL2D padding", padding, 0)
        peh, pew = ph, pw
    flags = _abi.NPU_POOL_F_COUNT_PAD if count_include_pad else 0
    params: tuple[int, ...] = (kh, kw, sh, sw, ph, pw)
    if (peh, pew, dh, dw) != (ph, pw, 1, 1) or ceil_mode:
        flags |= _abi.NPU_POOL_F_GEOMETRY | (_abi.NPU_POOL_F_CEIL if ceil_mode else 0)
        params += (flags, peh, pew, dh, dw)
    else:
        params += (flags,)
    op = TensorOp(_abi.Opcode.POOL2D, int(kind), (x, out), buffers, params)
    check_tensor_op(op)
    return op


def requant_op(
    acc: TensorRef,
    scale: TensorRef,
    out: TensorRef,
    zero_point: int = 0,
    act: _abi.ActKind = _abi.ActKind.NONE,
    buffers: tuple[BufferLike, ...] = (),
) -> TensorOp:
    """Return a REQUANT op: INT32 ``acc`` to INT8 ``out`` (``Cap.QUANT``).

    ``out = clamp(round(acc * scale) + zero_point, lo, 127)``: the exact
    product, rounded to the nearest integer with ties to even; ``lo`` is
    -128, or ``zero_point`` with ``act`` RELU. ``scale`` is FP32 and
    broadcasts to ``out`` (all dims 1: per tensor; one dim not 1: per
    channel along it); every scale element must be a finite fp32 above
    zero, else the device fails the op with ``BAD_QUANT``. ``acc`` has
    ``out``'s shape and any strides.

    Raises:
        ValueError: the op breaks a rule of :func:`check_tensor_op`.
    """
    params = (zero_point_word(zero_point),)
    op = TensorOp(_abi.Opcode.REQUANT, int(act), (acc, scale, out), buffers, params)
    check_tensor_op(op)
    return op
