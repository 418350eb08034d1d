"""User-mode queues of the CPU backend: rings in shared memory, run by a firmware thread.

A queue is what the driver lends (``docs/uapi.md``, QUEUE_CREATE): a memory
file holding the ring of ``entries`` 128-byte ``struct npu_cmd`` descriptors,
their 32-byte completion records and the 16-byte fence record, and a
one-page doorbell file; the process maps both and drives the queue with
plain stores. :class:`QueueEngine` plays the device's command processor of
``docs/npu-spec.md`` section 6 on them: it reads each doorbell (a free-running
tail), fetches each descriptor once, checks it in the spec's order, runs it
on the backend's buffers (device VAs translated by the backend), writes the
completion record and then the fence record, and advances its head.

Nothing traps a store in this process, so the doorbells are polled: by a
firmware thread (every 0.1 ms after work, backing off to 2 ms when idle; it
runs only while a queue is lent) and by every WAIT on a user queue, which
runs the rings itself before it sleeps. A WAIT command whose value is not
there blocks its queue, and is looked at again on each pass, as the
device's 1 ms re-check.

Departures from the device, written down in ``docs/runtime.md``: queues run
round robin, one command per queue per pass, whatever their priority; a
transfer must lie in one buffer (the driver's space makes adjacent buffers
contiguous); a tensor op the backend's checks refuse completes with
``BAD_ARGS`` (``BAD_OPCODE`` for an op its caps lack), not always the
device's exact status; there is no interrupt moderation.
"""

from __future__ import annotations

import ctypes
import errno
import logging
import mmap
import os
import struct
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Final

import numpy as np

from .. import _abi
from .cpu_kernels import DTYPE_SIZE, Executor
from .memfd import memfd
from .types import QueueInfo, WaitFailed

__all__ = ["QueueEngine", "Translate"]

log = logging.getLogger(__name__)

Bytes = np.ndarray[Any, np.dtype[np.uint8]]
#: ``translate(va, nbytes)`` -> ``(handle, offset, bytes)`` of the one buffer
#: holding ``[va, va + nbytes)``, or None (an MMU fault).
Translate = Callable[[int, int], "tuple[int, int, Bytes] | None"]

_CMD: Final = 128
_CPL: Final = 32
_HEADER: Final = struct.Struct("<HHHHQ")
_CPL_REC: Final = struct.Struct("<QIHHQQ")
_FENCE_WB: Final = struct.Struct("<QQ")
_U32: Final = struct.Struct("<I")
_U64: Final = struct.Struct("<Q")
_COPY: Final = struct.Struct("<QQQ")
_FILL: Final = struct.Struct("<QQII")
_GEMM: Final = struct.Struct("<QQQ8I")
_TENSOR: Final = struct.Struct("<QII")
_SYNC: Final = struct.Struct("<QQ")
_PARAMS_SIZE: Final = ctypes.sizeof(_abi.NpuTensorParams)
_MAX_XFER: Final = 1 << 32
_MAX_DIM: Final = 65536
_MAX_LD: Final = 1 << 24
# Payload bytes each opcode uses (offsets 16..); the rest must be zero.
_USED: Final = {
    _abi.NPU_OP_NOP: 0,
    _abi.NPU_OP_COPY: 24,
    _abi.NPU_OP_FILL: 24,
    _abi.NPU_OP_GEMM: 56,
    _abi.NPU_OP_SIGNAL: 16,
    _abi.NPU_OP_WAIT: 16,
    **dict.fromkeys(_abi.TENSOR_OPCODES, 16),
}
_BLOCKED: Final = -1  # a WAIT whose value is not there: no completion, head stays
_POLL_MIN_S: Final = 100e-6
_POLL_MAX_S: Final = 2e-3
#: mmap offsets of queue ``q``: its doorbell page, and its memory 1 MiB on.
DOORBELL_SHIFT: Final = 24
MEM_GAP: Final = 1 << 20


class _Fault(Exception):
    """A translation failed: the command completes with MMU_FAULT and its queue stops."""


@dataclass(eq=False)
class _Queue:
    index: int
    entries: int
    priority: int
    mem_fd: int
    mem: mmap.mmap  # the engine's own mapping of the queue memory
    bell_fd: int
    bell: mmap.mmap  # and of the doorbell page
    head: int = 0  # free-running, as Q_HEAD
    done: int = 0  # the fence of the last completed command
    # Why the device stopped the queue: (errno for WAIT, status, error fence).
    stop: tuple[int, int, int] | None = None

    @property
    def cpl_offset(self) -> int:
        return self.entries * _CMD

    @property
    def fence_offset(self) -> int:
        return self.entries * (_CMD + _CPL)

    @property
    def mem_size(self) -> int:
        return _mem_size(self.entries)


class QueueEngine:
    """The CPU backend's user queues 1..``count`` and the command processor running them.

    Every method but the thread's must be called with ``lock`` held (the
    backend's lock: it guards the buffers the commands touch as well).
    """

    def __init__(
        self,
        lock: threading.Lock,
        translate: Translate,
        executor: Executor,
        on_fault: Callable[[int, int], None],
        count: int,
        *,
        halted: Callable[[], bool],
    ) -> None:
        self._lock = lock
        self._translate = translate
        self._executor = executor
        self._on_fault = on_fault  # (queue, fence): a queue faulted, the file is faulted
        self.count = count
        self._halted = halted  # an injected hang: no command runs
        self._queues: dict[int, _Queue] = {}
        self._thread: threading.Thread | None = None
        self._closed = False

    # -- lending ----------------------------------------------------------------

    def create(self, entries: int, priority: int) -> QueueInfo:
        """Lend the lowest free queue (``EBUSY``: none left)."""
        if (
            entries < _abi.NPU_QUEUE_MIN_ENTRIES
            or entries > _abi.NPU_QUEUE_MAX_ENTRIES
            or entries & (entries - 1)
            or not 0 <= priority <= 3
        ):
            raise _err(errno.EINVAL)
        if priority > _abi.NPU_QUEUE_PRIORITY_USER and os.geteuid() != 0:
            raise _err(errno.EACCES)
        index = next((q for q in range(1, self.count + 1) if q not in self._queues), None)
        if index is None:
            raise _err(errno.EBUSY)
        mem_fd = memfd("npu-cpu-queue", _mem_size(entries))
        try:
            bell_fd = memfd("npu-cpu-doorbell", mmap.PAGESIZE)
        except BaseException:
            os.close(mem_fd)
            raise
        try:
            mem = mmap.mmap(mem_fd, _mem_size(entries), flags=mmap.MAP_SHARED)
            bell = mmap.mmap(bell_fd, mmap.PAGESIZE, flags=mmap.MAP_SHARED)
        except BaseException:
            os.close(mem_fd)
            os.close(bell_fd)
            raise
        q = _Queue(index, entries, priority, mem_fd, mem, bell_fd, bell)
        self._queues[index] = q
        self._start_thread()
        base = index << DOORBELL_SHIFT
        return QueueInfo(
            index=index,
            mem_offset=base + MEM_GAP,
            mem_size=q.mem_size,
            cpl_offset=q.cpl_offset,
            fence_offset=q.fence_offset,
            doorbell_offset=base,
        )

    def destroy(self, index: int) -> None:
        """Disable a lent queue and give it back (``ENOENT``: not lent, ``EINVAL``: no such queue).

        Commands not run are dropped. The doorbell file is cut to nothing,
        so a store through a mapping of it gets ``SIGBUS``, as after the
        driver zaps it; the queue memory lives on in the process's mappings.
        """
        q = self._queues.pop(self._index(index), None)
        if q is None:
            raise _err(errno.ENOENT)
        _release(q)

    def close(self) -> None:
        """Destroy every queue and stop the firmware thread."""
        self._closed = True
        queues, self._queues = list(self._queues.values()), {}
        for q in queues:
            _release(q)

    def map(self, offset: int, length: int, prot: int) -> mmap.mmap | None:
        """A mapping of a queue region at ``offset``; None if it is no queue's."""
        index, rest = offset >> DOORBELL_SHIFT, offset & ((1 << DOORBELL_SHIFT) - 1)
        q = self._queues.get(index)
        if q is None or index == 0:
            return None
        if rest == 0:
            fd, size = q.bell_fd, mmap.PAGESIZE
        elif rest == MEM_GAP:
            fd, size = q.mem_fd, q.mem_size
        else:
            raise _err(errno.EINVAL)
        if length > size:
            raise _err(errno.EINVAL)
        return mmap.mmap(fd, length, flags=mmap.MAP_SHARED, prot=prot)

    def _index(self, index: int) -> int:
        if not 1 <= index <= self.count:
            raise _err(errno.EINVAL)
        return index

    # -- waiting ------------------------------------------------------------------

    def check_wait(self, index: int, fence: int) -> bool:
        """Run the rings, then: True if queue ``index`` passed ``fence``.

        Raises ``ENOENT`` (not lent), ``EINVAL`` (no such queue) or
        :class:`WaitFailed` when the queue stopped before ``fence``.
        """
        q = self._queues.get(self._index(index))
        if q is None:
            raise _err(errno.ENOENT)
        self.pump()
        if _U64.unpack_from(q.mem, q.fence_offset)[0] >= fence:
            return True
        if q.stop is not None:
            code, status, error_fence = q.stop
            raise WaitFailed(code, status, error_fence)
        return False

    # -- the command processor ---------------------------------------------------

    def pump(self) -> bool:
        """Run every runnable queue, round robin, until none can go on; True if any ran."""
        ran = False
        if self._halted():
            return False
        while True:
            progress = False
            for q in list(self._queues.values()):
                if self._step(q):
                    progress = True
            if not progress:
                return ran
            ran = True

    def _step(self, q: _Queue) -> bool:
        """Run one command of ``q`` if it can; True if one completed."""
        if q.stop is not None:
            return False
        tail = _U32.unpack_from(q.bell, 0)[0]
        pending = (tail - q.head) & 0xFFFFFFFF
        if pending == 0:
            return False
        if pending > q.entries:
            log.warning("cpu queue %d: tail %d overruns head %d", q.index, tail, q.head)
            q.stop = (errno.EIO, _abi.NPU_ST_ABORTED, q.done)
            return False
        slot = q.head & (q.entries - 1)
        cmd = bytes(q.mem[slot * _CMD : (slot + 1) * _CMD])  # fetched once
        opcode, flags, ctx, rsvd0, fence = _HEADER.unpack_from(cmd)
        t_start = time.monotonic_ns()
        faulted = False
        try:
            status = self._run(cmd, opcode, flags, ctx, rsvd0)
        except _Fault:
            status, faulted = _abi.NPU_ST_MMU_FAULT, True
        if status == _BLOCKED:
            return False
        t_end = time.monotonic_ns()
        _CPL_REC.pack_into(q.mem, q.cpl_offset + slot * _CPL, fence, status, opcode, 0,
                           t_start, t_end)  # fmt: skip
        _FENCE_WB.pack_into(q.mem, q.fence_offset, fence, t_end)
        q.head = (q.head + 1) & 0xFFFFFFFF
        q.done = fence
        if faulted:  # a lent queue is confined: it stops after the command
            q.stop = (errno.EBADFD, _abi.NPU_ST_MMU_FAULT, fence)
            self._on_fault(q.index, fence)
        return True

    def _run(self, cmd: bytes, opcode: int, flags: int, ctx: int, rsvd0: int) -> int:
        """Check and run one descriptor (section 6.3 step 4): its status."""
        if flags & ~_abi.NPU_CMD_F_MASK:
            return _abi.NPU_ST_BAD_FLAGS
        if rsvd0:
            return _abi.NPU_ST_BAD_RESERVED
        if ctx:
            raise _Fault  # a lent queue cannot switch address spaces
        used = _USED.get(opcode)
        if used is None:
            return _abi.NPU_ST_BAD_OPCODE
        if any(cmd[16 + used :]):
            return _abi.NPU_ST_BAD_RESERVED
        if opcode == _abi.NPU_OP_NOP:
            return _abi.NPU_ST_OK
        if opcode == _abi.NPU_OP_COPY:
            return self._copy(*_COPY.unpack_from(cmd, 16))
        if opcode == _abi.NPU_OP_FILL:
            return self._fill(*_FILL.unpack_from(cmd, 16))
        if opcode == _abi.NPU_OP_GEMM:
            return self._gemm(*_GEMM.unpack_from(cmd, 16))
        if opcode in (_abi.NPU_OP_SIGNAL, _abi.NPU_OP_WAIT):
            va, value = _SYNC.unpack_from(cmd, 16)
            if va % 8:
                return _abi.NPU_ST_BAD_ARGS
            word = self._at(va, 8)
            if opcode == _abi.NPU_OP_SIGNAL:
                word.view("<u8")[0] = value
                return _abi.NPU_ST_OK
            return _abi.NPU_ST_OK if int(word.view("<u8")[0]) >= value else _BLOCKED
        params, kind, rsvd = _TENSOR.unpack_from(cmd, 16)
        return self._tensor(opcode, params, kind, rsvd)

    def _at(self, va: int, nbytes: int) -> Bytes:
        where = self._translate(va, nbytes)
        if where is None:
            raise _Fault
        return where[2]

    def _copy(self, src: int, dst: int, n: int) -> int:
        for addr in (src, dst):
            status = _range(addr, n)
            if status:
                return status
        if src < dst + n and dst < src + n:
            return _abi.NPU_ST_BAD_ARGS
        s = self._at(src, n)
        self._at(dst, n)[:] = s
        return _abi.NPU_ST_OK

    def _fill(self, dst: int, n: int, pattern: int, rsvd: int) -> int:
        if rsvd:
            return _abi.NPU_ST_BAD_RESERVED
        status = _range(dst, n)
        if status:
            return status
        if n % 4:
            return _abi.NPU_ST_BAD_ARGS
        self._at(dst, n).view("<u4")[:] = pattern
        return _abi.NPU_ST_OK

    def _gemm(self, a: int, b: int, c: int, *words: int) -> int:
        m, n, k, lda, ldb, ldc, dtype, gflags = words
        if dtype != _abi.NPU_DTYPE_FP32:
            return _abi.NPU_ST_BAD_ARGS
        if gflags & ~(_abi.NPU_GEMM_TRANS_A | _abi.NPU_GEMM_TRANS_B):
            return _abi.NPU_ST_BAD_FLAGS
        if not all(1 <= d <= _MAX_DIM for d in (m, n, k)):
            return _abi.NPU_ST_BAD_ARGS
        ta, tb = gflags & _abi.NPU_GEMM_TRANS_A, gflags & _abi.NPU_GEMM_TRANS_B
        stored = [((k, m) if ta else (m, k), lda), ((n, k) if tb else (k, n), ldb), ((m, n), ldc)]
        for (_, cols), ld in stored:
            if ld < cols or ld > _MAX_LD:
                return _abi.NPU_ST_BAD_ARGS
        spans = [((rows - 1) * ld + cols) * 4 for (rows, cols), ld in stored]
        for addr, span in zip((a, b, c), spans, strict=True):
            status = _range(addr, span)
            if status:
                return status
        mats = []
        for addr, span, ((rows, cols), ld) in zip((a, b, c), spans, stored, strict=True):
            flat = self._at(addr, span).view(np.float32)
            mats.append(np.lib.stride_tricks.as_strided(flat, (rows, cols), (ld * 4, 4)))
        x = mats[0].T if ta else mats[0]
        y = mats[1].T if tb else mats[1]
        mats[2][...] = x @ y  # every input is read before C is written
        return _abi.NPU_ST_OK

    def _tensor(self, opcode: int, params: int, kind: int, rsvd: int) -> int:
        """A tensor op: its parameter block read once, operands translated, then checked."""
        if rsvd:
            return _abi.NPU_ST_BAD_RESERVED
        if params % 64:
            return _abi.NPU_ST_BAD_ARGS
        if params + _PARAMS_SIZE > 1 << 64:
            return _abi.NPU_ST_BAD_ADDR
        block = bytes(self._at(params, _PARAMS_SIZE))
        hw = _abi.NpuTensorParams.from_buffer_copy(block)
        if any(hw.params[_abi.TENSOR_OP_PARAMS :]):
            return _abi.NPU_ST_BAD_RESERVED
        op = _abi.NpuTensorOp(opcode=opcode, flags=0, kind=kind)
        op.params[:] = hw.params[: _abi.TENSOR_OP_PARAMS]
        for i in range(_abi.NPU_TENSOR_OPERANDS):
            t = hw.t[i]
            if not any(bytes(t)):
                continue  # an unused operand; one not all zero fails the checks below
            size = DTYPE_SIZE.get(t.dtype)
            if size is None or not 1 <= t.ndim <= _abi.NPU_MAX_RANK:
                return _abi.NPU_ST_BAD_ARGS
            last = sum((t.shape[d] - 1) * t.strides[d] for d in range(t.ndim) if t.shape[d])
            status = _range(t.va, (last + 1) * size)
            if status:
                return status
            where = self._translate(t.va, (last + 1) * size)
            if where is None:
                raise _Fault
            ref = op.t[i]
            ref.handle, ref.offset, ref.dtype, ref.ndim = where[0], where[1], t.dtype, t.ndim
            ref.shape[:] = t.shape[:]
            ref.strides[:] = t.strides[:]
        try:
            self._executor.check_tensor(op)
        except OSError as exc:
            return _abi.NPU_ST_BAD_OPCODE if exc.errno == errno.EOPNOTSUPP else _abi.NPU_ST_BAD_ARGS
        return self._executor.run_tensor(op)

    # -- the firmware thread -----------------------------------------------------

    def _start_thread(self) -> None:
        if self._thread is None or not self._thread.is_alive():
            self._thread = threading.Thread(
                target=self._firmware, name="npu-cpu-firmware", daemon=True
            )
            self._thread.start()

    def _firmware(self) -> None:
        """Poll the doorbells while a queue is lent (the device's command processor)."""
        delay = _POLL_MIN_S
        while True:
            with self._lock:
                if self._closed or not self._queues:
                    self._thread = None
                    return
                ran = self.pump()
            delay = _POLL_MIN_S if ran else min(delay * 2, _POLL_MAX_S)
            time.sleep(delay)


def _mem_size(entries: int) -> int:
    """Bytes of queue memory: ring, completion records and fence record, in pages."""
    used = entries * (_CMD + _CPL) + _FENCE_WB.size
    return -(-used // mmap.PAGESIZE) * mmap.PAGESIZE


def _range(addr: int, n: int) -> int:
    """The spec's range check: 0 (OK), BAD_ARGS (length) or BAD_ADDR (wraps)."""
    if n == 0 or n > _MAX_XFER:
        return _abi.NPU_ST_BAD_ARGS
    if addr + n >= 1 << 64:
        return _abi.NPU_ST_BAD_ADDR
    return 0


def _release(q: _Queue) -> None:
    os.ftruncate(q.bell_fd, 0)  # later stores through a mapping get SIGBUS
    for mapping in (q.mem, q.bell):
        mapping.close()
    os.close(q.mem_fd)
    os.close(q.bell_fd)


def _err(code: int) -> OSError:
    return OSError(code, os.strerror(code))
