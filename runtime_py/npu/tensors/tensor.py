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

Ops go to the thread's current stream (:func:`npu.current_stream`): the
default stream (SUBMIT to the driver's queue 0) outside any ``with
stream:``, else the user stream, launched from user space. A tensor
remembers the stream of its producing op and the last op of each stream
that read it; an op whose input (or whose output, for ``copy_``) is still
being produced on another user stream is ordered after it in the device (a
SIGNAL there, a WAIT here), a write into a tensor after its pending reads
on other streams, and across the default stream the host waits instead.
So results never depend on which stream computed an input; overlap comes
from ops that do not depend on each other.

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

This module holds :class:`Tensor`, :func:`tensor` and the launch interface
the op modules and :mod:`npu.graph` share (allocation, launching, operand
conversion, dependency tracking: public names left out of ``npu``'s
namespace); the ops live in :mod:`npu.tensors.elementwise`,
:mod:`npu.tensors.reduce`, :mod:`npu.tensors.nn` and
:mod:`npu.tensors.quant`, which register the operators' functions
(:func:`register_operator`); the dtypes live in :mod:`npu.dtypes`.

bfloat16 has no numpy dtype: :data:`bfloat16` is a sentinel dtype object;
bfloat16 data is stored as ``uint16`` words (the top half of an IEEE float32)
and :meth:`Tensor.numpy` returns it as float32 values (exact).
"""

from __future__ import annotations

import builtins
import logging
import math
import operator
import os
import weakref
from collections.abc import Callable, Iterable, Sequence
from typing import Any, Protocol, SupportsIndex, TypeAlias, TypeVar, cast

import numpy as np
import numpy.typing as npt

from .. import _abi, _spans
from ..allocator import Allocation, allocator
from ..core.buffer import Buffer
from ..core.device import (
    DEFAULT_TIMEOUT_S,
    Device,
    DeviceArg,
    Timeline,
    default_device,
    resolve_device,
)
from ..core.eager import EagerQueue, eager_queue
from ..core.stream import Stream, StreamKey, current_user_stream, failures
from ..dtypes import (
    FROM_NUMPY,
    INT_RANGE,
    NUMPY,
    BFloat16Type,
    DType,
    DTypeArg,
    TensorDType,
    bf16_to_float32,
    bfloat16,
    dtype_of,
    infer_dtype,
    public_dtype,
    storage_dtype,
    to_storage,
)
from ..errors import NpuDeviceError, NpuError
from ..kernels import ops
from ..kernels.template import BoundOp, Template

# BFloat16Type, bfloat16, DTypeArg and TensorDType are re-exported from
# npu.dtypes (they were defined here; pickles of npu.bfloat16 name npu.tensor).
__all__ = [
    "AxisArg",
    "BFloat16Type",
    "DTypeArg",
    "Tensor",
    "TensorDType",
    "bfloat16",
    "permute",
    "tensor",
]

_logger = logging.getLogger(__name__)

#: What the ``axis`` arguments of the reductions accept.
AxisArg: TypeAlias = "SupportsIndex | Sequence[SupportsIndex] | None"

# Failed fences seen by Tensor.wait, per device: (timeline, error), the
# timeline None for the driver's queue 0, else the stream's StreamKey.
_F = TypeVar("_F", bound="Callable[..., Tensor]")

#: The functions behind the tensor's operators and methods, by name,
#: registered by the op modules (npu.tensors.elementwise, .reduce, .nn) when
#: they are imported (npu.tensors imports them all). The tensor sits below
#: its ops, as PyTorch's dispatcher sits below its kernels.
OPERATORS: dict[str, Callable[..., Tensor]] = {}


def register_operator(name: str) -> Callable[[_F], _F]:
    """Make the decorated function the one behind the tensor's operator or method ``name``."""

    def register(fn: _F) -> _F:
        OPERATORS[name] = fn
        return fn

    return register


class Recorder(Protocol):
    """What captures tensor ops (an :class:`npu.Graph`): ``Device.capturing`` while it does."""

    def record(self, batch: list[ops.AnyOp], out: Tensor, inputs: Sequence[Tensor]) -> None:
        """Record ``batch``, which makes ``out`` from ``inputs``, instead of launching it."""
        ...

    def keep(self, memory: Allocation) -> None:
        """Hold ``memory`` for every replay."""
        ...

    def add_output(self, tensor: Tensor) -> None:
        """``tensor`` is made during the capture: each replay sets its fence."""
        ...


def recorder(device: Device) -> Recorder | None:
    """The :class:`Recorder` capturing the calling thread's tensor ops on ``device``, if any."""
    graph = device.capturing
    return None if graph is None else cast("Recorder", graph)


# A dependency on another stream's ops: (stream, first fence, last fence).
_Dep: TypeAlias = "tuple[Stream, int, int]"


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


def check_shape(shape: tuple[int, ...], what: str) -> None:
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
    # No __dict__: a tensor is made per op, and fewer tracked containers mean
    # cheaper garbage collections (a third of an eager op's time in the guest).
    __slots__ = (
        "__weakref__",
        "_allocation",
        "_buffer",
        "_deps",
        "_device",
        "_dtype",
        "_fence",
        "_offset",
        "_readers",
        "_refs",
        "_shape",
        "_since",
        "_stream",
        "_strides",
    )

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
        allocation: Allocation | None = None,
        stream: Stream | None = None,
        deps: tuple[_Dep, ...] = (),
    ) -> None:
        self._device = device
        # Keeps the memory of the tensor and its views allocated.
        self._allocation = allocation
        self._buffer = buffer
        self._dtype = dtype
        self._shape = shape
        self._strides = _contiguous_strides(shape) if strides is None else strides
        self._offset = offset
        self._fence = fence
        # Lowest fence of the not-yet-waited ops this tensor was computed from.
        self._since = fence if since is None else since
        # The user stream of those fences (None: the driver's queue 0), and
        # the ops of other user streams it was computed from.
        self._stream = stream
        self._deps = deps
        # tensor_ref() results by rank (a tensor's layout never changes).
        self._refs: dict[int | None, ops.TensorRef] | None = None
        # The ops that read this tensor: stream (its StreamKey, which does not
        # keep it alive; None: the driver's queue 0) -> the last such fence.
        # A write into the tensor (copy_, a graph replay) is ordered after them.
        self._readers: dict[StreamKey | None, int] | None = None
        graph = recorder(device)
        if graph is not None:  # its fence is set by each replay
            graph.add_output(self)

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
        return public_dtype(self._dtype)

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
        """The values, as PyTorch prints them: ``tensor([1., 2.], device='npu:0')``.

        numpy's formatting, summarised beyond 1000 elements; the dtype is
        shown unless it is float32. Printing waits for the tensor. While a
        graph captures (no waiting) or after a failed op the values are
        replaced by what is known.
        """
        extra = f", device='{self._device.name}'"
        if self._dtype is not DType.FP32:
            extra += f", dtype=npu.{self.dtype}"
        if self._device.capturing is not None:
            return f"tensor(<captured>, shape={self._shape}{extra})"
        try:
            values = self.numpy()
        except NpuError as exc:
            return f"tensor(<{type(exc).__name__}: {exc}>, shape={self._shape}{extra})"
        if self._dtype is DType.BF16:
            values = values.astype(np.float32)
        body = np.array2string(
            values, separator=", ", prefix="tensor(", threshold=1000, edgeitems=3
        )
        if values.size == 0:
            extra = f", size={self._shape}" + extra
        return f"tensor({body}{extra})"

    __str__ = __repr__

    # -- synchronisation and download ---------------------------------------

    def wait(self, timeout_s: float | None = DEFAULT_TIMEOUT_S) -> None:
        """Wait until the op producing this tensor (and all before it) completed.

        Raises:
            NpuDeviceError: an op this tensor depends on failed on the device
                (also when the failure was first reported through another
                tensor).
            NpuTimeoutError: not done within ``timeout_s``.
            RuntimeError: called while an :class:`npu.Graph` captures.
        """
        if self._device.capturing is not None:
            raise RuntimeError("cannot wait for a tensor while a graph is capturing")
        if _aliased_writes and self._buffer is not None:
            _wait_aliased_writes(self, timeout_s)
        if self._fence is None:
            return
        lo = self._since if self._since is not None else self._fence
        _wait_fences(self._device, self._stream, lo, self._fence, timeout_s, self)
        for stream, dep_lo, dep_hi in self._deps:
            _wait_fences(self._device, stream, dep_lo, dep_hi, timeout_s, self)
        self._fence = None
        self._since = None
        self._stream = None
        self._deps = ()

    def numpy(self, timeout_s: float | None = DEFAULT_TIMEOUT_S) -> npt.NDArray[Any]:
        """Wait for the data and return a copy as a new ndarray.

        bfloat16 tensors come back as float32 (exact values).

        Raises:
            NpuDeviceError, NpuTimeoutError: see :meth:`wait`.
        """
        self.wait(timeout_s)
        out_dtype = np.dtype(np.float32) if self._dtype is DType.BF16 else NUMPY[self._dtype]
        if self._buffer is None:
            return np.zeros(self._shape, dtype=out_dtype)
        data = np.array(self._mapped_view(writeable=False), copy=True)
        if self._dtype is DType.BF16:
            return bf16_to_float32(data)
        return data

    def to_torch(self, timeout_s: float | None = DEFAULT_TIMEOUT_S) -> Any:
        """Wait for the data and return it as a ``torch.Tensor`` sharing this memory.

        Zero-copy like ``torch.from_numpy``: the torch tensor is a view of
        the device buffer's mapping and keeps this tensor (hence its
        buffer) alive; writes through it change this tensor, so do not
        write it while queued ops read the tensor. bfloat16 tensors and
        tensors without memory come back as a float32 copy. Needs torch
        (imported here, not by ``import npu``).

        Raises:
            ImportError: torch is not installed.
            NpuDeviceError, NpuTimeoutError: see :meth:`wait`.
        """
        import torch

        self.wait(timeout_s)
        if self._buffer is None or self._dtype is DType.BF16:
            return torch.from_numpy(self.numpy(timeout_s))
        view = self._mapped_view(writeable=True).view(_OwnedArray)
        view.owner = self
        return torch.from_numpy(view)

    def _mapped_view(self, writeable: bool) -> npt.NDArray[Any]:
        """This tensor's elements as an ndarray over its buffer's mapping (no copy)."""
        assert self._buffer is not None
        item = self.itemsize
        flat = self._buffer.numpy(storage_dtype(self._dtype))
        return np.lib.stride_tricks.as_strided(
            flat[self._offset :],
            shape=self._shape,
            strides=tuple(s * item for s in self._strides),
            writeable=writeable,
        )

    def copy_(self, src: Any) -> Tensor:
        """Write ``src`` (broadcast to this shape) into this tensor's memory, in place.

        A :class:`Tensor` ``src`` is copied by the device, asynchronously,
        on the current stream (COPY, the DMA engine, when both are dense
        with one dtype; else a CONVERT); with :func:`npu.from_numpy` tensors
        on either side this is an asynchronous host-to-device or
        device-to-host copy through pinned memory. Any other ``src`` (an
        ndarray, a list, a scalar) is written by the host: that first waits
        for every op queued on the device, on every stream (they may read
        this memory). Returns ``self``.

        Raises:
            ValueError: ``src`` does not broadcast to the shape, or lives on
                another device.
            RuntimeError: a host write while a graph captures.
        """
        if isinstance(src, Tensor):
            return _device_copy(src, self)
        if self._device.capturing is not None:
            raise RuntimeError("copy_: not while a graph is capturing")
        data = np.broadcast_to(np.asarray(src), self._shape)
        for queue, fence in self._device.last_fences().items():
            done = (
                self._device.completed(queue, fence)
                if isinstance(queue, int)
                else queue.completed(fence)
            )
            if not done:
                _wait_recording_failures(self._device, queue, fence)
        if self._buffer is None:
            return self
        item = self.itemsize
        flat = self._buffer.numpy(storage_dtype(self._dtype))
        view = np.lib.stride_tricks.as_strided(
            flat[self._offset :],
            shape=self._shape,
            strides=tuple(st * item for st in self._strides),
        )
        view[...] = to_storage(np.ascontiguousarray(data), self._dtype).reshape(self._shape)
        return self

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
            self._allocation,
            self._stream,
            self._deps,
        )

    def as_strided(self, size: Sequence[int], stride: Sequence[int]) -> Tensor:
        """A view of this tensor's memory with ``size`` and ``stride`` (in elements), as
        ``torch.as_strided`` from this tensor's offset; no device work.

        Strides may be 0 (a broadcast view).

        Raises:
            ValueError: the ranks differ, a size or stride is negative, the
                rank exceeds 4, or an element lies outside the buffer.
        """
        shape = tuple(operator.index(d) for d in size)
        strides = tuple(operator.index(s) for s in stride)
        if len(shape) != len(strides) or any(d < 0 for d in shape) or any(s < 0 for s in strides):
            raise ValueError(f"as_strided: invalid size {shape} with stride {strides}")
        check_shape(shape, "as_strided")
        if math.prod(shape):
            last = self._offset + builtins.sum(
                (d - 1) * s for d, s in zip(shape, strides, strict=True)
            )
            room = 0 if self._buffer is None else self._buffer.size // self.itemsize
            if last >= room:
                raise ValueError(
                    f"as_strided: size {shape} with stride {strides} reaches element {last}"
                    f" of a buffer of {room}"
                )
        return self._view(shape, strides)

    def view(self, *shape: SupportsIndex | Sequence[SupportsIndex]) -> Tensor:
        """This contiguous tensor with another shape of the same size, as ``torch.view``.

        Raises:
            ValueError: the tensor is not contiguous (use :meth:`reshape`) or
                the sizes differ.
        """
        if not self.is_contiguous:
            raise ValueError(f"view: a tensor of strides {self._strides} is not contiguous")
        return self.reshape(*shape)

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
            self._allocation,
            self._stream,
            self._deps,
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

    def clone(self) -> Tensor:
        """A contiguous copy in new device memory, made by the device (no wait)."""
        if self.size == 0:
            return empty_tensor(self._device, self._dtype, self._shape)
        return _device_copy(self, alloc(self._device, self._dtype, self._shape))

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
        check_shape(new_shape, "reshape")
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
            base._allocation,
            base._stream,
            base._deps,
        )

    def astype(self, dtype: DTypeArg, copy: bool = True) -> Tensor:
        """Convert to ``dtype`` with a device CONVERT (result contiguous).

        Float to int truncates toward zero and saturates at the integer
        range; with ``copy=False`` a tensor that already has ``dtype`` is
        returned as is.
        """
        target = dtype_of(dtype)
        if target is self._dtype and not copy:
            return self
        if self.size == 0:
            return empty_tensor(self._device, target, self._shape)
        out = alloc(self._device, target, self._shape)
        op = ops.convert(self.tensor_ref(), out.tensor_ref(), buffers_of(self, out))
        return launch([op], out, self)

    def to(self, target: DeviceArg | DTypeArg, dtype: DTypeArg | None = None) -> Tensor:
        """This tensor on another device and/or with another dtype, as PyTorch's ``to``.

        ``to(dtype)`` is ``astype(dtype, copy=False)``. ``to(device)`` (a
        :class:`npu.Device`, an index, ``"npu:N"`` or ``"cpu"``) copies the
        values to that device through the host (after a wait); ``self`` when
        it is already there. ``to(device, dtype)`` does both.
        """
        if isinstance(target, Device) or _names_device(target):
            device = resolve_device(cast("DeviceArg", target))
            moved = self
            if device is not self._device:
                values = self.numpy()
                data = values.astype(np.float32) if self._dtype is DType.BF16 else values
                moved = upload(data, self._dtype, device)
            return moved if dtype is None else moved.astype(dtype, copy=False)
        return self.astype(cast("DTypeArg", target), copy=False)

    # -- device operands -----------------------------------------------------

    def tensor_ref(self, rank: int | None = None) -> ops.TensorRef:
        """This tensor as an op operand (:class:`npu.TensorRef`), optionally aligned to ``rank``.

        Leading dims of size 1 are prepended; every dim of size 1 gets stride 0.
        """
        refs = self._refs
        if refs is not None:
            cached = refs.get(rank)
            if cached is not None:
                return cached
        else:
            refs = self._refs = {}
        assert self._buffer is not None, "empty tensors never reach the device"
        dims = self._shape or (1,)
        strides = self._strides or (1,)
        if rank is not None and rank > len(dims):
            pad = rank - len(dims)
            dims = (1,) * pad + dims
            strides = (0,) * pad + strides
        strides = tuple(0 if d == 1 else s for d, s in zip(dims, strides, strict=True))
        ref = refs[rank] = ops.TensorRef(
            self._buffer.handle, self._dtype, self._offset * self.itemsize, dims, strides
        )
        return ref

    # -- reductions and normalisation -----------------------------------------

    def sum(
        self,
        axis: AxisArg = None,
        keepdims: bool = False,
        *,
        dim: AxisArg = None,
        keepdim: bool | None = None,
    ) -> Tensor:
        """:func:`npu.sum` of this tensor (``dim``/``keepdim``: PyTorch's names)."""
        return OPERATORS["sum"](self, axis, keepdims, dim=dim, keepdim=keepdim)

    def mean(
        self,
        axis: AxisArg = None,
        keepdims: bool = False,
        *,
        dim: AxisArg = None,
        keepdim: bool | None = None,
    ) -> Tensor:
        """:func:`npu.mean` of this tensor (``dim``/``keepdim``: PyTorch's names)."""
        return OPERATORS["mean"](self, axis, keepdims, dim=dim, keepdim=keepdim)

    def max(
        self,
        axis: AxisArg = None,
        keepdims: bool = False,
        *,
        dim: AxisArg = None,
        keepdim: bool | None = None,
    ) -> Tensor:
        """:func:`npu.max` of this tensor (``dim``/``keepdim``: PyTorch's names)."""
        return OPERATORS["max"](self, axis, keepdims, dim=dim, keepdim=keepdim)

    def min(
        self,
        axis: AxisArg = None,
        keepdims: bool = False,
        *,
        dim: AxisArg = None,
        keepdim: bool | None = None,
    ) -> Tensor:
        """:func:`npu.min` of this tensor (``dim``/``keepdim``: PyTorch's names)."""
        return OPERATORS["min"](self, axis, keepdims, dim=dim, keepdim=keepdim)

    def softmax(self, axis: SupportsIndex = -1, *, dim: SupportsIndex | None = None) -> Tensor:
        """:func:`npu.softmax` of this tensor (``dim``: PyTorch's name)."""
        return OPERATORS["softmax"](self, axis, dim=dim)

    def log_softmax(self, axis: SupportsIndex = -1, *, dim: SupportsIndex | None = None) -> Tensor:
        """:func:`npu.log_softmax` of this tensor (``dim``: PyTorch's name)."""
        return OPERATORS["log_softmax"](self, axis, dim=dim)

    # -- operators -----------------------------------------------------------

    def __add__(self, other: Any) -> Tensor:
        return OPERATORS["add"](self, other)

    def __radd__(self, other: Any) -> Tensor:
        return OPERATORS["add"](other, self)

    def __sub__(self, other: Any) -> Tensor:
        return OPERATORS["subtract"](self, other)

    def __rsub__(self, other: Any) -> Tensor:
        return OPERATORS["subtract"](other, self)

    def __mul__(self, other: Any) -> Tensor:
        return OPERATORS["multiply"](self, other)

    def __rmul__(self, other: Any) -> Tensor:
        return OPERATORS["multiply"](other, self)

    def __truediv__(self, other: Any) -> Tensor:
        return OPERATORS["divide"](self, other)

    def __rtruediv__(self, other: Any) -> Tensor:
        return OPERATORS["divide"](other, self)

    # Comparisons return bool tensors, as in numpy and PyTorch; a tensor
    # stays hashable by identity (a dict key, a set member), as torch.Tensor.
    __hash__ = object.__hash__

    def __eq__(self, other: object) -> Tensor:  # type: ignore[override]
        if not _comparable(other):
            return NotImplemented
        return OPERATORS["equal"](self, other)

    def __ne__(self, other: object) -> Tensor:  # type: ignore[override]
        if not _comparable(other):
            return NotImplemented
        return OPERATORS["not_equal"](self, other)

    def __lt__(self, other: Any) -> Tensor:
        return OPERATORS["less"](self, other)

    def __le__(self, other: Any) -> Tensor:
        return OPERATORS["less_equal"](self, other)

    def __gt__(self, other: Any) -> Tensor:
        return OPERATORS["greater"](self, other)

    def __ge__(self, other: Any) -> Tensor:
        return OPERATORS["greater_equal"](self, other)

    def __neg__(self) -> Tensor:
        return OPERATORS["negative"](self)

    def __abs__(self) -> Tensor:
        return OPERATORS["abs"](self)

    def __matmul__(self, other: Any) -> Tensor:
        return OPERATORS["matmul"](self, other)

    def __rmatmul__(self, other: Any) -> Tensor:
        return OPERATORS["matmul"](other, self)

    def __pow__(self, exponent: Any) -> Tensor:
        """``self ** exponent`` (:func:`npu.power`)."""
        return OPERATORS["power"](self, exponent)

    def __rpow__(self, base: Any) -> Tensor:
        return OPERATORS["power"](as_tensor(base, "pow", self._device), self)

    # In place, as PyTorch's ``+=``: the result is written into this tensor's
    # memory (views see it), with this tensor's dtype.
    def __iadd__(self, other: Any) -> Tensor:
        return self.copy_(self + other)

    def __isub__(self, other: Any) -> Tensor:
        return self.copy_(self - other)

    def __imul__(self, other: Any) -> Tensor:
        return self.copy_(self * other)

    def __itruediv__(self, other: Any) -> Tensor:
        return self.copy_(self / other)

    def __ipow__(self, other: Any) -> Tensor:
        return self.copy_(self**other)

    # -- PyTorch-style accessors ------------------------------------------------

    def numel(self) -> int:
        """The number of elements (``size`` as a method, as PyTorch's)."""
        return self.size

    def dim(self) -> int:
        """The rank (``ndim`` as a method, as PyTorch's)."""
        return len(self._shape)

    def cpu(self) -> Tensor:
        """This tensor on the CPU backend (``.to("cpu")``); itself if it is there."""
        return self.to("cpu")

    # -- indexing ---------------------------------------------------------------

    def __getitem__(self, key: Any) -> Tensor:
        """Basic indexing, as numpy and PyTorch: a view sharing this memory.

        Integers (negative from the end), slices with a positive step,
        ``None`` (a new axis of size 1) and one ``...``. Integer arrays,
        tensors and masks (advanced indexing) are not supported.

        Raises:
            IndexError: an index out of range, too many indices, a step of
                0 or below, or advanced indexing.
            ValueError: the view would have rank above 4.
        """
        shape, strides, offset = _index(self, key)
        if len(shape) > _abi.NPU_MAX_RANK:
            raise ValueError(f"indexing: rank {len(shape)} is above {_abi.NPU_MAX_RANK}")
        if math.prod(shape) == 0:
            return empty_tensor(self._device, self._dtype, shape)
        view = self._view(shape, strides)
        view._offset = offset
        return view

    def __setitem__(self, key: Any, value: Any) -> None:
        """``self[key] = value``: writes through the view ``self[key]``.

        A :class:`Tensor` value is copied by the device when the view is
        contiguous; a strided view, or any other value (an ndarray, a list,
        a scalar), is written by the host after the queued work (as
        :meth:`copy_`).
        """
        view = self[key]
        if isinstance(value, Tensor) and not view.is_contiguous:
            value = value.numpy()
        view.copy_(value)


# ---------------------------------------------------------------------------
# Creation and launching
# ---------------------------------------------------------------------------


def _comparable(other: object) -> bool:
    """Can ``tensor == other`` compare element-wise? (Else Python's identity
    fallback answers, as for ``t == None``.)"""
    return isinstance(other, Tensor | np.ndarray | np.generic | int | float | list | tuple)


def _names_device(arg: Any) -> bool:
    """Does a ``to()`` argument name a device (rather than a dtype)?"""
    if isinstance(arg, bool):
        return False
    if isinstance(arg, int):
        return True
    return isinstance(arg, str) and (arg == "cpu" or arg.startswith(("npu:", "/dev/")))


def _index(t: Tensor, key: Any) -> tuple[tuple[int, ...], tuple[int, ...], int]:
    """(shape, strides, offset) of the basic-indexing view ``t[key]``."""
    keys = key if isinstance(key, tuple) else (key,)
    if builtins.sum(1 for k in keys if k is Ellipsis) > 1:
        raise IndexError("an index can only have a single ellipsis ('...')")
    used = builtins.sum(1 for k in keys if k is not None and k is not Ellipsis)
    ndim = len(t._shape)
    if used > ndim:
        raise IndexError(f"too many indices for a tensor of rank {ndim}: {used}")
    expanded: list[Any] = []
    for k in keys:
        if k is Ellipsis:
            expanded.extend([slice(None)] * (ndim - used))
        else:
            expanded.append(k)
    shape: list[int] = []
    strides: list[int] = []
    offset = t._offset
    dim = 0
    for k in expanded:
        if k is None:
            shape.append(1)
            strides.append(0)
            continue
        size, stride = t._shape[dim], t._strides[dim]
        if isinstance(k, slice):
            start, stop, step = k.indices(size) if (k.step or 1) > 0 else (0, 0, 0)
            if step <= 0:
                raise IndexError(f"slice step must be positive, not {k.step}")
            length = len(range(start, stop, step))
            if length:
                offset += start * stride
            shape.append(length)
            strides.append(stride * step)
        elif isinstance(k, int | np.integer) and not isinstance(k, bool | np.bool_):
            i = operator.index(k)
            if not -size <= i < size:
                raise IndexError(f"index {i} is out of bounds for dimension {dim} with size {size}")
            offset += (i + size if i < 0 else i) * stride
        else:
            raise IndexError(
                f"only integers, slices, None and ... are valid indices, not {type(k).__name__} "
                "(advanced indexing is not supported)"
            )
        dim += 1
    shape.extend(t._shape[dim:])
    strides.extend(t._strides[dim:])
    return tuple(shape), tuple(strides), offset


def buffers_of(*tensors: Tensor) -> tuple[Buffer, ...]:
    return tuple(t._buffer for t in tensors if t._buffer is not None)


def empty_tensor(device: Device, dtype: DType, shape: tuple[int, ...]) -> Tensor:
    return Tensor(device, None, dtype, shape)


def _wait_fences(
    device: Device,
    stream: Stream | None,
    lo: int,
    hi: int,
    timeout_s: float | None,
    what: object,
) -> None:
    """Wait for fences ``lo..hi`` of a timeline (``stream`` None: the driver's
    queue 0); raise the first failure among them, also one that an earlier
    wait met (kept in the device's failure history)."""
    key = None if stream is None else stream.key
    history = failures(device)
    while True:
        for where, failure in history:
            if where is key and lo <= failure.fence <= hi:
                raise failure
        try:
            if stream is None:
                eager_queue(device).wait(hi, timeout_s)
            else:
                stream.wait_fence(hi, timeout_s)
        except NpuDeviceError as exc:
            history.append((key, exc))
            if lo <= exc.fence <= hi:
                raise
            _logger.debug("device error at fence %d does not concern %r", exc.fence, what)
            continue
        return


def _wait_recording_failures(device: Device, queue: int | Timeline, fence: int) -> None:
    """Wait for ``fence`` of a timeline (a driver queue or a stream); a device
    error met on the way is kept for the tensors it concerns."""
    history = failures(device)
    # The default stream's ops (the eager queue's) and raw ones of queue 0: None.
    key = None if isinstance(queue, int | EagerQueue) else queue
    while True:
        try:
            if isinstance(queue, int):
                device.wait(fence, timeout_s=DEFAULT_TIMEOUT_S, queue=queue)
            else:
                queue.wait(fence, DEFAULT_TIMEOUT_S)
        except NpuDeviceError as exc:
            if any(where is key and f.fence == exc.fence for where, f in history):
                # Reported again: the queue is stopped at a failed op, so
                # nothing queued after it will touch the memory.
                return
            history.append((key, exc))
            continue
        return


def alloc(device: Device, dtype: DType, shape: tuple[int, ...], host_write: bool = False) -> Tensor:
    """A new contiguous tensor with uninitialised data (an empty one has no buffer).

    The memory comes from the device's caching allocator; ``host_write``
    says the host fills it (an upload), so a reused block is first waited for.
    """
    check_shape(shape, "tensor")
    size = math.prod(shape)
    if size == 0:
        return empty_tensor(device, dtype, shape)
    stream = None if host_write else current_user_stream(device)
    graph = recorder(device)
    mem = allocator(device).allocate(
        size * dtype.itemsize,
        host_write=host_write,
        wait=_wait_recording_failures,
        stream=None if stream is None else stream.key,
        # A graph's memory is used by replays on any stream: never a block
        # that ops of any timeline may still use.
        any_timeline=graph is not None,
    )
    if graph is not None:  # the graph's ops use it at every replay
        graph.keep(mem)
    return Tensor(
        device, mem.buffer, dtype, shape, offset=mem.offset // dtype.itemsize, allocation=mem
    )


def launch(batch: list[ops.AnyOp], out: Tensor, *inputs: Tensor) -> Tensor:
    """Launch ``batch`` on the current stream (no wait); ``out`` is produced by its last op.

    While an :class:`npu.Graph` captures, the batch is recorded instead.
    """
    device = out._device
    graph = recorder(device)
    if graph is not None:
        graph.record(batch, out, inputs)
        return out
    rec = _spans.recorder
    t0 = _spans.now() if rec is not None else 0
    stream = current_user_stream(device)
    after, deps, since = dependencies(stream, inputs, out)
    if stream is None:
        eager = eager_queue(device)
        first = 0
        for op in batch:
            if isinstance(op, ops.TensorOp):
                fence = eager.launch(op.to_bytes(), True, op)
            else:
                fence = eager.launch(bytes(op.pack()), False, op)
            first = first or fence
    else:
        first, fence = stream.run_ops(batch, after)
    note_reads(inputs, stream, fence)
    first = first if since is None else builtins.min(since, first)
    note_write(out, stream, first, fence, merge_deps(deps) if deps else ())
    if rec is not None:
        _record_op(rec, batch[-1].opcode.name, t0, stream, first, fence, inputs)
    if _launch_blocking:
        out.wait()  # NPU_LAUNCH_BLOCKING=1: a failure surfaces at the op itself
    return out


def _record_op(
    rec: _spans.SpanLog,
    name: str,
    t0: int,
    stream: Stream | None,
    first: int,
    fence: int,
    inputs: tuple[Tensor, ...],
) -> None:
    """The host span of a tensor op's dispatch (the profiler is on)."""
    args: dict[str, Any] = {}
    q = stream.queue if stream is not None else None
    if q is not None:  # eager ops' fences are tickets: their SUBMIT names the driver's
        args["queue"] = q.index
        args["fences"] = (first, fence)
    if rec.record_shapes:
        args["shapes"] = [list(t._shape) for t in inputs]
    rec.add(f"tensor.{name}", t0, _spans.now(), args)


class Plan:
    """An eager op's signature, checked once: its result's dtype and shape, and
    the :class:`npu.kernels.template.Template` of its descriptor.

    The op modules make one from the first op of a signature (built and
    checked the slow way) and keep it by the signature of its inputs
    (:func:`signature`); :func:`run_plan` then launches the op again with
    only the operands' addresses patched.
    """

    __slots__ = ("dtype", "itemsizes", "nbytes", "shape", "strides", "template")

    def __init__(self, op: ops.TensorOp, dtype: DType, shape: tuple[int, ...]) -> None:
        check_shape(shape, "tensor")
        self.template = Template(op)
        self.dtype = dtype
        self.shape = shape
        self.strides = _contiguous_strides(shape)
        self.nbytes = math.prod(shape) * dtype.itemsize
        self.itemsizes = tuple(r.dtype.itemsize for r in op.operands)


def signature(t: Tensor) -> tuple[object, ...] | None:
    """What an op's plan depends on of input ``t``: its dtype, shape and strides
    (a plan holds no device: the caller checks that the inputs share one);
    None if ``t`` cannot take the fast path (empty, no buffer)."""
    if t._buffer is None:
        return None
    return (t._dtype, t._shape, t._strides)


def run_plan(plan: Plan, inputs: tuple[Tensor, ...]) -> Tensor | None:
    """Launch ``plan``'s op on ``inputs`` (of the plan's signature) into a new
    tensor; None when the slow path must (a graph captures).

    Each operand's buffer must still be live and its extent fit the buffer
    (checked here per call); the rest was checked when the plan was made.
    """
    device = inputs[0]._device
    if device.capturing is not None:
        return None
    rec = _spans.recorder
    t0 = _spans.now() if rec is not None else 0
    template = plan.template
    stream = current_user_stream(device)
    mem = allocator(device).allocate(
        plan.nbytes,
        wait=_wait_recording_failures,
        stream=None if stream is None else stream.key,
    )
    item = plan.itemsizes[-1]
    out = Tensor.__new__(Tensor)
    out._device = device
    out._allocation = mem
    out._buffer = mem.buffer
    out._dtype = plan.dtype
    out._shape = plan.shape
    out._strides = plan.strides
    out._offset = mem.offset // item
    out._refs = None
    out._readers = None
    after, deps, since = dependencies(stream, inputs)
    handles = []
    offsets = []
    bufs = []
    for t, extent, size in zip(inputs, template.extents, plan.itemsizes, strict=False):
        buf = t._buffer
        assert buf is not None
        offset = t._offset * size
        if offset + extent > buf.size:
            raise ValueError(f"{template.opcode.name}: operand {t!r} does not fit {buf!r}")
        handles.append(buf.handle)  # raises NpuError(EBADF) if freed
        offsets.append(offset)
        bufs.append(buf)
    handles.append(mem.buffer.handle)
    offsets.append(mem.offset)
    bufs.append(mem.buffer)
    bound = BoundOp(template, tuple(handles), tuple(offsets))
    if stream is None:
        fence = eager_queue(device).launch_template(template, handles, offsets, bound)
    else:
        vas = [buf.va + off for buf, off in zip(bufs, offsets, strict=True)]
        fence = stream.run_template(bound, template, vas, tuple(bufs), after)
    note_reads(inputs, stream, fence)
    out._stream = stream
    out._fence = fence
    out._since = fence if since is None else builtins.min(since, fence)
    out._deps = merge_deps(deps) if deps else ()
    if rec is not None:
        _record_op(rec, template.opcode.name, t0, stream, fence, fence, inputs)
    if _launch_blocking:
        out.wait()
    return out


def dependencies(
    stream: Stream | None, inputs: Iterable[Tensor], out: Tensor | None = None
) -> tuple[list[tuple[Stream, int]], list[_Dep], int | None]:
    """Order work about to go to ``stream`` (None: the default stream) after the
    pending ops producing ``inputs`` and ``out`` (overwritten, for ``copy_``).

    Producers on the same timeline need nothing (it runs in order). The
    default stream has no SIGNAL or WAIT, so a producer on the other side of
    it is waited for here, by the host. Returns the fences of other user
    streams the work must WAIT for, the dependencies its result inherits
    (for error reporting), and the lowest pending fence of the inputs on
    ``stream`` (None if there is none).
    """
    after: list[tuple[Stream, int]] = []
    deps: list[_Dep] = []
    since: int | None = None
    for t in inputs:
        if _aliased_writes and t._buffer is not None:
            for src, (_lo, hi) in _aliased_writes_of(t._buffer).items():
                if src is stream:
                    continue  # in order on this timeline
                if src is None or stream is None:
                    _wait_aliased_writes(t, DEFAULT_TIMEOUT_S)
                    break
                after.append((src, hi))
        if t._fence is None:
            continue
        src = t._stream
        if src is stream:
            if t._since is not None:
                since = t._since if since is None else builtins.min(since, t._since)
        elif src is None or stream is None:
            t.wait()
            continue
        else:
            after.append((src, t._fence))
            deps.append((src, t._since if t._since is not None else t._fence, t._fence))
        deps.extend(t._deps)
    if out is not None:
        order_write(out, stream, after)
    return after, deps, since


def has_readers(t: Tensor) -> bool:
    """True if ops that read ``t`` may still be pending (see :func:`order_write`)."""
    return bool(t._readers)


def note_write(
    out: Tensor, stream: Stream | None, since: int, fence: int, deps: Sequence[_Dep] = ()
) -> None:
    """``out`` is now made by ops up to ``fence`` on ``stream`` (None: the driver's
    queue 0), the oldest not waited for being ``since``, from the ops of other
    streams in ``deps`` (merged: one entry per stream, see :func:`merge_deps`);
    the write is ordered after its earlier readers."""
    out._readers = None
    out._stream = stream
    out._fence = fence
    out._since = since
    out._deps = tuple(deps)


def order_write(out: Tensor, stream: Stream | None, after: list[tuple[Stream, int]]) -> None:
    """Order a write into ``out`` on ``stream`` after the pending ops that
    produce it and those that read it on other timelines (device-side WAITs
    added to ``after`` between user streams, host waits across the default
    stream)."""
    if out._fence is not None and out._stream is not stream:
        if out._stream is None or stream is None:
            out.wait()
        else:
            after.append((out._stream, out._fence))
    readers = out._readers  # the caller clears them once the write is launched
    if not readers:
        return
    own = None if stream is None else stream.key
    device = out._device
    for key, fence in readers.items():
        if key is own:
            continue
        if key is None:  # read on the default stream
            eager = eager_queue(device)
            if not eager.completed(fence):
                _wait_recording_failures(device, eager, fence)
            continue
        reader = key.stream
        if reader is None or key.completed(fence):
            continue
        if stream is None:
            _wait_recording_failures(device, key, fence)
        else:
            after.append((reader, fence))


def note_reads(inputs: Iterable[Tensor], stream: Stream | None, fence: int) -> None:
    """Remember that ``inputs`` are read by ops up to ``fence`` of ``stream``."""
    key = None if stream is None else stream.key
    for t in inputs:
        readers = t._readers
        if readers is None:
            t._readers = {key: fence}
        else:
            readers[key] = fence


def merge_deps(deps: list[_Dep]) -> tuple[_Dep, ...]:
    """One (stream, lowest, highest fence) per stream."""
    merged: dict[Stream, tuple[int, int]] = {}
    for stream, lo, hi in deps:
        seen = merged.get(stream)
        merged[stream] = (
            (lo, hi) if seen is None else (builtins.min(lo, seen[0]), builtins.max(hi, seen[1]))
        )
    return tuple((s, lo, hi) for s, (lo, hi) in merged.items())


#: Environment variable: ``1`` makes every tensor op wait for itself (debugging).
#: Read once, when ``npu`` is imported (like ``CUDA_LAUNCH_BLOCKING``).
LAUNCH_BLOCKING_ENV = "NPU_LAUNCH_BLOCKING"
_launch_blocking = os.environ.get(LAUNCH_BLOCKING_ENV, "") == "1"


def upload(data: npt.NDArray[Any], dtype: DType, device: Device) -> Tensor:
    shape = tuple(int(d) for d in data.shape)
    check_shape(shape, "tensor")
    out = alloc(device, dtype, shape, host_write=True)
    if out._buffer is not None:
        out._buffer.write(to_storage(data, dtype), out._offset * dtype.itemsize)
    return out


def tensor(x: Any, dtype: DTypeArg | None = None, device: DeviceArg = None) -> Tensor:
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
        if device is not None:
            return x.to(device, dtype)  # a copy when it lives on another device
        return x if dtype is None else x.to(dtype)
    dev = resolve_device(device)
    if dtype is None:
        data = np.asarray(x)
        target = infer_dtype(data)
    else:
        target = dtype_of(dtype)
        data = np.asarray(x, dtype=np.float32 if target is DType.BF16 else NUMPY[target])
    return upload(data, target, dev)


def from_numpy(array: npt.NDArray[Any], device: DeviceArg = None) -> Tensor:
    """A tensor that *shares* ``array``'s memory (no copy): pinned user memory.

    Like ``torch.from_numpy``: the driver pins the pages holding the array
    (BO_USERPTR) and the tensor reads them in place, so an upload costs no
    copy. The tensor (and its views) keep the array alive and pinned.
    Writes to the array show in the tensor; do not change the array while
    queued ops read it (as with CUDA's asynchronous copies from pinned
    memory). A read-only array gives a tensor the device may only read.

    Raises:
        TypeError: a dtype other than float32, float16, int8 or int32.
        ValueError: rank > 4, an empty array, or strides that are negative
            or not multiples of the itemsize.
        NpuError: BO_USERPTR failed (e.g. ``ENOMEM`` at the per-context
            limit).
    """
    dev = resolve_device(device)
    if not isinstance(array, np.ndarray):
        raise TypeError(f"from_numpy() takes an ndarray, not {type(array).__name__}")
    if array.dtype not in FROM_NUMPY:
        raise TypeError(f"from_numpy(): unsupported dtype {array.dtype}")
    target = FROM_NUMPY[array.dtype]
    shape = tuple(int(d) for d in array.shape)
    check_shape(shape, "from_numpy")
    if array.size == 0:
        raise ValueError("from_numpy(): the array is empty")
    item = array.itemsize
    if any(st < 0 or st % item for st in array.strides):
        raise ValueError(f"from_numpy(): strides {array.strides} are not usable by the device")
    buf, offset = dev.userptr(array)
    strides = tuple(st // item for st in array.strides)
    return Tensor(dev, buf, target, shape, strides, offset // item)


def from_torch(value: Any, device: DeviceArg = None) -> Tensor:
    """A tensor of a CPU ``torch.Tensor``: shared (no copy) where the device can read it.

    A CPU tensor of float32, float16, int8 or int32 with usable strides is
    pinned in place as :func:`from_numpy` does (writes to either show in
    the other); anything else (another dtype, bfloat16, a negative or
    zero-size stride, rank > 4) is copied as :func:`tensor` would.

    Raises:
        TypeError: ``value`` is not a torch tensor, or lives on another device.
    """
    if not hasattr(value, "detach") or not hasattr(value, "is_cpu"):
        raise TypeError(f"from_torch() takes a torch.Tensor, not {type(value).__name__}")
    if not value.is_cpu:
        raise TypeError(f"from_torch(): the tensor is on {value.device}, not the CPU")
    t = value.detach()
    if str(t.dtype) == "torch.bfloat16":
        return tensor(t.float().numpy(), dtype=DType.BF16, device=device)
    arr = t.numpy()
    try:
        return from_numpy(arr, device)
    except (TypeError, ValueError):
        return tensor(np.ascontiguousarray(arr), device=device)


class _OwnedArray(np.ndarray[Any, Any]):
    """An ndarray view that keeps the :class:`Tensor` owning its memory alive."""

    owner: Any = None


def _scalar_dtype(value: Any, other: DType | None) -> DType | None:
    """dtype a Python scalar takes next to a tensor of dtype ``other`` (weak scalars)."""
    if isinstance(value, bool | int) and not isinstance(value, np.generic):
        if other is None:
            return DType.INT32
        if not other.is_float:
            lo, hi = INT_RANGE[other]
            if not lo <= int(value) <= hi:
                raise OverflowError(
                    f"Python integer {value} out of bounds for {public_dtype(other)}"
                )
        return other
    if isinstance(value, float) and not isinstance(value, np.generic):
        return other if other is not None and other.is_float else DType.FP32
    return None


def operands(x: Any, y: Any, what: str) -> tuple[Tensor, Tensor]:
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
            return upload(np.asarray(value), weak, dev)
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


def cast_to(t: Tensor, dtype: DType, batch: list[ops.AnyOp]) -> Tensor:
    """``t`` in ``dtype``, appending the CONVERT to ``batch`` if one is needed."""
    if t._dtype is dtype:
        return t
    out = alloc(t._device, dtype, t._shape)
    batch.append(ops.convert(t.tensor_ref(), out.tensor_ref(), buffers_of(t, out)))
    return out


def broadcast_shapes(a: tuple[int, ...], b: tuple[int, ...], what: str) -> tuple[int, ...]:
    if a == b:  # a tensor's shape was checked when it was made
        return a
    try:
        shape = tuple(int(d) for d in np.broadcast_shapes(a, b))
    except ValueError:
        raise ValueError(f"{what}: shapes {a} and {b} cannot be broadcast together") from None
    check_shape(shape, what)
    return shape


# Writes into memory that other tensors may view (copy_ into a view, in-place
# operators, __setitem__), by buffer: per timeline (None: the default
# stream), the first and last fence of those not waited for yet (a timeline
# runs in order, so one range per timeline covers them all and the entry
# stays small however many writes a loop makes). A view's write does not
# change the fence of the other tensors of its memory, so their waits and
# readers on other timelines look here. Usually empty.
_AliasedWrites: TypeAlias = "dict[Stream | None, tuple[int, int]]"
_aliased_writes: dict[int, tuple[weakref.ref[Buffer], _AliasedWrites]] = {}


def _aliased_writes_of(buf: Buffer) -> _AliasedWrites:
    entry = _aliased_writes.get(id(buf))
    return entry[1] if entry is not None and entry[0]() is buf else {}


def _note_aliased_write(dst: Tensor) -> None:
    buf = dst._buffer
    if buf is None or dst._fence is None:
        return
    since = dst._since if dst._since is not None else dst._fence
    key = id(buf)
    entry = _aliased_writes.get(key)
    if entry is None or entry[0]() is not buf:

        def gone(ref: weakref.ref[Buffer], key: int = key) -> None:
            found = _aliased_writes.get(key)
            if found is not None and found[0] is ref:
                del _aliased_writes[key]

        entry = _aliased_writes[key] = (weakref.ref(buf, gone), {})
    writes = entry[1]
    old = writes.get(dst._stream)
    writes[dst._stream] = (since if old is None else builtins.min(old[0], since), dst._fence)


def _wait_aliased_writes(t: Tensor, timeout_s: float | None) -> None:
    """Wait for the writes into ``t``'s buffer through views (then forget them)."""
    buf = t._buffer
    assert buf is not None
    writes = _aliased_writes_of(buf)
    if writes:
        del _aliased_writes[id(buf)]
        for stream, (lo, hi) in writes.items():
            _wait_fences(t._device, stream, lo, hi, timeout_s, t)


def _device_copy(src: Tensor, dst: Tensor) -> Tensor:
    """Queue the copy of ``src`` (broadcast to ``dst``'s shape) into ``dst``."""
    if src._device is not dst._device:
        raise ValueError("copy_: the tensors live on different devices")
    shape = broadcast_shapes(src._shape, dst._shape, "copy_")
    if shape != dst._shape:
        raise ValueError(f"copy_: shape {src._shape} does not broadcast to {dst._shape}")
    if dst.size == 0:
        return dst
    if src._buffer is None or dst._buffer is None:
        raise ValueError("copy_: an empty source cannot fill a non-empty tensor")
    same_layout = (
        src._dtype is dst._dtype
        and src._shape == dst._shape
        and src.is_contiguous
        and dst.is_contiguous
    )
    nbytes = dst.nbytes
    src_at, dst_at = src._offset * src.itemsize, dst._offset * dst.itemsize
    if same_layout and src._buffer is dst._buffer and src_at == dst_at:
        return dst  # the same memory
    disjoint = (
        src._buffer is not dst._buffer or src_at + nbytes <= dst_at or dst_at + nbytes <= src_at
    )
    op: ops.AnyOp
    if same_layout and disjoint:
        op = ops.copy(src._buffer, dst._buffer, nbytes, src_at, dst_at)
    else:
        rank = len(dst._shape) or 1
        ref = src.tensor_ref(rank)
        dims = dst._shape or (1,)
        wide = ops.TensorRef(
            ref.handle,
            ref.dtype,
            ref.offset,
            dims,
            tuple(0 if d == 1 else st for d, st in zip(ref.shape, ref.strides, strict=True)),
        )
        op = ops.convert(wide, dst.tensor_ref(), buffers_of(src, dst))
    launch([op], dst, src)
    _note_aliased_write(dst)
    return dst


def as_tensor(x: Any, what: str, device: Device | None = None) -> Tensor:
    if isinstance(x, Tensor):
        return x
    if device is not None:
        return tensor(x, device=device)
    return operands(x, 0, what)[0]


def permute(x: Tensor, axes: Iterable[SupportsIndex] | None = None) -> Tensor:
    """``x.transpose(axes)``: a strided view, no device work."""
    if axes is None:
        return x.transpose()
    return x.transpose(tuple(axes))
