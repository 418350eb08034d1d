"""Device discovery and :class:`Device`, one open NPU.

:class:`Device` sits on a backend of :mod:`npu.hal`: the driver backend
(``/dev/npuN``, ioctl and mmap) or the CPU backend (the same descriptors run
with numpy, no device needed). It checks arguments, remembers what it
submitted and turns every backend ``OSError`` into an :class:`npu.NpuError`
that keeps the errno and names the call that failed, in the driver's terms
(``BO_CREATE(size=...)``, ``SUBMIT(...)``, ``WAIT(...)``).

A device is named by an index ``N`` or ``"npu:N"`` (``/dev/npuN``), a node
path, or ``"cpu"`` (the CPU backend); ``$NPU_BACKEND=cpu`` makes the CPU
backend the default device.
"""

from __future__ import annotations

import ctypes
import dataclasses
import errno
import glob
import logging
import mmap
import operator
import os
import re
import threading
import time
import weakref
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final, Protocol, SupportsIndex, TypeVar, cast

from .. import _abi, _spans
from .._closing import Closing
from ..errors import (
    DEFAULT_TIMEOUT_S,
    DeviceNotFoundError,
    NpuDeviceError,
    NpuError,
    NpuTimeoutError,
)
from ..hal import Backend, BoInfo, CpuBackend, DriverBackend, WaitFailed
from ..kernels.ops import AnyOp, Op, TensorOp
from ..kernels.template import BoundOp
from .buffer import Buffer, UserBuffer
from .userqueue import UserQueue

if TYPE_CHECKING:
    import numpy.typing as npt


__all__ = [
    "DEFAULT_TIMEOUT_S",
    "Device",
    "DeviceInfo",
    "FenceInfo",
    "PackedOps",
    "close_default_device",
    "default_device",
    "devices",
    "open_device",
    "resolve_device",
    "set_default_device",
]

log = logging.getLogger(__name__)


_DEV_DIR = "/dev"
#: The driver's devices are DRM accel devices (/dev/accel/accelN); udev links
#: each as /dev/npuN (guest/99-npu.rules), N the accel index.
_UDEV_SUBSYSTEM = "accel"
_DRIVER = "npu"
_NODE_RE = re.compile(r"npu(\d+)$")
# WAIT with timeout_s=None is issued in slices of this length.
_FOREVER_SLICE_NS = 60 * 10**9
# Submissions remembered per queue to name the op of a device error.
_INFLIGHT_HISTORY = 1024
_PAGE = mmap.PAGESIZE
_FD_MAX = (1 << 31) - 1  # file descriptors are C ints
_TIMEOUT_ERRNOS = frozenset({errno.ETIMEDOUT, errno.ETIME})
_T = TypeVar("_T")
_INDEX_RE = re.compile(r"npu:(\d+)$")
#: The name of the CPU backend wherever a device is named.
CPU: Final = "cpu"


class Timeline(Protocol):
    """A fence sequence other than the driver's queues: a stream's (``npu.core.stream.StreamKey``).

    The device keeps each one's last launched fence (:meth:`Device.note_timeline`)
    for the caching allocator and ``npu.synchronize()``, without knowing
    streams.
    """

    def completed(self, fence: int) -> bool:
        """True if ``fence`` has completed (no system call)."""
        ...

    def wait(self, fence: int, timeout_s: float | None = ...) -> None:
        """Wait for ``fence``; device errors raise."""
        ...


class Deferred(Protocol):
    """Work held back from the driver's queue 0 (the default stream's batch of
    eager ops, ``npu.core.eager.EagerQueue``): flushed before any other SUBMIT
    so that queue 0 keeps program order, and at :meth:`Device.close`."""

    def flush(self) -> None:
        """Submit what is held back."""
        ...

    def close(self) -> None:
        """Flush, then stop holding work back."""
        ...


# ---------------------------------------------------------------------------
# Discovery
# ---------------------------------------------------------------------------


def _node_key(path: str) -> tuple[int, str]:
    match = _NODE_RE.search(os.path.basename(path))
    return (int(match.group(1)) if match else -1, path)


def _udev_nodes() -> list[str]:
    """The ``/dev/npuN`` links of the accel devices the ``npu`` driver drives, according
    to udev (their ``/dev/accel/accelN`` nodes where a link is missing; [] if unavailable)."""
    try:
        import pyudev
    except ImportError:
        log.debug("pyudev is not installed; skipping udev discovery")
        return []
    nodes: list[str] = []
    try:
        context = pyudev.Context()
        for dev in context.list_devices(subsystem=_UDEV_SUBSYSTEM):
            pci = dev.find_parent("pci")
            if pci is None or pci.driver != _DRIVER or not dev.device_node:
                continue
            link = os.path.join(_DEV_DIR, f"npu{dev.sys_number}")
            nodes.append(link if os.path.exists(link) else str(dev.device_node))
    except Exception as exc:  # libudev missing, no /sys, ...: fall back to the glob
        log.debug("udev discovery failed: %s", exc)
        return []
    return nodes


def _glob_nodes(dev_dir: str = _DEV_DIR) -> list[str]:
    """Paths ``<dev_dir>/npuN`` that exist."""
    candidates = glob.glob(os.path.join(glob.escape(dev_dir), "npu[0-9]*"))
    return [path for path in candidates if _NODE_RE.fullmatch(os.path.basename(path))]


def devices() -> list[str]:
    """Return the NPU device nodes of this machine, sorted by index.

    udev (accel devices of the ``npu`` driver) is asked first; when it knows of no device (or
    pyudev/libudev is unavailable) ``/dev/npu*`` is globbed. Returns ``[]``
    when there is no NPU.
    """
    nodes = _udev_nodes()
    if not nodes:
        nodes = _glob_nodes(_DEV_DIR)
    return sorted(set(nodes), key=_node_key)


def node_path(device: int | str | os.PathLike[str]) -> str:
    """The device node path of an index ``N`` or ``"npu:N"`` (``/dev/npuN``), or a path."""
    if isinstance(device, bool):
        raise TypeError("device must be an index or a path, not bool")
    if isinstance(device, str) and (match := _INDEX_RE.fullmatch(device)):
        device = int(match.group(1))
    if isinstance(device, int):
        if device < 0:
            raise ValueError(f"device index {device} is negative")
        return os.path.join(_DEV_DIR, f"npu{device}")
    return os.fspath(device)


#: What names a device: an index, ``"npu:N"``, a node path, ``"cpu"`` or a backend.
DeviceSpec = int | str | os.PathLike[str] | Backend


def open_backend(device: DeviceSpec) -> Backend:
    """The backend a device name stands for (see :class:`Device`).

    Raises:
        DeviceNotFoundError: no such device node (``ENOENT``, ``ENODEV``, ``ENXIO``).
        NpuError: the node could not be opened (e.g. ``EACCES``).
    """
    if isinstance(device, Backend):
        return device
    if device == CPU:
        return CpuBackend()
    path = node_path(device)
    context = f"open({path})"
    try:
        return DriverBackend(path)
    except OSError as exc:
        if exc.errno in (errno.ENOENT, errno.ENODEV, errno.ENXIO):
            raise DeviceNotFoundError(context, exc.errno, exc.strerror) from exc
        raise NpuError.from_oserror(exc, context) from exc


# ---------------------------------------------------------------------------
# Device
# ---------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class DeviceInfo:
    """What GET_INFO reports about a device (``struct npu_info``)."""

    path: str
    hw_version: int
    abi_version: int
    driver_version: int
    caps: _abi.Cap
    num_queues: int
    num_cores: int
    max_submit: int
    ring_entries: int
    max_bo_size: int
    pci_vendor: int
    pci_device: int
    user_queues: int = 0  # hardware queues QUEUE_CREATE can lend
    device_memory: int = 0  # bytes of device memory (BAR2), 0: none

    @property
    def hw_version_str(self) -> str:
        """Hardware version as ``"major.minor"``."""
        return _version_str(self.hw_version)

    @property
    def driver_version_str(self) -> str:
        """Driver version as ``"major.minor"``."""
        return _version_str(self.driver_version)

    def has(self, cap: _abi.Cap) -> bool:
        """True if the device has every capability bit in ``cap``."""
        return (self.caps & cap) == cap


def _version_str(version: int) -> str:
    return f"{version >> 16}.{version & 0xFFFF}"


@dataclass(frozen=True, slots=True)
class FenceInfo:
    """What the device recorded for a completed op (:meth:`Device.fence_info`).

    ``t_start_ns``/``t_end_ns`` are the device clock when the op started and
    completed; ``status`` is its ``npu.Status`` value.
    """

    fence: int
    status: int
    t_start_ns: int
    t_end_ns: int


@dataclass(frozen=True, slots=True)
class PackedOps:
    """A run of ops of one format, packed for one SUBMIT (:meth:`Device.pack`)."""

    ops: tuple[AnyOp, ...]
    tensor: bool
    raw: ctypes.Array[Any]
    buffers: tuple[Buffer, ...]  # each distinct runtime buffer the ops name


@dataclass(frozen=True, slots=True)
class _Submitted:
    first_fence: int
    last_fence: int
    ops: tuple[object, ...]  # AnyOp, or a BoundOp made into one when asked


class Device(Closing):
    """An open NPU device (``/dev/npuN``).

    Args:
        device: an index ``N`` (opens ``/dev/npuN``) or a device node path.

    Raises:
        DeviceNotFoundError: the node does not exist (``ENOENT``) or has no
            device behind it (``ENODEV``/``ENXIO``).
        NpuError: any other ``open`` failure (e.g. ``EACCES``).

    A device is a context manager; :meth:`close` frees every buffer still
    allocated from it and closes the file descriptor. Methods called after
    :meth:`close` raise :class:`NpuError` with ``errno.EBADF``.
    """

    def __init__(self, device: DeviceSpec = 0) -> None:
        backend = open_backend(device)
        self.path = backend.path
        self._backend = backend
        self._closer = weakref.finalize(self, backend.close)
        self._info: DeviceInfo | None = None
        self._buffers: weakref.WeakSet[Buffer] = weakref.WeakSet()
        self._queues: weakref.WeakSet[UserQueue] = weakref.WeakSet()
        # Device VAs from BO_CREATE / BO_USERPTR, until alloc() takes them.
        self._bo_vas: dict[int, int] = {}
        self._lock = threading.Lock()
        # Serializes import_dmabuf: a dma-buf imported twice gives one handle, one Buffer.
        self._import_lock = threading.Lock()
        self._inflight: dict[int, deque[_Submitted]] = {}
        # Per queue: the last fence submitted, and the highest fence a WAIT
        # saw complete (what the caching allocator checks before it lets the
        # host write into a reused block).
        self._submitted: dict[int, int] = {}
        self._completed: dict[int, int] = {}
        # Per live timeline with work (an npu.Stream's StreamKey): the fence
        # of its last launch, for the caching allocator and npu.synchronize().
        # Written by the stream, read without a lock.
        self._timelines: dict[Timeline, int] = {}
        # Per thread: what captures its work (an npu.Graph), if anything.
        self._capture = threading.local()
        # How many threads capture now: 0 makes `capturing` free (eager ops ask it).
        self._captures = 0
        # Per-device state of the layers above (the caching allocator, the
        # default stream), by factory; guarded by _attach_lock, dropped at close.
        self._attachments: dict[Callable[[Device], object], object] = {}
        self._attach_lock = threading.RLock()
        # What holds eager ops back from queue 0, if anything (set once).
        self._deferred: Deferred | None = None
        log.debug("opened %s (%s backend)", self.path, backend.kind)

    # -- lifetime -----------------------------------------------------------

    @property
    def closed(self) -> bool:
        """True once :meth:`close` has run."""
        return not self._closer.alive

    @property
    def backend(self) -> Backend:
        """The :mod:`npu.hal` backend (raises :class:`NpuError` ``EBADF`` once closed)."""
        if self.closed:
            raise NpuError(errno.EBADF, "device is closed", f"Device({self.path})")
        return self._backend

    @property
    def name(self) -> str:
        """``"npu:N"`` for ``/dev/npuN``, ``"cpu"`` for the CPU backend, else the path."""
        match = _NODE_RE.fullmatch(os.path.basename(self.path))
        if self.path == os.path.join(_DEV_DIR, os.path.basename(self.path)) and match:
            return f"npu:{match.group(1)}"
        return self.path

    @property
    def kind(self) -> str:
        """``"driver"`` or ``"cpu"``: which backend runs the ops."""
        return self._backend.kind

    def fileno(self) -> int:
        """A pollable file descriptor (raises :class:`NpuError` ``EBADF`` once closed)."""
        return self.backend.fileno()

    def close(self) -> None:
        """Close its user queues, free its buffers and close the file. Idempotent."""
        if self.closed:
            return
        deferred, self._deferred = self._deferred, None
        if deferred is not None:
            try:
                deferred.close()
            except NpuError as exc:
                log.warning("flushing eager ops while closing %s failed: %s", self.path, exc)
        with self._attach_lock:
            self._attachments.clear()
        for queue in list(self._queues):
            try:
                queue.close()
            except NpuError as exc:
                log.warning("closing %r while closing %s failed: %s", queue, self.path, exc)
        self._bo_vas.clear()
        for buf in list(self._buffers):
            try:
                buf.free()
            except NpuError as exc:
                log.warning("freeing %r while closing %s failed: %s", buf, self.path, exc)
        self._closer()
        log.debug("closed %s", self.path)

    def __repr__(self) -> str:
        state = "closed" if self.closed else self._backend.kind
        return f"<npu.Device {self.path} {state}>"

    # -- graph capture --------------------------------------------------------------

    @property
    def capturing(self) -> object | None:
        """What captures the calling thread's work on this device (an :class:`npu.Graph`), if any.

        Capture is per thread (PyTorch's ``thread_local`` capture mode): ops
        other threads issue meanwhile run as usual and are not recorded.
        While a thread captures, :meth:`submit` refuses its raw ops.
        """
        if not self._captures:
            return None
        graph: object | None = getattr(self._capture, "graph", None)
        return graph

    def begin_capture(self, graph: object) -> None:
        """Make ``graph`` record the calling thread's tensor ops (:meth:`npu.Graph.capture`).

        Raises:
            RuntimeError: the thread already captures a graph on this device.
        """
        if self.capturing is not None:
            raise RuntimeError("Graph.capture: this thread already captures a graph on the device")
        with self._lock:
            self._captures += 1
        self._capture.graph = graph

    def end_capture(self, graph: object) -> None:
        """End the calling thread's capture of ``graph``."""
        if self.capturing is graph:
            self._capture.graph = None
            with self._lock:
                self._captures -= 1

    # -- state of the layers above ------------------------------------------------

    def attachment(self, factory: Callable[[Device], _T]) -> _T:
        """The object ``factory(self)`` made on the first call with ``factory``; the same one after.

        The layers above keep their per-device state here (the caching
        allocator, the default stream) without the device knowing them. The
        objects are dropped at :meth:`close`.
        """
        found = self._attachments.get(factory)  # the fast path: no lock
        if found is not None:
            return cast("_T", found)
        with self._attach_lock:
            found = self._attachments.get(factory)
            if found is None:
                found = factory(self)
                self._attachments[factory] = found
        return cast("_T", found)

    def defer_to(self, deferred: Deferred) -> None:
        """Let ``deferred`` hold work back from queue 0 (see :class:`Deferred`).

        Raises:
            RuntimeError: another object does already.
        """
        if self._deferred is not None and self._deferred is not deferred:
            raise RuntimeError("defer_to: the device already defers to another object")
        self._deferred = deferred

    def flush_deferred(self) -> None:
        """Submit the work held back from queue 0 (see :class:`Deferred`), if any."""
        if self._deferred is not None:
            self._deferred.flush()

    def note_timeline(self, timeline: Timeline, fence: int) -> None:
        """``fence`` is the last one launched on ``timeline`` (called by npu.Stream)."""
        self._timelines[timeline] = fence

    def forget_timeline(self, timeline: Timeline) -> None:
        """``timeline`` is gone: none of its work can touch memory any more."""
        self._timelines.pop(timeline, None)

    def last_fences(self) -> dict[int | Timeline, int]:
        """The last fence launched on each queue and each live timeline (a copy).

        Takes no lock, so a finalizer may call it whatever the thread holds:
        each ``dict(d)`` copy is one step under the GIL.
        """
        fences: dict[int | Timeline, int] = {}
        fences.update(cast("dict[int | Timeline, int]", self._submitted))  # one GIL step
        if self._timelines:  # (keys hash in C: no Python code runs inside)
            fences.update(cast("dict[int | Timeline, int]", self._timelines))
        return fences

    # -- backend calls -----------------------------------------------------------

    def _call(
        self,
        context: str | Callable[[], str],
        fn: Callable[..., _T],
        *args: int | ctypes.Array[Any],
        retry_eintr: bool = False,
    ) -> _T:
        """``fn(*args)`` on the backend; its OSError -> NpuError naming ``context``.

        With ``retry_eintr`` a call interrupted by a signal (``EINTR``, which
        the driver only returns before doing anything) is issued again once
        the signal handlers have run.
        """
        while True:
            try:
                return fn(*args)
            except InterruptedError as exc:
                if retry_eintr:
                    continue
                text = context if isinstance(context, str) else context()
                raise NpuError.from_oserror(exc, text) from exc
            except OSError as exc:
                text = context if isinstance(context, str) else context()
                raise NpuError.from_oserror(exc, text) from exc

    @property
    def info(self) -> DeviceInfo:
        """Device properties from GET_INFO (queried once, then cached)."""
        if self._info is None:
            raw = self._call("GET_INFO", self.backend.query)
            fields = {f.name: getattr(raw, f.name) for f in dataclasses.fields(raw)}
            self._info = DeviceInfo(path=self.path, **{**fields, "caps": _abi.Cap(raw.caps)})
        return self._info

    def bo_create(
        self, size: SupportsIndex, *, device_memory: bool = False
    ) -> tuple[int, int, int]:
        """Create a buffer object (BO_CREATE).

        Args:
            size: bytes (rounded up to pages).
            device_memory: place it in the device's own memory (BAR2,
                ``NPU_BO_DEVICE``) instead of host pages.

        Returns:
            ``(handle, mmap_offset, alloc_size)``. The buffer's device
            virtual address is remembered for :meth:`alloc` (``Buffer.va``).

        Raises:
            ValueError: ``size`` is not a u64.
            NpuError: the driver refused, e.g. ``EINVAL`` for ``size=0``,
                ``ENOMEM``, or ``EOPNOTSUPP`` for device memory on a device
                without it; the context reads ``"BO_CREATE(size=...)"``.
        """
        size = _check_u(f"BO_CREATE size={size}", size, _abi.U64_MAX)
        flags = _abi.NPU_BO_DEVICE if device_memory else 0
        what = f"BO_CREATE(size={size}{', device memory' if device_memory else ''})"
        arg = self._call(what, self.backend.bo_create, size, flags)
        self._bo_vas[arg.handle] = arg.va
        log.debug(
            "BO_CREATE size=%d -> handle=%d offset=%#x alloc=%d va=%#x",
            size,
            arg.handle,
            arg.mmap_offset,
            arg.alloc_size,
            arg.va,
        )
        return arg.handle, arg.mmap_offset, arg.alloc_size

    def bo_destroy(self, handle: int) -> None:
        """Destroy a buffer object (BO_DESTROY).

        Raises:
            NpuError: e.g. ``ENOENT``/``EINVAL`` for an unknown handle.
        """
        handle = _check_u(f"BO_DESTROY handle={handle}", handle, _abi.U32_MAX)
        self._call(f"BO_DESTROY(handle={handle})", self.backend.bo_destroy, handle)
        self._bo_vas.pop(handle, None)
        log.debug("BO_DESTROY handle=%d", handle)

    def bo_info(self, handle: int) -> BoInfo:
        """What the driver reports of buffer object ``handle`` (BO_INFO).

        Returns:
            An :class:`npu.hal.BoInfo`: ``handle``, ``mmap_offset``,
            ``alloc_size`` (the object's size), ``va`` (its device address in
            this file's address space) and ``flags`` (``NPU_BO_INFO_*``:
            device memory, user pointer, imported, read-only).

        Raises:
            NpuError: ``ENOENT`` for an unknown handle; the context reads
                ``"BO_INFO(handle=...)"``.
        """
        handle = _check_u(f"BO_INFO handle={handle}", handle, _abi.U32_MAX)
        return self._call(f"BO_INFO(handle={handle})", self.backend.bo_info, handle)

    def submit(self, ops: Sequence[AnyOp], queue: int = 0) -> int:
        """Submit operations to a queue (SUBMIT) and return the fence of the last one.

        The ops run in order and get consecutive fences. Completion is
        observed with :meth:`wait`. A SUBMIT interrupted by a signal while
        the driver waits for ring space is retried.

        One SUBMIT carries one kind of op array: ``struct npu_op``
        (:class:`npu.ops.Op`) or ``struct npu_tensor_op``
        (:class:`npu.ops.TensorOp`). A sequence that mixes the two is split
        into consecutive SUBMITs of one kind each, in order, so the fences
        still increase op by op. Such a split is not atomic: if a later
        SUBMIT is refused, the earlier ones are already queued.

        Raises:
            ValueError: no ops, more than ``NPU_SUBMIT_MAX_OPS``, or an op uses
                a buffer of another device.
            TypeError: an element is neither an ``Op`` nor a ``TensorOp``.
            NpuError: a buffer was freed (``EBADF``) or the driver refused the
                submission (e.g. ``EINVAL``, ``ENOENT`` for an unknown handle,
                ``ERANGE`` for a tensor past the end of its buffer).
        """
        if self.capturing is not None:
            raise RuntimeError("submit: raw ops are not recorded while a graph captures")
        batch = tuple(ops)
        if not batch:
            raise ValueError("submit: no ops")
        if len(batch) > _abi.NPU_SUBMIT_MAX_OPS:
            raise ValueError(
                f"submit: {len(batch)} ops, at most {_abi.NPU_SUBMIT_MAX_OPS} per submission"
            )
        queue = _check_u(f"SUBMIT queue={queue}", queue, _abi.U32_MAX)
        if self._deferred is not None:
            self._deferred.flush()  # queue 0 in program order
        for op in batch:
            if not isinstance(op, Op | TensorOp):
                raise TypeError(f"submit: {op!r} is not an npu.ops.Op or npu.ops.TensorOp")
            for buf in op.buffers:
                if isinstance(buf, Buffer):
                    if buf.device is not self:
                        raise ValueError(f"submit: {op} uses {buf!r} of {buf.device!r}")
                    buf.handle  # noqa: B018 - raises NpuError(EBADF) if freed
        fence = 0
        start = 0
        while start < len(batch):
            tensor = isinstance(batch[start], TensorOp)
            end = start + 1
            while end < len(batch) and isinstance(batch[end], TensorOp) == tensor:
                end += 1
            fence = self._submit_one_kind(batch[start:end], queue, tensor)
            start = end
        return fence

    def pack(self, ops: Sequence[AnyOp]) -> list[PackedOps]:
        """Pack ``ops`` once into SUBMIT-ready arrays (for :meth:`submit_packed`).

        The ops are split into runs of one op format and at most
        ``NPU_SUBMIT_MAX_OPS`` ops each. The packed arrays keep the ops (and
        through them their buffers) alive.

        Raises:
            TypeError: an element is neither an ``Op`` nor a ``TensorOp``.
        """
        batch = tuple(ops)
        runs: list[PackedOps] = []
        start = 0
        while start < len(batch):
            if not isinstance(batch[start], Op | TensorOp):
                raise TypeError(f"pack: {batch[start]!r} is not an npu.ops.Op or TensorOp")
            tensor = isinstance(batch[start], TensorOp)
            end = start + 1
            while (
                end < len(batch)
                and end - start < _abi.NPU_SUBMIT_MAX_OPS
                and isinstance(batch[end], TensorOp) == tensor
            ):
                end += 1
            run = batch[start:end]
            struct: type[ctypes.Structure] = _abi.NpuTensorOp if tensor else _abi.NpuOp
            raw = (struct * len(run))()
            bufs: dict[int, Buffer] = {}
            for i, op in enumerate(run):
                raw[i] = op.pack()
                for buf in op.buffers:
                    if isinstance(buf, Buffer):
                        if buf.device is not self:
                            raise ValueError(f"pack: {op} uses {buf!r} of {buf.device!r}")
                        bufs[id(buf)] = buf
            runs.append(PackedOps(run, tensor, raw, tuple(bufs.values())))
            start = end
        return runs

    def submit_packed(self, packed: Sequence[PackedOps], queue: int = 0) -> int:
        """Submit ops packed by :meth:`pack` (one SUBMIT per run); the last fence.

        Nothing is re-validated or re-packed here, which is what makes a
        replay cheap; the driver still checks every op. Only that no buffer
        the ops name was freed meanwhile is checked (its handle could name
        another buffer object by now).

        Raises:
            ValueError: nothing to submit.
            NpuError: a buffer was freed (``EBADF``), or as :meth:`submit`.
        """
        if not packed:
            raise ValueError("submit_packed: no ops")
        queue = _check_u(f"SUBMIT queue={queue}", queue, _abi.U32_MAX)
        for run in packed:
            for buf in run.buffers:
                buf.handle  # noqa: B018 - raises NpuError(EBADF) if freed
        if self._deferred is not None:
            self._deferred.flush()  # queue 0 in program order
        fence = 0
        for run in packed:
            fence = self._submit_one_kind(run.ops, queue, run.tensor, run.raw)
        return fence

    def submit_records(
        self, data: bytes | ctypes.Array[Any], count: int, tensor: bool, ops: Sequence[object]
    ) -> int:
        """SUBMIT ``count`` packed descriptors to queue 0 as they are (no flush of
        deferred work: the deferring object calls this); the last fence.

        ``data`` holds ``struct npu_tensor_op`` records (``tensor``) or
        ``struct npu_op`` ones, made from checked ops (a
        :class:`npu.kernels.template.Template`); ``ops`` name them in errors
        (an op, or a :class:`npu.kernels.template.BoundOp`).

        Raises:
            ValueError: ``count`` is not in 1..NPU_SUBMIT_MAX_OPS or ``data``
                is not ``count`` records.
            NpuError: the driver refused the submission.
        """
        struct: type[ctypes.Structure] = _abi.NpuTensorOp if tensor else _abi.NpuOp
        size = ctypes.sizeof(data) if isinstance(data, ctypes.Array) else len(data)
        if not 1 <= count <= _abi.NPU_SUBMIT_MAX_OPS or size != count * ctypes.sizeof(struct):
            raise ValueError(f"submit_records: {size} bytes are not {count} records")
        raw = data if isinstance(data, ctypes.Array) else (struct * count).from_buffer_copy(data)
        return self._submit_one_kind(tuple(ops), 0, tensor, raw)

    def _submit_one_kind(
        self,
        batch: tuple[object, ...],
        queue: int,
        tensor: bool,
        raw_ops: ctypes.Array[Any] | None = None,
    ) -> int:
        """One SUBMIT of ops that are all ``TensorOp`` (``tensor``) or all ``Op``."""
        struct: type[ctypes.Structure] = _abi.NpuTensorOp if tensor else _abi.NpuOp
        if raw_ops is None:
            if tensor:  # packed by the struct module, then one copy into ctypes
                data = b"".join(cast("TensorOp", op).to_bytes() for op in batch)
                raw_ops = (struct * len(batch)).from_buffer_copy(data)
            else:
                raw_ops = (struct * len(batch))()
                for i, op in enumerate(batch):
                    raw_ops[i] = cast("Op", op).pack()

        def context() -> str:
            shown = ", ".join(str(op) for op in batch[:4])
            more = ", ..." if len(batch) > 4 else ""
            return f"SUBMIT(queue={queue}, num_ops={len(batch)}, ops=[{shown}{more}])"

        rec = _spans.recorder
        t0 = _spans.now() if rec is not None else 0
        fence = self._call(
            context,
            self.backend.submit,
            raw_ops,
            ctypes.sizeof(struct),
            queue,
            retry_eintr=True,
        )
        if rec is not None:
            rec.add(
                "Device.submit",
                t0,
                _spans.now(),
                {"queue": queue, "fences": (fence - len(batch) + 1, fence), "ops": len(batch)},
            )
        with self._lock:
            history = self._inflight.setdefault(queue, deque(maxlen=_INFLIGHT_HISTORY))
            history.append(_Submitted(fence - len(batch) + 1, fence, batch))
            self._submitted[queue] = fence
        log.debug(
            "SUBMIT queue=%d num_ops=%d op_size=%d -> fence %d",
            queue,
            len(batch),
            ctypes.sizeof(struct),
            fence,
        )
        return fence

    def wait(self, fence: int, timeout_s: float | None = DEFAULT_TIMEOUT_S, queue: int = 0) -> None:
        """Wait until ``fence`` has completed on ``queue`` (WAIT).

        Args:
            fence: a fence returned by :meth:`submit`.
            timeout_s: seconds to wait; ``0`` polls, ``None`` waits forever.
            queue: the queue the fence belongs to.

        Raises:
            NpuDeviceError: an op up to ``fence`` failed on the device
                (``EIO``); carries ``status``, ``status_name``, ``fence`` (the
                failed op's) and ``op``.
            NpuTimeoutError: the fence did not complete in time.
            NpuError: any other failure, e.g. ``EINVAL`` for a fence never
                submitted.
        """
        fence = _check_u(f"WAIT fence={fence}", fence, _abi.U64_MAX)
        queue = _check_u(f"WAIT queue={queue}", queue, _abi.U32_MAX)
        if timeout_s is not None and not timeout_s >= 0:
            raise ValueError(f"WAIT timeout_s={timeout_s} must be >= 0 or None")
        backend = self.backend
        context = f"WAIT(fence={fence}, queue={queue}, timeout_s={timeout_s})"
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        rec = _spans.recorder
        t0 = _spans.now() if rec is not None else 0
        while True:
            if deadline is None:
                timeout_ns = _FOREVER_SLICE_NS
            else:
                remaining = max(0.0, deadline - time.monotonic())
                timeout_ns = min(int(remaining * 1e9), _abi.U64_MAX)
            try:
                backend.wait(fence, timeout_ns, queue)
            except InterruptedError:
                continue  # signal handlers have run; wait for the remaining time
            except OSError as exc:
                if exc.errno in _TIMEOUT_ERRNOS:
                    if deadline is None:
                        continue
                    raise NpuTimeoutError(
                        fence, timeout_s or 0.0, context, exc.errno, exc.strerror
                    ) from exc
                if isinstance(exc, WaitFailed) and exc.errno == errno.EIO:
                    error_fence = exc.error_fence
                    raise NpuDeviceError(
                        exc.status,
                        error_fence,
                        self._find_op(queue, error_fence),
                        context,
                        errno.EIO,
                        exc.strerror,
                    ) from exc
                raise NpuError.from_oserror(exc, context) from exc
            break
        with self._lock:
            history = self._inflight.get(queue)
            while history and history[0].last_fence <= fence:
                history.popleft()
            if fence > self._completed.get(queue, 0):
                self._completed[queue] = fence
        if rec is not None:
            rec.add("Device.wait", t0, _spans.now(), {"queue": queue, "fence": fence})
        log.debug("WAIT queue=%d fence=%d done", queue, fence)

    def fence_info(self, fence: int, queue: int = 0) -> FenceInfo:
        """The device status and timestamps of a completed fence (FENCE_INFO).

        Raises:
            NpuError: ``EINVAL`` (a fence never submitted), ``EBUSY`` (not
                completed yet), ``ENOENT`` (its record was reused: more than
                ``ring_entries`` later ops, or a device reset).
        """
        fence = _check_u(f"FENCE_INFO fence={fence}", fence, _abi.U64_MAX)
        queue = _check_u(f"FENCE_INFO queue={queue}", queue, _abi.U32_MAX)
        times = self._call(
            f"FENCE_INFO(fence={fence}, queue={queue})", self.backend.fence_info, fence, queue
        )
        return FenceInfo(fence, times.status, times.t_start, times.t_end)

    def submitted_fences(self) -> dict[int, int]:
        """The last fence submitted on each queue used so far (a copy)."""
        with self._lock:
            return dict(self._submitted)

    def completed(self, queue: int, fence: int) -> bool:
        """True if a WAIT has already seen ``fence`` complete on ``queue`` (no ioctl)."""
        return self._completed.get(queue, 0) >= fence

    def run(
        self, ops: Sequence[AnyOp], queue: int = 0, timeout_s: float | None = DEFAULT_TIMEOUT_S
    ) -> int:
        """Submit ``ops`` and wait for them; return the fence of the last one."""
        fence = self.submit(ops, queue)
        self.wait(fence, timeout_s=timeout_s, queue=queue)
        return fence

    def alloc(self, size: SupportsIndex, *, device_memory: bool = False) -> Buffer:
        """Allocate and map a buffer of ``size`` bytes (BO_CREATE + mmap).

        With ``device_memory`` the buffer lives in the device's own memory
        (``DeviceInfo.device_memory`` bytes; mapped write-combined through
        BAR2): device-side copies and ops on it do not cross the bus.

        Raises:
            NpuError: BO_CREATE or mmap failed (e.g. ``EINVAL`` for ``size=0``,
                ``ENOMEM`` when device memory is exhausted).
        """
        rec = _spans.recorder
        t0 = _spans.now() if rec is not None else 0
        if device_memory:
            handle, mmap_offset, alloc_size = self.bo_create(size, device_memory=True)
        else:
            handle, mmap_offset, alloc_size = self.bo_create(size)
        va = self._bo_vas.pop(handle, 0)
        try:
            buf = Buffer(self, handle, operator.index(size), alloc_size, mmap_offset, va=va)
        except BaseException:
            try:
                self.bo_destroy(handle)
            except NpuError as exc:
                log.warning("BO_DESTROY after a failed mmap failed: %s", exc)
            raise
        self._buffers.add(buf)
        if rec is not None:
            rec.add("Device.alloc", t0, _spans.now(), {"size": alloc_size, "handle": handle})
        return buf

    def bo_userptr(self, addr: int, size: int, readonly: bool = False) -> int:
        """Make pinned user memory a buffer object (BO_USERPTR); return its handle.

        Raises:
            NpuError: ``EINVAL`` (unaligned ``addr``/``size``, ``size`` 0, bad
                flags), ``E2BIG`` (over ``max_bo_size``), ``EFAULT`` (memory
                not mapped, or mapped read-only without ``readonly``),
                ``ENOMEM`` (the per-context limit or out of memory),
                ``ENOTTY`` (a driver without BO_USERPTR).
        """
        addr = _check_u(f"BO_USERPTR addr={addr}", addr, _abi.U64_MAX)
        size = _check_u(f"BO_USERPTR size={size}", size, _abi.U64_MAX)
        flags = _abi.NPU_BO_USERPTR_READONLY if readonly else 0
        arg = self._call(
            f"BO_USERPTR(addr={addr:#x}, size={size}, readonly={readonly})",
            self.backend.bo_userptr,
            addr,
            size,
            flags,
        )
        self._bo_vas[arg.handle] = arg.va
        log.debug("BO_USERPTR addr=%#x size=%d -> handle=%d va=%#x", addr, size, arg.handle, arg.va)
        return arg.handle

    def userptr(self, array: npt.NDArray[Any]) -> tuple[UserBuffer, int]:
        """Pin ``array``'s memory as a buffer object, without a copy.

        The pages holding the array's bytes are wrapped; the device may
        write them only if the array is writeable. Returns the buffer and the
        byte offset of the array's first byte in it. The buffer keeps the
        array alive; do not change the array while queued ops read it.

        Raises:
            ValueError: ``array`` is empty.
            NpuError: see :meth:`bo_userptr`.
        """
        if array.size == 0:
            raise ValueError("userptr: the array is empty")
        start = int(array.__array_interface__["data"][0])
        spans = [(dim - 1) * step for dim, step in zip(array.shape, array.strides, strict=True)]
        lo = start + sum(min(0, span) for span in spans)
        hi = start + sum(max(0, span) for span in spans) + array.itemsize
        base = lo - lo % _PAGE
        end = -(-hi // _PAGE) * _PAGE
        readonly = not array.flags.writeable
        handle = self.bo_userptr(base, end - base, readonly)
        va = self._bo_vas.pop(handle, 0)
        try:
            buf = UserBuffer(self, handle, base, end - base, readonly, array, va=va)
        except BaseException:
            self.bo_destroy(handle)
            raise
        self._buffers.add(buf)
        return buf, lo - base

    def export_dmabuf(self, buffer: Buffer) -> int:
        """Share ``buffer`` as a dma-buf (PRIME_HANDLE_TO_FD); return its file descriptor.

        The new descriptor (close-on-exec, read-write) is the caller's to
        close: pass it to another :class:`Device` (:meth:`import_dmabuf`),
        another process (over a Unix socket) or another driver; it keeps the
        memory alive, also after ``buffer`` is freed. A dma-buf carries no
        fences: wait for the work writing the buffer before another user
        reads it, and the other way round. Same as
        :meth:`npu.Buffer.export_dmabuf`.

        Raises:
            ValueError: ``buffer`` belongs to another device.
            NpuError: ``EBADF`` (the buffer was freed), ``EOPNOTSUPP`` (a
                buffer in device memory or over user memory, which the
                driver cannot share; or the CPU backend, which has no
                dma-bufs), ``EMFILE`` (out of file descriptors); the context
                reads ``"PRIME_HANDLE_TO_FD(handle=...)"``.
        """
        if buffer.device is not self:
            raise ValueError(f"export_dmabuf: {buffer!r} belongs to {buffer.device!r}")
        handle = buffer.handle  # raises NpuError(EBADF) if freed
        backend = self.backend

        def context() -> str:
            kind = ""
            if isinstance(buffer, UserBuffer):
                kind = ", user memory"
            else:
                try:
                    if backend.bo_info(handle).flags & _abi.NPU_BO_INFO_DEVICE:
                        kind = ", device memory"
                except OSError:
                    pass  # only a detail of the message
            return f"PRIME_HANDLE_TO_FD(handle={handle}{kind})"

        fd = self._call(context, backend.dmabuf_export, handle)
        log.debug("PRIME_HANDLE_TO_FD handle=%d -> fd %d", handle, fd)
        return fd

    def import_dmabuf(self, fd: SupportsIndex) -> Buffer:
        """A :class:`npu.Buffer` over the dma-buf ``fd`` (PRIME_FD_TO_HANDLE + BO_INFO + mmap).

        ``fd`` stays the caller's (close it whenever; the buffer keeps the
        memory). The dma-buf may come from another :class:`Device` (another
        open file, here or in another process: :meth:`export_dmabuf`) or
        from another exporter, such as a udmabuf over a memfd. The buffer is
        mapped through this device's file, has a device address in this
        file's address space (``Buffer.va``), can be named by ops like any
        buffer and is freed like any (:meth:`npu.Buffer.free`, garbage
        collection, :meth:`close`); freeing it drops this file's reference
        only. Its ``size`` is the dma-buf's size.

        A dma-buf this device exported, or one it imported already, is the
        same buffer object to the driver: the live :class:`npu.Buffer` of
        that handle is returned again (freeing it frees it for every
        caller).

        Raises:
            ValueError: ``fd`` is negative or too large.
            TypeError: ``fd`` is not an int.
            NpuError: ``EBADF`` (not an open file), ``EINVAL`` (not a
                dma-buf, or one the device cannot address), ``EOPNOTSUPP``
                (the CPU backend has no dma-bufs), ``ENOMEM``; the context
                reads ``"PRIME_FD_TO_HANDLE(fd=...)"``, or ``"mmap(...)"``
                when the mapping failed.
        """
        fd = _check_u(f"PRIME_FD_TO_HANDLE fd={fd}", fd, _FD_MAX)
        with self._import_lock:
            info = self._call(f"PRIME_FD_TO_HANDLE(fd={fd})", self.backend.dmabuf_import, fd)
            for buf in list(self._buffers):
                if not buf.freed and buf.handle == info.handle:
                    log.debug("PRIME_FD_TO_HANDLE fd=%d -> %r again", fd, buf)
                    return buf
            self._bo_vas.pop(info.handle, None)  # a handle of bo_create() not made a Buffer
            try:
                buf = Buffer(
                    self,
                    info.handle,
                    info.alloc_size,
                    info.alloc_size,
                    info.mmap_offset,
                    va=info.va,
                )
            except BaseException:
                try:
                    self.bo_destroy(info.handle)
                except NpuError as exc:
                    log.warning("BO_DESTROY after a failed mmap failed: %s", exc)
                raise
            self._buffers.add(buf)
        log.debug(
            "PRIME_FD_TO_HANDLE fd=%d -> handle=%d size=%d offset=%#x va=%#x",
            fd,
            info.handle,
            info.alloc_size,
            info.mmap_offset,
            info.va,
        )
        return buf

    @property
    def buffers(self) -> list[Buffer]:
        """The buffers allocated from this device and not freed yet."""
        return list(self._buffers)

    def forget_buffer(self, buf: Buffer) -> None:
        """Drop a freed buffer from :attr:`buffers` (called by :meth:`npu.Buffer.free`)."""
        self._buffers.discard(buf)

    def create_queue(self, entries: int = 256, priority: int = 0) -> UserQueue:
        """Borrow a hardware queue for this file: a :class:`npu.UserQueue`.

        QUEUE_CREATE lends one of the device's hardware queues 1..7 and the
        queue's ring, completion records, fence record and doorbell are
        mapped into the process, so commands need no system call. Closing
        the device closes its queues.

        Args:
            entries: ring entries, a power of two in 16..4096.
            priority: 0..3, higher runs first; above 1 needs ``CAP_SYS_NICE``.

        Raises:
            ValueError: ``entries`` or ``priority`` out of range.
            NpuError: ``EBUSY`` (every hardware queue is lent), ``EACCES``
                (priority above 1 without ``CAP_SYS_NICE``), ``EBADFD`` (this
                file is faulted), ``ENOTTY`` (a driver without user queues).
        """
        return UserQueue(self, entries, priority)

    @property
    def queues(self) -> list[UserQueue]:
        """The user queues created on this device and not closed yet."""
        return list(self._queues)

    def register_queue(self, queue: UserQueue) -> None:
        """Add a new user queue to :attr:`queues` (called by :class:`npu.UserQueue`)."""
        self._queues.add(queue)

    def forget_queue(self, queue: UserQueue) -> None:
        """Drop a closed user queue from :attr:`queues` (called by ``UserQueue.close``)."""
        self._queues.discard(queue)

    def _find_op(self, queue: int, fence: int) -> AnyOp | None:
        """The op that got ``fence`` (fences of one SUBMIT are consecutive)."""
        with self._lock:
            for sub in self._inflight.get(queue, ()):
                if sub.first_fence <= fence <= sub.last_fence:
                    found: object = sub.ops[fence - sub.first_fence]
                    return found.op() if isinstance(found, BoundOp) else cast("AnyOp", found)
        return None


def _check_u(what: str, value: SupportsIndex, hi: int) -> int:
    """Return ``value`` as a plain int (numpy integers accepted) if in ``[0, hi]``."""
    if isinstance(value, bool):
        raise TypeError(f"{what}: must be an int, not bool")
    try:
        number = operator.index(value)
    except TypeError:
        raise TypeError(f"{what}: must be an int, not {type(value).__name__}") from None
    if not 0 <= number <= hi:
        raise ValueError(f"{what}: out of range [0, {hi}]")
    return number


# ---------------------------------------------------------------------------
# Opening and the default device
# ---------------------------------------------------------------------------


def open_device(device: DeviceSpec = 0) -> Device:
    """Open an NPU: an index ``N`` or ``"npu:N"`` (``/dev/npuN``, default 0), a node
    path, ``"cpu"`` (the CPU backend) or a :mod:`npu.hal` backend.

    Raises:
        DeviceNotFoundError: ``ENODEV`` when the machine has no NPU at all,
            ``ENOENT`` when this one does not exist.
        NpuError: the device could not be opened (e.g. ``EACCES``).
    """
    if isinstance(device, Backend) or device == CPU:
        return Device(device)
    path = node_path(device)
    if not os.path.exists(path) and not devices():
        raise DeviceNotFoundError(
            f"open_device({device!r}): no NPU device found (udev subsystem "
            f"{_UDEV_SUBSYSTEM!r}, {_DEV_DIR}/npu*)",
            errno.ENODEV,
        )
    return Device(path)


_default_device: Device | None = None
_default_lock = threading.Lock()

#: Environment variable naming the default device (index, ``npu:N``, path or ``cpu``).
DEVICE_ENV: Final = "NPU_DEVICE"
#: Environment variable choosing the default device's backend: ``driver`` or ``cpu``.
BACKEND_ENV: Final = "NPU_BACKEND"


def default_device() -> Device:
    """Return the device used by the high-level functions, opening it on first use.

    It is the CPU backend if ``$NPU_BACKEND`` is ``cpu``, else ``$NPU_DEVICE``
    (an index, ``npu:N``, a path or ``cpu``) if set, else ``/dev/npu0``; it is
    reopened if it was closed.

    Raises:
        ValueError: ``$NPU_BACKEND`` is neither ``driver`` nor ``cpu``.
    """
    global _default_device
    with _default_lock:
        if _default_device is None or _default_device.closed:
            backend = os.environ.get(BACKEND_ENV, "").strip() or "driver"
            if backend not in ("driver", CPU):
                raise ValueError(f"{BACKEND_ENV}={backend!r}: expected 'driver' or 'cpu'")
            spec = CPU if backend == CPU else os.environ.get(DEVICE_ENV, "").strip()
            target: int | str = int(spec) if spec.isdigit() else (spec or 0)
            _default_device = open_device(target)
            log.debug("default device is %s", _default_device.path)
        return _default_device


#: Devices opened by name through :func:`resolve_device`, by canonical name.
_named_devices: dict[str, Device] = {}

#: What every ``device=`` argument accepts.
DeviceArg = Device | DeviceSpec | None


def resolve_device(device: DeviceArg) -> Device:
    """The device a ``device=`` argument names, as in PyTorch.

    ``None`` is :func:`default_device`; a :class:`Device` is itself; an index
    ``N``, ``"npu:N"``, a node path or ``"cpu"`` is that device, opened on
    first use and shared by every later use of the name (the default device
    if it is the same node).

    Raises:
        DeviceNotFoundError, NpuError: as :func:`open_device`.
    """
    if device is None:
        return default_device()
    if isinstance(device, Device):
        return device
    if isinstance(device, Backend):
        raise TypeError("resolve_device: open a backend with npu.Device(backend)")
    key = CPU if device == CPU else node_path(device)
    with _default_lock:
        default = _default_device
        if default is not None and not default.closed and default.path == key:
            return default
        named = _named_devices.get(key)
        if named is None or named.closed:
            named = _named_devices[key] = open_device(key)
        return named


def set_default_device(device: Device | None) -> None:
    """Make ``device`` the default device (``None``: reopen lazily on next use).

    The previous default device is not closed.
    """
    global _default_device
    with _default_lock:
        _default_device = device


def close_default_device() -> None:
    """Close the default device if it was opened; the next use reopens it."""
    global _default_device
    with _default_lock:
        device, _default_device = _default_device, None
    if device is not None:
        device.close()
