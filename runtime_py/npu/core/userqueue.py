"""User-mode queues: a hardware queue of the NPU lent to this process.

:meth:`npu.Device.create_queue` asks the driver for one of the device's
hardware queues (QUEUE_CREATE) and maps its memory and its doorbell into the
process. From then on commands need no system call: :meth:`UserQueue.push`
writes a ``struct npu_cmd`` descriptor into the ring, :meth:`UserQueue.kick`
stores the new tail index into the doorbell page, and the device writes a
completion record per command and the last completed fence into the fence
record, which :meth:`UserQueue.completed` reads. :meth:`UserQueue.wait`
spins on the fence record for a moment, then sleeps in the WAIT ioctl.

Fences are the queue's own timeline: 1, 2, 3, ... in push order (command
``f`` sits in ring slot ``(f - 1) % entries``). Descriptors carry device
virtual addresses (:attr:`npu.Buffer.va`) of the buffers of the same
:class:`npu.Device`; any other address faults: the device stops the queue
and the driver marks the whole file faulted (its SUBMITs fail with
``EBADFD``). Errors are found in the completion records and reported by
:meth:`UserQueue.wait` once each, oldest first, as :class:`npu.NpuDeviceError`
(``errno`` ``EBADFD`` for an MMU fault, else ``EIO``).

A :class:`UserQueue` is not thread-safe: use one per thread, or a lock.
"""

from __future__ import annotations

import ctypes
import errno
import logging
import mmap
import operator
import struct
import sys
import time
import weakref
from collections import deque
from dataclasses import dataclass
from typing import TYPE_CHECKING, Final, NoReturn, Protocol, SupportsIndex

import numpy as np

from .. import _abi, _spans
from .._closing import Closing
from ..errors import DEFAULT_TIMEOUT_S, NpuDeviceError, NpuError, NpuTimeoutError
from ..hal import Backend, WaitFailed
from ..kernels.descriptors import check_range as _check_range
from .buffer import BackendOwner, Buffer

if TYPE_CHECKING:
    from collections.abc import Callable

    import numpy.typing as npt

__all__ = ["DEFAULT_SPIN_S", "Completion", "UserQueue"]

log = logging.getLogger(__name__)


class QueueOwner(BackendOwner, Protocol):
    """What a user queue needs of its device (an :class:`npu.Device`)."""

    def register_queue(self, queue: UserQueue) -> None:
        """Add a new queue to the device's list."""
        ...

    def forget_queue(self, queue: UserQueue) -> None:
        """Drop a closed queue from the device's list."""
        ...


#: How long :meth:`UserQueue.wait` spins on the fence record before it
#: sleeps in the WAIT ioctl (seconds).
DEFAULT_SPIN_S: Final = 50e-6

_CMD_SIZE: Final = ctypes.sizeof(_abi.NpuCmd)  # 128
_CPL_SIZE: Final = ctypes.sizeof(_abi.NpuCpl)  # 32
# opcode, flags, ctx, rsvd0, fence, three payload words, the rest zero.
CMD3: Final = struct.Struct("<HHHHQQQQ88x")
_CPL: Final = struct.Struct("<QIHHQQ")
_FENCE: Final = struct.Struct("<Q")
_U32_MASK: Final = 0xFFFFFFFF
_F_IRQ: Final = _abi.NPU_CMD_F_IRQ
_OP_NOP: Final = int(_abi.Opcode.NOP)
_OP_COPY: Final = int(_abi.Opcode.COPY)
_OP_FILL: Final = int(_abi.Opcode.FILL)
# WAIT slices when no command at or after the awaited fence asks for an
# interrupt (nothing would wake the waiter): poll the fence record this often.
_POLL_SLICE_NS: Final = 200_000
_FOREVER_SLICE_NS: Final = 60 * 10**9
# Below this many records a scan reads them one by one; above, with numpy.
_SCAN_LOOP_MAX: Final = 16
# Device errors remembered until a wait reports them (as the driver's 1024).
_MAX_PENDING_ERRORS: Final = 1024


@dataclass(frozen=True, slots=True)
class Completion:
    """The completion record of one command of a :class:`UserQueue`.

    ``status`` is its ``npu.Status`` value; ``t_start_ns`` / ``t_end_ns`` are
    the device clock when the command started and completed.
    """

    fence: int
    status: int
    opcode: int
    t_start_ns: int
    t_end_ns: int

    @property
    def ok(self) -> bool:
        """True if the command completed with ``NPU_ST_OK``."""
        return self.status == _abi.NPU_ST_OK


@dataclass(frozen=True, slots=True)
class _Failure:
    fence: int
    status: int
    opcode: int
    op: object | None = None


class UserQueue(Closing):
    """A hardware queue lent to this process (QUEUE_CREATE), driven without ioctls.

    Do not construct directly; use :meth:`npu.Device.create_queue`.

    Args:
        device: the open device whose file the queue is lent to.
        entries: ring entries, a power of two in 16..4096.
        priority: 0..3, higher runs first; above 1 needs ``CAP_SYS_NICE``.
        spin_s: default spin time of :meth:`wait` before it sleeps.

    Raises:
        ValueError: ``entries`` or ``priority`` out of range (checked here).
        NpuError: QUEUE_CREATE failed (``EBUSY``: every hardware queue is
            lent; ``EACCES``: priority above 1 without ``CAP_SYS_NICE``;
            ``EBADFD``: the file is faulted), or a mapping failed.

    Attributes:
        device: the owning :class:`npu.Device`.
        index: the hardware queue (what WAIT takes as ``queue``).
        entries: ring entries.
        priority: the scheduling priority asked for.
        spin_s: default spin time of :meth:`wait`, in seconds.
    """

    def __init__(
        self,
        device: QueueOwner,
        entries: int = 256,
        priority: int = 0,
        *,
        spin_s: float = DEFAULT_SPIN_S,
    ) -> None:
        entries = operator.index(entries)
        priority = operator.index(priority)
        if (
            entries < _abi.NPU_QUEUE_MIN_ENTRIES
            or entries > _abi.NPU_QUEUE_MAX_ENTRIES
            or entries & (entries - 1)
        ):
            raise ValueError(
                f"create_queue: entries={entries} is not a power of two in "
                f"{_abi.NPU_QUEUE_MIN_ENTRIES}..{_abi.NPU_QUEUE_MAX_ENTRIES}"
            )
        if not 0 <= priority <= 3:
            raise ValueError(f"create_queue: priority={priority} is not in 0..3")
        if sys.byteorder != "little":
            raise NotImplementedError("user queues read device records in host byte order")
        self.device = device
        self.entries = entries
        self.priority = priority
        self.spin_s = spin_s
        backend = device.backend
        try:
            arg = backend.queue_create(entries, priority)
        except OSError as exc:
            raise NpuError.from_oserror(
                exc, f"QUEUE_CREATE(entries={entries}, priority={priority})"
            ) from exc
        self.index = arg.index
        self._mem_size = arg.mem_size
        self._cpl_offset = arg.cpl_offset
        self._fence_offset = arg.fence_offset
        self._closed = True
        self._maps: list[mmap.mmap] = []
        # Destroys the queue if this object is collected without close().
        self._finalizer = weakref.finalize(
            self, _destroy_unreferenced, weakref.ref(device), self.index
        )
        self._finalizer.atexit = False
        try:
            mem = _map(backend, self._mem_size, arg.mem_offset, writable_only=False)
            self._maps.append(mem)
            bell_map = _map(backend, mmap.PAGESIZE, arg.doorbell_offset, writable_only=True)
            self._maps.append(bell_map)
        except BaseException:
            self._unmap()
            self._finalizer()
            raise
        self._mem = mem
        self._closed = False
        cpl_bytes = entries * _CPL_SIZE
        # Views preallocated once: the hot paths index them, nothing else.
        self._bell: ctypes.c_uint32 | None = ctypes.c_uint32.from_buffer(bell_map)
        self._ring_addr = ctypes.addressof(ctypes.c_char.from_buffer(mem))
        self._fence_view: memoryview = memoryview(mem)[
            self._fence_offset : self._fence_offset + 16
        ].cast("Q")
        self._cpl_words: memoryview = memoryview(mem)[
            self._cpl_offset : self._cpl_offset + cpl_bytes
        ].cast("I")
        self._status_np: npt.NDArray[np.uint32] = np.frombuffer(
            mem, dtype=np.uint32, count=cpl_bytes // 4, offset=self._cpl_offset
        )[2 :: _CPL_SIZE // 4]
        # The ring as (entries, 16) u64 words, for blocks of prebuilt descriptors.
        self._ring_np: npt.NDArray[np.uint64] = np.frombuffer(
            mem, dtype=np.uint64, count=entries * _CMD_SIZE // 8
        ).reshape(entries, _CMD_SIZE // 8)
        self._mask = entries - 1
        self._tail = 0  # last fence pushed (= ring tail index)
        self._kicked = 0  # last tail stored into the doorbell
        self._checked = 0  # completion records inspected up to this fence
        self._irq_fence = 0  # last pushed fence whose command asks for an IRQ
        # Why the device stopped the queue (errno EBADFD: an MMU fault; EIO: a
        # ring error or a device reset) and after which fence; None: running.
        self._stop: tuple[int, int] | None = None
        self._failures: deque[_Failure] = deque()
        # Buffers of the commands in flight, kept alive until they complete.
        self._keep: deque[tuple[int, Buffer, Buffer | None]] = deque()
        self._context = f"UserQueue(queue={self.index})"
        # The op of a failed fence, asked when its record is first scanned
        # (before the slot is reused): npu.Stream names its ops this way.
        self._op_of: Callable[[int], object | None] | None = None
        device.register_queue(self)
        log.debug(
            "QUEUE_CREATE entries=%d priority=%d -> queue %d (mem %d bytes)",
            entries,
            priority,
            self.index,
            self._mem_size,
        )

    # -- state ----------------------------------------------------------------

    @property
    def closed(self) -> bool:
        """True once :meth:`close` has run (or the device was closed)."""
        return self._closed

    @property
    def last_fence(self) -> int:
        """The fence of the last command pushed (0 before the first)."""
        return self._tail

    # -- the ring, for npu.Stream: descriptors written in place ----------------

    @property
    def context(self) -> str:
        """How errors name the queue (a stream names it after itself)."""
        return self._context

    @context.setter
    def context(self, name: str) -> None:
        self._context = name

    @property
    def tail(self) -> int:
        """The fence of the last command pushed (the ring's tail index)."""
        return self._tail

    @property
    def checked(self) -> int:
        """Completion records are inspected up to this fence."""
        return self._checked

    @property
    def ring(self) -> npt.NDArray[np.uint64]:
        """The ring as 64-bit words (8 per command), mapped: writes reach the device."""
        return self._ring_np

    @property
    def fence_record(self) -> memoryview:
        """The mapped fence record (``[0]``: the last fence completed); released at close."""
        return self._fence_view

    def completed(self) -> int:
        """The last fence the device completed, from the fence record (no ioctl)."""
        if self._closed:
            raise self._closed_error("completed")
        return int(self._fence_view[0])

    def completion(self, fence: int) -> Completion:
        """The completion record of a completed ``fence``.

        Raises:
            ValueError: ``fence`` is 0 or was never pushed.
            NpuError: ``EBUSY`` (not completed yet), ``ENOENT`` (its record
                was reused by a command ``entries`` later), ``EBADF`` (closed).
        """
        if self._closed:
            raise self._closed_error("completion")
        if not 0 < fence <= self._tail:
            raise ValueError(f"{self._context}: fence {fence} was never pushed")
        if self._fence_view[0] < fence:
            raise NpuError(errno.EBUSY, None, f"{self._context}.completion(fence={fence})")
        off = self._cpl_offset + ((fence - 1) & self._mask) * _CPL_SIZE
        rec = _CPL.unpack_from(self._mem, off)
        # The fence read again after the copy: a record rewritten meanwhile
        # (its slot reused) is not returned torn.
        if rec[0] != fence or _FENCE.unpack_from(self._mem, off)[0] != fence:
            raise NpuError(errno.ENOENT, None, f"{self._context}.completion(fence={fence})")
        return Completion(rec[0], rec[1], rec[2], rec[4], rec[5])

    def status(self, fence: int) -> int:
        """The ``NPU_ST_*`` status of a completed ``fence`` (see :meth:`completion`)."""
        return self.completion(fence).status

    # -- pushing commands -----------------------------------------------------

    def push(self, cmd: _abi.NpuCmd, timeout_s: float | None = DEFAULT_TIMEOUT_S) -> int:
        """Copy ``cmd`` into the ring with the next fence; return that fence.

        The descriptor is taken as it is (opcode, flags, ``ctx``, payload of
        device addresses); only its ``fence`` is set, in the ring copy. It
        runs once :meth:`kick` (or a :meth:`wait`) rings the doorbell. When
        ``entries`` commands are already in flight, push waits up to
        ``timeout_s`` for the oldest to complete.

        Raises:
            NpuError: ``EBUSY`` (the ring stayed full), ``EBADFD`` (the device
                stopped the queue on an MMU fault), ``EIO`` (it stopped it on a
                ring error or a device reset), ``EBADF`` (closed).
            NpuDeviceError: the queue stopped while push waited for room.
        """
        if not isinstance(cmd, _abi.NpuCmd):
            raise TypeError(f"{self._context}: push takes an npu._abi.NpuCmd, not {type(cmd)}")
        off = self.claim(timeout_s)
        fence = self._tail + 1
        ctypes.memmove(self._ring_addr + off, ctypes.addressof(cmd), _CMD_SIZE)
        _FENCE.pack_into(self._mem, off + 8, fence)
        self._tail = fence
        if cmd.flags & _F_IRQ:
            self._irq_fence = fence
        return fence

    def nop(self, *, irq: bool = False) -> int:
        """Push a NOP; return its fence. ``irq``: interrupt when it completes."""
        tail = self._tail
        if self._closed or self._stop is not None or tail - self._checked >= self.entries:
            return self.emit(_OP_NOP, irq, 0, 0, 0, None, None, None)
        # The fast path of _emit: a free slot of an open, running queue.
        fence = tail + 1
        CMD3.pack_into(
            self._mem, (tail & self._mask) * _CMD_SIZE, _OP_NOP, _F_IRQ if irq else 0, 0, 0,
            fence, 0, 0, 0,
        )  # fmt: skip
        self._tail = fence
        if irq:
            self._irq_fence = fence
        return fence

    def copy(
        self,
        src: Buffer,
        dst: Buffer,
        nbytes: SupportsIndex,
        src_offset: SupportsIndex = 0,
        dst_offset: SupportsIndex = 0,
        *,
        irq: bool = False,
    ) -> int:
        """Push a COPY of ``nbytes`` from ``src[src_offset:]`` to ``dst[dst_offset:]``.

        Both buffers must belong to this queue's device; they are kept alive
        until the command completes. Returns the fence.

        Raises:
            ValueError: a range does not fit its buffer, ``nbytes`` is not in
                ``1..NPU_MAX_XFER``, the ranges overlap, or a buffer is of
                another device.
            NpuError: as :meth:`push`; ``EBADF`` for a freed buffer.
        """
        n = _check_range("COPY nbytes", nbytes, 1, _abi.NPU_MAX_XFER)
        s_off = _check_range("COPY src_offset", src_offset, 0, _abi.U64_MAX)
        d_off = _check_range("COPY dst_offset", dst_offset, 0, _abi.U64_MAX)
        s_va = self._va_of("COPY src", src, s_off, n)
        d_va = self._va_of("COPY dst", dst, d_off, n)
        if s_va < d_va + n and d_va < s_va + n:
            raise ValueError(f"{self._context}: COPY source and destination overlap")
        return self.emit(_OP_COPY, irq, s_va, d_va, n, src, dst, None)

    def fill(
        self,
        dst: Buffer,
        pattern_u32: SupportsIndex,
        nbytes: SupportsIndex,
        offset: SupportsIndex = 0,
        *,
        irq: bool = False,
    ) -> int:
        """Push a FILL of ``dst[offset:offset + nbytes]`` with a 32-bit pattern.

        The pattern is stored little endian every 4 bytes. Returns the fence.

        Raises:
            ValueError: ``nbytes`` is not a positive multiple of 4 up to
                ``NPU_MAX_XFER``, the pattern is not a u32, the range does
                not fit ``dst``, or ``dst`` is of another device.
            NpuError: as :meth:`push`; ``EBADF`` for a freed buffer.
        """
        n = _check_range("FILL nbytes", nbytes, 4, _abi.NPU_MAX_XFER)
        if n % 4:
            raise ValueError(f"{self._context}: FILL nbytes={n} is not a multiple of 4")
        pattern = _check_range("FILL pattern_u32", pattern_u32, 0, _abi.U32_MAX)
        d_off = _check_range("FILL offset", offset, 0, _abi.U64_MAX)
        d_va = self._va_of("FILL dst", dst, d_off, n)
        return self.emit(_OP_FILL, irq, d_va, n, pattern, dst, None, None)

    def kick(self) -> None:
        """Ring the doorbell: the device runs every command pushed so far."""
        bell = self._bell
        if bell is None:
            raise self._closed_error("kick")
        tail = self._tail
        bell.value = tail & _U32_MASK
        self._kicked = tail

    # -- waiting --------------------------------------------------------------

    def wait(
        self,
        fence: int,
        timeout_s: float | None = DEFAULT_TIMEOUT_S,
        *,
        spin_s: float | None = None,
    ) -> None:
        """Wait until ``fence`` has completed; raise the errors of commands up to it.

        Rings the doorbell first if pushed commands were not kicked. Spins on
        the fence record for ``spin_s`` (default :attr:`spin_s`), then sleeps
        in the WAIT ioctl. When no command from ``fence`` on asks for an
        interrupt, a NOP with ``NPU_CMD_F_IRQ`` is pushed (it takes the next
        fence) so that the sleep ends with the completion, not a poll.

        Raises:
            ValueError: ``fence`` was never pushed, or a negative timeout.
            NpuDeviceError: a command up to ``fence`` completed with an error
                (each reported once, oldest first): ``errno`` ``EBADFD`` with
                status ``NPU_ST_MMU_FAULT`` when it faulted (the queue has
                stopped and the file is faulted), else ``EIO``.
            NpuTimeoutError: ``fence`` did not complete within ``timeout_s``.
            NpuError: ``EBADF`` (closed), or another WAIT failure.
        """
        if self._closed:
            raise self._closed_error("wait")
        if not 0 <= fence <= self._tail:
            raise ValueError(f"{self._context}: wait on fence {fence}, last pushed {self._tail}")
        if timeout_s is not None and not timeout_s >= 0:
            raise ValueError(f"{self._context}: timeout_s={timeout_s} must be >= 0 or None")
        if self._kicked < fence:
            self.kick()
        done = int(self._fence_view[0])
        if done < fence:
            rec = _spans.recorder
            t0 = _spans.now() if rec is not None else 0
            self._scan(done)
            if self._stop is not None:
                # A fault stopped the queue: `fence` never completes, so the
                # failure is raised now. Any other failure is raised once
                # `fence` has completed, as the call promises.
                self._check(done, fence)
            self._sleep(fence, timeout_s, self.spin_s if spin_s is None else spin_s)
            if rec is not None:
                rec.add("UserQueue.wait", t0, _spans.now(), {"queue": self.index, "fence": fence})
        self._check(fence, fence)

    def synchronize(self, timeout_s: float | None = DEFAULT_TIMEOUT_S) -> None:
        """Wait for every command pushed so far (see :meth:`wait`)."""
        self.wait(self._tail, timeout_s)

    # -- lifetime -------------------------------------------------------------

    def close(self) -> None:
        """Give the hardware queue back (QUEUE_DESTROY) and unmap it. Idempotent.

        Commands not run yet are dropped: :meth:`synchronize` first to finish
        them. The doorbell mapping is gone at once; the queue memory stays
        readable until every view of it is released.

        Raises:
            NpuError: QUEUE_DESTROY failed (the queue is closed anyway).
        """
        if self._closed:
            return
        self._closed = True
        self._bell = None
        self._finalizer.detach()
        error: NpuError | None = None
        if not self.device.closed:
            try:
                self.device.backend.queue_destroy(self.index)
            except OSError as exc:
                error = NpuError.from_oserror(exc, f"QUEUE_DESTROY(queue={self.index})")
        self._fence_view.release()
        self._cpl_words.release()
        del self._status_np
        del self._ring_np
        self._unmap()
        self._keep.clear()
        self.device.forget_queue(self)
        log.debug("QUEUE_DESTROY queue=%d", self.index)
        if error is not None:
            raise error

    def __repr__(self) -> str:
        if self.closed:
            return f"<npu.UserQueue queue={self.index} closed>"
        return (
            f"<npu.UserQueue queue={self.index} entries={self.entries} "
            f"pushed={self._tail} completed={self._fence_view[0]}>"
        )

    # -- internals ------------------------------------------------------------

    def _closed_error(self, what: str) -> NpuError:
        return NpuError(errno.EBADF, "user queue is closed", f"{self._context}.{what}")

    def _stopped_error(self) -> NpuError:
        assert self._stop is not None
        code, fence = self._stop
        why = "an MMU fault" if code == errno.EBADFD else "an error (ring or reset)"
        return NpuError(
            code,
            f"the device stopped the queue on {why}",
            f"{self._context}.push (stopped after fence {fence})",
        )

    def claim(self, timeout_s: float | None) -> int:
        """Room for one more command: return the byte offset of its ring slot."""
        if self._closed:
            raise self._closed_error("push")
        if self._stop is not None:
            raise self._stopped_error()
        tail = self._tail
        if tail - self._checked >= self.entries:
            self._make_room(timeout_s)
        return (tail & self._mask) * _CMD_SIZE

    def reserve(self, count: int, timeout_s: float | None) -> int:
        """Room for ``count`` (<= entries) more commands: return the first one's fence.

        Their ring slots are ``(fence - 1) % entries``; :meth:`commit`
        then publishes them.
        """
        if self._closed:
            raise self._closed_error("push")
        if self._stop is not None:
            raise self._stopped_error()
        if not 0 < count <= self.entries:
            raise ValueError(f"{self._context}: {count} commands do not fit {self.entries} entries")
        # (A wait for room may push an interrupting NOP: check again after it.)
        while self._tail + count - self._checked > self.entries:
            self._make_room(timeout_s, count)
        return self._tail + 1

    def commit(self, count: int) -> None:
        """The ``count`` slots :meth:`reserve` made room for now hold complete
        descriptors (fences set, no interrupt flag): advance the tail past them."""
        self._tail += count

    def emit(
        self,
        opcode: int,
        irq: bool,
        w0: int,
        w1: int,
        w2: int,
        keep0: Buffer | None,
        keep1: Buffer | None,
        timeout_s: float | None,
    ) -> int:
        """Push one descriptor of up to three payload words."""
        tail = self._tail
        if self._closed or self._stop is not None or tail - self._checked >= self.entries:
            off = self.claim(DEFAULT_TIMEOUT_S if timeout_s is None else timeout_s)
        else:  # _claim's fast path, inline
            off = (tail & self._mask) * _CMD_SIZE
        fence = self._tail + 1
        flags = _F_IRQ if irq else 0
        CMD3.pack_into(self._mem, off, opcode, flags, 0, 0, fence, w0, w1, w2)
        self._tail = fence
        if irq:
            self._irq_fence = fence
        if keep0 is not None:
            self._keep.append((fence, keep0, keep1))
        return fence

    def put(self, off: int, opcode: int, w0: int, w1: int, w2: int) -> int:
        """Write a descriptor into the slot :meth:`claim` returned; no IRQ, nothing kept."""
        fence = self._tail + 1
        CMD3.pack_into(self._mem, off, opcode, 0, 0, 0, fence, w0, w1, w2)
        self._tail = fence
        return fence

    def _va_of(self, what: str, buf: Buffer, offset: int, nbytes: int) -> int:
        if not isinstance(buf, Buffer):
            raise TypeError(f"{self._context}: {what} must be an npu.Buffer, not {type(buf)}")
        owner: object = buf.device  # one Device behind both protocols
        if owner is not self.device:
            raise ValueError(f"{self._context}: {what} {buf!r} belongs to {owner!r}")
        va = buf.va  # raises NpuError(EBADF) if freed
        if not va:
            raise ValueError(f"{self._context}: {what} {buf!r} has no device address")
        if offset + nbytes > buf.size:
            raise ValueError(
                f"{self._context}: {what} range [{offset}, {offset + nbytes}) does not "
                f"fit the buffer of {buf.size} bytes"
            )
        return va + offset

    def _make_room(self, timeout_s: float | None, count: int = 1) -> None:
        """Wait until the oldest command whose slot the next ``count`` pushes reuse is done."""
        need = self._tail + count - self.entries
        if self._fence_view[0] < need:
            if self._kicked < self._tail:
                self.kick()
            if timeout_s == 0:
                raise NpuError(
                    errno.EBUSY,
                    f"ring full ({self.entries} commands in flight)",
                    f"{self._context}.push",
                )
            try:
                self._sleep(need, timeout_s, self.spin_s)
            except NpuTimeoutError as exc:
                raise NpuError(
                    errno.EBUSY,
                    f"ring full ({self.entries} commands in flight) for {timeout_s} s",
                    f"{self._context}.push",
                ) from exc
        self._scan(int(self._fence_view[0]))
        if self._stop is not None:
            raise self._stopped_error()

    def _scan(self, upto: int) -> None:
        """Inspect the completion records of fences (checked, upto]; note failures."""
        start = self._checked
        count = upto - start
        if count <= 0:
            return
        if count > self.entries:  # cannot happen while push keeps the rule
            log.warning("%s: %d completion records lost", self._context, count - self.entries)
            start, count = upto - self.entries, self.entries
        mask = self._mask
        if count <= _SCAN_LOOP_MAX:
            words = self._cpl_words
            for fence in range(start + 1, upto + 1):
                if words[((fence - 1) & mask) * 8 + 2]:
                    self._note_failure(fence)
        else:
            first = start & mask
            status = self._status_np
            end = first + count
            if end <= self.entries:
                bad = np.flatnonzero(status[first:end])
            else:
                bad = np.concatenate(
                    (
                        np.flatnonzero(status[first:]),
                        np.flatnonzero(status[: end - self.entries]) + (self.entries - first),
                    )
                )
            for i in bad.tolist():
                self._note_failure(start + 1 + int(i))
        self._checked = upto
        keep = self._keep
        while keep and keep[0][0] <= upto:
            keep.popleft()

    def _note_failure(self, fence: int) -> None:
        rec = _CPL.unpack_from(self._mem, self._cpl_offset + ((fence - 1) & self._mask) * _CPL_SIZE)
        status, opcode = int(rec[1]), int(rec[2])
        if status == _abi.NPU_ST_MMU_FAULT and self._stop is None:
            self._stop = (errno.EBADFD, fence)
        if len(self._failures) < _MAX_PENDING_ERRORS:
            op = self._op_of(fence) if self._op_of is not None else None
            self._failures.append(_Failure(fence, status, opcode, op))
        else:
            log.warning("%s: error at fence %d dropped (too many pending)", self._context, fence)

    def _check(self, upto: int, fence: int) -> None:
        """Scan the records up to ``upto`` (completed); raise the oldest failure."""
        self._scan(upto)
        failures = self._failures
        if failures and failures[0].fence <= upto:
            raise self._failure_error(failures.popleft(), fence)

    def _failure_error(self, failure: _Failure, fence: int) -> NpuDeviceError:
        code = errno.EBADFD if failure.status == _abi.NPU_ST_MMU_FAULT else errno.EIO
        try:
            name = _abi.Opcode(failure.opcode).name
        except ValueError:
            name = f"opcode {failure.opcode}"
        return NpuDeviceError(
            failure.status,
            failure.fence,
            failure.op,
            f"{self._context}.wait(fence={fence}): {name} at fence {failure.fence}",
            code,
        )

    def _spin(self, fence: int, spin_s: float) -> bool:
        view = self._fence_view
        if view[0] >= fence:
            return True
        if spin_s > 0:
            clock = time.perf_counter
            end = clock() + spin_s
            while clock() < end:
                if view[0] >= fence:
                    return True
        return bool(view[0] >= fence)

    def _sleep(self, fence: int, timeout_s: float | None, spin_s: float) -> None:
        """Block until the fence record reaches ``fence`` (spin, then WAIT)."""
        if self._spin(fence, spin_s):
            return
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        if (
            self._irq_fence < fence
            and self._stop is None
            and self._tail - self._checked < self.entries
        ):
            # Nothing from `fence` on interrupts: add a NOP that does.
            self.emit(_OP_NOP, True, 0, 0, 0, None, None, 0)
            self.kick()
        backend = self.device.backend
        view = self._fence_view
        while True:
            if deadline is None:
                slice_ns = _FOREVER_SLICE_NS
            else:
                slice_ns = max(0, int((deadline - time.monotonic()) * 1e9))
            if self._irq_fence < fence:
                slice_ns = min(slice_ns, _POLL_SLICE_NS)
            try:
                backend.wait(fence, slice_ns, self.index)
            except InterruptedError:
                continue
            except OSError as exc:
                if view[0] >= fence:
                    return
                if exc.errno in (errno.ETIMEDOUT, errno.ETIME):
                    if deadline is None or time.monotonic() < deadline:
                        continue
                    raise NpuTimeoutError(
                        fence,
                        timeout_s or 0.0,
                        f"{self._context}.wait(fence={fence}, timeout_s={timeout_s})",
                        exc.errno,
                        exc.strerror,
                    ) from exc
                if isinstance(exc, WaitFailed):
                    self._stopped(fence, exc, exc.status, exc.error_fence)
                raise NpuError.from_oserror(exc, f"{self._context}.wait(fence={fence})") from exc
            return

    def _stopped(self, fence: int, exc: OSError, status: int, error_fence: int) -> NoReturn:
        """WAIT says the device stopped the queue before ``fence``: raise why."""
        self._scan(int(self._fence_view[0]))
        if self._failures:
            raise self._failure_error(self._failures.popleft(), fence) from exc
        if self._stop is None:
            self._stop = (exc.errno or errno.EIO, error_fence)
        raise NpuDeviceError(
            status,
            error_fence,
            None,
            f"{self._context}.wait(fence={fence}): the queue stopped after fence {error_fence}",
            exc.errno if exc.errno is not None else errno.EIO,
            exc.strerror,
        ) from exc

    def _unmap(self) -> None:
        maps, self._maps = self._maps, []
        for mapping in maps:
            try:
                mapping.close()
            except BufferError:
                log.debug(
                    "user queue %d: views still reference its memory; it is unmapped "
                    "when they are garbage-collected",
                    self.index,
                )


def _map(backend: Backend, length: int, offset: int, *, writable_only: bool) -> mmap.mmap:
    """Map ``length`` bytes of the device at ``offset`` (shared)."""
    prot = mmap.PROT_WRITE if writable_only else mmap.PROT_READ | mmap.PROT_WRITE
    try:
        return backend.map(offset, length, prot)
    except OSError as exc:
        raise NpuError.from_oserror(exc, f"mmap(offset={offset:#x}, size={length})") from exc


def _destroy_unreferenced(device_ref: weakref.ref[QueueOwner], index: int) -> None:
    """Finalizer: give back the queue of a UserQueue collected without close()."""
    device = device_ref()
    if device is None or device.closed:
        return
    log.debug("user queue %d collected without close(); destroying it", index)
    try:
        device.backend.queue_destroy(index)
    except OSError as exc:
        log.warning("destroying unreferenced user queue %d (QUEUE_DESTROY) failed: %s", index, exc)
