"""Descriptor templates: a tensor op's signature checked once, its descriptors patched per call.

An eager op of the tensor layer has the same signature (opcode, kind,
params, and each operand's dtype, shape and strides) call after call; only
where its operands live changes. A :class:`Template` is made from one op
that passed :func:`npu.ops.check_tensor_op`. It keeps that op's
``struct npu_tensor_op`` (for SUBMIT) and its ``struct npu_tensor_params``
(for a user-queue parameter block) as bytes, and per call writes only the
varying words: each operand's buffer handle and byte offset, or its device
address. Nothing is re-validated, and no per-op Python descriptor object is
built; :meth:`Template.bind` makes the :class:`TensorOp` only when one is
needed (an error message, a graph).

What the caller still checks per call, the template gives it:
``extents[i]`` is the bytes operand ``i`` spans from its first element,
which must fit its buffer.
"""

from __future__ import annotations

import ctypes
import struct
from collections.abc import Sequence
from typing import Final

from .. import _abi
from .descriptors import REF_SIZE, BufferLike, TensorOp, TensorRef
from .validate import check_tensor_op

__all__ = ["BoundOp", "Template", "pack_tensor_params"]

_RANK: Final = _abi.NPU_MAX_RANK
_OPERAND_FMT: Final = "QII" + f"{_RANK}I" * 2
#: ``struct npu_tensor_params``: the operands as device addresses, then params.
PARAMS: Final = struct.Struct(
    "<" + _OPERAND_FMT * _abi.NPU_TENSOR_OPERANDS + f"{_abi.NPU_TENSOR_PARAMS}I"
)
PARAMS_SIZE: Final = ctypes.sizeof(_abi.NpuTensorParams)
assert PARAMS.size == PARAMS_SIZE
_OPERAND_SIZE: Final = struct.calcsize("<" + _OPERAND_FMT)
_EMPTY_OPERAND: Final = (0,) * (3 + 2 * _RANK)
# Offset of struct npu_tensor_ref operand i in struct npu_tensor_op; in it,
# the handle (u32), dtype (u32) and offset (u64) come first.
_OP_REFS: Final = 8
_HANDLE_DTYPE_OFFSET: Final = struct.Struct("<IIQ")
_VA: Final = struct.Struct("<Q")


def pack_tensor_params(op: TensorOp, vas: Sequence[int]) -> bytes:
    """The 256-byte ``struct npu_tensor_params`` of ``op`` with operand ``i`` at ``vas[i]``.

    ``vas`` are the device virtual addresses of element ``[0, ..., 0]`` of
    each operand (buffer VA + the operand's byte offset). Unused operands and
    params are zero, as the device requires.

    Raises:
        ValueError: ``len(vas)`` differs from the number of operands, or an
            address is not a u64.
    """
    if len(vas) != len(op.operands):
        raise ValueError(f"{op.opcode.name}: {len(op.operands)} operands, {len(vas)} addresses")
    values: list[int] = []
    for ref, va in zip(op.operands, vas, strict=True):
        if not 0 <= va <= _abi.U64_MAX:
            raise ValueError(f"{op.opcode.name}: operand address {va:#x} is not a u64")
        pad = (0,) * (_RANK - ref.ndim)
        values += (va, int(ref.dtype), ref.ndim, *ref.shape, *pad, *ref.strides, *pad)
    for _ in range(len(op.operands), _abi.NPU_TENSOR_OPERANDS):
        values += _EMPTY_OPERAND
    values += op.params
    values += (0,) * (_abi.NPU_TENSOR_PARAMS - len(op.params))
    return PARAMS.pack(*values)


def _bare_ref(like: TensorRef, handle: int, offset: int) -> TensorRef:
    """``like`` at another handle and offset, without re-running its checks
    (its signature passed them; handle and offset ranges are the caller's)."""
    ref = object.__new__(TensorRef)
    for name, value in (
        ("handle", handle),
        ("dtype", like.dtype),
        ("offset", offset),
        ("shape", like.shape),
        ("strides", like.strides),
    ):
        object.__setattr__(ref, name, value)
    return ref


class Template:
    """The signature of one checked tensor op, with per-call descriptor patching.

    Args:
        op: an op that :func:`npu.ops.check_tensor_op` accepts (checked here
            again, which is free for a signature seen before).

    Attributes:
        opcode, kind: the op's.
        extents: per operand, the bytes from its first element to the end
            of its last (what must fit its buffer).
    """

    __slots__ = ("_block", "_like", "_record", "extents", "kind", "opcode", "params")

    def __init__(self, op: TensorOp) -> None:
        check_tensor_op(op)
        self.opcode: Final = op.opcode
        self.kind: Final = op.kind
        self.params: Final = op.params
        self._like = op.operands
        self.extents: Final = tuple(r.extent for r in op.operands)
        self._record = bytearray(op.to_bytes())
        self._block = bytearray(pack_tensor_params(op, [0] * len(op.operands)))

    @property
    def operands(self) -> int:
        """How many operands the op has."""
        return len(self._like)

    def record(self, handles: Sequence[int], offsets: Sequence[int]) -> bytes:
        """The ``struct npu_tensor_op`` with operand ``i`` at ``offsets[i]`` of BO ``handles[i]``.

        Handles must be u32 and offsets u64 (``struct.error`` otherwise).
        """
        rec = bytearray()
        self.append_record(rec, handles, offsets)
        return bytes(rec)

    def append_record(self, dst: bytearray, handles: Sequence[int], offsets: Sequence[int]) -> None:
        """:meth:`record` appended to ``dst`` (a batch of descriptors) in place."""
        at = len(dst) + _OP_REFS
        dst += self._record
        pack_into = _HANDLE_DTYPE_OFFSET.pack_into
        for like, handle, offset in zip(self._like, handles, offsets, strict=True):
            pack_into(dst, at, handle, like.dtype, offset)
            at += REF_SIZE

    def block(self, vas: Sequence[int]) -> bytes:
        """The ``struct npu_tensor_params`` with operand ``i`` at device address ``vas[i]``."""
        blk = bytearray(PARAMS_SIZE)
        self.write_block(memoryview(blk), 0, vas)
        return bytes(blk)

    def write_block(self, dst: memoryview, at: int, vas: Sequence[int]) -> None:
        """:meth:`block` written straight into ``dst[at:at + 256]`` (a stream's
        parameter arena): one copy of the prebuilt bytes, then the addresses."""
        dst[at : at + PARAMS_SIZE] = self._block
        pack_into = _VA.pack_into
        for va in vas:
            pack_into(dst, at, va)
            at += _OPERAND_SIZE

    def bind(
        self,
        handles: Sequence[int],
        offsets: Sequence[int],
        buffers: tuple[BufferLike, ...] = (),
    ) -> TensorOp:
        """The :class:`TensorOp` of this signature at these operands (not checked again)."""
        refs = tuple(
            _bare_ref(like, h, o) for like, h, o in zip(self._like, handles, offsets, strict=True)
        )
        op = object.__new__(TensorOp)
        for name, value in (
            ("opcode", self.opcode),
            ("kind", self.kind),
            ("operands", refs),
            ("buffers", buffers),
            ("params", self.params),
            ("concurrent", False),
        ):
            object.__setattr__(op, name, value)
        return op


class BoundOp:
    """A template at given operands, made into a :class:`TensorOp` only when asked.

    What a queue keeps per launched op to name it in an error message.
    """

    __slots__ = ("_handles", "_offsets", "_op", "_template")

    def __init__(self, template: Template, handles: tuple[int, ...], offsets: tuple[int, ...]):
        self._template = template
        self._handles = handles
        self._offsets = offsets
        self._op: TensorOp | None = None

    def op(self) -> TensorOp:
        """The :class:`TensorOp` (made once)."""
        if self._op is None:
            self._op = self._template.bind(self._handles, self._offsets)
        return self._op

    def __str__(self) -> str:
        return str(self.op())
