"""The reference kernels of the CPU backend: every descriptor, checked and run with numpy.

:class:`Executor` checks a ``struct npu_tensor_op`` as the driver does (an
op the caps lack -> ``EOPNOTSUPP``, a malformed one -> ``EINVAL``, an unknown
handle -> ``ENOENT``, an extent past its buffer -> ``ERANGE``) and runs
``struct npu_op`` and ``struct npu_tensor_op`` descriptors on buffer bytes:
float math in float32 rounded to the output dtype, integer math wrapping,
float -> int truncating toward zero and saturating (NaN -> 0), float32 ->
bfloat16 rounding to nearest even. REDUCE, SOFTMAX and LAYERNORM compute in
float64 (integer sums in int64, wrapping at the output dtype) and round once
to the output dtype. MATMUL and LINEAR compute ``act(a @ b [+ bias])`` in
float64 and round once. CONV2D (:func:`conv2d_ref`: one tensordot per kernel
tap over the zero-padded input, per group) and POOL2D compute in float64
too. Their int8 forms sum ``(a - in_zp) * b`` exactly (int64), add the int32
bias, wrap to int32, apply RELU and wrap to the output dtype; REQUANT rounds
``acc * scale`` exactly (``Fraction``, ties to even), adds the zero point and
clamps. These are the semantics ``docs/npu-spec.md`` gives the device.
"""

from __future__ import annotations

import ctypes
import errno
import math
import os
import struct
from collections.abc import Callable
from fractions import Fraction
from typing import Any

import numpy as np

from .. import _abi

__all__ = ["DTYPE_SIZE", "Executor", "conv2d_ref", "pool2d_ref"]

Bytes = np.ndarray[Any, np.dtype[np.uint8]]


def _err(code: int) -> OSError:
    return OSError(code, os.strerror(code))


class Executor:
    """Runs descriptors on the buffers ``buffer(handle)`` returns (None: no such handle)."""

    def __init__(self, buffer: Callable[[int], Bytes | None], caps: int) -> None:
        self._buffer = buffer
        self.caps = caps

    def _bo(self, handle: int) -> Bytes:
        data = self._buffer(handle)
        if data is None:
            raise _err(errno.ENOENT)
        return data

    def _region(self, ref: _abi.NpuBufRef) -> Bytes:
        data = self._bo(ref.handle)
        if ref.rsvd or ref.offset + ref.size > data.size:
            raise _err(errno.EINVAL)
        return data[ref.offset : ref.offset + ref.size]

    def _matrix(
        self, ref: _abi.NpuBufRef, rows: int, cols: int, ld: int
    ) -> np.ndarray[Any, np.dtype[np.float32]]:
        flat = self._region(ref).view(np.float32)
        return np.lib.stride_tricks.as_strided(flat, shape=(rows, cols), strides=(ld * 4, 4))

    def run(self, op: _abi.NpuOp) -> int:
        """Run a ``struct npu_op``; its device status."""
        if op.opcode == _abi.NPU_OP_NOP:
            return _abi.NPU_ST_OK
        if op.opcode == _abi.NPU_OP_COPY:
            src, dst = self._region(op.bufs[0]), self._region(op.bufs[1])
            if src.size != dst.size:
                return _abi.NPU_ST_BAD_ARGS
            dst[:] = src
            return _abi.NPU_ST_OK
        if op.opcode == _abi.NPU_OP_FILL:
            dst = self._region(op.bufs[0])
            if dst.size % 4:
                return _abi.NPU_ST_BAD_ARGS
            dst.view("<u4")[:] = op.params[0]
            return _abi.NPU_ST_OK
        if op.opcode == _abi.NPU_OP_GEMM:
            m, n, k, lda, ldb, ldc, _dtype, flags = list(op.params)
            ta, tb = flags & _abi.NPU_GEMM_TRANS_A, flags & _abi.NPU_GEMM_TRANS_B
            a = self._matrix(op.bufs[0], *((k, m) if ta else (m, k)), lda)
            b = self._matrix(op.bufs[1], *((n, k) if tb else (k, n)), ldb)
            c = self._matrix(op.bufs[2], m, n, ldc)
            c[:] = (a.T if ta else a) @ (b.T if tb else b)
            return _abi.NPU_ST_OK
        return _abi.NPU_ST_BAD_OPCODE

    def check_tensor(self, op: _abi.NpuTensorOp) -> None:
        """Refuse a malformed tensor op as the driver does (OSError with its errno)."""
        n = _N_OPERANDS.get(op.opcode)
        used = _N_PARAMS.get(op.opcode, 0)
        if op.opcode == _abi.NPU_OP_POOL2D and not (
            op.params[_abi.NPU_POOL_P_FLAGS] & _abi.NPU_POOL_F_GEOMETRY
        ):
            used = 7
        if n is None or op.flags & ~_abi.NPU_TENSOR_OP_F_MASK or op.rsvd or any(op.params[used:]):
            raise _err(errno.EINVAL)
        if op.opcode not in _SUPPORTED_BY or not self.caps & _SUPPORTED_BY[op.opcode]:
            raise _err(errno.EOPNOTSUPP)
        if (
            op.flags & _abi.NPU_TENSOR_OP_F_CONCURRENT
            and not self.caps & _abi.NPU_INFO_CAP_CONCURRENT
        ):
            raise _err(errno.EOPNOTSUPP)
        if (
            op.opcode == _abi.NPU_OP_POOL2D
            and op.params[_abi.NPU_POOL_P_FLAGS] & (_abi.NPU_POOL_F_GEOMETRY | _abi.NPU_POOL_F_CEIL)
            and not self.caps & _abi.NPU_INFO_CAP_POOL_GEOMETRY
        ):
            raise _err(errno.EOPNOTSUPP)
        if (
            op.opcode == _abi.NPU_OP_CONV2D
            and op.params[_abi.NPU_CONV_P_FLAGS] & _abi.NPU_CONV_F_ACCUMULATE
            and not self.caps & _abi.NPU_INFO_CAP_CONV_ACCUMULATE
        ):
            raise _err(errno.EOPNOTSUPP)
        if (
            op.opcode in (_abi.NPU_OP_MATMUL, _abi.NPU_OP_LINEAR, _abi.NPU_OP_CONV2D)
            and op.kind == _abi.NPU_ACT_RELU6
            and not self.caps & _abi.NPU_INFO_CAP_ACT_RELU6
        ):
            raise _err(errno.EOPNOTSUPP)
        for i in range(_abi.NPU_TENSOR_OPERANDS):  # the driver's order of checks
            t = op.t[i]
            if i >= n:
                if bytes(t) != bytes(ctypes.sizeof(t)):
                    raise _err(errno.EINVAL)
                continue
            if t.rsvd or t.rsvd2:
                raise _err(errno.EINVAL)
            if self._buffer(t.handle) is None:
                raise _err(errno.ENOENT)
        extents = []
        for i in range(n):
            t = op.t[i]
            size = DTYPE_SIZE.get(t.dtype, 0)
            if not size or not 1 <= t.ndim <= _abi.NPU_MAX_RANK:
                raise _err(errno.EINVAL)
            numel, last = 1, 0
            for d in range(_abi.NPU_MAX_RANK):
                if d >= t.ndim:
                    if t.shape[d] or t.strides[d]:
                        raise _err(errno.EINVAL)
                    continue
                if not 1 <= t.shape[d] <= _abi.NPU_MAX_STRIDE or t.strides[d] > _abi.NPU_MAX_STRIDE:
                    raise _err(errno.EINVAL)
                numel *= t.shape[d]
                last += (t.shape[d] - 1) * t.strides[d]
            if numel > _abi.NPU_MAX_ELEMS:
                raise _err(errno.EINVAL)
            extents.append((t.handle, t.offset + (last + 1) * size))
        ins, out = [op.t[i] for i in range(n - 1)], op.t[n - 1]
        want, contiguous = 1, True
        for d in reversed(range(out.ndim)):
            if out.shape[d] > 1 and out.strides[d] != want:
                contiguous = False
            want *= out.shape[d]
        if not contiguous and op.opcode == _abi.NPU_OP_CONVERT:
            if not self.caps & _abi.NPU_INFO_CAP_STRIDED_OUT:
                raise _err(errno.EOPNOTSUPP)
            if not _abi.strides_disjoint(out.shape[: out.ndim], out.strides[: out.ndim]):
                raise _err(errno.EINVAL)
        elif not contiguous:
            raise _err(errno.EINVAL)

        def shape(t: _abi.NpuTensorRef) -> tuple[int, ...]:
            return tuple(t.shape[: t.ndim])

        is_float = out.dtype in _FLOATS
        compare = op.opcode == _abi.NPU_OP_ELTWISE and op.kind >= _abi.NPU_ELTWISE_EQ
        bool_ok = compare or op.opcode in (_abi.NPU_OP_CONVERT, _abi.NPU_OP_SELECT)
        if not bool_ok and any(op.t[i].dtype == _abi.NPU_DTYPE_BOOL for i in range(n)):
            raise _err(errno.EINVAL)
        if op.opcode == _abi.NPU_OP_ELTWISE:
            want_out = _abi.NPU_DTYPE_BOOL if compare else ins[0].dtype
            ok = (
                op.kind < _abi.NPU_ELTWISE_COUNT
                and out.dtype == want_out
                and all(
                    t.dtype == ins[0].dtype
                    and t.ndim == out.ndim
                    and all(a in (b, 1) for a, b in zip(shape(t), shape(out), strict=True))
                    for t in ins
                )
            )
            ok = ok and (op.kind != _abi.NPU_ELTWISE_DIV or is_float)
        elif op.opcode == _abi.NPU_OP_UNARY:
            ok = (
                op.kind < _abi.NPU_UNARY_COUNT
                and ins[0].dtype == out.dtype
                and shape(ins[0]) == shape(out)
                and (op.kind in _INT_UNARY or is_float)
            )
        elif op.opcode == _abi.NPU_OP_REDUCE:
            mask = op.params[0]
            ok = (
                op.kind < _abi.NPU_REDUCE_COUNT
                and ins[0].dtype == out.dtype
                and 0 < mask < 1 << ins[0].ndim
                and ins[0].ndim == out.ndim
                and shape(out)
                == tuple(1 if mask >> d & 1 else n for d, n in enumerate(shape(ins[0])))
                and (op.kind != _abi.NPU_REDUCE_MEAN or is_float)
            )
        elif op.opcode == _abi.NPU_OP_SOFTMAX:
            ok = (
                op.kind < _abi.NPU_SOFTMAX_COUNT
                and ins[0].dtype == out.dtype
                and is_float
                and shape(ins[0]) == shape(out)
                and op.params[0] < out.ndim
            )
        elif op.opcode == _abi.NPU_OP_LAYERNORM:
            k = op.params[0]
            norm = tuple(d if i + k >= out.ndim else 1 for i, d in enumerate(shape(out)))
            eps = _f32(op.params[1])
            ok = (
                op.kind == 0
                and all(t.dtype == out.dtype for t in ins)
                and is_float
                and shape(ins[0]) == shape(out)
                and 1 <= k <= out.ndim
                and shape(ins[1]) == norm
                and shape(ins[2]) == norm
                and math.isfinite(eps)
                and eps > 0
            )
        elif op.opcode in (_abi.NPU_OP_MATMUL, _abi.NPU_OP_LINEAR):
            a, b, r = shape(ins[0]), shape(ins[1]), out.ndim
            o = shape(out)
            ok = (
                _mm_dtypes_ok(op, ins, out, op.params[0])
                and r >= 2
                and len(a) == r
                and len(b) == r
                and a[-2] == o[-2]
                and b[-1] == o[-1]
                and a[-1] == b[-2]
                and all(x in (o[d], 1) for t in (a, b) for d, x in enumerate(t[:-2]))
                and (op.opcode == _abi.NPU_OP_MATMUL or shape(ins[2]) == (1,) * (r - 1) + (o[-1],))
            )
        elif op.opcode == _abi.NPU_OP_CONV2D:
            flags = op.params[_abi.NPU_CONV_P_FLAGS]
            ok = (
                _mm_dtypes_ok(op, ins, out, op.params[7])
                and _conv_ok([shape(t) for t in (*ins, out)], list(op.params[:7]))
                and not flags & ~_abi.NPU_CONV_F_MASK
                and (is_float or not flags & _abi.NPU_CONV_F_ACCUMULATE)
            )
        elif op.opcode == _abi.NPU_OP_POOL2D:
            ok = (
                op.kind < _abi.NPU_POOL_COUNT
                and ins[0].dtype == out.dtype
                and is_float
                and _pool_ok(shape(ins[0]), shape(out), list(op.params[:11]))
            )
        elif op.opcode == _abi.NPU_OP_REQUANT:
            ok = (
                op.kind in (_abi.NPU_ACT_NONE, _abi.NPU_ACT_RELU)
                and (ins[0].dtype, ins[1].dtype, out.dtype)
                == (_abi.NPU_DTYPE_INT32, _abi.NPU_DTYPE_FP32, _abi.NPU_DTYPE_INT8)
                and shape(ins[0]) == shape(out)
                and ins[1].ndim == out.ndim
                and all(s in (o, 1) for s, o in zip(shape(ins[1]), shape(out), strict=True))
                and _signed(op.params[0]) in range(-128, 128)
            )
        elif op.opcode == _abi.NPU_OP_SELECT:
            ok = (
                op.kind == 0
                and ins[0].dtype == _abi.NPU_DTYPE_BOOL
                and ins[1].dtype == out.dtype
                and ins[2].dtype == out.dtype
                and all(
                    t.ndim == out.ndim
                    and all(a in (b, 1) for a, b in zip(shape(t), shape(out), strict=True))
                    for t in ins
                )
            )
        else:
            ok = op.kind == 0 and shape(ins[0]) == shape(out)
        if not ok:
            raise _err(errno.EINVAL)
        for handle, end in extents:
            if end > self._bo(handle).size:
                raise _err(errno.ERANGE)

    def _tensor(self, t: _abi.NpuTensorRef) -> np.ndarray[Any, Any]:
        """A writable strided view of the operand in its storage dtype."""
        storage = _STORAGE[t.dtype]
        flat = self._bo(t.handle)[t.offset :]
        item = storage.itemsize
        return np.lib.stride_tricks.as_strided(
            flat.view(storage)
            if flat.size % item == 0
            else flat[: flat.size // item * item].view(storage),
            shape=tuple(t.shape[: t.ndim]),
            strides=tuple(t.strides[d] * item for d in range(t.ndim)),
        )

    def _load(self, t: _abi.NpuTensorRef) -> np.ndarray[Any, Any]:
        raw = self._tensor(t)
        if t.dtype == _abi.NPU_DTYPE_BOOL:  # any nonzero byte is true
            mask: np.ndarray[Any, Any] = (raw != 0).astype(np.int64)
            return mask
        if t.dtype == _abi.NPU_DTYPE_BF16:
            return (raw.astype(np.uint32) << 16).view(np.float32)
        if t.dtype in _FLOATS:
            return raw.astype(np.float32)
        return raw.astype(np.int64)

    def _store(self, t: _abi.NpuTensorRef, values: np.ndarray[Any, Any]) -> None:
        dst = self._tensor(t)
        if t.dtype == _abi.NPU_DTYPE_BOOL:  # NaN is nonzero: true
            dst[...] = (values != 0).astype(np.uint8)
            return
        if t.dtype in _FLOATS:
            with np.errstate(over="ignore"):  # out of range rounds to +-inf, as on the device
                f = values.astype(np.float32)
            if t.dtype == _abi.NPU_DTYPE_BF16:
                u = f.view(np.uint32).astype(np.uint64)
                bits = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)
                dst[...] = np.where(np.isnan(f), ((u >> 16) | 0x40).astype(np.uint16), bits)
            else:
                with np.errstate(over="ignore"):
                    dst[...] = f.astype(_STORAGE[t.dtype])
            return
        lo, hi = _INT_RANGE[t.dtype]
        if values.dtype.kind == "f":
            v = np.nan_to_num(np.trunc(values.astype(np.float64)), nan=0.0)
            dst[...] = np.clip(v, lo, hi).astype(_STORAGE[t.dtype])
        else:  # integer math wraps
            dst[...] = values.astype(np.int64).astype(_STORAGE[t.dtype])

    def _execute_int(self, op: _abi.NpuTensorOp) -> None:
        """Integer MATMUL/LINEAR/CONV2D: exact sums, int32 wrap, RELU, wrap to the output."""
        x = self._load(op.t[0])
        w = self._load(op.t[1])
        if op.opcode == _abi.NPU_OP_CONV2D:
            zp = _signed(op.params[7])
            y = np.rint(conv2d_ref((x - zp).astype(np.float64), w.astype(np.float64),
                                   list(op.params[:7]))).astype(np.int64)  # fmt: skip
            y = y + self._load(op.t[2])
            out = op.t[3]
        else:
            y = np.matmul(x - _signed(op.params[0]), w)
            if op.opcode == _abi.NPU_OP_LINEAR:
                y = y + self._load(op.t[2])
            out = op.t[3 if op.opcode == _abi.NPU_OP_LINEAR else 2]
        y = (y + (1 << 31)) % (1 << 32) - (1 << 31)
        if op.kind == _abi.NPU_ACT_RELU:
            y = np.maximum(y, 0)
        self._store(out, y)

    def run_tensor(self, op: _abi.NpuTensorOp) -> int:
        """Run a checked ``struct npu_tensor_op``; its device status."""
        if op.opcode == _abi.NPU_OP_CONVERT:
            self._store(op.t[1], self._load(op.t[0]))
            return _abi.NPU_ST_OK
        if op.opcode == _abi.NPU_OP_SELECT:  # the chosen element's bits, unchanged
            cond = self._tensor(op.t[0]) != 0
            x, y, dst = self._tensor(op.t[1]), self._tensor(op.t[2]), self._tensor(op.t[3])
            dst[...] = np.where(cond, x, y)
            return _abi.NPU_ST_OK
        if op.opcode == _abi.NPU_OP_ELTWISE:
            a, b = self._load(op.t[0]), self._load(op.t[1])
            fn = _ELTWISE[op.kind]
            with np.errstate(all="ignore"):
                self._store(op.t[2], fn(a, b))
            return _abi.NPU_ST_OK
        if op.opcode == _abi.NPU_OP_REDUCE:
            x = self._load(op.t[0])
            axes = tuple(d for d in range(op.t[0].ndim) if op.params[0] >> d & 1)
            if x.dtype.kind == "f":
                x = x.astype(np.float64)
            self._store(op.t[1], _REDUCE[op.kind](x, axis=axes, keepdims=True))
            return _abi.NPU_ST_OK
        if op.opcode == _abi.NPU_OP_SOFTMAX:
            x = self._load(op.t[0]).astype(np.float64)
            ax = op.params[0]
            with np.errstate(all="ignore"):
                shifted = x - np.max(x, axis=ax, keepdims=True)
                lse = np.log(np.sum(np.exp(shifted), axis=ax, keepdims=True))
                y = shifted - lse if op.kind == _abi.NPU_SOFTMAX_LOG else np.exp(shifted - lse)
            self._store(op.t[1], y)
            return _abi.NPU_ST_OK
        if op.opcode == _abi.NPU_OP_LAYERNORM:
            x = self._load(op.t[0]).astype(np.float64)
            g = self._load(op.t[1]).astype(np.float64)
            b = self._load(op.t[2]).astype(np.float64)
            axes = tuple(range(op.t[0].ndim - op.params[0], op.t[0].ndim))
            mu = x.mean(axis=axes, keepdims=True)
            var = ((x - mu) ** 2).mean(axis=axes, keepdims=True)
            self._store(op.t[3], (x - mu) / np.sqrt(var + _f32(op.params[1])) * g + b)
            return _abi.NPU_ST_OK
        if op.opcode == _abi.NPU_OP_REQUANT:
            acc, scale = np.broadcast_arrays(self._load(op.t[0]), self._load(op.t[1]))
            zp = _signed(op.params[0])
            lo = zp if op.kind == _abi.NPU_ACT_RELU else -128
            if not np.all(np.isfinite(scale) & (scale > 0)):
                return _abi.NPU_ST_BAD_QUANT
            q = [
                min(max(round(Fraction(int(x)) * Fraction(float(s))) + zp, lo), 127)
                for x, s in zip(acc.ravel(), scale.ravel(), strict=True)
            ]
            self._store(op.t[2], np.array(q, np.int64).reshape(acc.shape))
            return _abi.NPU_ST_OK
        if op.opcode in (_abi.NPU_OP_MATMUL, _abi.NPU_OP_LINEAR, _abi.NPU_OP_CONV2D) and (
            op.t[0].dtype == _abi.NPU_DTYPE_INT8
        ):
            self._execute_int(op)
            return _abi.NPU_ST_OK
        if op.opcode in (_abi.NPU_OP_MATMUL, _abi.NPU_OP_LINEAR):
            a = self._load(op.t[0]).astype(np.float64)
            b = self._load(op.t[1]).astype(np.float64)
            y = np.matmul(a, b)
            if op.opcode == _abi.NPU_OP_LINEAR:
                y = y + self._load(op.t[2]).astype(np.float64)
            y = _fused_act(op.kind, y)
            self._store(op.t[3 if op.opcode == _abi.NPU_OP_LINEAR else 2], y)
            return _abi.NPU_ST_OK
        if op.opcode == _abi.NPU_OP_CONV2D:
            x = self._load(op.t[0]).astype(np.float64)
            w = self._load(op.t[1]).astype(np.float64)
            y = conv2d_ref(x, w, list(op.params[:7])) + self._load(op.t[2]).astype(np.float64)
            if op.params[_abi.NPU_CONV_P_FLAGS] & _abi.NPU_CONV_F_ACCUMULATE:
                y = y + self._load(op.t[3]).astype(np.float64)
            y = _fused_act(op.kind, y)
            self._store(op.t[3], y)
            return _abi.NPU_ST_OK
        if op.opcode == _abi.NPU_OP_POOL2D:
            x = self._load(op.t[0]).astype(np.float64)
            self._store(op.t[1], pool2d_ref(x, op.kind, list(op.params[:11])))
            return _abi.NPU_ST_OK
        x = self._load(op.t[0])
        with np.errstate(all="ignore"):
            self._store(op.t[1], _UNARY[op.kind](x))
        return _abi.NPU_ST_OK


def _fused_act(kind: int, y: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
    """The MATMUL/LINEAR/CONV2D activation ``kind`` of ``y`` (NaN stays NaN)."""
    if kind == _abi.NPU_ACT_RELU:
        return np.asarray(np.maximum(y, 0))
    if kind == _abi.NPU_ACT_GELU:
        return np.asarray(_UNARY[_abi.NPU_UNARY_GELU](y))
    if kind == _abi.NPU_ACT_RELU6:
        return np.asarray(np.minimum(np.maximum(y, 0), 6))
    return y


def _window_out(size: int, k: int, stride: int, pad: int, dil: int) -> int:
    span, padded = dil * (k - 1) + 1, size + 2 * pad
    if not k or not stride or not dil or span > padded:
        return 0
    return (padded - span) // stride + 1


def _conv_ok(shapes: list[tuple[int, ...]], p: list[int]) -> bool:
    x, w, b, out = shapes
    sh, sw, ph, pw, dh, dw, g = p
    if any(len(t) != 4 for t in shapes) or not g or ph > _abi.NPU_MAX_PAD or pw > _abi.NPU_MAX_PAD:
        return False
    if x[1] % g or w[0] % g or w[1] != x[1] // g or b != (1, w[0], 1, 1):
        return False
    return out == (
        x[0],
        w[0],
        _window_out(x[2], w[2], sh, ph, dh),
        _window_out(x[3], w[3], sw, pw, dw),
    )


def _pool_geometry(p: list[int]) -> tuple[list[tuple[int, int, int, int, int]], int] | None:
    """Per axis (k, stride, pad begin, pad end, dilation) and the flags; None if invalid."""
    kh, kw, sh, sw, ph, pw, flags, *rest = p
    if flags & ~_abi.NPU_POOL_F_MASK:
        return None
    if flags & _abi.NPU_POOL_F_GEOMETRY:
        peh, pew, dh, dw = rest
    elif any(rest) or flags & _abi.NPU_POOL_F_CEIL:
        return None
    else:
        peh, pew, dh, dw = ph, pw, 1, 1
    return [(kh, sh, ph, peh, dh), (kw, sw, pw, pew, dw)], flags


def _pool_out(n: int, k: int, stride: int, pb: int, pe: int, dil: int, ceil: bool) -> int:
    """POOL2D output size along one axis (``npu_pool_out``); 0 if invalid."""
    span = dil * (k - 1) + 1
    if not k or not stride or not dil or span > n + pb + pe or pb >= span or pe >= span:
        return 0
    q, r = divmod(n + pb + pe - span, stride)
    return q + 2 if ceil and r and (q + 1) * stride < n + pb else q + 1


def _pool_ok(x: tuple[int, ...], out: tuple[int, ...], p: list[int]) -> bool:
    geo = _pool_geometry(p)
    if geo is None or len(x) != 4 or len(out) != 4:
        return False
    axes, flags = geo
    ceil = bool(flags & _abi.NPU_POOL_F_CEIL)
    return out == (x[0], x[1], *(_pool_out(n, *a, ceil) for n, a in zip(x[2:], axes, strict=True)))


def conv2d_ref(x: np.ndarray[Any, Any], w: np.ndarray[Any, Any], p: list[int]) -> Any:
    """conv2d of NCHW ``x`` with ``w`` [O, C/g, KH, KW] (params as NPU_CONV_P_*), no bias."""
    sh, sw, ph, pw, dh, dw, g = p
    n, c, h, wd = x.shape
    o, cg, kh, kw = w.shape
    oh = _window_out(h, kh, sh, ph, dh)
    ow = _window_out(wd, kw, sw, pw, dw)
    xp = np.zeros((n, c, h + 2 * ph, wd + 2 * pw), x.dtype)
    xp[:, :, ph : ph + h, pw : pw + wd] = x
    y = np.zeros((n, o, oh, ow), np.float64)
    og = o // g
    for gi in range(g):
        xs = xp[:, gi * cg : (gi + 1) * cg]
        ws = w[gi * og : (gi + 1) * og]
        for i in range(kh):
            for j in range(kw):
                patch = xs[
                    :,
                    :,
                    i * dh : i * dh + sh * (oh - 1) + 1 : sh,
                    j * dw : j * dw + sw * (ow - 1) + 1 : sw,
                ]
                y[:, gi * og : (gi + 1) * og] += np.einsum("nchw,oc->nohw", patch, ws[:, :, i, j])
    return y


def pool2d_ref(x: np.ndarray[Any, Any], kind: int, p: list[int]) -> Any:
    """POOL2D of NCHW ``x`` (params as NPU_POOL_P_*, valid), in float64.

    Embeds the input in a zero canvas that reaches the last tap of the last
    window and walks the kernel taps as strided slices, with one mask of
    the real elements and one of the declared padded extent.
    """
    geo = _pool_geometry(p)
    assert geo is not None
    (kh, sh, pbh, peh, dh), (kw, sw, pbw, pew, dw) = axes = geo[0]
    ceil = bool(geo[1] & _abi.NPU_POOL_F_CEIL)
    n, c, h, w = x.shape
    oh, ow = (_pool_out(size, *a, ceil) for size, a in zip((h, w), axes, strict=True))
    ext = (
        max((oh - 1) * sh + dh * (kh - 1) + 1, h + pbh + peh),
        max((ow - 1) * sw + dw * (kw - 1) + 1, w + pbw + pew),
    )
    xp = np.zeros((n, c, *ext))
    xp[:, :, pbh : pbh + h, pbw : pbw + w] = x
    real = np.zeros(ext, bool)
    real[pbh : pbh + h, pbw : pbw + w] = True
    padded = np.zeros(ext, bool)
    padded[: h + pbh + peh, : w + pbw + pew] = True
    is_max = kind == _abi.NPU_POOL_MAX
    acc = np.full((n, c, oh, ow), -np.inf if is_max else 0.0)
    cnt, pcnt = np.zeros((oh, ow)), np.zeros((oh, ow))
    for i in range(kh):
        for j in range(kw):
            win = (
                slice(i * dh, i * dh + sh * (oh - 1) + 1, sh),
                slice(j * dw, j * dw + sw * (ow - 1) + 1, sw),
            )
            tap, m = xp[:, :, win[0], win[1]], real[win]
            if is_max:
                acc = np.where(m, np.maximum(acc, tap), acc)
            else:
                acc += np.where(m, tap, 0.0)
            cnt += m
            pcnt += padded[win]
    if is_max:
        return acc
    div = pcnt if geo[1] & _abi.NPU_POOL_F_COUNT_PAD else cnt
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(div > 0, acc / np.where(div > 0, div, 1), 0.0)


def _signed(word: int) -> int:
    """A params word as a signed 32-bit value (zero points)."""
    return word - (1 << 32) if word & 0x8000_0000 else word


def _mm_dtypes_ok(op: _abi.NpuTensorOp, ins: list[Any], out: Any, zp: int) -> bool:
    """Float (one dtype, zero point 0) or int8 MATMUL/LINEAR/CONV2D operands."""
    if ins[0].dtype != _abi.NPU_DTYPE_INT8:
        return (
            zp == 0
            and op.kind < _abi.NPU_ACT_COUNT
            and all(t.dtype == out.dtype for t in ins)
            and out.dtype in _FLOATS
        )
    return (
        ins[1].dtype == _abi.NPU_DTYPE_INT8
        and (op.opcode == _abi.NPU_OP_MATMUL or ins[2].dtype == _abi.NPU_DTYPE_INT32)
        and out.dtype in (_abi.NPU_DTYPE_INT32, _abi.NPU_DTYPE_INT8)
        and op.kind in (_abi.NPU_ACT_NONE, _abi.NPU_ACT_RELU)
        and _signed(zp) in range(-128, 128)
    )


def _f32(bits: int) -> float:
    value: float = struct.unpack("<f", struct.pack("<I", bits))[0]
    return value


_N_OPERANDS = {
    _abi.NPU_OP_ELTWISE: 3,
    _abi.NPU_OP_UNARY: 2,
    _abi.NPU_OP_CONVERT: 2,
    _abi.NPU_OP_REDUCE: 2,
    _abi.NPU_OP_SOFTMAX: 2,
    _abi.NPU_OP_LAYERNORM: 4,
    _abi.NPU_OP_MATMUL: 3,
    _abi.NPU_OP_LINEAR: 4,
    _abi.NPU_OP_CONV2D: 4,
    _abi.NPU_OP_POOL2D: 2,
    _abi.NPU_OP_REQUANT: 3,
    _abi.NPU_OP_SELECT: 4,
}
_N_PARAMS = {
    _abi.NPU_OP_REDUCE: 1,
    _abi.NPU_OP_SOFTMAX: 1,
    _abi.NPU_OP_LAYERNORM: 2,
    _abi.NPU_OP_MATMUL: 1,
    _abi.NPU_OP_LINEAR: 1,
    _abi.NPU_OP_CONV2D: 9,
    _abi.NPU_OP_POOL2D: 11,
    _abi.NPU_OP_REQUANT: 1,
}
_SUPPORTED_BY = {
    **dict.fromkeys(
        (_abi.NPU_OP_ELTWISE, _abi.NPU_OP_UNARY, _abi.NPU_OP_CONVERT), _abi.NPU_INFO_CAP_TENSOR
    ),
    **dict.fromkeys(
        (_abi.NPU_OP_REDUCE, _abi.NPU_OP_SOFTMAX, _abi.NPU_OP_LAYERNORM), _abi.NPU_INFO_CAP_REDUCE
    ),
    **dict.fromkeys((_abi.NPU_OP_MATMUL, _abi.NPU_OP_LINEAR), _abi.NPU_INFO_CAP_MATMUL),
    **dict.fromkeys((_abi.NPU_OP_CONV2D, _abi.NPU_OP_POOL2D), _abi.NPU_INFO_CAP_CONV),
    _abi.NPU_OP_REQUANT: _abi.NPU_INFO_CAP_QUANT,
    _abi.NPU_OP_SELECT: _abi.NPU_INFO_CAP_SELECT,
}
_REDUCE: dict[int, Any] = {
    _abi.NPU_REDUCE_SUM: np.sum,
    _abi.NPU_REDUCE_MEAN: np.mean,
    _abi.NPU_REDUCE_MAX: np.max,
    _abi.NPU_REDUCE_MIN: np.min,
}
_FLOATS = (_abi.NPU_DTYPE_FP32, _abi.NPU_DTYPE_FP16, _abi.NPU_DTYPE_BF16)
#: Bytes per element of each device dtype (also the CPU queues' extent checks).
DTYPE_SIZE = {
    _abi.NPU_DTYPE_FP32: 4,
    _abi.NPU_DTYPE_FP16: 2,
    _abi.NPU_DTYPE_BF16: 2,
    _abi.NPU_DTYPE_INT8: 1,
    _abi.NPU_DTYPE_INT32: 4,
    _abi.NPU_DTYPE_BOOL: 1,
}
_STORAGE: dict[int, np.dtype[Any]] = {
    _abi.NPU_DTYPE_FP32: np.dtype(np.float32),
    _abi.NPU_DTYPE_FP16: np.dtype(np.float16),
    _abi.NPU_DTYPE_BF16: np.dtype(np.uint16),
    _abi.NPU_DTYPE_INT8: np.dtype(np.int8),
    _abi.NPU_DTYPE_INT32: np.dtype(np.int32),
    _abi.NPU_DTYPE_BOOL: np.dtype(np.uint8),
}
_INT_RANGE = {_abi.NPU_DTYPE_INT8: (-128, 127), _abi.NPU_DTYPE_INT32: (-(2**31), 2**31 - 1)}
_ELTWISE = {
    _abi.NPU_ELTWISE_ADD: np.add,
    _abi.NPU_ELTWISE_SUB: np.subtract,
    _abi.NPU_ELTWISE_MUL: np.multiply,
    _abi.NPU_ELTWISE_DIV: np.divide,
    _abi.NPU_ELTWISE_MAX: np.maximum,
    _abi.NPU_ELTWISE_MIN: np.minimum,
    _abi.NPU_ELTWISE_EQ: np.equal,
    _abi.NPU_ELTWISE_NE: np.not_equal,
    _abi.NPU_ELTWISE_LT: np.less,
    _abi.NPU_ELTWISE_LE: np.less_equal,
    _abi.NPU_ELTWISE_GT: np.greater,
    _abi.NPU_ELTWISE_GE: np.greater_equal,
}
_erf = np.vectorize(math.erf, otypes=[np.float64])
_UNARY: dict[int, Callable[[Any], Any]] = {
    _abi.NPU_UNARY_RELU: lambda x: np.maximum(x, 0),
    _abi.NPU_UNARY_GELU: lambda x: x * (1 + _erf(x / math.sqrt(2))) / 2,
    _abi.NPU_UNARY_SIGMOID: lambda x: 1 / (1 + np.exp(-x)),
    _abi.NPU_UNARY_TANH: np.tanh,
    _abi.NPU_UNARY_EXP: np.exp,
    _abi.NPU_UNARY_LOG: np.log,
    _abi.NPU_UNARY_SQRT: np.sqrt,
    _abi.NPU_UNARY_ABS: np.abs,
    _abi.NPU_UNARY_NEG: np.negative,
    _abi.NPU_UNARY_ERF: _erf,
    _abi.NPU_UNARY_RECIPROCAL: np.reciprocal,
}
_INT_UNARY = frozenset({_abi.NPU_UNARY_RELU, _abi.NPU_UNARY_ABS, _abi.NPU_UNARY_NEG})
