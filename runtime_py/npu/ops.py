"""Building the operations of a SUBMIT (``struct npu_op``).

Each builder validates its arguments in Python (raising :class:`ValueError`)
and returns an immutable :class:`Op`; :meth:`npu.Device.submit` packs a
sequence of them into an array of ``struct npu_op``.

Buffers are passed as anything with integer ``handle`` and ``size``
attributes (:class:`BufferLike`), normally :class:`npu.Buffer`. Each op refers
to byte ranges of buffers (:class:`BufRef`: handle, offset, size); a range must
lie inside ``buffer.size``.
"""

from __future__ import annotations

import operator
from dataclasses import dataclass, field
from typing import Protocol, SupportsIndex

from . import _abi

__all__ = [
    "BufRef",
    "BufferLike",
    "Op",
    "copy",
    "fill",
    "gemm",
    "gemm_extent",
    "nop",
]

_FP32_BYTES = 4


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


def _check_range(what: str, value: SupportsIndex, lo: int, hi: int) -> int:
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
