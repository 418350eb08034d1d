"""Streams: CUDA-like ordered work queues on user-mode queues.

A :class:`Stream` owns one hardware queue lent to this process
(:class:`npu.UserQueue`), so launching work costs no system call: a
descriptor written into the mapped ring and a doorbell store. Work on one
stream runs in launch order; work on different streams may overlap and is
ordered only by :class:`npu.Event`: ``ev.record(producer)`` pushes a SIGNAL
of the producer's 64-bit counter and ``consumer.wait_event(ev)`` pushes a
device-side WAIT on it, so the consumer's queue holds in the device until
the producer reaches the marker, without a host round trip.

:class:`npu.Tensor` ops (``y = x + 1``, ``a @ b``, ...) go to the thread's
current stream: inside ``with stream:`` they are launched on it, ordered
after inputs still being produced on other streams (see :mod:`npu.tensors.tensor`).
Ops built by hand (``npu.ops.eltwise`` ... ``npu.ops.requant_op``) are
launched with :meth:`Stream.launch`. Either way the stream writes each op's
``struct npu_tensor_params`` (operands as device virtual addresses) into a
parameter arena of its own, one 256-byte block per ring slot, reused once
the slot's completion record has been seen.

Errors of asynchronous work are found in the completion records and raised
at the next :meth:`Stream.synchronize`, :meth:`Stream.query`,
:meth:`npu.Event.synchronize` or :meth:`npu.Event.query` as
:class:`npu.NpuDeviceError` (``status``, ``fence``, ``op``: the failed op,
and the stream named in the message), each once, oldest first.

:func:`default_stream` is the kernel path (SUBMIT to queue 0), which
tensor ops use outside any ``with stream:``; ``with stream:`` makes
``stream`` the current stream of the thread (:func:`current_stream`) for
tensor ops, :meth:`npu.Graph.replay`, :meth:`npu.Event.record` without an
argument and the ``stream=None`` defaults of the calls here.

This module also holds :class:`Event` (a marker in a timeline: a stream
records and waits on events, an event asks its stream whether it is
reached, so the two live together), :func:`synchronize` (every timeline of
a device) and :func:`failures` (the device errors waits met, which tensors
computed from a failed op look up).
"""

from __future__ import annotations

import collections
import ctypes
import errno
import logging
import threading
import weakref
from collections import deque
from collections.abc import Sequence
from types import TracebackType
from typing import Final, SupportsIndex, TypeAlias, cast

import numpy as np

from .. import _abi, _spans
from ..errors import NpuDeviceError, NpuError, NpuTimeoutError
from ..kernels import ops
from ..kernels.template import PARAMS_SIZE, BoundOp, Template, pack_tensor_params
from ..kernels.validate import check_tensor_op
from .buffer import Buffer
from .device import DEFAULT_TIMEOUT_S, Device, DeviceArg, Timeline, resolve_device
from .userqueue import CMD3, Completion, UserQueue

__all__ = [
    "Event",
    "Failure",
    "Stream",
    "StreamKey",
    "current_stream",
    "current_user_stream",
    "default_stream",
    "failures",
    "pack_tensor_params",
    "synchronize",
]

log = logging.getLogger(__name__)

#: Ring entries of a stream's queue unless asked otherwise.
DEFAULT_ENTRIES: Final = 256
_PARAMS_SIZE: Final = PARAMS_SIZE  # 256
_OP_NOP: Final = int(_abi.Opcode.NOP)
_OP_COPY: Final = int(_abi.Opcode.COPY)
_OP_FILL: Final = int(_abi.Opcode.FILL)
_OP_SIGNAL: Final = int(_abi.Opcode.SIGNAL)
_OP_WAIT: Final = int(_abi.Opcode.WAIT)
# Packed parameter blocks kept for ops launched again (graph-like loops).
_PACK_CACHE_MAX: Final = 256
# u64 counters in the per-device timeline page (one per live stream).
_TIMELINE_BYTES: Final = 4096
_SLOT_BYTES: Final = 8
# u64 words of a descriptor and of a parameter block.
_CMD_WORDS: Final = ctypes.sizeof(_abi.NpuCmd) // 8
_PARAMS_WORDS: Final = _PARAMS_SIZE // 8


# ---------------------------------------------------------------------------
# The timeline page: one u64 counter per live stream of a device
# ---------------------------------------------------------------------------


class _Timeline:
    """A small BO of a device holding the SIGNAL counters of its streams.

    Shared by the device's live streams and freed with the last of them, so
    that a WAIT queued on one stream never reads a freed page while another
    stream lives. A counter slot given back keeps counting from its last
    value (a WAIT still queued on an old value stays satisfied).
    """

    def __init__(self, device: Device) -> None:
        self.buffer = device.alloc(_TIMELINE_BYTES)
        self.va = self.buffer.va
        self.users = 0
        self.free_slots = list(range(_TIMELINE_BYTES // _SLOT_BYTES - 1, -1, -1))
        self.last = [0] * (_TIMELINE_BYTES // _SLOT_BYTES)


_TIMELINES: weakref.WeakKeyDictionary[Device, _Timeline] = weakref.WeakKeyDictionary()
_TIMELINES_LOCK = threading.Lock()


def _take_slot(device: Device) -> tuple[_Timeline, int]:
    with _TIMELINES_LOCK:
        tl = _TIMELINES.get(device)
        if tl is None or tl.buffer.freed:
            tl = _Timeline(device)
            _TIMELINES[device] = tl
        if not tl.free_slots:
            raise NpuError(errno.EBUSY, "no stream counter left", "Stream")
        tl.users += 1
        return tl, tl.free_slots.pop()


def _give_slot(
    device_ref: weakref.ref[Device],
    tl: _Timeline,
    slot: int,
    counter: list[int],
    key: StreamKey,
) -> None:
    """Give a stream's counter back (at close, or when it is collected unclosed)."""
    owner = device_ref()
    if owner is not None:
        owner.forget_timeline(key)
    with _TIMELINES_LOCK:
        tl.last[slot] = counter[0]
        tl.free_slots.append(slot)
        tl.users -= 1
        if tl.users:
            return
        device = device_ref()
        if device is not None and _TIMELINES.get(device) is tl:
            del _TIMELINES[device]
        if device is None or device.closed:
            return
    try:
        tl.buffer.free()
    except NpuError as exc:
        log.warning("freeing the stream timeline page failed: %s", exc)


class StreamKey:
    """What tensors' failure history and the caching allocator keep of a stream.

    It names the stream's timeline (its queue's fences) without keeping the
    stream alive: a stream closed or collected has no work left that could
    touch memory, so every fence of it counts as completed.
    """

    __slots__ = ("__weakref__", "_ref")

    def __init__(self, stream: Stream) -> None:
        self._ref = weakref.ref(stream)

    @property
    def stream(self) -> Stream | None:
        """The stream, while it lives."""
        return self._ref()

    def completed(self, fence: int) -> bool:
        """True if the stream's queue passed ``fence`` (reads the fence record, no ioctl)."""
        s = self._ref()
        if s is None or s._closed:
            return True
        q = s._queue
        if q is None or q.closed:
            return True
        try:
            return int(q.fence_record[0]) >= fence
        except ValueError:  # closed by another thread meanwhile: its work is over
            return True

    def wait(self, fence: int, timeout_s: float | None = DEFAULT_TIMEOUT_S) -> None:
        """Wait for ``fence`` of the stream (nothing to do once it is closed or gone).

        Raises:
            NpuDeviceError, NpuTimeoutError: as :meth:`npu.UserQueue.wait`.
        """
        s = self._ref()
        if s is not None:
            s.wait_fence(fence, timeout_s)

    def __repr__(self) -> str:
        s = self._ref()
        return f"<npu.StreamKey of {s!r}>" if s is not None else "<npu.StreamKey of a dead stream>"


# ---------------------------------------------------------------------------
# The current stream of a thread
# ---------------------------------------------------------------------------


class _Current(threading.local):
    def __init__(self) -> None:
        self.stack: list[Stream] = []


_CURRENT = _Current()


def default_stream(device: DeviceArg = None) -> Stream:
    """The default stream of ``device`` (default: the default device): the kernel path.

    Its work goes through SUBMIT to the driver's queue 0, as
    :meth:`npu.Device.submit` and tensor ops outside ``with stream:`` do.
    """
    return resolve_device(device).attachment(_new_default_stream)


def _new_default_stream(device: Device) -> Stream:
    stream = Stream.__new__(Stream)
    stream._init_default(device)
    return stream


def current_stream(device: DeviceArg = None) -> Stream:
    """The stream of the innermost ``with stream:`` of this thread, else the default stream.

    With ``device``, the innermost such stream of that device (else its
    default stream).
    """
    for stream in reversed(_CURRENT.stack):
        if device is None or stream.device is device:
            return stream
    return default_stream(device)


def _current_user_stream() -> Stream | None:
    """The innermost ``with stream:`` of this thread, None outside any."""
    stack = _CURRENT.stack
    return stack[-1] if stack else None


def current_user_stream(device: Device) -> Stream | None:
    """The current stream of ``device`` in this thread if it is a user stream, else None.

    On the path of every tensor op: outside any ``with stream:`` this is one
    attribute read.
    """
    stack = _CURRENT.stack
    if not stack:
        return None
    for i in range(len(stack) - 1, -1, -1):
        s = stack[i]
        if s.device is device:
            return None if s._queue is None else s
    return None


# ---------------------------------------------------------------------------
# Programs: op sequences prebuilt for replays on user streams
# ---------------------------------------------------------------------------


class Program:
    """A sequence of ops as ring descriptors and parameter blocks, built once.

    A replay (:meth:`Stream._replay`) copies the rows into the ring and the
    blocks into the arena with a few numpy statements, setting only each
    command's fence and each tensor op's parameter block address: the
    per-op work of a launch in Python is paid once, at the build.
    """

    __slots__ = ("buffers", "desc", "ops", "params", "tensor_rows")

    def __init__(
        self,
        desc: np.ndarray,
        params: np.ndarray,
        tensor_rows: np.ndarray,
        op_list: Sequence[ops.AnyOp],
        buffers: tuple[Buffer, ...],
    ) -> None:
        self.desc = desc  # (n, 16) u64: descriptors, fence words 0
        self.params = params  # (tensor ops, 32) u64: their parameter blocks
        self.tensor_rows = tensor_rows  # which rows are tensor ops
        self.ops = tuple(op_list)
        self.buffers = buffers  # every buffer the ops address, once each

    def __len__(self) -> int:
        return len(self.ops)


# ---------------------------------------------------------------------------
# Stream
# ---------------------------------------------------------------------------


def _alive(bufs: tuple[Buffer, ...]) -> bool:
    # A loop, not all(<generator>): this is on the launch path.
    for b in bufs:  # noqa: SIM110
        if b.freed:
            return False
    return True


class _Desc:
    """A COPY/FILL/SIGNAL/WAIT a stream launched, for error messages."""

    __slots__ = ("args", "name")

    def __init__(self, name: str, args: tuple[int, ...]) -> None:
        self.name = name
        self.args = args

    def __str__(self) -> str:
        return f"{self.name}({', '.join(f'{a:#x}' for a in self.args)})"


class Stream:
    """An ordered queue of device work on a user-mode queue (like ``torch.cuda.Stream``).

    Args:
        device: the device (default: the default device).
        priority: 0..3, higher runs first at each command (the driver's
            queue 0, the default stream, runs at 1); above 1 needs
            ``CAP_SYS_NICE``. Note: CUDA's order is the reverse.
        entries: ring entries (a power of two in 16..4096); a full ring
            makes launches wait for the oldest command.
        timeout_s: how long a launch waits for room in a full ring.

    Raises:
        ValueError: ``entries`` or ``priority`` out of range.
        NpuError: no hardware queue left (``EBUSY``), ``EACCES``, ``EBADFD``.

    ``with stream:`` makes it the thread's current stream (it does not
    close it). Calls are serialised by a lock, so a stream may be shared
    by threads. Launch methods return the command's fence on the stream's
    queue (for :meth:`completion`).
    """

    device: Device
    priority: int

    def __init__(
        self,
        device: DeviceArg = None,
        priority: int = 0,
        *,
        entries: int = DEFAULT_ENTRIES,
        timeout_s: float | None = DEFAULT_TIMEOUT_S,
    ) -> None:
        self.device = resolve_device(device)
        self.priority = priority
        self._lock = threading.RLock()
        self._timeout_s = timeout_s
        self._arena: Buffer | None = None
        self._arena_view: memoryview | None = None
        self._arena_va = 0
        self._packed: dict[int, tuple[ops.TensorOp, bytes, tuple[Buffer, ...]]] = {}
        self._closed = True
        self._queue: UserQueue | None = None
        queue = self.device.create_queue(entries, priority)
        try:
            self._timeline, self._slot = _take_slot(self.device)
        except BaseException:
            queue.close()
            raise
        self._queue = queue
        self._entries = queue.entries
        self._mask = queue.entries - 1
        self._value = self._timeline.last[self._slot]
        # The last value signalled, for the finalizer of a stream not closed.
        self._counter = [self._value]
        self._signal_va = self._timeline.va + self._slot * _SLOT_BYTES
        # The fence of the last SIGNAL pushed here (its value is _value).
        self._signal_fence = 0
        # Per other stream: the highest value of its counter a WAIT pushed
        # here already waits for (later work is ordered after it too).
        self._waited: weakref.WeakKeyDictionary[StreamKey, int] = weakref.WeakKeyDictionary()
        self._key = StreamKey(self)
        # The arena as (entries, 32) u64 words and each block's device
        # address, for program replays.
        self._arena_np: np.ndarray | None = None
        self._block_vas: np.ndarray | None = None
        # Program replays not yet scanned: (first fence, last fence, ops).
        self._replays: deque[tuple[int, int, tuple[ops.AnyOp, ...]]] = deque()
        # The op at each ring slot (fence, op), for errors and to keep the
        # buffers of tensor ops alive until their slot is reused.
        self._ops: list[tuple[int, object, object] | None] = [None] * queue.entries
        self._events: weakref.WeakSet[Event] = weakref.WeakSet()
        self._name = f"Stream(queue={queue.index}, priority={priority})"
        queue.context = self._name
        queue._op_of = self._op_of
        self._closed = False
        self._release = weakref.finalize(
            self,
            _give_slot,
            weakref.ref(self.device),
            self._timeline,
            self._slot,
            self._counter,
            self._key,
        )
        self._release.atexit = False

    def _init_default(self, device: Device) -> None:
        self.device = device
        self.priority = 1
        self._lock = threading.RLock()
        self._queue = None
        self._closed = False
        self._name = "Stream(default)"
        self._key = StreamKey(self)

    # -- state ----------------------------------------------------------------

    @property
    def key(self) -> StreamKey:
        """The stream's timeline as the device, the allocator and tensors keep it."""
        return self._key

    @property
    def is_default(self) -> bool:
        """True for the default stream (the kernel SUBMIT path)."""
        return self._queue is None

    @property
    def closed(self) -> bool:
        """True once :meth:`close` has run (never for the default stream)."""
        return self._closed

    @property
    def queue(self) -> UserQueue | None:
        """The user queue under the stream (None for the default stream)."""
        return self._queue

    @property
    def last_fence(self) -> int:
        """The fence of the last command launched (queue 0's for the default stream)."""
        if self._queue is None:
            return self.device.submitted_fences().get(0, 0)
        return self._queue.last_fence

    def completion(self, fence: int) -> Completion:
        """The completion record (status, device timestamps) of a completed ``fence``.

        Raises:
            NotImplementedError: on the default stream (use :meth:`npu.Device.fence_info`).
            ValueError, NpuError: as :meth:`npu.UserQueue.completion`.
        """
        with self._lock:
            return self._live("completion").completion(fence)

    def __repr__(self) -> str:
        if self._queue is None:
            return f"<npu.Stream default {self.device.path}>"
        state = " closed" if self._closed else f" launched={self._queue.last_fence}"
        return f"<npu.{self._name}{state}>"

    # -- current stream -------------------------------------------------------

    def __enter__(self) -> Stream:
        _CURRENT.stack.append(self)
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        stack = _CURRENT.stack
        for i in range(len(stack) - 1, -1, -1):
            if stack[i] is self:
                del stack[i]
                break

    # -- work -----------------------------------------------------------------

    def copy(
        self,
        dst: Buffer,
        src: Buffer,
        nbytes: SupportsIndex,
        dst_offset: SupportsIndex = 0,
        src_offset: SupportsIndex = 0,
    ) -> int:
        """Launch a COPY of ``nbytes`` from ``src[src_offset:]`` to ``dst[dst_offset:]``.

        Destination first, like ``cudaMemcpyAsync`` (``npu.ops.copy`` and
        :meth:`npu.UserQueue.copy` take the source first). Returns the fence.

        Raises:
            ValueError: a range does not fit, the ranges overlap, a buffer is
                of another device; NpuError: as :meth:`npu.UserQueue.push`.
        """
        if self._queue is None:
            return self.device.submit([ops.copy(src, dst, nbytes, src_offset, dst_offset)])
        rec = _spans.recorder
        t0 = _spans.now() if rec is not None else 0
        with self._lock:
            q = self._live("copy")
            fence = q.copy(src, dst, nbytes, src_offset, dst_offset)
            self._ops[(fence - 1) & self._mask] = (fence, _Desc("COPY", (dst.va, src.va)), None)
            q.kick()
        if rec is not None:
            rec.add("Stream.copy", t0, _spans.now(), {"queue": q.index, "fences": (fence, fence)})
        return fence

    def fill(
        self,
        dst: Buffer,
        pattern_u32: SupportsIndex,
        nbytes: SupportsIndex,
        offset: SupportsIndex = 0,
    ) -> int:
        """Launch a FILL of ``dst[offset:offset + nbytes]`` with a 32-bit pattern; return the fence.

        Raises:
            ValueError: as :func:`npu.ops.fill`; NpuError: as :meth:`npu.UserQueue.push`.
        """
        if self._queue is None:
            return self.device.submit([ops.fill(dst, pattern_u32, nbytes, offset)])
        rec = _spans.recorder
        t0 = _spans.now() if rec is not None else 0
        with self._lock:
            q = self._live("fill")
            fence = q.fill(dst, pattern_u32, nbytes, offset)
            self._ops[(fence - 1) & self._mask] = (fence, _Desc("FILL", (dst.va,)), None)
            q.kick()
        if rec is not None:
            rec.add("Stream.fill", t0, _spans.now(), {"queue": q.index, "fences": (fence, fence)})
        return fence

    def launch(self, op: ops.AnyOp, *, validate: bool = True) -> int:
        """Launch an op built by :mod:`npu.ops` (the same objects ``Device.submit`` takes).

        Tensor ops (ELTWISE, UNARY, CONVERT, REDUCE, SOFTMAX, LAYERNORM,
        MATMUL, LINEAR, CONV2D, POOL2D, REQUANT) get a parameter block in
        the stream's arena with their operands as device VAs; NOP, COPY,
        FILL and GEMM become one descriptor. The op's buffers (``op.buffers``,
        else the device's buffers with its handles) are kept alive until
        the op's ring slot is reused. ``validate`` re-checks a tensor op
        with :func:`npu.ops.check_tensor_op` (the builders already did);
        an op the device rejects completes with a status raised at the next
        synchronisation. Returns the fence.

        Raises:
            ValueError: a rule of the op is broken, a handle names no live
                buffer of this device, or an operand does not fit its buffer.
            NpuError: as :meth:`npu.UserQueue.push`.
        """
        q = self._queue
        if q is None:
            return self.device.submit([op])
        rec = _spans.recorder
        t0 = _spans.now() if rec is not None else 0
        with self._lock:
            if self._closed:
                self._live("launch")
            if isinstance(op, ops.TensorOp):
                fence = self._launch_tensor(q, op, validate, cache=True)
            else:
                fence = self._launch_op(q, op)
            q.kick()
        if rec is not None:
            rec.add(
                "Stream.launch",
                t0,
                _spans.now(),
                {"queue": q.index, "fences": (fence, fence), "op": op.opcode.name},
            )
        return fence

    def nop(self) -> int:
        """Launch a NOP; return its fence."""
        if self._queue is None:
            return self.device.submit([ops.nop()])
        with self._lock:
            q = self._live("nop")
            fence = q.nop()
            q.kick()
            return fence

    # -- events ---------------------------------------------------------------

    def wait_event(self, event: Event) -> None:
        """Make work launched later on this stream wait until ``event`` is reached.

        For an event recorded on another user stream of the same device
        this pushes a device-side WAIT on that stream's counter: no host
        round trip. An event of the default stream (the kernel path), or
        the default stream waiting on a user stream's event, is waited for
        by the host here (the kernel path has no device-side WAIT). An event
        never recorded, or recorded on this stream, needs nothing.

        Raises:
            ValueError: the event is of another device.
            NpuDeviceError: a host wait met a failed op.
        """
        src = event._stream
        if src is None:  # kernel path or never recorded
            if event.fence and self._queue is not None:
                if event.device is not self.device:
                    raise ValueError(f"wait_event: {event!r} is of another device")
                event.synchronize()
            return
        if src is self:
            return
        if src.device is not self.device:
            raise ValueError(f"wait_event: {event!r} was recorded on a stream of another device")
        if self._queue is None or src._closed:
            event.synchronize()
            return
        with self._lock:
            q = self._live("wait_event")
            fence = q.emit(_OP_WAIT, False, event._va, event._value, 0, None, None, self._timeout_s)
            desc = _Desc("WAIT", (event._va, event._value))
            self._ops[(fence - 1) & self._mask] = (fence, desc, None)
            q.kick()

    def _record(self, event: Event) -> None:
        """Push the SIGNAL of ``event`` (see :meth:`npu.Event.record`)."""
        with self._lock:
            q = self._live("record")
            fence, value = self._signal(q)
            q.kick()
            self._events.add(event)
            event._set_stream_marker(self, fence, self._signal_va, value)

    def _signal(self, q: UserQueue) -> tuple[int, int]:
        """Push a SIGNAL of the next counter value (lock held, not kicked): (fence, value)."""
        value = self._value + 1
        va = self._signal_va
        fence = q.emit(_OP_SIGNAL, False, va, value, 0, None, None, self._timeout_s)
        self._value = self._counter[0] = value
        self._signal_fence = fence
        self._ops[(fence - 1) & self._mask] = (fence, _Desc("SIGNAL", (va, value)), None)
        return fence, value

    def _signal_after(self, fence: int) -> int | None:
        """The counter value this stream stores once ``fence`` is done, or None if it is.

        Pushes a SIGNAL unless one already follows ``fence``. Takes only this
        stream's lock (never while holding another stream's: no lock order).
        """
        with self._lock:
            q = self._queue
            if q is None or self._closed or int(q.fence_record[0]) >= fence:
                return None
            if self._signal_fence <= fence:
                self._signal(q)
                q.kick()
            return self._value

    def _event_done(self, event: Event, timeout_s: float | None) -> bool:
        """Wait up to ``timeout_s`` (0: poll) for an event's SIGNAL; note its time."""
        with self._lock:
            q = self._queue
            if q is None or self._closed:
                return True
            fence = event._fence or 0
            if timeout_s == 0 and q.completed() < fence:
                done = q.completed()
                if done:
                    q.wait(done, timeout_s=0)
                return False
            q.wait(fence, timeout_s)
            event._note_stamp(self._stamp(fence))
            return True

    def _stamp(self, fence: int) -> int | None:
        q = self._queue
        assert q is not None
        try:
            return q.completion(fence).t_end_ns
        except NpuError as exc:
            if exc.errno == errno.ENOENT:
                return None
            raise

    # -- tensor ops (called by npu.tensor) -------------------------------------

    def run_ops(
        self, batch: Sequence[ops.AnyOp], after: Sequence[tuple[Stream, int]]
    ) -> tuple[int, int]:
        """Launch the ops of a tensor op (or a graph) after the fences ``after`` of
        other user streams; return the fences of the first and the last op.

        Each such fence costs a SIGNAL on its stream (unless one follows it
        already) and a device-side WAIT here (unless an earlier WAIT here
        covers it): no host round trip.
        """
        rec = _spans.recorder
        t0 = _spans.now() if rec is not None else 0
        waits = self._signals_for(after)
        with self._lock:
            q = self._live("launch")
            self._push_waits(q, waits)
            first = 0
            fence = 0
            for op in batch:
                if isinstance(op, ops.TensorOp):
                    fence = self._launch_tensor(q, op, False, cache=False, made=True)
                else:
                    fence = self._launch_op(q, op)
                if not first:
                    first = fence
            q.kick()
            self.device.note_timeline(self._key, fence)
        if rec is not None:
            rec.add(
                "Stream.run_ops", t0, _spans.now(), {"queue": q.index, "fences": (first, fence)}
            )
        return first, fence

    def run_template(
        self,
        bound: BoundOp,
        template: Template,
        vas: Sequence[int],
        bufs: tuple[Buffer, ...],
        after: Sequence[tuple[Stream, int]],
    ) -> int:
        """Launch one tensor op of a checked signature (the tensor layer's fast
        path, :class:`npu.kernels.template.Template`) with its operands at the
        device addresses ``vas``, after the fences ``after`` of other streams;
        return its fence. ``bufs`` are kept alive until its slot is reused;
        ``bound`` names it in errors."""
        rec = _spans.recorder
        t0 = _spans.now() if rec is not None else 0
        waits = self._signals_for(after) if after else ()
        with self._lock:
            q = self._live("launch")
            if waits:
                self._push_waits(q, waits)
            view, ring_off, slot, off = self._claim_slot(q)
            template.write_block(view, off, vas)
            fence = q.put(ring_off, template.opcode, self._arena_va + off, template.kind, 0)
            self._ops[slot] = (fence, bound, bufs)
            q.kick()
            self.device.note_timeline(self._key, fence)
        if rec is not None:
            rec.add(
                "Stream.launch",
                t0,
                _spans.now(),
                {"queue": q.index, "fences": (fence, fence), "op": template.opcode.name},
            )
        return fence

    def _signals_for(self, after: Sequence[tuple[Stream, int]]) -> list[tuple[Stream, int]]:
        """For each (stream, fence): the counter value its stream stores once the
        fence is done (a SIGNAL pushed there if needed); done fences drop out.
        Called without this stream's lock held."""
        waits = []
        for src, fence in after:
            value = src._signal_after(fence)
            if value is not None:
                waits.append((src, value))
        return waits

    def _push_waits(self, q: UserQueue, waits: Sequence[tuple[Stream, int]]) -> None:
        """Push a WAIT per (stream, value) not covered by an earlier WAIT (lock held)."""
        for src, value in waits:
            if self._waited.get(src._key, 0) >= value:
                continue
            wf = q.emit(_OP_WAIT, False, src._signal_va, value, 0, None, None, self._timeout_s)
            desc = _Desc("WAIT", (src._signal_va, value))
            self._ops[(wf - 1) & self._mask] = (wf, desc, None)
            self._waited[src._key] = value

    def wait_fence(self, fence: int, timeout_s: float | None) -> None:
        """Wait for ``fence`` of this stream (returns at once if it is closed)."""
        with self._lock:
            q = self._queue
            if q is None or self._closed:
                return
            q.wait(fence, timeout_s)

    # -- synchronisation ------------------------------------------------------

    def synchronize(self, timeout_s: float | None = DEFAULT_TIMEOUT_S) -> None:
        """Wait until everything launched so far is done.

        Raises:
            NpuDeviceError: an op launched since the last report failed
                (oldest first, once each); ``op`` is the op, the message names
                the stream.
            NpuTimeoutError: not done within ``timeout_s`` (e.g. a WAIT on an
                event that is never reached).
        """
        if self._queue is None:
            synchronize(self.device)
            return
        rec = _spans.recorder
        t0 = _spans.now() if rec is not None else 0
        with self._lock:
            if self._closed:
                return
            q = self._queue
            q.synchronize(timeout_s)
            self._note_stamps()
        if rec is not None:
            rec.add(
                "Stream.synchronize", t0, _spans.now(), {"queue": q.index, "fence": q.last_fence}
            )

    def query(self) -> bool:
        """True if everything launched so far is done (no waiting).

        Raises:
            NpuDeviceError: an op that completed so far failed (once each).
        """
        if self._queue is None:
            for queue, fence in self.device.submitted_fences().items():
                if self.device.completed(queue, fence):
                    continue
                try:
                    self.device.wait(fence, timeout_s=0, queue=queue)
                except NpuTimeoutError:
                    return False
            return True
        with self._lock:
            if self._closed:
                return True
            q = self._queue
            done = q.completed()
            if done:
                q.wait(done, timeout_s=0)
            return done >= q.last_fence

    def close(self, timeout_s: float | None = DEFAULT_TIMEOUT_S) -> None:
        """Wait for the work launched (up to ``timeout_s``), then give everything back.

        The queue, the parameter arena and the stream's counter are released
        even if the wait fails (work not run by then is dropped), and the
        failure is raised afterwards. Idempotent; a no-op on the default
        stream.

        Raises:
            NpuDeviceError, NpuTimeoutError: as :meth:`synchronize`.
        """
        if self._queue is None:
            return
        with self._lock:
            if self._closed:
                return
            error: BaseException | None = None
            q = self._queue
            if not q.closed:
                try:
                    q.synchronize(timeout_s)
                    self._note_stamps()
                except NpuError as exc:
                    error = exc
            self._closed = True
            self.device.forget_timeline(self._key)
            q._op_of = None
            try:
                q.close()
            except NpuError as exc:
                error = error or exc
            self._ops = [None] * self._entries
            self._packed.clear()
            self._replays.clear()
            self._arena_np = self._block_vas = None
            arena, self._arena = self._arena, None
            if self._arena_view is not None:
                self._arena_view.release()
                self._arena_view = None
            if arena is not None:
                try:
                    arena.free()
                except NpuError as exc:
                    error = error or exc
            self._release.detach()
            _give_slot(
                weakref.ref(self.device), self._timeline, self._slot, self._counter, self._key
            )
            log.debug("%s closed", self._name)
            if error is not None:
                raise error

    # -- internals ------------------------------------------------------------

    def _live(self, what: str) -> UserQueue:
        q = self._queue
        if q is None:
            raise NotImplementedError(f"Stream.{what}: not on the default stream")
        if self._closed:
            raise NpuError(errno.EBADF, "stream is closed", f"{self._name}.{what}")
        return q

    def _op_of(self, fence: int) -> object | None:
        entry = self._ops[(fence - 1) & self._mask]
        if entry is not None and entry[0] == fence:
            found = entry[1]
            return found.op() if isinstance(found, BoundOp) else found
        for first, last, op_list in self._replays:
            if first <= fence <= last:
                return op_list[fence - first]
        return None

    def _note_stamps(self) -> None:
        """Everything is done: give the events recorded here their time stamp."""
        for event in list(self._events):
            if event._stream is self and event._t_end_ns is None and event._fence:
                event._note_stamp(self._stamp(event._fence))
        self._events.clear()

    def _buffers_of(self, what: str, op: ops.AnyOp, handles: Sequence[int]) -> list[Buffer]:
        by_handle: dict[int, Buffer] = {}
        for b in op.buffers:
            if isinstance(b, Buffer) and not b.freed:
                by_handle[b.handle] = b
        out = []
        for handle in handles:
            buf = by_handle.get(handle)
            if buf is None:
                for b in self.device.buffers:
                    if not b.freed and b.handle == handle:
                        buf = by_handle[handle] = b
                        break
            if buf is None:
                raise ValueError(f"{self._name}.{what}: handle {handle} names no live buffer")
            if buf.device is not self.device:
                raise ValueError(f"{self._name}.{what}: {buf!r} belongs to {buf.device!r}")
            out.append(buf)
        return out

    def _pack(self, op: ops.TensorOp, validate: bool) -> tuple[bytes, tuple[Buffer, ...]]:
        if validate:
            check_tensor_op(op)
        bufs = self._buffers_of(op.opcode.name, op, [r.handle for r in op.operands])
        vas = []
        for ref, buf in zip(op.operands, bufs, strict=True):
            if ref.offset + ref.extent > buf.size:
                raise ValueError(
                    f"{self._name}.launch: operand {ref} does not fit {buf!r} ({buf.size} bytes)"
                )
            vas.append(buf.va + ref.offset)
        return pack_tensor_params(op, vas), tuple(bufs)

    def _pack_made(self, op: ops.TensorOp) -> tuple[bytes, tuple[Buffer, ...]]:
        """:meth:`_pack` for an op the tensor layer made from live tensors.

        Its operands lie inside ``op.buffers`` by construction, so each is
        matched to its buffer there without the bounds checks; anything
        unexpected falls back to :meth:`_pack`.
        """
        bufs = op.buffers
        vas = []
        for ref in op.operands:
            for b in bufs:
                if isinstance(b, Buffer) and not b.freed and b.handle == ref.handle:
                    vas.append(b.va + ref.offset)
                    break
            else:
                return self._pack(op, validate=False)
        return pack_tensor_params(op, vas), cast("tuple[Buffer, ...]", bufs)

    def _launch_tensor(
        self, q: UserQueue, op: ops.TensorOp, validate: bool, cache: bool, made: bool = False
    ) -> int:
        """Push ``op`` with its parameter block (not kicked); ``cache`` keeps the
        packed block for launches of the same op object again; ``made``: the
        tensor layer built it (see :meth:`_pack_made`)."""
        key = id(op)
        entry = self._packed.get(key) if cache else None
        if entry is None or entry[0] is not op or not _alive(entry[2]):
            block, bufs = self._pack_made(op) if made else self._pack(op, validate)
            entry = (op, block, bufs)
            if cache:
                if len(self._packed) >= _PACK_CACHE_MAX:
                    self._packed.clear()
                self._packed[key] = entry
        view, ring_off, slot, off = self._claim_slot(q)
        view[off : off + _PARAMS_SIZE] = entry[1]
        fence = q.put(ring_off, op.opcode, self._arena_va + off, op.kind, 0)
        self._ops[slot] = (fence, op, entry[2])
        return fence

    def _claim_slot(self, q: UserQueue) -> tuple[memoryview, int, int, int]:
        """Room for one tensor op (lock held): the arena, the ring offset of its
        descriptor, its slot and the byte offset of its parameter block there.
        Room first: the slot's block is free once its last command completed."""
        view = self._arena_view
        if view is None:
            view = self._make_arena()
        ring_off = q.claim(self._timeout_s)
        slot = q.tail & self._mask
        return view, ring_off, slot, slot * _PARAMS_SIZE

    def _make_arena(self) -> memoryview:
        arena = self.device.alloc(self._entries * _PARAMS_SIZE)
        self._arena = arena
        self._arena_va = arena.va
        self._arena_np = np.frombuffer(arena.view, np.uint64).reshape(self._entries, _PARAMS_WORDS)
        # The device address of each slot's parameter block.
        self._block_vas = np.arange(self._entries, dtype=np.uint64) * np.uint64(
            _PARAMS_SIZE
        ) + np.uint64(arena.va)
        self._arena_view = view = arena.view
        return view

    def _descriptor(self, op: ops.Op) -> tuple[bytes, tuple[Buffer, ...]]:
        """The ring descriptor (fence 0) of a NOP, COPY, FILL or GEMM, and its buffers."""
        code = op.opcode
        bufs = self._buffers_of(code.name, op, [r.handle for r in op.bufs])
        vas = []
        for ref, buf in zip(op.bufs, bufs, strict=True):
            if ref.offset + ref.size > buf.size:
                raise ValueError(f"{self._name}.launch: {op} does not fit {buf!r}")
            vas.append(buf.va + ref.offset)
        if code is _abi.Opcode.NOP:
            words = (0, 0, 0)
        elif code is _abi.Opcode.COPY:
            words = (vas[0], vas[1], op.bufs[0].size)
        elif code is _abi.Opcode.FILL:
            words = (vas[0], op.bufs[0].size, op.params[0])
        elif code is _abi.Opcode.GEMM:
            cmd = _abi.NpuCmd(opcode=int(code))
            g = cmd.gemm
            g.a, g.b, g.c = vas
            g.m, g.n, g.k, g.lda, g.ldb, g.ldc, g.dtype, g.flags = op.params
            return bytes(cmd), tuple(bufs)
        else:
            raise ValueError(f"{self._name}.launch: {code.name} cannot be launched on a stream")
        return CMD3.pack(int(code), 0, 0, 0, 0, *words), tuple(bufs)

    def _launch_op(self, q: UserQueue, op: ops.Op) -> int:
        """Push a NOP, COPY, FILL or GEMM (not kicked)."""
        desc, bufs = self._descriptor(op)
        cmd = _abi.NpuCmd.from_buffer_copy(desc)
        fence = q.push(cmd, self._timeout_s)
        self._ops[(fence - 1) & self._mask] = (fence, op, bufs)
        return fence

    # -- programs ---------------------------------------------------------------

    def build_program(self, op_list: Sequence[ops.AnyOp]) -> Program:
        """Prebuild ``op_list`` for :meth:`_replay` (on any stream of this device).

        Raises:
            ValueError: as :meth:`launch` (an op does not fit its buffers, a
                handle names no live buffer, an opcode streams cannot run).
        """
        desc = np.zeros((len(op_list), _CMD_WORDS), np.uint64)
        blocks: list[bytes] = []
        rows: list[int] = []
        used: dict[int, Buffer] = {}
        for i, op in enumerate(op_list):
            if isinstance(op, ops.TensorOp):
                block, bufs = self._pack(op, validate=False)
                blocks.append(block)
                rows.append(i)
                flags = _abi.NPU_CMD_F_CONCURRENT if op.concurrent else 0
                raw = CMD3.pack(int(op.opcode), flags, 0, 0, 0, 0, op.kind, 0)
            else:
                raw, bufs = self._descriptor(op)
            desc[i] = np.frombuffer(raw, np.uint64)
            for b in bufs:
                used[id(b)] = b
        params = np.frombuffer(b"".join(blocks), np.uint64).reshape(len(blocks), _PARAMS_WORDS)
        return Program(desc, params.copy(), np.array(rows, np.intp), op_list, tuple(used.values()))

    def replay_program(
        self, program: Program, after: Sequence[tuple[Stream, int]] = ()
    ) -> tuple[int, int]:
        """Launch a prebuilt program after the fences ``after`` of other user
        streams (as :meth:`_run`); return the fences of its first and last op.

        Runs of at most half the ring go in at a time, each copied straight
        into the free ring slots and arena blocks (slices, two where the
        ring wraps), then the fence and parameter-address words are set and
        one doorbell store announces the run; a full ring makes the next run
        wait for room, as launches do.

        Raises:
            NpuError: ``EBADF``, a buffer the program addresses was freed since
                the build (nothing is launched); else as :meth:`launch`.
        """
        rec = _spans.recorder
        t0 = _spans.now() if rec is not None else 0
        waits = self._signals_for(after)
        with self._lock:
            q = self._live("replay")
            if not _alive(program.buffers):
                raise NpuError(
                    errno.EBADF, "a buffer the ops address was freed", f"{self._name}.replay"
                )
            self._push_waits(q, waits)
            if self._arena_view is None:
                self._make_arena()
            arena, block_vas = self._arena_np, self._block_vas
            assert arena is not None and block_vas is not None
            ring = q.ring
            entries = self._entries
            step = max(1, entries // 2)
            rows = program.tensor_rows
            dense = len(rows) == len(program)  # every op a tensor op
            first_all = 0
            for start in range(0, len(program), step):
                count = min(step, len(program) - start)
                first = q.reserve(count, self._timeout_s)
                slot = (first - 1) & self._mask
                # One or two runs of consecutive slots: [slot, end) then [0, rest).
                runs = [(slot, start, min(count, entries - slot))]
                if runs[0][2] < count:
                    runs.append((0, start + runs[0][2], count - runs[0][2]))
                for at, row, n in runs:
                    fence = first + row - start
                    ring[at : at + n] = program.desc[row : row + n]
                    ring[at : at + n, 1] = np.arange(fence, fence + n, dtype=np.uint64)
                    if dense:
                        ring[at : at + n, 2] = block_vas[at : at + n]
                        arena[at : at + n] = program.params[row : row + n]
                        continue
                    lo, hi = np.searchsorted(rows, (row, row + n))
                    if hi > lo:
                        mine = rows[lo:hi] - row + at
                        ring[mine, 2] = block_vas[mine]
                        arena[mine] = program.params[lo:hi]
                q.commit(count)
                q.kick()
                if not first_all:
                    first_all = first
            last = q.last_fence
            self._replays = deque(r for r in self._replays if r[1] > q.checked)
            self._replays.append((first_all, last, program.ops))
            self.device.note_timeline(self._key, last)
        if rec is not None:
            rec.add(
                "Stream.replay_program",
                t0,
                _spans.now(),
                {"queue": q.index, "fences": (first_all, last), "ops": len(program)},
            )
        return first_all, last


# ---------------------------------------------------------------------------
# Failures and synchronize: what every timeline of a device reported
# ---------------------------------------------------------------------------

#: A device error and the timeline it came from (None: the driver's queue 0).
Failure: TypeAlias = "tuple[Timeline | None, NpuDeviceError]"
_FAILURE_HISTORY: Final = 64


def _new_failure_history(device: Device) -> collections.deque[Failure]:
    return collections.deque(maxlen=_FAILURE_HISTORY)


def failures(device: Device) -> collections.deque[Failure]:
    """The device errors waits met on ``device``, newest last (the last 64).

    A failure is reported by the wait that meets it; tensors computed from
    the failed op look it up here, so it also raises at their own wait.
    """
    return device.attachment(_new_failure_history)


def synchronize(device: DeviceArg = None) -> None:
    """Wait until every op submitted to ``device`` (default: the default device) is done.

    Like ``torch.cuda.synchronize()``. A failure of any of those ops raises
    here (:class:`npu.NpuDeviceError`, naming the op); it is also kept for
    the tensors computed from it (:func:`failures`).

    Raises:
        NpuDeviceError: an op that had not been waited for failed.
        RuntimeError: called while a graph captures.
    """
    dev = resolve_device(device)
    if dev.capturing is not None:
        raise RuntimeError("synchronize: not while a graph is capturing")
    rec = _spans.recorder
    t0 = _spans.now() if rec is not None else 0
    _synchronize(dev)
    if rec is not None:
        rec.add("synchronize", t0, _spans.now())


def _synchronize(dev: Device) -> None:
    history = failures(dev)
    for queue, fence in dev.last_fences().items():
        if isinstance(queue, int):
            while not dev.completed(queue, fence):
                try:
                    dev.wait(fence, timeout_s=DEFAULT_TIMEOUT_S, queue=queue)
                except NpuDeviceError as exc:
                    history.append((None, exc))
                    raise
            continue
        while not queue.completed(fence):
            try:
                queue.wait(fence, DEFAULT_TIMEOUT_S)
            except NpuDeviceError as exc:
                history.append((queue, exc))
                raise


# ---------------------------------------------------------------------------
# Events: markers in a timeline
# ---------------------------------------------------------------------------

_QUEUE = 0


class Event:
    """A marker in a device's queue.

    Args:
        device: the device (default: the default device).
        enable_timing: record a NOP the device timestamps, for
            :meth:`elapsed_time`.
    """

    def __init__(self, device: DeviceArg = None, enable_timing: bool = False) -> None:
        self._device_given = device is not None
        self.device = resolve_device(device)
        self.enable_timing = enable_timing
        self._fence: int | None = None
        # On a user stream: the stream, the counter's VA and the value its
        # SIGNAL stores, and the SIGNAL's completion time once seen.
        self._stream: Stream | None = None
        self._va = 0
        self._value = 0
        self._t_end_ns: int | None = None

    @property
    def fence(self) -> int | None:
        """The fence of the marker (on its stream's queue), or None before :meth:`record`."""
        return self._fence

    @property
    def stream(self) -> Stream | None:
        """The user stream the event was last recorded on (None: the default stream)."""
        return self._stream

    def record(self, stream: Stream | None = None) -> None:
        """Put the marker after everything launched so far on ``stream``.

        ``stream`` defaults to the current stream (:func:`npu.current_stream`):
        the innermost ``with stream:`` of the thread, else the default stream
        (the kernel path: after everything submitted to the device so far).
        An event not given a device takes the device of the stream.

        Raises:
            ValueError: the stream is of another device than the one given.
            RuntimeError: while an :class:`npu.Graph` captures.
            NpuError: the marker was refused (e.g. a closed stream).
        """
        target = stream if stream is not None else _current_user_stream()
        if target is not None and not target.is_default:
            if target.device is not self.device:
                if self._device_given:
                    raise ValueError(f"Event.record: {target!r} is of another device")
                self.device = target.device
            self._t_end_ns = None
            target._record(self)
            return
        if target is not None and target.device is not self.device:
            if self._device_given:
                raise ValueError(f"Event.record: {target!r} is of another device")
            self.device = target.device
        self._stream = None
        self._t_end_ns = None
        if self.enable_timing:
            self._fence = self.device.submit([ops.nop()], _QUEUE)
        else:
            if self.device.capturing is not None:
                raise RuntimeError("Event.record: not while a graph is capturing")
            self.device.flush_deferred()  # the eager ops so far are before the marker
            self._fence = self.device.submitted_fences().get(_QUEUE, 0)

    def query(self) -> bool:
        """True once the device has passed the marker (or it was never recorded).

        Raises:
            NpuDeviceError: an op before the marker failed (reported once).
        """
        if self._fence is None or self._fence == 0:
            return True
        if self._stream is not None:
            return self._stream._event_done(self, 0)
        if self.device.completed(_QUEUE, self._fence):
            return True
        try:
            self.device.wait(self._fence, timeout_s=0, queue=_QUEUE)
        except NpuTimeoutError:
            return False
        return True

    def synchronize(self, timeout_s: float | None = DEFAULT_TIMEOUT_S) -> None:
        """Wait until the device has passed the marker.

        Raises:
            NpuDeviceError: an op before the marker failed (reported once).
            NpuTimeoutError: not within ``timeout_s``.
        """
        if self._stream is not None:
            self._stream._event_done(self, timeout_s)
        elif self._fence:
            self.device.wait(self._fence, timeout_s=timeout_s, queue=_QUEUE)

    def elapsed_time(self, end: Event) -> float:
        """Device milliseconds from this marker to ``end``'s (both done).

        The times are the device clock at the completion of each marker (a
        stream event's SIGNAL; a default-stream event's NOP), so events of
        different streams of a device can be compared.

        Raises:
            ValueError: an event of the default stream lacks
                ``enable_timing``, an event was not recorded, or they belong
                to different devices.
            RuntimeError: a marker is not reached yet (call
                :meth:`synchronize` on ``end`` first).
            NpuError: the record is gone (more than ``ring_entries`` later
                ops, or a device reset since), ``ENOENT``.
        """
        for ev in (self, end):
            if ev._fence is None or (ev._stream is None and not ev.enable_timing):
                raise ValueError("elapsed_time: both events need enable_timing and a record()")
        if end.device is not self.device:
            raise ValueError("elapsed_time: the events belong to different devices")
        stamps = []
        for ev in (self, end):
            assert ev._fence is not None
            if ev._stream is not None:
                stamps.append(ev._stream_stamp())
                continue
            try:
                info = self.device.fence_info(ev._fence, _QUEUE)
            except NpuError as exc:
                if exc.errno == errno.EBUSY:
                    raise RuntimeError(
                        "elapsed_time: an event is not reached yet; synchronize() first"
                    ) from exc
                raise
            if info.status:
                raise NpuDeviceError(info.status, ev._fence, None, "Event marker")
            stamps.append(info.t_end_ns)
        return (stamps[1] - stamps[0]) / 1e6

    # -- user streams (npu.stream) ---------------------------------------------

    def _set_stream_marker(self, stream: Stream, fence: int, va: int, value: int) -> None:
        self._stream = stream
        self._fence = fence
        self._va = va
        self._value = value
        self._t_end_ns = None

    def _note_stamp(self, t_end_ns: int | None) -> None:
        if t_end_ns is not None:
            self._t_end_ns = t_end_ns

    def _stream_stamp(self) -> int:
        """The device time of this stream event's SIGNAL (completed)."""
        assert self._stream is not None
        if self._t_end_ns is None:
            if not self._stream._event_done(self, 0):
                raise RuntimeError("elapsed_time: an event is not reached yet; synchronize() first")
            if self._t_end_ns is None:
                raise NpuError(
                    errno.ENOENT,
                    "the completion record of the marker was reused",
                    f"Event.elapsed_time({self._stream!r}, fence={self._fence})",
                )
        return self._t_end_ns

    def __repr__(self) -> str:
        where = repr(self._stream) if self._stream is not None else "default stream"
        return f"<npu.Event fence={self._fence} on {where}>"
