"""High-level functions on numpy arrays.

Each call uploads its inputs into fresh device buffers, runs one operation,
waits for it, copies the result out of the mapping and frees the buffers.
They use :func:`npu.default_device` unless a ``device`` is given.
"""

from __future__ import annotations

import contextlib
import logging
from typing import Any, overload

import numpy as np
import numpy.typing as npt

from . import _abi
from .core.buffer import Buffer
from .core.device import DEFAULT_TIMEOUT_S, Device, DeviceArg, resolve_device
from .kernels import ops
from .tensors.nn import matmul as _tensor_matmul
from .tensors.tensor import Tensor

__all__ = ["copy_array", "fill", "matmul"]

log = logging.getLogger(__name__)


@overload
def matmul(
    a: Tensor,
    b: Tensor | npt.ArrayLike,
    *,
    device: DeviceArg = None,
    timeout_s: float | None = DEFAULT_TIMEOUT_S,
) -> Tensor: ...


@overload
def matmul(
    a: npt.ArrayLike,
    b: Tensor,
    *,
    device: DeviceArg = None,
    timeout_s: float | None = DEFAULT_TIMEOUT_S,
) -> Tensor: ...


@overload
def matmul(
    a: npt.ArrayLike,
    b: npt.ArrayLike,
    *,
    device: DeviceArg = None,
    timeout_s: float | None = DEFAULT_TIMEOUT_S,
) -> npt.NDArray[np.float32]: ...


def matmul(
    a: Tensor | npt.ArrayLike,
    b: Tensor | npt.ArrayLike,
    *,
    device: DeviceArg = None,
    timeout_s: float | None = DEFAULT_TIMEOUT_S,
) -> npt.NDArray[np.float32] | Tensor:
    """Return ``a @ b`` computed by a device GEMM, as a new float32 array (or a Tensor).

    If ``a`` or ``b`` is a :class:`npu.Tensor` one MATMUL op runs on the
    device-resident data with ``np.matmul`` semantics (ranks 1..4, batch
    broadcasting) and the result is a :class:`npu.Tensor` of the operands'
    common float dtype (not waited for; see :func:`npu.tensors.nn.matmul`). ``device`` must then be
    ``None`` or the tensors' device, and ``timeout_s`` is not used.

    ``a`` (``m x k``) and ``b`` (``k x n``) are converted with
    ``np.ascontiguousarray(x, dtype=np.float32)``. If ``m``, ``n`` or ``k`` is
    0 the result (``m x n`` zeros) is computed without the device.

    Raises:
        ValueError: an operand is not 2-D, the inner dimensions differ, or a
            dimension exceeds ``NPU_MAX_DIM``.
        NpuError: allocation or execution failed (``NpuDeviceError`` when the
            device reports an error status, ``NpuTimeoutError`` on timeout).
    """
    if isinstance(a, Tensor) or isinstance(b, Tensor):
        owner = a.device if isinstance(a, Tensor) else b.device  # type: ignore[union-attr]
        if device is not None and device is not owner:
            raise ValueError("matmul: device= differs from the tensors' device")
        return _tensor_matmul(a, b)
    a32 = np.ascontiguousarray(a, dtype=np.float32)
    b32 = np.ascontiguousarray(b, dtype=np.float32)
    if a32.ndim != 2 or b32.ndim != 2:
        raise ValueError(f"matmul: operands must be 2-D, got shapes {a32.shape} and {b32.shape}")
    (m, k), (k2, n) = a32.shape, b32.shape
    if k != k2:
        raise ValueError(
            f"matmul: shapes {a32.shape} and {b32.shape} are not aligned "
            f"({k} columns in a, {k2} rows in b)"
        )
    for name, dim in (("m", m), ("n", n), ("k", k)):
        if dim > _abi.NPU_MAX_DIM:
            raise ValueError(f"matmul: {name}={dim} exceeds NPU_MAX_DIM={_abi.NPU_MAX_DIM}")
    if 0 in (m, n, k):
        return np.zeros((m, n), dtype=np.float32)
    dev = resolve_device(device)
    with contextlib.ExitStack() as stack:
        buf_a = _upload(stack, dev, a32)
        buf_b = _upload(stack, dev, b32)
        buf_c = stack.enter_context(dev.alloc(m * n * 4))
        dev.run([ops.gemm(buf_a, buf_b, buf_c, m, n, k)], timeout_s=timeout_s)
        result: npt.NDArray[np.float32] = buf_c.numpy(np.float32, (m, n)).copy()
    return result


def copy_array(
    x: npt.ArrayLike,
    *,
    device: DeviceArg = None,
    timeout_s: float | None = DEFAULT_TIMEOUT_S,
) -> npt.NDArray[Any]:
    """Return a copy of ``x`` made by a device COPY between two buffers.

    The result has the dtype and shape of ``np.ascontiguousarray(x)``. An
    empty array is copied without the device.

    Raises:
        TypeError: ``x`` has an object dtype (not plain bytes).
        NpuError: allocation or execution failed.
    """
    src = np.ascontiguousarray(x)
    if src.dtype.hasobject:
        raise TypeError("copy_array: arrays of Python objects cannot be copied by the device")
    if src.nbytes == 0:
        return src.copy()
    dev = resolve_device(device)
    with contextlib.ExitStack() as stack:
        buf_src = _upload(stack, dev, src)
        buf_dst = stack.enter_context(dev.alloc(src.nbytes))
        dev.run([ops.copy(buf_src, buf_dst, src.nbytes)], timeout_s=timeout_s)
        return buf_dst.numpy(src.dtype, src.shape).copy()


def fill(
    shape: int | tuple[int, ...],
    value: Any,
    dtype: npt.DTypeLike = np.float32,
    *,
    device: DeviceArg = None,
    timeout_s: float | None = DEFAULT_TIMEOUT_S,
) -> npt.NDArray[Any]:
    """Return a new array of ``shape`` and ``dtype`` filled with ``value`` by a device FILL.

    ``dtype`` must have 1-, 2- or 4-byte elements (e.g. float32, int32,
    uint8); ``value`` is converted to it and its bytes repeated to form the
    32-bit FILL pattern.

    Raises:
        ValueError: unsupported element size or negative dimension.
        NpuError: allocation or execution failed.
    """
    dt = np.dtype(dtype)
    if dt.hasobject or dt.itemsize not in (1, 2, 4):
        raise ValueError(f"fill: dtype {dt} is not a 1-, 2- or 4-byte element type")
    dims = (shape,) if isinstance(shape, int) else tuple(shape)
    if any(d < 0 for d in dims):
        raise ValueError(f"fill: negative dimension in shape {dims}")
    element = np.array(value, dtype=dt).reshape(1)
    pattern = int(np.tile(element, 4 // dt.itemsize).view("<u4")[0])
    nbytes = int(np.prod(dims, dtype=np.int64)) * dt.itemsize
    if nbytes == 0:
        return np.empty(dims, dtype=dt)
    padded = (nbytes + 3) & ~3
    dev = resolve_device(device)
    with dev.alloc(padded) as buf:
        dev.run([ops.fill(buf, pattern, padded)], timeout_s=timeout_s)
        return buf.numpy(dt, dims).copy()


def _upload(stack: contextlib.ExitStack, dev: Device, array: npt.NDArray[Any]) -> Buffer:
    """Allocate a buffer registered on ``stack`` holding the bytes of ``array``."""
    buf = stack.enter_context(dev.alloc(array.nbytes))
    buf.write(array)
    return buf
