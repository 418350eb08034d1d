"""Device-resident tensors and the tensor ops (ELTWISE, UNARY, ..., MATMUL, CONV2D, POOL2D).

A :class:`Tensor` is an n-D array (rank 0..4) that lives in a device buffer
object. It has a dtype (float32, float16, bfloat16, int8 or int32), a shape,
strides in *elements*, an element offset, the :class:`npu.Buffer` it views
(shared by views such as transposes) and the fence of the op that produced
it. Ops on tensors pack ``struct npu_tensor_op`` and submit them **without
waiting**: chains of ops stay on the device and only :meth:`Tensor.numpy`
(or :meth:`Tensor.wait`) waits for the producing fence. Ops of one queue run
in order, so waiting for a tensor's fence also covers everything it was
computed from.

Semantics follow numpy (see docs/runtime.md for the rules and their
exceptions):

- broadcasting with ``np.broadcast_shapes``; a broadcast operand keeps its
  dims of size 1 (with stride 0) and gets leading dims of size 1 prepended;
- dtype promotion with :func:`result_type` (numpy's ``np.result_type`` over
  the supported dtypes, float64 replaced by float32, bfloat16 placed between
  int8 and float32); Python ``int``/``float`` scalars are *weak* (NEP 50):
  they take the dtype of the tensor they meet;
- true division and the float-only unary ops of integer inputs produce a
  float dtype (float32 where numpy gives float64);
- reductions (:func:`sum`, :func:`mean`, :func:`max`, :func:`min`) take
  ``axis=None|int|tuple`` and ``keepdims`` like numpy; ``sum`` of integers
  gives int32 (numpy: int64) and wraps at int32; ``mean`` of integers is
  float32;
- :func:`softmax`, :func:`log_softmax` and :func:`layer_norm` (like
  ``torch.nn.functional.layer_norm``) compute in the input's float dtype;
  integer inputs become float32 first;
- :func:`matmul` (and ``@``) follows ``np.matmul`` for ranks 1..4 (batch
  broadcasting, 1-D promotion) in the operands' common float dtype;
  :func:`linear` is ``torch.nn.functional.linear`` plus an activation, fused
  into one LINEAR op;
- :func:`conv2d` (``torch.nn.functional.conv2d`` plus a fused activation),
  :func:`max_pool2d`, :func:`avg_pool2d` and :func:`global_avg_pool2d` work
  on NCHW tensors in the common float dtype, one CONV2D/POOL2D op each;
- empty tensors (a dimension of 0) are handled in Python without the device.

bfloat16 has no numpy dtype: :data:`bfloat16` is a sentinel dtype object;
bfloat16 data is stored as ``uint16`` words (the top half of an IEEE float32)
and :meth:`Tensor.numpy` returns it as float32 values (exact).
"""

from __future__ import annotations

import builtins
import collections
import logging
import math
import operator
import weakref
from collections.abc import Iterable, Sequence
from typing import Any, Final, SupportsIndex, TypeAlias

import numpy as np
import numpy.typing as npt

from . import _abi, ops

try:
    from numpy.exceptions import AxisError
except ImportError:  # numpy < 1.25, as in the guest's Debian 12
    from numpy import AxisError  # type: ignore[attr-defined,no-redef]

from .buffer import Buffer
from .device import DEFAULT_TIMEOUT_S, Device, default_device
from .errors import NpuDeviceError

__all__ = [
    "AxisArg",
    "BFloat16Type",
    "DTypeArg",
    "PairArg",
    "Tensor",
    "TensorDType",
    "abs",
    "add",
    "avg_pool2d",
    "bf16_to_float32",
    "bfloat16",
    "conv2d",
    "divide",
    "exp",
    "float32_to_bf16",
    "gelu",
    "global_avg_pool2d",
    "layer_norm",
    "linear",
    "log",
    "log_softmax",
    "matmul",
    "max",
    "max_pool2d",
    "maximum",
    "mean",
    "min",
    "minimum",
    "multiply",
    "negative",
    "permute",
    "relu",
    "result_type",
    "sigmoid",
    "softmax",
    "sqrt",
    "subtract",
    "sum",
    "tanh",
    "tensor",
]

_logger = logging.getLogger(__name__)

DType = _abi.DType


class BFloat16Type:
    """The type of :data:`npu.bfloat16`, the bfloat16 dtype marker.

    There is a single instance. It is stored as ``uint16`` words
    (:attr:`storage`); ``itemsize`` is 2.
    """

    name: Final = "bfloat16"
    itemsize: Final = 2
    storage: Final = np.dtype(np.uint16)

    _instance: BFloat16Type | None = None

    def __new__(cls) -> BFloat16Type:
        """Return the single instance."""
        if cls._instance is None:
            cls._instance = super().__new__(cls)
        return cls._instance

    def __repr__(self) -> str:
        return "npu.bfloat16"

    def __str__(self) -> str:
        return "bfloat16"

    def __reduce__(self) -> str:
        return "bfloat16"


#: The bfloat16 dtype marker (``Tensor.dtype`` of bf16 tensors).
bfloat16: Final = BFloat16Type()

#: What the ``axis`` arguments of the reductions accept.
AxisArg: TypeAlias = "SupportsIndex | Sequence[SupportsIndex] | None"
#: What :attr:`Tensor.dtype` returns: a numpy dtype or :data:`bfloat16`.
TensorDType: TypeAlias = "np.dtype[Any] | BFloat16Type"
#: What the ``dtype`` arguments accept: numpy dtype-likes, ``npu.bfloat16``
#: (or the strings ``"bfloat16"``/``"bf16"``) and :class:`npu.DType`.
DTypeArg: TypeAlias = "npt.DTypeLike | BFloat16Type | _abi.DType"

_NUMPY: Final[dict[DType, np.dtype[Any]]] = {
    DType.FP32: np.dtype(np.float32),
    DType.FP16: np.dtype(np.float16),
    DType.INT8: np.dtype(np.int8),
    DType.INT32: np.dtype(np.int32),
}
_FROM_NUMPY: Final[dict[np.dtype[Any], DType]] = {v: k for k, v in _NUMPY.items()}
_INT_RANGE: Final = {
    DType.INT8: (-(2**7), 2**7 - 1),
    DType.INT32: (-(2**31), 2**31 - 1),
}
# Failed fences seen by Tensor.wait, per device (NpuDeviceError objects).
_FAILURES: weakref.WeakKeyDictionary[Device, collections.deque[NpuDeviceError]] = (
    weakref.WeakKeyDictionary()
)
_FAILURE_HISTORY = 64


# ---------------------------------------------------------------------------
# dtypes and promotion
# ---------------------------------------------------------------------------


def _dtype(arg: DTypeArg) -> DType:
    """The :class:`npu.DType` of a dtype argument (TypeError if unsupported)."""
    if isinstance(arg, DType):
        return arg
    if arg is bfloat16 or (isinstance(arg, str) and arg.lower() in ("bfloat16", "bf16")):
        return DType.BF16
    if arg is None:
        raise TypeError("dtype must not be None here")
    try:
        dt = np.dtype(arg)  # type: ignore[arg-type]
    except TypeError as exc:
        raise TypeError(f"unsupported dtype {arg!r}") from exc
    try:
        return _FROM_NUMPY[dt]
    except KeyError:
        raise TypeError(
            f"unsupported tensor dtype {dt}: use float32, float16, npu.bfloat16, int8 or int32"
        ) from None


def _public(dtype: DType) -> TensorDType:
    return bfloat16 if dtype is DType.BF16 else _NUMPY[dtype]


def _storage(dtype: DType) -> np.dtype[Any]:
    return BFloat16Type.storage if dtype is DType.BF16 else _NUMPY[dtype]


def _promote(a: DType, b: DType) -> DType:
    if a is b:
        return a
    if a.is_float and b.is_float:
        return DType.FP32  # fp16/bf16 mixes and anything with fp32
    if not a.is_float and not b.is_float:
        return DType.INT32  # int8 with int32
    flt, integer = (a, b) if a.is_float else (b, a)
    # numpy: int8 fits every float; int32 needs float64 (-> float32 here).
    return flt if integer is DType.INT8 else DType.FP32


def result_type(a: DTypeArg, b: DTypeArg) -> TensorDType:
    """The dtype of a binary op on tensors of dtypes ``a`` and ``b``.

    numpy's ``np.result_type`` restricted to the supported dtypes, with
    float64 replaced by float32 and bfloat16 treated like float16:
    ``bf16 op bf16 -> bf16``, ``bf16 op int8 -> bf16``, bf16 with fp16,
    fp32 or int32 -> fp32.

    Raises:
        TypeError: a dtype is not supported.
    """
    return _public(_promote(_dtype(a), _dtype(b)))


def _float_of(dtype: DType) -> DType:
    """The float dtype numpy computes float-only functions of ``dtype`` in."""
    if dtype.is_float:
        return dtype
    return DType.FP16 if dtype is DType.INT8 else DType.FP32


def float32_to_bf16(x: npt.ArrayLike) -> npt.NDArray[np.uint16]:
    """Convert to bfloat16 words, rounding to nearest even (NaN stays a quiet NaN).

    The input is first converted to float32.
    """
    f = np.asarray(x, dtype=np.float32)
    u = f.view(np.uint32).astype(np.uint64)
    rounded = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)
    nan_bits = ((u >> 16) | 0x0040).astype(np.uint16)
    out: npt.NDArray[np.uint16] = np.where(np.isnan(f), nan_bits, rounded).astype(np.uint16)
    return out


def bf16_to_float32(bits: npt.ArrayLike) -> npt.NDArray[np.float32]:
    """Convert bfloat16 words to float32 (exact)."""
    # dtype= keeps uint32 for 0-d input under numpy < 2's value-based casting.
    u = np.asarray(np.left_shift(np.asarray(bits, dtype=np.uint16), 16, dtype=np.uint32))
    out: npt.NDArray[np.float32] = u.view(np.float32)
    return out


def _to_storage(array: npt.NDArray[Any], dtype: DType) -> npt.NDArray[Any]:
    """``array`` converted on the host to the storage representation of ``dtype``."""
    if dtype is DType.BF16:
        return float32_to_bf16(array)
    return np.ascontiguousarray(array, dtype=_NUMPY[dtype])


def _infer(array: npt.NDArray[Any]) -> DType:
    """The tensor dtype of a numpy array (narrowing float64 and other ints)."""
    dt = array.dtype
    if dt in _FROM_NUMPY:
        return _FROM_NUMPY[dt]
    if dt == np.float64:
        _logger.debug("float64 data is stored as float32")
        return DType.FP32
    if dt == np.bool_:
        return DType.INT8
    if dt.kind in "iu":
        if array.size and (array.min() < _INT_RANGE[DType.INT32][0] or array.max() > 2**31 - 1):
            raise ValueError(f"{dt} values do not fit int32, the widest tensor integer dtype")
        _logger.debug("%s data is stored as int32", dt)
        return DType.INT32
    raise TypeError(
        f"unsupported dtype {dt}: tensors hold float32, float16, bfloat16, int8 or int32"
    )


# ---------------------------------------------------------------------------
# Tensor
# ---------------------------------------------------------------------------


def _contiguous_strides(shape: Sequence[int]) -> tuple[int, ...]:
    strides: list[int] = []
    acc = 1
    for dim in reversed(shape):
        strides.append(acc)
        acc *= dim
    return tuple(reversed(strides))


def _check_shape(shape: tuple[int, ...], what: str) -> None:
    if len(shape) > _abi.NPU_MAX_RANK:
        raise ValueError(f"{what}: rank {len(shape)} > NPU_MAX_RANK={_abi.NPU_MAX_RANK}")
    if math.prod(shape) > _abi.NPU_MAX_ELEMS:
        raise ValueError(
            f"{what}: shape {shape} has more than NPU_MAX_ELEMS={_abi.NPU_MAX_ELEMS} elements"
        )


class Tensor:
    """An n-D array (rank 0..4) resident in a device buffer.

    Create with :func:`npu.tensor`; ops return new tensors. Do not call the
    constructor directly.

    A rank-0 tensor is stored as shape ``(1,)`` on the device and shows shape
    ``()``. ``strides`` and ``offset`` are in elements (unlike numpy's byte
    strides). Views (:meth:`transpose`, :attr:`T`, :meth:`reshape`) share the
    buffer. An empty tensor (a dimension of 0) has no buffer.

    numpy ufuncs do not apply to tensors (``__array_ufunc__ = None``), so
    ``ndarray + tensor`` calls :meth:`__radd__` and stays on the device;
    ``np.asarray(t)`` downloads (``__array__``).
    """

    __array_ufunc__ = None

    def __init__(
        self,
        device: Device,
        buffer: Buffer | None,
        dtype: DType,
        shape: tuple[int, ...],
        strides: tuple[int, ...] | None = None,
        offset: int = 0,
        fence: int | None = None,
        since: int | None = None,
    ) -> None:
        self._device = device
        self._buffer = buffer
        self._dtype = dtype
        self._shape = shape
        self._strides = _contiguous_strides(shape) if strides is None else strides
        self._offset = offset
        self._fence = fence
        # Lowest fence of the not-yet-waited ops this tensor was computed from.
        self._since = fence if since is None else since

    # -- properties ---------------------------------------------------------

    @property
    def device(self) -> Device:
        """The device holding the data."""
        return self._device

    @property
    def buffer(self) -> Buffer | None:
        """The buffer object viewed (shared by views); ``None`` for an empty tensor."""
        return self._buffer

    @property
    def dtype(self) -> TensorDType:
        """``np.dtype`` (float32, float16, int8, int32) or :data:`npu.bfloat16`."""
        return _public(self._dtype)

    @property
    def npu_dtype(self) -> _abi.DType:
        """The device element type (:class:`npu.DType`)."""
        return self._dtype

    @property
    def shape(self) -> tuple[int, ...]:
        """The shape (``()`` for rank 0)."""
        return self._shape

    @property
    def strides(self) -> tuple[int, ...]:
        """Strides in elements (not bytes)."""
        return self._strides

    @property
    def offset(self) -> int:
        """Offset of element ``[0, ..., 0]`` in the buffer, in elements."""
        return self._offset

    @property
    def fence(self) -> int | None:
        """Fence of the op that produced the data; ``None`` once waited for or uploaded."""
        return self._fence

    @property
    def ndim(self) -> int:
        """Rank, 0..4."""
        return len(self._shape)

    @property
    def size(self) -> int:
        """Number of elements."""
        return math.prod(self._shape)

    @property
    def itemsize(self) -> int:
        """Bytes per element."""
        return self._dtype.itemsize

    @property
    def nbytes(self) -> int:
        """``size * itemsize``."""
        return self.size * self.itemsize

    @property
    def is_contiguous(self) -> bool:
        """Row-major and dense (dims of size 1 are ignored), as outputs must be."""
        want = 1
        for dim, stride in zip(reversed(self._shape), reversed(self._strides), strict=True):
            if dim > 1 and stride != want:
                return False
            want *= dim
        return True

    @property
    def T(self) -> Tensor:
        """The transpose (axes reversed): a view, no device work."""
        return self.transpose()

    def __len__(self) -> int:
        if not self._shape:
            raise TypeError("len() of a rank-0 tensor")
        return self._shape[0]

    def __repr__(self) -> str:
        state = f" fence={self._fence}" if self._fence is not None else ""
        return (
            f"<npu.Tensor shape={self._shape} dtype={self.dtype} device={self._device.path}{state}>"
        )

    # -- synchronisation and download ---------------------------------------

    def wait(self, timeout_s: float | None = DEFAULT_TIMEOUT_S) -> None:
        """Wait until the op producing this tensor (and all before it) completed.

        Raises:
            NpuDeviceError: an op this tensor depends on failed on the device
                (also when the failure was first reported through another
                tensor).
            NpuTimeoutError: not done within ``timeout_s``.
        """
        if self._fence is None:
            return
        lo = self._since if self._since is not None else self._fence
        hi = self._fence
        failures = _FAILURES.setdefault(self._device, collections.deque(maxlen=_FAILURE_HISTORY))
        while True:
            for failure in failures:
                if lo <= failure.fence <= hi:
                    raise failure
            try:
                self._device.wait(hi, timeout_s=timeout_s)
            except NpuDeviceError as exc:
                failures.append(exc)
                if lo <= exc.fence <= hi:
                    raise
                _logger.debug("device error at fence %d does not concern %r", exc.fence, self)
                continue
            break
        self._fence = None
        self._since = None

    def numpy(self, timeout_s: float | None = DEFAULT_TIMEOUT_S) -> npt.NDArray[Any]:
        """Wait for the data and return a copy as a new ndarray.

        bfloat16 tensors come back as float32 (exact values).

        Raises:
            NpuDeviceError, NpuTimeoutError: see :meth:`wait`.
        """
        self.wait(timeout_s)
        out_dtype = np.dtype(np.float32) if self._dtype is DType.BF16 else _NUMPY[self._dtype]
        if self._buffer is None:
            return np.zeros(self._shape, dtype=out_dtype)
        item = self.itemsize
        flat = self._buffer.numpy(_storage(self._dtype))
        view = np.lib.stride_tricks.as_strided(
            flat[self._offset :],
            shape=self._shape,
            strides=tuple(s * item for s in self._strides),
            writeable=False,
        )
        data = np.array(view, copy=True)
        if self._dtype is DType.BF16:
            return bf16_to_float32(data)
        return data

    def __array__(
        self, dtype: npt.DTypeLike | None = None, copy: bool | None = None
    ) -> npt.NDArray[Any]:
        """Download (``np.asarray(t)``); always a copy."""
        data = self.numpy()
        return data if dtype is None else data.astype(dtype, copy=False)

    def item(self) -> int | float:
        """The single element as a Python number (waits)."""
        if self.size != 1:
            raise ValueError(f"item(): tensor of shape {self._shape} has {self.size} elements")
        value: int | float = self.numpy().reshape(-1)[0].item()
        return value

    def __float__(self) -> float:
        return float(self.item())

    def __int__(self) -> int:
        return int(self.item())

    def __bool__(self) -> bool:
        if self.size != 1:
            raise ValueError(f"the truth value of a tensor with {self.size} elements is ambiguous")
        return bool(self.item())

    # -- views and conversions -----------------------------------------------

    def _view(self, shape: tuple[int, ...], strides: tuple[int, ...]) -> Tensor:
        return Tensor(
            self._device,
            self._buffer,
            self._dtype,
            shape,
            strides,
            self._offset,
            self._fence,
            self._since,
        )

    def _view_as(self, shape: tuple[int, ...]) -> Tensor:
        """A contiguous view of a contiguous tensor with another shape of equal size."""
        return Tensor(
            self._device,
            self._buffer,
            self._dtype,
            shape,
            None,
            self._offset,
            self._fence,
            self._since,
        )

    def transpose(self, *axes: SupportsIndex | Sequence[SupportsIndex]) -> Tensor:
        """Permute the axes (reverse them without arguments): a view, no device work.

        ``t.transpose(1, 0, 2)`` and ``t.transpose((1, 0, 2))`` are the same.

        Raises:
            ValueError: ``axes`` is not a permutation of ``range(ndim)``.
        """
        if len(axes) == 1 and isinstance(axes[0], Sequence):
            seq: Sequence[Any] = axes[0]
        else:
            seq = axes
        if not seq:
            perm = tuple(reversed(range(self.ndim)))
        else:
            perm = tuple(operator.index(a) for a in seq)
            perm = tuple(a + self.ndim if a < 0 else a for a in perm)
            if sorted(perm) != list(range(self.ndim)):
                raise ValueError(f"axes {tuple(seq)} are not a permutation of {self.ndim} axes")
        return self._view(
            tuple(self._shape[a] for a in perm), tuple(self._strides[a] for a in perm)
        )

    def permute(self, *axes: SupportsIndex | Sequence[SupportsIndex]) -> Tensor:
        """Alias of :meth:`transpose`."""
        return self.transpose(*axes)

    def contiguous(self) -> Tensor:
        """Return ``self`` if row-major and dense, else a contiguous copy (one CONVERT)."""
        if self.is_contiguous:
            return self
        return self.astype(self._dtype)

    def reshape(self, *shape: SupportsIndex | Sequence[SupportsIndex]) -> Tensor:
        """Return a view of another shape (one dim may be ``-1``).

        A non-contiguous tensor is first made contiguous (one CONVERT).

        Raises:
            ValueError: the sizes differ, or the rank exceeds 4.
        """
        seq: Sequence[Any] = (
            shape[0] if len(shape) == 1 and isinstance(shape[0], Sequence) else shape
        )
        dims = [operator.index(d) for d in seq]
        if dims.count(-1) > 1 or any(d < -1 for d in dims):
            raise ValueError(f"reshape: invalid shape {tuple(dims)}")
        if -1 in dims:
            known = math.prod(d for d in dims if d != -1)
            if known == 0 or self.size % known:
                raise ValueError(f"reshape: cannot reshape {self._shape} into {tuple(dims)}")
            dims[dims.index(-1)] = self.size // known
        new_shape = tuple(dims)
        if math.prod(new_shape) != self.size:
            raise ValueError(f"reshape: cannot reshape {self._shape} into {new_shape}")
        _check_shape(new_shape, "reshape")
        base = self.contiguous()
        return Tensor(
            base._device,
            base._buffer,
            base._dtype,
            new_shape,
            None,
            base._offset,
            base._fence,
            base._since,
        )

    def astype(self, dtype: DTypeArg, copy: bool = True) -> Tensor:
        """Convert to ``dtype`` with a device CONVERT (result contiguous).

        Float to int truncates toward zero and saturates at the integer
        range; with ``copy=False`` a tensor that already has ``dtype`` is
        returned as is.
        """
        target = _dtype(dtype)
        if target is self._dtype and not copy:
            return self
        if self.size == 0:
            return _empty(self._device, target, self._shape)
        out = _alloc(self._device, target, self._shape)
        op = ops.convert(self._ref(), out._ref(), _bufs(self, out))
        return _launch([op], out, self)

    def to(self, dtype: DTypeArg) -> Tensor:
        """``astype(dtype, copy=False)``: ``self`` if it already has ``dtype``."""
        return self.astype(dtype, copy=False)

    # -- device operands -----------------------------------------------------

    def _ref(self, rank: int | None = None) -> ops.TensorRef:
        """This tensor as an operand, optionally aligned to ``rank`` for broadcasting.

        Leading dims of size 1 are prepended; every dim of size 1 gets stride 0.
        """
        assert self._buffer is not None, "empty tensors never reach the device"
        dims = self._shape or (1,)
        strides = self._strides or (1,)
        if rank is not None and rank > len(dims):
            pad = rank - len(dims)
            dims = (1,) * pad + dims
            strides = (0,) * pad + strides
        strides = tuple(0 if d == 1 else s for d, s in zip(dims, strides, strict=True))
        return ops.TensorRef(
            self._buffer.handle, self._dtype, self._offset * self.itemsize, dims, strides
        )

    # -- reductions and normalisation -----------------------------------------

    def sum(self, axis: AxisArg = None, keepdims: bool = False) -> Tensor:
        """:func:`npu.sum` of this tensor."""
        return sum(self, axis, keepdims)

    def mean(self, axis: AxisArg = None, keepdims: bool = False) -> Tensor:
        """:func:`npu.mean` of this tensor."""
        return mean(self, axis, keepdims)

    def max(self, axis: AxisArg = None, keepdims: bool = False) -> Tensor:
        """:func:`npu.max` of this tensor."""
        return max(self, axis, keepdims)

    def min(self, axis: AxisArg = None, keepdims: bool = False) -> Tensor:
        """:func:`npu.min` of this tensor."""
        return min(self, axis, keepdims)

    def softmax(self, axis: SupportsIndex = -1) -> Tensor:
        """:func:`npu.softmax` of this tensor."""
        return softmax(self, axis)

    def log_softmax(self, axis: SupportsIndex = -1) -> Tensor:
        """:func:`npu.log_softmax` of this tensor."""
        return log_softmax(self, axis)

    # -- operators -----------------------------------------------------------

    def __add__(self, other: Any) -> Tensor:
        return add(self, other)

    def __radd__(self, other: Any) -> Tensor:
        return add(other, self)

    def __sub__(self, other: Any) -> Tensor:
        return subtract(self, other)

    def __rsub__(self, other: Any) -> Tensor:
        return subtract(other, self)

    def __mul__(self, other: Any) -> Tensor:
        return multiply(self, other)

    def __rmul__(self, other: Any) -> Tensor:
        return multiply(other, self)

    def __truediv__(self, other: Any) -> Tensor:
        return divide(self, other)

    def __rtruediv__(self, other: Any) -> Tensor:
        return divide(other, self)

    def __neg__(self) -> Tensor:
        return negative(self)

    def __abs__(self) -> Tensor:
        return abs(self)

    def __matmul__(self, other: Any) -> Tensor:
        return matmul(self, other)

    def __rmatmul__(self, other: Any) -> Tensor:
        return matmul(other, self)


# ---------------------------------------------------------------------------
# Creation and launching
# ---------------------------------------------------------------------------


def _bufs(*tensors: Tensor) -> tuple[Buffer, ...]:
    return tuple(t._buffer for t in tensors if t._buffer is not None)


def _empty(device: Device, dtype: DType, shape: tuple[int, ...]) -> Tensor:
    return Tensor(device, None, dtype, shape)


def _alloc(device: Device, dtype: DType, shape: tuple[int, ...]) -> Tensor:
    """A new contiguous tensor with uninitialised data (an empty one has no buffer)."""
    _check_shape(shape, "tensor")
    size = math.prod(shape)
    if size == 0:
        return _empty(device, dtype, shape)
    return Tensor(device, device.alloc(size * dtype.itemsize), dtype, shape)


def _launch(batch: list[ops.AnyOp], out: Tensor, *inputs: Tensor) -> Tensor:
    """Submit ``batch`` (no wait); ``out`` is produced by its last op."""
    fence = out._device.submit(batch)
    since = fence - len(batch) + 1
    for t in inputs:
        if t._fence is not None and t._since is not None:
            since = builtins.min(since, t._since)
    out._fence = fence
    out._since = since
    return out


def _upload(data: npt.NDArray[Any], dtype: DType, device: Device) -> Tensor:
    shape = tuple(int(d) for d in data.shape)
    _check_shape(shape, "tensor")
    out = _alloc(device, dtype, shape)
    if out._buffer is not None:
        out._buffer.write(_to_storage(data, dtype))
    return out


def tensor(x: Any, dtype: DTypeArg | None = None, device: Device | None = None) -> Tensor:
    """Upload ``x`` (an ndarray, a scalar or a nested list) as a new :class:`Tensor`.

    Without ``dtype`` the dtype follows ``np.asarray(x)``: float32, float16,
    int8 and int32 are kept; float64 becomes float32; bool becomes int8;
    other integer dtypes become int32 if the values fit. A :class:`Tensor`
    argument is returned as is (converted if ``dtype`` differs).

    Raises:
        TypeError: unsupported dtype (complex, object, strings, float64 asked
            for explicitly, ...).
        ValueError: rank > 4, too many elements, or integers beyond int32.
        NpuError: allocation failed.
    """
    if isinstance(x, Tensor):
        if device is not None and device is not x._device:
            raise ValueError("tensor(): the tensor lives on another device")
        return x if dtype is None else x.to(dtype)
    dev = device if device is not None else default_device()
    if dtype is None:
        data = np.asarray(x)
        target = _infer(data)
    else:
        target = _dtype(dtype)
        data = np.asarray(x, dtype=np.float32 if target is DType.BF16 else _NUMPY[target])
    return _upload(data, target, dev)


def _scalar_dtype(value: Any, other: DType | None) -> DType | None:
    """dtype a Python scalar takes next to a tensor of dtype ``other`` (weak scalars)."""
    if isinstance(value, bool | int) and not isinstance(value, np.generic):
        if other is None:
            return DType.INT32
        if not other.is_float:
            lo, hi = _INT_RANGE[other]
            if not lo <= int(value) <= hi:
                raise OverflowError(f"Python integer {value} out of bounds for {_public(other)}")
        return other
    if isinstance(value, float) and not isinstance(value, np.generic):
        return other if other is not None and other.is_float else DType.FP32
    return None


def _operands(x: Any, y: Any, what: str) -> tuple[Tensor, Tensor]:
    """Both operands as tensors of one device (Python scalars weak, the rest uploaded)."""
    tx = x if isinstance(x, Tensor) else None
    ty = y if isinstance(y, Tensor) else None
    if tx is not None and ty is not None and tx._device is not ty._device:
        raise ValueError(f"{what}: operands live on different devices")
    anchor = tx if tx is not None else ty
    dev = anchor._device if anchor is not None else default_device()

    def convert(value: Any, other: Tensor | None) -> Tensor:
        if isinstance(value, Tensor):
            return value
        weak = _scalar_dtype(value, other._dtype if other is not None else None)
        if weak is not None:
            return _upload(np.asarray(value), weak, dev)
        try:
            return tensor(value, device=dev)
        except TypeError as exc:
            raise TypeError(f"{what}: unsupported operand {value!r}: {exc}") from exc

    if tx is None and ty is None:
        # Neither is a tensor: strong types first, then weak scalars relative to them.
        if _scalar_dtype(x, None) is None:
            tx = convert(x, None)
            return tx, convert(y, tx)
        ty = convert(y, None)
        return convert(x, ty), ty
    return convert(x, ty), convert(y, tx)


def _cast(t: Tensor, dtype: DType, batch: list[ops.AnyOp]) -> Tensor:
    """``t`` in ``dtype``, appending the CONVERT to ``batch`` if one is needed."""
    if t._dtype is dtype:
        return t
    out = _alloc(t._device, dtype, t._shape)
    batch.append(ops.convert(t._ref(), out._ref(), _bufs(t, out)))
    return out


def _broadcast(a: tuple[int, ...], b: tuple[int, ...], what: str) -> tuple[int, ...]:
    try:
        shape = tuple(int(d) for d in np.broadcast_shapes(a, b))
    except ValueError:
        raise ValueError(f"{what}: shapes {a} and {b} cannot be broadcast together") from None
    _check_shape(shape, what)
    return shape


def _binary(kind: _abi.EltwiseKind, x: Any, y: Any, what: str) -> Tensor:
    a, b = _operands(x, y, what)
    dtype = _promote(a._dtype, b._dtype)
    if kind is _abi.EltwiseKind.DIV and not dtype.is_float:
        dtype = DType.FP32
    shape = _broadcast(a._shape, b._shape, what)
    if math.prod(shape) == 0:
        return _empty(a._device, dtype, shape)
    batch: list[ops.AnyOp] = []
    ca, cb = _cast(a, dtype, batch), _cast(b, dtype, batch)
    out = _alloc(a._device, dtype, shape)
    rank = builtins.max(1, len(shape))
    batch.append(ops.eltwise(kind, ca._ref(rank), cb._ref(rank), out._ref(), _bufs(ca, cb, out)))
    return _launch(batch, out, a, b)


def _unary(kind: _abi.UnaryKind, x: Any, what: str) -> Tensor:
    t = x if isinstance(x, Tensor) else _operands(x, 0, what)[0]
    dtype = t._dtype
    if _abi.UnaryKind.GELU <= kind <= _abi.UnaryKind.SQRT:
        dtype = _float_of(dtype)
    if t.size == 0:
        return _empty(t._device, dtype, t._shape)
    batch: list[ops.AnyOp] = []
    src = _cast(t, dtype, batch)
    out = _alloc(t._device, dtype, t._shape)
    batch.append(ops.unary(kind, src._ref(), out._ref(), _bufs(src, out)))
    return _launch(batch, out, t)


# ---------------------------------------------------------------------------
# Public op functions
# ---------------------------------------------------------------------------


def add(x: Any, y: Any) -> Tensor:
    """``x + y`` on the device (numpy broadcasting and promotion)."""
    return _binary(_abi.EltwiseKind.ADD, x, y, "add")


def subtract(x: Any, y: Any) -> Tensor:
    """``x - y`` on the device."""
    return _binary(_abi.EltwiseKind.SUB, x, y, "subtract")


def multiply(x: Any, y: Any) -> Tensor:
    """``x * y`` on the device."""
    return _binary(_abi.EltwiseKind.MUL, x, y, "multiply")


def divide(x: Any, y: Any) -> Tensor:
    """``x / y`` (true division); integer operands give float32 (numpy: float64)."""
    return _binary(_abi.EltwiseKind.DIV, x, y, "divide")


def maximum(x: Any, y: Any) -> Tensor:
    """Element-wise maximum."""
    return _binary(_abi.EltwiseKind.MAX, x, y, "maximum")


def minimum(x: Any, y: Any) -> Tensor:
    """Element-wise minimum."""
    return _binary(_abi.EltwiseKind.MIN, x, y, "minimum")


def relu(x: Any) -> Tensor:
    """``max(x, 0)``; any dtype."""
    return _unary(_abi.UnaryKind.RELU, x, "relu")


def gelu(x: Any) -> Tensor:
    """Exact GELU ``x * (1 + erf(x / sqrt(2))) / 2``; integer inputs promote like :func:`exp`."""
    return _unary(_abi.UnaryKind.GELU, x, "gelu")


def sigmoid(x: Any) -> Tensor:
    """``1 / (1 + exp(-x))``; integer inputs promote like :func:`exp`."""
    return _unary(_abi.UnaryKind.SIGMOID, x, "sigmoid")


def tanh(x: Any) -> Tensor:
    """Hyperbolic tangent; integer inputs promote like :func:`exp`."""
    return _unary(_abi.UnaryKind.TANH, x, "tanh")


def exp(x: Any) -> Tensor:
    """``e ** x``; int8 inputs give float16 and int32 inputs float32, as numpy (float64)."""
    return _unary(_abi.UnaryKind.EXP, x, "exp")


def log(x: Any) -> Tensor:
    """Natural logarithm; integer inputs promote like :func:`exp`."""
    return _unary(_abi.UnaryKind.LOG, x, "log")


def sqrt(x: Any) -> Tensor:
    """Square root; integer inputs promote like :func:`exp`."""
    return _unary(_abi.UnaryKind.SQRT, x, "sqrt")


def abs(x: Any) -> Tensor:
    """Absolute value; any dtype."""
    return _unary(_abi.UnaryKind.ABS, x, "abs")


def negative(x: Any) -> Tensor:
    """``-x``; any dtype."""
    return _unary(_abi.UnaryKind.NEG, x, "negative")


def permute(x: Tensor, axes: Iterable[SupportsIndex] | None = None) -> Tensor:
    """``x.transpose(axes)``: a strided view, no device work."""
    if axes is None:
        return x.transpose()
    return x.transpose(tuple(axes))


# ---------------------------------------------------------------------------
# Reductions, softmax and layer norm (REDUCE, SOFTMAX, LAYERNORM)
# ---------------------------------------------------------------------------


def _as_tensor(x: Any, what: str) -> Tensor:
    return x if isinstance(x, Tensor) else _operands(x, 0, what)[0]


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
    t = _as_tensor(x, what)
    axes = _axes(axis, t.ndim, what)
    dtype = t._dtype
    if kind is _abi.ReduceKind.SUM and not dtype.is_float:
        dtype = DType.INT32  # numpy: int64; the device accumulates and wraps in int32
    elif kind is _abi.ReduceKind.MEAN and not dtype.is_float:
        dtype = DType.FP32  # numpy: float64
    keep = tuple(1 if d in axes else n for d, n in enumerate(t._shape))
    shape = keep if keepdims else tuple(n for d, n in enumerate(t._shape) if d not in axes)
    if not axes:  # axis=() or a rank-0 tensor: no reduction, only the dtype rule
        return t.astype(dtype)
    if t.size == 0:
        return _reduce_empty(kind, t, dtype, shape, what)
    batch: list[ops.AnyOp] = []
    src = _cast(t, dtype, batch)
    out = _alloc(t._device, dtype, keep)
    batch.append(ops.reduce(kind, src._ref(), out._ref(), axes, _bufs(src, out)))
    _launch(batch, out, t)
    return out if keepdims else out._view_as(shape)


def _reduce_empty(
    kind: _abi.ReduceKind, t: Tensor, dtype: DType, shape: tuple[int, ...], what: str
) -> Tensor:
    """A reduction of an empty tensor, on the host (numpy's results)."""
    if math.prod(shape) == 0:
        return _empty(t._device, dtype, shape)
    if kind is _abi.ReduceKind.SUM:
        return _upload(np.zeros(shape, np.float32), dtype, t._device)
    if kind is _abi.ReduceKind.MEAN:
        _logger.warning("%s: mean of an empty slice is NaN", what)
        return _upload(np.full(shape, np.nan, np.float32), dtype, t._device)
    raise ValueError(f"zero-size array to reduction operation {what} which has no identity")


def sum(x: Any, axis: AxisArg = None, keepdims: bool = False) -> Tensor:
    """Sum over ``axis`` (None: all axes; an int or a tuple; negative counts from the end).

    Like ``np.sum`` but integer inputs (int8, int32) give **int32**, summed
    on the device and wrapping at int32 (numpy gives int64, or wraps the same
    way with ``dtype=np.int32``). Float inputs keep their dtype. With
    ``keepdims=False`` the result is a view of the keepdims-form output.

    Raises:
        AxisError: an axis is out of range (numpy's, a ValueError).
        ValueError: duplicate axes.
    """
    return _reduce(_abi.ReduceKind.SUM, x, axis, keepdims, "sum")


def mean(x: Any, axis: AxisArg = None, keepdims: bool = False) -> Tensor:
    """Arithmetic mean over ``axis`` (see :func:`sum`); integer inputs give float32."""
    return _reduce(_abi.ReduceKind.MEAN, x, axis, keepdims, "mean")


def max(x: Any, axis: AxisArg = None, keepdims: bool = False) -> Tensor:
    """Maximum over ``axis`` (see :func:`sum`); keeps the dtype.

    Raises:
        ValueError: a reduced axis of an empty tensor (no identity), or as :func:`sum`.
    """
    return _reduce(_abi.ReduceKind.MAX, x, axis, keepdims, "maximum")


def min(x: Any, axis: AxisArg = None, keepdims: bool = False) -> Tensor:
    """Minimum over ``axis`` (see :func:`max`)."""
    return _reduce(_abi.ReduceKind.MIN, x, axis, keepdims, "minimum")


def _softmax(kind: _abi.SoftmaxKind, x: Any, axis: SupportsIndex, what: str) -> Tensor:
    t = _as_tensor(x, what)
    ax = _axis(axis, builtins.max(1, t.ndim), what)  # rank 0 is stored as (1,)
    dtype = t._dtype if t._dtype.is_float else DType.FP32
    if t.size == 0:
        return _empty(t._device, dtype, t._shape)
    batch: list[ops.AnyOp] = []
    src = _cast(t, dtype, batch)
    out = _alloc(t._device, dtype, t._shape)
    batch.append(ops.softmax(kind, src._ref(), out._ref(), ax, _bufs(src, out)))
    return _launch(batch, out, t)


def softmax(x: Any, axis: SupportsIndex = -1) -> Tensor:
    """``exp(x) / sum(exp(x), axis)`` along one axis (default the last), on the device.

    Float inputs keep their dtype; integer inputs are converted to float32.
    """
    return _softmax(_abi.SoftmaxKind.SOFTMAX, x, axis, "softmax")


def log_softmax(x: Any, axis: SupportsIndex = -1) -> Tensor:
    """``log(softmax(x, axis))``, computed stably on the device (see :func:`softmax`)."""
    return _softmax(_abi.SoftmaxKind.LOG, x, axis, "log_softmax")


def _norm_param(
    value: Any, default: float, dtype: DType, norm: tuple[int, ...], t: Tensor, what: str
) -> Tensor:
    """weight/bias as a tensor of shape ``norm`` in ``dtype`` (uploaded if not a Tensor)."""
    if value is None:
        return _upload(np.full(norm, default, np.float32), dtype, t._device)
    if isinstance(value, Tensor):
        if value._device is not t._device:
            raise ValueError(f"{what}: operands live on different devices")
        p = value
    else:
        p = _upload(np.asarray(value, dtype=np.float32), dtype, t._device)
    if p._shape != norm:
        raise ValueError(f"{what}: shape {p._shape} is not normalized_shape {norm}")
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
    t = _as_tensor(x, what)
    seq: Sequence[SupportsIndex] = (
        normalized_shape if isinstance(normalized_shape, Sequence) else (normalized_shape,)
    )
    norm = tuple(operator.index(d) for d in seq)
    if not norm or len(norm) > t.ndim or t._shape[t.ndim - len(norm) :] != norm:
        raise ValueError(
            f"{what}: normalized_shape {norm} does not match the trailing dims of {t._shape}"
        )
    if not math.isfinite(eps) or eps <= 0 or ops.f32_bits(eps) & 0x7FFFFFFF == 0:
        raise ValueError(f"{what}: eps={eps} must be positive and finite in float32")
    dtype = t._dtype if t._dtype.is_float else DType.FP32
    if t.size == 0:
        return _empty(t._device, dtype, t._shape)
    batch: list[ops.AnyOp] = []
    gamma = _cast(_norm_param(weight, 1.0, dtype, norm, t, what), dtype, batch)
    beta = _cast(_norm_param(bias, 0.0, dtype, norm, t, what), dtype, batch)
    src = _cast(t, dtype, batch)
    out = _alloc(t._device, dtype, t._shape)
    rank = t.ndim
    batch.append(
        ops.layernorm(
            src._ref(),
            gamma._ref(rank),
            beta._ref(rank),
            out._ref(),
            len(norm),
            eps,
            _bufs(src, gamma, beta, out),
        )
    )
    inputs = [t] + [p for p in (weight, bias) if isinstance(p, Tensor)]
    return _launch(batch, out, *inputs)


# ---------------------------------------------------------------------------
# matmul and linear (MATMUL, LINEAR; the v1 GEMM on older devices)
# ---------------------------------------------------------------------------


def _gemm_layout(t: Tensor) -> tuple[bool, int] | None:
    """``(transposed, ld)`` if GEMM can read the 2-D view directly, else None."""
    rows, cols = t._shape
    s0, s1 = t._strides
    if (cols == 1 or s1 == 1) and (rows == 1 or s0 >= cols):
        ld = s0 if rows > 1 else cols
        return (False, ld) if ld <= _abi.NPU_MAX_LD else None
    if (rows == 1 or s0 == 1) and (cols == 1 or s1 >= rows):
        ld = s1 if cols > 1 else rows
        return (True, ld) if ld <= _abi.NPU_MAX_LD else None
    return None


def _gemm_operand(t: Tensor, batch: list[ops.AnyOp]) -> tuple[Tensor, bool, int]:
    if t._dtype is not DType.FP32:
        t = _cast(t, DType.FP32, batch)
    layout = _gemm_layout(t)
    if layout is None:
        copy = _alloc(t._device, DType.FP32, t._shape)
        batch.append(ops.convert(t._ref(), copy._ref(), _bufs(t, copy)))
        t = copy
        layout = (False, t._shape[1])
    return t, layout[0], layout[1]


def _gemm_2d(a: Tensor, b: Tensor) -> Tensor:
    """``a @ b`` of 2-D tensors as a v1 fp32 GEMM (devices without ``Cap.MATMUL``)."""
    dev = a._device
    (m, k), (_, n) = a.shape, b.shape
    for name, dim in (("m", m), ("n", n), ("k", k)):
        if dim > _abi.NPU_MAX_DIM:
            raise ValueError(f"matmul: {name}={dim} exceeds NPU_MAX_DIM={_abi.NPU_MAX_DIM}")
    batch: list[ops.AnyOp] = []
    ga, trans_a, lda = _gemm_operand(a, batch)
    gb, trans_b, ldb = _gemm_operand(b, batch)
    out = _alloc(dev, DType.FP32, (m, n))
    assert ga._buffer is not None and gb._buffer is not None and out._buffer is not None
    batch.append(
        ops.gemm(
            ga._buffer,
            gb._buffer,
            out._buffer,
            m,
            n,
            k,
            lda,
            ldb,
            n,
            trans_a,
            trans_b,
            a_offset=ga._offset * 4,
            b_offset=gb._offset * 4,
        )
    )
    return _launch(batch, out, a, b)


_ACTIVATIONS: Final[dict[str, _abi.ActKind]] = {
    "none": _abi.ActKind.NONE,
    "relu": _abi.ActKind.RELU,
    "gelu": _abi.ActKind.GELU,
}


def _activation(activation: str | _abi.ActKind | None, what: str) -> _abi.ActKind:
    if activation is None:
        return _abi.ActKind.NONE
    if isinstance(activation, _abi.ActKind):
        return activation
    if isinstance(activation, str) and activation.lower() in _ACTIVATIONS:
        return _ACTIVATIONS[activation.lower()]
    raise ValueError(f"{what}: activation must be None, 'relu' or 'gelu', not {activation!r}")


def _matmul_operand(value: Any, dev: Device, what: str) -> Tensor:
    """``value`` as a tensor on ``dev`` of rank >= 1 (non-tensors uploaded)."""
    if isinstance(value, Tensor):
        if value._device is not dev:
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
    (m, k), (k2, n) = a._shape[-2:], b._shape[-2:]
    if k != k2:
        raise ValueError(
            f"{what}: shapes {a._shape} and {b._shape} are not aligned: K={k} in a, {k2} in b"
        )
    batch_shape = _broadcast(a._shape[:-2], b._shape[:-2], what)
    shape = (*batch_shape, m, n)
    _check_shape(shape, what)
    final = tuple(
        d
        for i, d in enumerate(shape)
        if not (squeeze[0] and i == len(shape) - 2) and not (squeeze[1] and i == len(shape) - 1)
    )
    dev = a._device
    if math.prod(shape) == 0:
        return _empty(dev, dtype, final)
    batch: list[ops.AnyOp] = []
    if k == 0:  # no products: act(0 + bias), without the device op
        out = _upload(np.zeros(shape, np.float32), dtype, dev)
        if bias is not None:
            out = add(out, bias.astype(dtype, copy=False))
        if act is _abi.ActKind.RELU:
            out = relu(out)
        elif act is _abi.ActKind.GELU:
            out = gelu(out)
        return out if final == shape else out._view_as(final)
    ca, cb = _cast(a, dtype, batch), _cast(b, dtype, batch)
    out = _alloc(dev, dtype, shape)
    rank = len(shape)
    if bias is None:
        op = ops.matmul_op(ca._ref(rank), cb._ref(rank), out._ref(), act, _bufs(ca, cb, out))
    else:
        cbias = _cast(bias, dtype, batch)
        op = ops.linear_op(
            ca._ref(rank),
            cb._ref(rank),
            cbias._ref(rank),
            out._ref(),
            act,
            _bufs(ca, cb, cbias, out),
        )
    batch.append(op)
    _launch(batch, out, *inputs)
    return out if final == shape else out._view_as(final)


def matmul(x: Any, y: Any) -> Tensor:
    """``x @ y`` with numpy ``matmul`` semantics, as one device MATMUL op (no wait).

    Operands of rank 1..4 (non-tensors are uploaded with :func:`tensor`): a
    1-D ``x`` is treated as ``(1, K)`` and a 1-D ``y`` as ``(K, 1)``, the
    added axis being dropped from the result; the batch dims (all but the
    last two) broadcast like numpy's. The result dtype is the operands'
    common float dtype (:func:`result_type`; integer results become
    float32). Transposed and other strided views are read in place.

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
    dev = anchor._device if anchor is not None else default_device()
    a = _matmul_operand(x, dev, what)
    b = _matmul_operand(y, dev, what)
    dtype = _promote(a._dtype, b._dtype)
    if not dtype.is_float:
        dtype = DType.FP32
    if not dev.info.has(_abi.Cap.MATMUL):
        if a.ndim != 2 or b.ndim != 2:
            raise ValueError(
                f"{what}: the device has no MATMUL op, and the v1 GEMM takes 2-D operands only"
            )
        if a._shape[1] != b._shape[0]:
            raise ValueError(f"{what}: shapes {a.shape} and {b.shape} are not aligned")
        if 0 in a._shape or 0 in b._shape:
            return _fused(what, a, b, None, _abi.ActKind.NONE, DType.FP32, (False, False), ())
        return _gemm_2d(a, b)
    squeeze = (a.ndim == 1, b.ndim == 1)
    a2 = a._view((1, *a._shape), (0, *a._strides)) if squeeze[0] else a
    b2 = b._view((*b._shape, 1), (*b._strides, 0)) if squeeze[1] else b
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
    dev = anchor._device if anchor is not None else default_device()
    if not dev.info.has(_abi.Cap.MATMUL):
        raise ValueError(f"{what}: the device has no MATMUL/LINEAR ops (Cap.MATMUL)")
    t = _matmul_operand(x, dev, what)
    w = _matmul_operand(weight, dev, what)
    if w.ndim != 2:
        raise ValueError(f"{what}: weight must be 2-D [out_features, in_features], not {w.shape}")
    n, k = w._shape
    if t._shape[-1] != k:
        raise ValueError(
            f"{what}: x {t.shape} has {t._shape[-1]} features, weight {w.shape} takes {k}"
        )
    dtype = _promote(t._dtype, w._dtype)
    inputs = [t, w]
    b: Tensor | None = None
    if bias is not None:
        b = _matmul_operand(bias, dev, what)
        if b._shape != (n,):
            raise ValueError(f"{what}: bias shape must be ({n},), not {b.shape}")
        dtype = _promote(dtype, b._dtype)
        inputs.append(b)
    if not dtype.is_float:
        dtype = DType.FP32
    squeeze = t.ndim == 1
    a2 = t._view((1, *t._shape), (0, *t._strides)) if squeeze else t
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


def _pair(value: PairArg, what: str, lo: int) -> tuple[int, int]:
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
        if value._device is not dev:
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
        bias = _upload(np.zeros((1, out_channels, 1, 1), np.float32), dtype, dev)
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
    dev = anchor._device if anchor is not None else default_device()
    _need_conv(dev, what)
    t = _nchw(x, dev, what, "input")
    w = _nchw(weight, dev, what, "weight")
    unbatched = t.ndim == 3
    if unbatched:
        t = t._view((1, *t._shape), (0, *t._strides))
    if t.ndim != 4:
        raise ValueError(f"{what}: input must be [N, C, H, W] or [C, H, W], not {t.shape}")
    if w.ndim != 4:
        raise ValueError(f"{what}: weight must be [O, C / groups, KH, KW], not {w.shape}")
    sh, sw = _pair(stride, f"{what}: stride", 1)
    ph, pw = _pair(padding, f"{what}: padding", 0)
    dh, dw = _pair(dilation, f"{what}: dilation", 1)
    g = _pair(groups, f"{what}: groups", 1)[0]
    n, c, h, wd = t._shape
    o, cg, kh, kw = w._shape
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
    dtype = _promote(t._dtype, w._dtype)
    inputs = [t, w]
    b: Tensor | None = None
    if bias is not None:
        b = _nchw(bias, dev, what, "bias")
        if b._shape != (o,):
            raise ValueError(f"{what}: bias shape must be ({o},), not {b.shape}")
        dtype = _promote(dtype, b._dtype)
        inputs.append(b)
    if not dtype.is_float:
        dtype = DType.FP32
    shape = (n, o, oh, ow)
    final = shape[1:] if unbatched else shape
    if n == 0 or o == 0:
        return _empty(dev, dtype, final)
    if c == 0:  # no products: act(bias) everywhere, without the device op
        out = _upload(np.zeros(shape, np.float32), dtype, dev)
        if b is not None:
            out = add(out, b.astype(dtype, copy=False).reshape(1, o, 1, 1))
        if act is not _abi.ActKind.NONE:
            out = relu(out) if act is _abi.ActKind.RELU else gelu(out)
        return out._view_as(final) if unbatched else out
    batch: list[ops.AnyOp] = []
    cx, cw = _cast(t, dtype, batch), _cast(w, dtype, batch)
    cb = _zero_bias(dev, o, dtype) if b is None else _cast(b, dtype, batch)
    bias_ref = cb._view((1, o, 1, 1), (0, cb._strides[-1], 0, 0)) if cb.ndim == 1 else cb
    out = _alloc(dev, dtype, shape)
    batch.append(
        ops.conv2d_op(
            cx._ref(),
            cw._ref(),
            bias_ref._ref(),
            out._ref(),
            (sh, sw),
            (ph, pw),
            (dh, dw),
            g,
            act,
            _bufs(cx, cw, cb, out),
        )
    )
    _launch(batch, out, *inputs)
    return out._view_as(final) if unbatched else out


def _pool(
    kind: _abi.PoolKind,
    x: Any,
    kernel_size: PairArg,
    stride: PairArg | None,
    padding: PairArg,
    count_include_pad: bool,
    what: str,
) -> Tensor:
    t = _as_tensor(x, what)
    dev = t._device
    _need_conv(dev, what)
    unbatched = t.ndim == 3
    if unbatched:
        t = t._view((1, *t._shape), (0, *t._strides))
    if t.ndim != 4:
        raise ValueError(f"{what}: input must be [N, C, H, W] or [C, H, W], not {t.shape}")
    kh, kw = _pair(kernel_size, f"{what}: kernel_size", 1)
    sh, sw = (kh, kw) if stride is None else _pair(stride, f"{what}: stride", 1)
    ph, pw = _pair(padding, f"{what}: padding", 0)
    if ph >= kh or pw >= kw:
        raise ValueError(
            f"{what}: padding ({ph}, {pw}) must be smaller than the kernel ({kh}, {kw})"
        )
    n, c, h, wd = t._shape
    oh, ow = ops.window_out(h, kh, sh, ph), ops.window_out(wd, kw, sw, pw)
    if not oh or not ow:
        raise ValueError(
            f"{what}: the {kh}x{kw} window does not fit the {h}x{wd} input padded by ({ph}, {pw})"
        )
    dtype = _float_of(t._dtype)
    shape = (n, c, oh, ow)
    final = shape[1:] if unbatched else shape
    if n == 0 or c == 0:
        return _empty(dev, dtype, final)
    batch: list[ops.AnyOp] = []
    src = _cast(t, dtype, batch)
    out = _alloc(dev, dtype, shape)
    batch.append(
        ops.pool2d_op(
            kind,
            src._ref(),
            out._ref(),
            (kh, kw),
            (sh, sw),
            (ph, pw),
            count_include_pad,
            _bufs(src, out),
        )
    )
    _launch(batch, out, t)
    return out._view_as(final) if unbatched else out


def max_pool2d(
    x: Any, kernel_size: PairArg, stride: PairArg | None = None, padding: PairArg = 0
) -> Tensor:
    """Max pooling like ``torch.nn.functional.max_pool2d`` (no dilation, floor mode).

    One POOL2D op, submitted without waiting. ``x`` is ``[N, C, H, W]`` (or
    ``[C, H, W]``); ``kernel_size``, ``stride`` (default ``kernel_size``)
    and ``padding`` are ints or ``(h, w)`` pairs; padded positions never win.
    The result has ``x``'s float dtype (float32 for integers).

    Raises:
        ValueError: bad rank, a kernel/stride below 1, ``padding`` not below
            the kernel size (torch asks for at most half of it), no window
            fitting, or a device without ``Cap.CONV``.
    """
    return _pool(_abi.PoolKind.MAX, x, kernel_size, stride, padding, True, "max_pool2d")


def avg_pool2d(
    x: Any,
    kernel_size: PairArg,
    stride: PairArg | None = None,
    padding: PairArg = 0,
    count_include_pad: bool = True,
) -> Tensor:
    """Average pooling like ``torch.nn.functional.avg_pool2d`` (floor mode).

    As :func:`max_pool2d`; padded positions read zero and, with
    ``count_include_pad`` (the default), count in the divisor (the kernel
    area), else the divisor is the number of in-bounds elements.

    Raises:
        ValueError: as :func:`max_pool2d`.
    """
    return _pool(
        _abi.PoolKind.AVG, x, kernel_size, stride, padding, count_include_pad, "avg_pool2d"
    )


def global_avg_pool2d(x: Any) -> Tensor:
    """Mean over H and W of ``[N, C, H, W]`` as ``[N, C, 1, 1]`` (one POOL2D, kernel H x W).

    Like ``torch.nn.functional.adaptive_avg_pool2d(x, 1)``; a 3-D ``[C, H,
    W]`` input gives ``[C, 1, 1]``.

    Raises:
        ValueError: bad rank, an empty H or W, or a device without ``Cap.CONV``.
    """
    what = "global_avg_pool2d"
    t = _as_tensor(x, what)
    if t.ndim not in (3, 4):
        raise ValueError(f"{what}: input must be [N, C, H, W] or [C, H, W], not {t.shape}")
    h, w = t._shape[-2:]
    if not h or not w:
        raise ValueError(f"{what}: H and W must not be empty, got {t.shape}")
    return _pool(_abi.PoolKind.AVG, t, (h, w), 1, 0, True, what)
