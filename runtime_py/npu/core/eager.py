"""The default stream's timeline: eager ops batched into SUBMITs.

Outside any ``with npu.Stream(...)``, every tensor op used to be one SUBMIT
(a system call costing hundreds of microseconds in the guest, against tens
for the op's Python). An :class:`EagerQueue` holds the packed descriptors of
eager ops back instead and submits them together, in order, in one SUBMIT
(up to :data:`BATCH_MAX` ops of one format) when

- anything waits for one of them (a host synchronisation:
  ``Tensor.numpy()``, ``wait()``, ``npu.synchronize()``, the allocator
  letting the host write a reused block, ...);
- the batch is full, or the next op has the other descriptor format;
- any other SUBMIT goes to queue 0 (:meth:`npu.Device.submit`, a graph
  replay, an event): queue 0 keeps program order;
- the next op finds the batch older than :data:`FLUSH_S`, or the flusher
  thread (every :data:`FLUSHER_BUSY_S` while a batch is held) does, so work
  never waits for a synchronisation that does not come;
- the device closes.

The queue's fences are its own (1, 2, ... per device), as a user stream's
are: the driver's fence of an op is only known once its batch is submitted.
Waits translate, and a device error's ``fence`` is translated back (its
context names the driver's fence). A batch the driver refuses at flush is
lost: every wait for one of its ops raises that refusal.
"""

from __future__ import annotations

import bisect
import errno
import logging
import threading
import time
import weakref
from collections import deque
from collections.abc import Sequence
from typing import Final

from .. import _abi, _spans
from ..errors import DEFAULT_TIMEOUT_S, NpuDeviceError, NpuError
from ..kernels.template import Template
from .device import Device, PackedOps

__all__ = ["BATCH_MAX", "FLUSH_S", "EagerQueue", "eager_queue"]

log = logging.getLogger(__name__)

#: The most eager ops one SUBMIT carries.
BATCH_MAX: Final = min(128, _abi.NPU_SUBMIT_MAX_OPS)
#: Age in seconds at which the next launch submits the batch.
FLUSH_S: Final = 0.002
#: How often the flusher thread looks for a batch left behind (the program
#: stopped launching without a synchronisation) while one is held, and
#: while none is. It is not told of new batches: waking it would cost the
#: launching thread a switch of the GIL per batch.
FLUSHER_BUSY_S: Final = 0.008
FLUSHER_IDLE_S: Final = 0.05
# Submitted batches whose ticket -> driver fence mapping is kept until waited.
_SEGMENTS_MAX: Final = 4096


class EagerQueue:
    """The default stream's timeline of ``device`` (one per device: :func:`eager_queue`).

    A :class:`npu.core.device.Timeline`: :meth:`completed` and :meth:`wait`
    take its own fences. Thread-safe: ops of several threads get fences in
    the order they call :meth:`launch`.
    """

    def __init__(self, device: Device) -> None:
        self.device = device
        # Guards every attribute below.
        self._lock = threading.Lock()
        self._data = bytearray()  # the batch: its packed descriptors
        self._ops: list[object] = []  # what names each one in errors
        self._tensor = True  # the batch's descriptor format
        self._since = 0.0  # monotonic time of the batch's first op
        self._next = 0  # the last fence given
        self._flushed = 0  # the last fence submitted (or lost)
        self._done = 0  # the highest fence seen complete
        # Submitted batches not known complete, oldest first: (first fence,
        # last fence, driver fence of the last), and their first fences.
        self._segments: list[tuple[int, int, int]] = []
        self._firsts: list[int] = []
        # Batches the driver refused: (first fence, last fence, the error).
        self._lost: deque[tuple[int, int, NpuError]] = deque(maxlen=64)
        self._thread: threading.Thread | None = None
        self._closed = False
        self.submits = 0  # SUBMITs made, for statistics
        device.defer_to(self)

    def __repr__(self) -> str:
        return f"<npu.EagerQueue of {self.device.path} at fence {self._next}>"

    @property
    def stream(self) -> None:
        """No :class:`npu.Stream`: the default stream's ops are this queue's."""
        return None

    @property
    def last_fence(self) -> int:
        """The fence of the last op launched."""
        return self._next

    # -- launching -------------------------------------------------------------

    def launch(self, record: bytes, tensor: bool, op: object) -> int:
        """Queue one packed descriptor (``struct npu_tensor_op`` if ``tensor``,
        else ``struct npu_op``) of a checked op; return its fence. ``op``
        names it in errors.

        Raises:
            NpuError: ``EBADF`` once the device closed, or the driver refused
                the earlier batch this launch had to submit first.
        """
        with self._lock:
            self._admit(tensor)
            self._data += record
            return self._admitted(op)

    def launch_template(
        self, template: Template, handles: Sequence[int], offsets: Sequence[int], op: object
    ) -> int:
        """:meth:`launch` of ``template``'s descriptor at these operands, packed
        straight into the batch (:meth:`Template.append_record`)."""
        with self._lock:
            self._admit(True)
            template.append_record(self._data, handles, offsets)
            return self._admitted(op)

    def _admit(self, tensor: bool) -> None:
        """Make room in the batch for one descriptor of this format (lock held)."""
        if self._closed:
            raise NpuError(errno.EBADF, "device is closed", f"Device({self.device.path})")
        ops_held = self._ops
        if ops_held and (self._tensor is not tensor or time.monotonic() - self._since >= FLUSH_S):
            self._flush_locked()
        if not ops_held:
            self._since = time.monotonic()
            self._tensor = tensor
            if self._thread is None:
                self._start_flusher()

    def _admitted(self, op: object) -> int:
        """The descriptor just packed is in: its fence (lock held)."""
        self._ops.append(op)
        self._next += 1
        fence = self._next
        if len(self._ops) >= BATCH_MAX:
            self._flush_locked()
        self.device.note_timeline(self, fence)
        return fence

    def submit_packed(self, packed: Sequence[PackedOps]) -> tuple[int, int]:
        """Submit ops packed by :meth:`npu.Device.pack` now, after the batch (a
        graph replay on the default stream); return their first and last fence.

        Raises:
            ValueError: nothing to submit.
            NpuError: a buffer was freed (``EBADF``), or the driver refused.
        """
        if not packed:
            raise ValueError("submit_packed: no ops")
        for run in packed:
            for buf in run.buffers:
                buf.handle  # noqa: B018 - raises NpuError(EBADF) if freed
        with self._lock:
            if self._closed:
                raise NpuError(errno.EBADF, "device is closed", f"Device({self.device.path})")
            self._flush_locked()
            start = self._next + 1
            for run in packed:
                first = self._next + 1
                self._next += len(run.ops)
                self._flushed = self._next
                try:
                    fence = self.device.submit_records(run.raw, len(run.ops), run.tensor, run.ops)
                except NpuError as exc:
                    self._lost.append((first, self._next, exc))
                    raise
                self._add_segment(first, self._next, fence)
            last = self._next
        self.device.note_timeline(self, last)
        return start, last

    def flush(self) -> None:
        """Submit the batch now (nothing to do if it is empty).

        Raises:
            NpuError: the driver refused it (its ops are lost; their waits
                raise this too).
        """
        if self._ops:
            rec = _spans.recorder
            t0 = _spans.now() if rec is not None else 0
            with self._lock:
                self._flush_locked()
            if rec is not None:
                rec.add("EagerQueue.flush", t0, _spans.now())

    def close(self) -> None:
        """Flush, stop the flusher thread; later launches raise ``EBADF``."""
        with self._lock:
            self._closed = True
            self._flush_locked()

    def _flush_locked(self) -> None:
        if not self._ops:
            return
        first, last = self._flushed + 1, self._next
        data = bytes(self._data)
        op_list = tuple(self._ops)
        self._data.clear()
        self._ops.clear()
        self._flushed = last
        try:
            fence = self.device.submit_records(data, len(op_list), self._tensor, op_list)
        except NpuError as exc:
            self._lost.append((first, last, exc))
            raise
        self._add_segment(first, last, fence)

    def _add_segment(self, first: int, last: int, fence: int) -> None:
        self._segments.append((first, last, fence))
        self._firsts.append(first)
        if len(self._segments) > _SEGMENTS_MAX:  # the oldest stay mapped conservatively
            del self._segments[: _SEGMENTS_MAX // 2]
            del self._firsts[: _SEGMENTS_MAX // 2]
        self.submits += 1

    def _start_flusher(self) -> None:
        thread = threading.Thread(
            target=_flusher, args=(weakref.ref(self),), name="npu-eager-flush", daemon=True
        )
        self._thread = thread
        thread.start()

    def flusher_tick(self) -> float | None:
        """One step of the flusher thread (which holds no strong reference to
        the queue between steps): submit a batch older than :data:`FLUSH_S`;
        the seconds to sleep until the next step, None once the queue closed."""
        with self._lock:
            if self._closed:
                return None
            if self._ops and time.monotonic() - self._since >= FLUSH_S:
                try:
                    self._flush_locked()
                except NpuError as exc:  # kept for the waits of the lost ops
                    log.warning("eager batch refused: %s", exc)
            return FLUSHER_BUSY_S if self._ops else FLUSHER_IDLE_S

    # -- fences ----------------------------------------------------------------

    def _driver_fence(self, fence: int, what: str) -> int | None:
        """Queue 0's fence of ``fence`` (flushing its batch first); None if it
        is known complete (lock held). Raises the refusal of a lost batch."""
        if fence > self._next:
            raise NpuError(
                errno.EINVAL,
                f"fence {fence} was never launched (last {self._next})",
                f"{what}(default stream)",
            )
        for first, last, exc in self._lost:
            if first <= fence <= last:
                raise NpuError(
                    exc.errno or errno.EIO,
                    f"its batch was refused: {exc}",
                    f"{what}(default stream fence {fence})",
                )
        if fence > self._flushed:
            self._flush_locked()
        if fence <= self._done:
            return None
        i = bisect.bisect_right(self._firsts, fence) - 1
        if i < 0:
            # Older than every batch kept (a batch dropped unwaited, or one
            # lost): queue 0 runs in order, so the oldest kept one's first
            # fence covers it.
            if not self._segments:
                return None
            first, last, driver = self._segments[0]
            return driver - (last - first)
        first, last, driver = self._segments[i]
        return driver - (last - fence) if fence <= last else None

    def _ticket(self, driver: int) -> int:
        """This queue's fence of queue 0's fence ``driver``; 0 if none of its ops has it."""
        with self._lock:
            for first, last, last_driver in self._segments:
                base = last_driver - (last - first)
                if base <= driver <= last_driver:
                    return first + driver - base
        return 0

    def _note_done(self, fence: int) -> None:
        with self._lock:
            if fence > self._done:
                self._done = fence
                done = bisect.bisect_right(self._firsts, fence) - 1  # not the one holding it
                if done > 0:
                    del self._segments[:done]
                    del self._firsts[:done]

    def completed(self, fence: int) -> bool:
        """True if ``fence`` is known complete (no system call).

        An op still held back is not complete, and asking does not submit it
        (the allocator asks about many blocks it may reuse; a wait submits).
        """
        if fence <= self._done:
            return True
        if fence > self._flushed:
            return False
        with self._lock:
            driver = self._driver_fence(fence, "completed")
        if driver is None or self.device.completed(0, driver):
            self._note_done(fence)
            return True
        return False

    def wait(self, fence: int, timeout_s: float | None = DEFAULT_TIMEOUT_S) -> None:
        """Wait for ``fence`` (flushing its batch first).

        Raises:
            NpuDeviceError: an op up to it failed; ``fence`` is this queue's
                fence of the failed op (0 if it is not one of its ops).
            NpuTimeoutError, NpuError: as :meth:`npu.Device.wait`, or the
                refusal of the op's batch.
        """
        if fence <= self._done:
            return
        with self._lock:
            driver = self._driver_fence(fence, "wait")
        if driver is not None:
            try:
                self.device.wait(driver, timeout_s=timeout_s)
            except NpuDeviceError as exc:
                ticket = self._ticket(exc.fence)
                raise NpuDeviceError(
                    exc.status,
                    ticket,
                    exc.op,
                    f"{exc.context} (default stream fence {ticket})",
                    exc.errno or errno.EIO,
                    exc.strerror,
                ) from exc
        self._note_done(fence)


def _flusher(ref: weakref.ReferenceType[EagerQueue]) -> None:
    """The flusher thread: submits a batch older than :data:`FLUSH_S` that no
    launch submitted (the program stopped launching without synchronising)."""
    while True:
        queue = ref()
        pause = None if queue is None else queue.flusher_tick()
        del queue
        if pause is None:
            return
        time.sleep(pause)


def eager_queue(device: Device) -> EagerQueue:
    """The default stream's :class:`EagerQueue` of ``device`` (made on first use)."""
    return device.attachment(EagerQueue)
