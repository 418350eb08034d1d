"""The descriptor types of tensor ops: :class:`TensorRef` and :class:`TensorOp`.

They mirror ``struct npu_tensor_ref`` and ``struct npu_tensor_op`` and check
their own fields' ranges; what an op means (which shapes and dtypes go
together) is checked by :mod:`npu.kernels.validate`, and the builders live in
:mod:`npu.ops`. This module imports nothing of the runtime but the ABI.
"""

from __future__ import annotations

import ctypes
import dataclasses
import enum
import operator
import struct
from dataclasses import dataclass, field
from typing import Protocol, SupportsIndex

from .. import _abi

__all__ = ["REF_SIZE", "BufferLike", "TensorOp", "TensorRef", "check_range"]

# The C layouts of struct npu_tensor_ref and struct npu_tensor_op, packed by
# the struct module (one C call per operand, no ctypes field setting).
_REF = struct.Struct(f"<IIQII{_abi.NPU_MAX_RANK}I{_abi.NPU_MAX_RANK}IQ")
_OP_HEAD = struct.Struct("<HHI")
_OP_TAIL = struct.Struct(f"<{_abi.TENSOR_OP_PARAMS}IQ")
_NO_REF = bytes(_REF.size)
#: Bytes of one ``struct npu_tensor_ref``.
REF_SIZE = _REF.size
assert _REF.size == ctypes.sizeof(_abi.NpuTensorRef)
assert _OP_HEAD.size + _abi.NPU_TENSOR_OPERANDS * _REF.size + _OP_TAIL.size == ctypes.sizeof(
    _abi.NpuTensorOp
)


class BufferLike(Protocol):
    """What the op builders need from a buffer: its BO handle and usable size."""

    @property
    def handle(self) -> int:
        """The buffer object handle (nonzero, per file descriptor)."""
        ...

    @property
    def size(self) -> int:
        """Usable size in bytes."""
        ...


def check_range(what: str, value: SupportsIndex, lo: int, hi: int) -> int:
    """Return ``value`` as an int (numpy integers accepted) if it lies in ``[lo, hi]``."""
    if isinstance(value, bool):
        raise TypeError(f"{what} must be an int, not bool")
    try:
        number = operator.index(value)
    except TypeError:
        raise TypeError(f"{what} must be an int, not {type(value).__name__}") from None
    if not lo <= number <= hi:
        raise ValueError(f"{what}={number} is out of range [{lo}, {hi}]")
    return number


@dataclass(frozen=True, slots=True)
class TensorRef:
    """A tensor operand (``struct npu_tensor_ref``): a strided view into a buffer object.

    ``offset`` is in bytes (to element ``[0, ..., 0]``), ``strides`` in
    elements; ``shape`` and ``strides`` have ``1..NPU_MAX_RANK`` entries.
    Construction checks what ``npu_tensor_check`` checks (``ValueError``).
    """

    handle: int
    dtype: _abi.DType
    offset: int
    shape: tuple[int, ...]
    strides: tuple[int, ...]

    def __post_init__(self) -> None:
        check_range("tensor handle", self.handle, 0, _abi.U32_MAX)
        check_range("tensor offset", self.offset, 0, _abi.U64_MAX)
        if not isinstance(self.dtype, _abi.DType):
            raise TypeError(f"tensor dtype must be npu.DType, not {type(self.dtype).__name__}")
        ndim = len(self.shape)
        if not 1 <= ndim <= _abi.NPU_MAX_RANK:
            raise ValueError(f"tensor rank {ndim} is not in 1..{_abi.NPU_MAX_RANK}")
        if len(self.strides) != ndim:
            raise ValueError(f"tensor shape {self.shape} and strides {self.strides} differ in rank")
        numel = 1
        for d in range(ndim):
            check_range(f"tensor shape[{d}]", self.shape[d], 1, _abi.NPU_MAX_STRIDE)
            check_range(f"tensor strides[{d}]", self.strides[d], 0, _abi.NPU_MAX_STRIDE)
            numel *= self.shape[d]
        if numel > _abi.NPU_MAX_ELEMS:
            raise ValueError(
                f"tensor of shape {self.shape} has {numel} elements, "
                f"more than NPU_MAX_ELEMS={_abi.NPU_MAX_ELEMS}"
            )

    @property
    def ndim(self) -> int:
        """Rank (1..4)."""
        return len(self.shape)

    @property
    def numel(self) -> int:
        """Number of elements."""
        n = 1
        for dim in self.shape:
            n *= dim
        return n

    @property
    def extent(self) -> int:
        """Bytes from element 0 to the end of the furthest element (``npu_tensor_extent``)."""
        last = sum((dim - 1) * stride for dim, stride in zip(self.shape, self.strides, strict=True))
        return (last + 1) * self.dtype.itemsize

    @property
    def contiguous(self) -> bool:
        """Row-major and dense, ignoring dims of size 1 (``npu_tensor_is_contiguous``)."""
        want = 1
        for dim, stride in zip(reversed(self.shape), reversed(self.strides), strict=True):
            if dim > 1 and stride != want:
                return False
            want *= dim
        return True

    @property
    def disjoint(self) -> bool:
        """No two elements share an address (``npu_tensor_is_disjoint``).

        What a strided CONVERT output must be (:func:`npu._abi.strides_disjoint`).
        """
        return _abi.strides_disjoint(self.shape, self.strides)

    def to_bytes(self) -> bytes:
        """The ``struct npu_tensor_ref`` as bytes (dims at and above ``ndim`` zero)."""
        pad = (0,) * (_abi.NPU_MAX_RANK - len(self.shape))
        return _REF.pack(
            self.handle, self.dtype, self.offset, len(self.shape), 0,
            *self.shape, *pad, *self.strides, *pad, 0,
        )  # fmt: skip

    def pack(self) -> _abi.NpuTensorRef:
        """Return the ``struct npu_tensor_ref`` (dims at and above ``ndim`` zero)."""
        return _abi.NpuTensorRef.from_buffer_copy(self.to_bytes())

    def __str__(self) -> str:
        shape = "x".join(str(d) for d in self.shape)
        strides = ",".join(str(s) for s in self.strides)
        return f"{self.dtype.name.lower()}[{shape}]@{self.handle}+{self.offset}/({strides})"


@dataclass(frozen=True, slots=True)
class TensorOp:
    """One tensor op (``struct npu_tensor_op``): ELTWISE .. POOL2D.

    ``operands`` are the inputs followed by the output, as in ``npu_hw.h``
    (ELTWISE: a, b, out; UNARY, CONVERT, REDUCE, SOFTMAX: in, out;
    LAYERNORM: in, gamma, beta, out; MATMUL: a, b, out; LINEAR: a, b, bias,
    out; CONV2D: in, weight, bias, out; POOL2D: in, out; REQUANT: acc,
    scale, out). ``kind`` is an
    :class:`npu.EltwiseKind`, :class:`npu.UnaryKind`,
    :class:`npu.ReduceKind`, :class:`npu.SoftmaxKind`, :class:`npu.ActKind`
    (MATMUL, LINEAR, CONV2D, REQUANT), :class:`npu.PoolKind` (POOL2D) or 0
    (CONVERT, LAYERNORM). ``params`` are the op's 32-bit params
    (REDUCE: axes bit mask; SOFTMAX: axis; LAYERNORM: number of normalised
    trailing axes, eps as fp32 bits; MATMUL, LINEAR: the input zero point;
    CONV2D: the seven ``NPU_CONV_P_*`` values and the input zero point;
    POOL2D: the seven ``NPU_POOL_P_*`` values; REQUANT: the output zero
    point; zero points as two's complement words); the rest of the 12 are
    packed as zero. ``concurrent`` (``Cap.CONCURRENT``) says the op does not
    depend on the ops before it in the same submission back to the last op
    without it, so the device may run them at the same time (the runtime
    sets it; see :meth:`with_concurrent`). Build with :func:`eltwise`,
    :func:`unary`, :func:`convert`, :func:`reduce`, :func:`softmax`,
    :func:`layernorm`, :func:`matmul_op`, :func:`linear_op`,
    :func:`conv2d_op`, :func:`pool2d_op` and :func:`requant_op`, which
    check the op
    with :func:`npu.ops.check_tensor_op`. ``buffers`` holds the buffer objects for
    :meth:`npu.Device.submit`'s checks; it is not part of equality.
    """

    opcode: _abi.Opcode
    kind: int
    operands: tuple[TensorRef, ...]
    buffers: tuple[BufferLike, ...] = field(default=(), compare=False, repr=False)
    params: tuple[int, ...] = ()
    concurrent: bool = False

    def __post_init__(self) -> None:
        if len(self.params) > _abi.TENSOR_OP_PARAMS:
            raise ValueError(
                f"{self.opcode.name}: {len(self.params)} params, at most {_abi.TENSOR_OP_PARAMS}"
            )
        for i, value in enumerate(self.params):
            check_range(f"{self.opcode.name} params[{i}]", value, 0, _abi.U32_MAX)

    def to_bytes(self) -> bytes:
        """The ``struct npu_tensor_op`` as bytes (unused operands, params, rsvd zero)."""
        refs = b"".join(ref.to_bytes() for ref in self.operands)
        unused = _abi.NPU_TENSOR_OPERANDS - len(self.operands)
        params = self.params + (0,) * (_abi.TENSOR_OP_PARAMS - len(self.params))
        return b"".join(
            (
                _OP_HEAD.pack(
                    self.opcode,
                    _abi.NPU_TENSOR_OP_F_CONCURRENT if self.concurrent else 0,
                    self.kind,
                ),
                refs,
                _NO_REF * unused,
                _OP_TAIL.pack(*params, 0),
            )
        )

    def with_concurrent(self, concurrent: bool = True) -> TensorOp:
        """This op with ``concurrent`` set (or cleared)."""
        return dataclasses.replace(self, concurrent=concurrent)

    def pack(self) -> _abi.NpuTensorOp:
        """Return the ``struct npu_tensor_op`` (unused operands, params, rsvd zero)."""
        return _abi.NpuTensorOp.from_buffer_copy(self.to_bytes())

    def __str__(self) -> str:
        kinds: dict[_abi.Opcode, type[enum.IntEnum]] = {
            _abi.Opcode.ELTWISE: _abi.EltwiseKind,
            _abi.Opcode.UNARY: _abi.UnaryKind,
            _abi.Opcode.REDUCE: _abi.ReduceKind,
            _abi.Opcode.SOFTMAX: _abi.SoftmaxKind,
            _abi.Opcode.MATMUL: _abi.ActKind,
            _abi.Opcode.LINEAR: _abi.ActKind,
            _abi.Opcode.CONV2D: _abi.ActKind,
            _abi.Opcode.POOL2D: _abi.PoolKind,
            _abi.Opcode.REQUANT: _abi.ActKind,
        }
        name = self.opcode.name
        kind_enum = kinds.get(self.opcode)
        if kind_enum is not None:
            try:
                name = f"{name}.{kind_enum(self.kind).name}"
            except ValueError:
                name = f"{name}.{self.kind}"
        params = list(self.params)
        while params and not params[-1]:
            params.pop()
        extra = f", params=[{','.join(f'{p:#x}' for p in params)}]" if params else ""
        both = ", concurrent" if self.concurrent else ""
        return f"{name}({', '.join(str(t) for t in self.operands)}{extra}{both})"
