"""The CPU backend: the device's command set run with numpy, in this process.

It needs no device and no QEMU: each buffer object is an anonymous memory
file (so :meth:`CpuBackend.map` gives real shared mappings, and a freed
buffer's memory lives on in the mappings still holding it, as with the
driver's mmap), a submission is checked like the
driver checks it and run at once by :class:`npu.hal.cpu_kernels.Executor`,
and its fences complete before ``submit`` returns. It lends seven user-mode
queues (rings in shared memory run by a firmware thread,
:mod:`npu.hal.cpu_queues`), has no device memory and no user-pointer buffers
(those calls fail with ``EOPNOTSUPP``), no dma-bufs (export and import fail
with ``EOPNOTSUPP``), and reports the capabilities of the
ops it implements. A buffer's device VA is its mapping offset (from 4 GiB on,
as the driver's: below are the queues' regions), never reused.

It is the runtime's reference: host tests run the whole runtime on it, and
in the guest the op suite compares the driver backend with it. For those
tests it can record the calls made to it (``record=True``) and inject
failures: ``fail_opcode`` (an opcode -> the device status its ops end
with) and ``hang`` (the device stops answering: no later op runs and
every wait times out).
"""

from __future__ import annotations

import bisect
import ctypes
import errno
import mmap
import os
import threading
import time
from dataclasses import dataclass
from typing import Any

import numpy as np

from .. import _abi
from .cpu_kernels import Executor
from .cpu_queues import QueueEngine
from .memfd import memfd
from .types import BoInfo, FenceTimes, HalInfo, QueueInfo, WaitFailed

__all__ = ["CPU_CAPS", "CpuBackend", "HalCall"]

_PAGE = mmap.PAGESIZE

#: The capabilities the CPU backend reports: every op it runs.
CPU_CAPS = (
    _abi.NPU_INFO_CAP_COPY
    | _abi.NPU_INFO_CAP_FILL
    | _abi.NPU_INFO_CAP_GEMM_FP32
    | _abi.NPU_INFO_CAP_TIMESTAMPS
    | _abi.NPU_INFO_CAP_TENSOR
    | _abi.NPU_INFO_CAP_REDUCE
    | _abi.NPU_INFO_CAP_MATMUL
    | _abi.NPU_INFO_CAP_CONV
    | _abi.NPU_INFO_CAP_QUANT
    | _abi.NPU_INFO_CAP_POOL_GEOMETRY
    | _abi.NPU_INFO_CAP_SELECT
    | _abi.NPU_INFO_CAP_STRIDED_OUT
    | _abi.NPU_INFO_CAP_CONV_ACCUMULATE
    | _abi.NPU_INFO_CAP_ACT_RELU6
    | _abi.NPU_INFO_CAP_CONCURRENT
)
_DRIVER_VERSION = 0x0001_0000  # 1.0: the CPU backend's own version
_RECORDS = 256  # completion records kept for fence_info (the ring's entries)
_USER_QUEUES = 7  # hardware queues 1..7, as the device's
_BO_BASE = 1 << 32  # buffers' mapping offsets (and VAs) start here, as the driver's
_WAIT_SLICE_S = (20e-6, 1e-3)  # a user-queue WAIT's sleeps between passes, growing


def _err(code: int) -> OSError:
    return OSError(code, os.strerror(code))


def _no_dmabufs() -> OSError:
    code = errno.EOPNOTSUPP
    return OSError(code, f"{os.strerror(code)}: the CPU backend has no dma-bufs")


@dataclass(frozen=True, slots=True)
class HalCall:
    """One recorded backend call: its name and integer arguments."""

    name: str
    args: tuple[int, ...] = ()


@dataclass(slots=True)
class _Bo:
    fd: int  # its memory file
    offset: int  # its mapping offset
    size: int
    data: np.ndarray[Any, np.dtype[np.uint8]]  # the backend's own view of it


class CpuBackend:
    """The CPU backend (see the module docstring). ``caps`` narrows what it reports."""

    kind = "cpu"
    path = "cpu"

    def __init__(self, *, caps: int = CPU_CAPS, record: bool = False) -> None:
        # Polls readable: every submission completes before submit returns.
        self._fd = os.eventfd(1, os.EFD_CLOEXEC)
        self._lock = threading.Lock()  # guards everything below
        self._bos: dict[int, _Bo] = {}
        self._by_offset: dict[int, int] = {}  # mapping offset -> handle
        self._next_handle = 1
        self._next_offset = _BO_BASE
        self._starts: list[int] = []  # the buffers' offsets (= VAs), sorted
        self._fence = 0  # the last fence handed out
        self._completed = 0  # the last fence run to its end
        self._failed: tuple[int, int] | None = None  # (fence, status): the queue stopped
        self._stamps: dict[int, tuple[int, int]] = {}  # fence -> (start, end) ns
        self._executor = Executor(self._buffer, caps)
        # (queue, fence) of the MMU fault that marked this file faulted.
        self._faulted: tuple[int, int] | None = None
        self._queues = QueueEngine(
            self._lock, self._translate, self._executor, self._fault, _USER_QUEUES,
            halted=lambda: self.hang,
        )  # fmt: skip
        self.caps = caps
        self.fail_opcode: dict[int, int] = {}
        self.hang = False
        self.record = record
        self.calls: list[HalCall] = []
        self.submitted: list[_abi.NpuOp] = []
        self.submitted_tensor: list[_abi.NpuTensorOp] = []
        self.submits: list[tuple[int, int]] = []  # (op_size, num_ops) of accepted submits

    def __repr__(self) -> str:
        return f"<npu.hal.CpuBackend fences={self._fence} buffers={len(self._bos)}>"

    @property
    def handles(self) -> frozenset[int]:
        """The live buffer-object handles."""
        with self._lock:
            return frozenset(self._bos)

    @property
    def last_fence(self) -> int:
        """The last fence handed out (0: nothing submitted yet)."""
        return self._fence

    def _note(self, name: str, *args: int) -> None:
        if self.record:
            self.calls.append(HalCall(name, args))

    def _buffer(self, handle: int) -> np.ndarray[Any, np.dtype[np.uint8]] | None:
        bo = self._bos.get(handle)
        return None if bo is None else bo.data

    def _translate(
        self, va: int, nbytes: int
    ) -> tuple[int, int, np.ndarray[Any, np.dtype[np.uint8]]] | None:
        """The buffer holding ``[va, va + nbytes)``: (handle, offset, its bytes); None: a fault."""
        i = bisect.bisect_right(self._starts, va) - 1
        if i < 0:
            return None
        handle = self._by_offset[self._starts[i]]
        bo = self._bos[handle]
        off = va - bo.offset
        if off + nbytes > bo.size:
            return None
        return handle, off, bo.data[off : off + nbytes]

    def _fault(self, queue: int, fence: int) -> None:
        """A user queue's command faulted: the file is faulted, as the driver marks it."""
        if self._faulted is None:
            self._faulted = (queue, fence)

    # -- lifetime ------------------------------------------------------------

    def fileno(self) -> int:
        if self._fd < 0:
            raise _err(errno.EBADF)
        return self._fd

    def close(self) -> None:
        with self._lock:
            fd, self._fd = self._fd, -1
            self._queues.close()
            bos, self._bos = self._bos, {}
            self._by_offset.clear()
            self._starts.clear()
        for bo in bos.values():
            os.close(bo.fd)
        if fd >= 0:
            os.close(fd)

    # -- properties and buffers ------------------------------------------------

    def query(self) -> HalInfo:
        self._note("query")
        return HalInfo(
            hw_version=_abi.NPU_HW_VERSION,
            abi_version=_abi.NPU_ABI_VERSION,
            driver_version=_DRIVER_VERSION,
            caps=self.caps,
            num_queues=1,
            num_cores=os.cpu_count() or 1,
            max_submit=_abi.NPU_SUBMIT_MAX_OPS,
            ring_entries=_RECORDS,
            max_bo_size=_abi.NPU_BO_MAX_SIZE,
            pci_vendor=_abi.NPU_PCI_VENDOR_ID,
            pci_device=_abi.NPU_PCI_DEVICE_ID,
            user_queues=_USER_QUEUES,
        )

    def bo_create(self, size: int, flags: int) -> BoInfo:
        self._note("bo_create", size, flags)
        if flags & _abi.NPU_BO_DEVICE:
            raise _err(errno.EOPNOTSUPP)
        if size == 0 or size > _abi.NPU_BO_MAX_SIZE or flags:
            raise _err(errno.EINVAL)
        alloc = -(-size // _PAGE) * _PAGE
        with self._lock:
            self.fileno()
            fd = memfd("npu-cpu-bo", alloc)
            try:
                view = mmap.mmap(fd, alloc, flags=mmap.MAP_SHARED)
            except BaseException:
                os.close(fd)
                raise
            # Offsets are never reused: a stale offset can never map a new buffer.
            offset = self._next_offset
            self._next_offset += alloc
            handle = self._next_handle
            self._next_handle += 1
            self._bos[handle] = _Bo(fd, offset, alloc, np.frombuffer(view, dtype=np.uint8))
            self._by_offset[offset] = handle
            self._starts.append(offset)  # offsets only grow: the list stays sorted
        return BoInfo(handle, offset, alloc, va=offset)

    def bo_userptr(self, addr: int, size: int, flags: int) -> BoInfo:
        self._note("bo_userptr", addr, size, flags)
        raise _err(errno.EOPNOTSUPP)

    def bo_destroy(self, handle: int) -> None:
        self._note("bo_destroy", handle)
        with self._lock:
            bo = self._bos.pop(handle, None)
            if bo is None:
                raise _err(errno.ENOENT)
            del self._by_offset[bo.offset]
            del self._starts[bisect.bisect_left(self._starts, bo.offset)]
            # The memory goes back to the system once no mapping holds it.
            os.close(bo.fd)

    def bo_info(self, handle: int) -> BoInfo:
        self._note("bo_info", handle)
        with self._lock:
            bo = self._bos.get(handle)
            if bo is None:
                raise _err(errno.ENOENT)
            return BoInfo(handle, bo.offset, bo.size, va=bo.offset, flags=0)

    def dmabuf_export(self, handle: int) -> int:
        self._note("dmabuf_export", handle)
        raise _no_dmabufs()

    def dmabuf_import(self, fd: int) -> BoInfo:
        self._note("dmabuf_import", fd)
        raise _no_dmabufs()

    def map(self, offset: int, length: int, prot: int) -> mmap.mmap:
        self._note("map", offset, length)
        with self._lock:
            self.fileno()
            if offset < _BO_BASE:
                queue_map = self._queues.map(offset, length, prot)
                if queue_map is None:
                    raise _err(errno.EINVAL)
                return queue_map
            handle = self._by_offset.get(offset)  # a whole buffer, the common case
            candidates = [self._bos[handle]] if handle is not None else self._bos.values()
            for bo in candidates:
                if bo.offset <= offset and offset + length <= bo.offset + bo.size:
                    return mmap.mmap(
                        bo.fd, length, flags=mmap.MAP_SHARED, prot=prot, offset=offset - bo.offset
                    )
            raise _err(errno.EINVAL)

    # -- submission and fences ---------------------------------------------------

    def submit(self, ops: ctypes.Array[Any], op_size: int, queue: int) -> int:
        self._note("submit", op_size, len(ops), queue)
        if queue or not 1 <= len(ops) <= _abi.NPU_SUBMIT_MAX_OPS:
            raise _err(errno.EINVAL)
        with self._lock:
            if self._faulted is not None:
                raise _err(errno.EBADFD)
            if op_size == ctypes.sizeof(_abi.NpuTensorOp):
                tensor_ops = [_abi.NpuTensorOp.from_buffer_copy(op) for op in ops]
                for top in tensor_ops:  # everything is checked first: a bad op queues nothing
                    self._executor.check_tensor(top)
                if self.record:
                    self.submitted_tensor.extend(tensor_ops)
                    self.submits.append((op_size, len(ops)))
                for top in tensor_ops:
                    self._run(top.opcode, lambda op=top: self._executor.run_tensor(op))
            elif op_size == ctypes.sizeof(_abi.NpuOp):
                plain = [_abi.NpuOp.from_buffer_copy(op) for op in ops]
                if self.record:
                    self.submitted.extend(plain)
                    self.submits.append((op_size, len(ops)))
                for op in plain:
                    self._run(op.opcode, lambda op=op: self._executor.run(op))
            else:
                raise _err(errno.EINVAL)
            return self._fence

    def _run(self, opcode: int, run: Any) -> None:
        """Give the next fence to one op and run it, unless the queue stopped or hangs."""
        self._fence += 1
        if self._failed is not None or self.hang:
            return
        t_start = time.monotonic_ns()
        status = self.fail_opcode.get(opcode)
        if status is None:
            status = int(run())
        if status != _abi.NPU_ST_OK:
            self._failed = (self._fence, status)
            return
        self._completed = self._fence
        self._stamps[self._fence] = (t_start, time.monotonic_ns())
        if len(self._stamps) > _RECORDS:  # as the driver's ring of records
            self._stamps.pop(next(iter(self._stamps)))

    def wait(self, fence: int, timeout_ns: int, queue: int) -> None:
        self._note("wait", fence, timeout_ns, queue)
        if queue:
            self._wait_user(fence, timeout_ns, queue)
            return
        with self._lock:
            if fence > self._fence:
                raise _err(errno.EINVAL)
            if self._failed is not None and fence >= self._failed[0]:
                raise WaitFailed.device_error(self._failed[1], self._failed[0])
            if self._faulted is not None:
                raise WaitFailed(errno.EBADFD, _abi.NPU_ST_MMU_FAULT, self._faulted[1])
            if fence <= self._completed and not self.hang:
                return
        # Only an injected hang leaves a fence pending, and nothing can
        # complete it later: the wait times out at once.
        raise _err(errno.ETIMEDOUT)

    def _wait_user(self, fence: int, timeout_ns: int, queue: int) -> None:
        """WAIT on a lent queue: run the rings, then sleep a little, until its fence record
        reaches ``fence`` (a fence never pushed just times out, as with the driver)."""
        deadline = time.monotonic_ns() + timeout_ns
        pause, longest = _WAIT_SLICE_S
        while True:
            with self._lock:
                if self._queues.check_wait(queue, fence):
                    return
            if time.monotonic_ns() >= deadline:
                raise _err(errno.ETIMEDOUT)
            time.sleep(min(pause, max(0.0, (deadline - time.monotonic_ns()) / 1e9)))
            pause = min(pause * 2, longest)

    def fence_info(self, fence: int, queue: int) -> FenceTimes:
        self._note("fence_info", fence, queue)
        with self._lock:
            if queue or not 0 < fence <= self._fence:
                raise _err(errno.EINVAL)
            if fence > self._completed:
                raise _err(errno.EBUSY)
            times = self._stamps.get(fence)
            if times is None:
                raise _err(errno.ENOENT)
            return FenceTimes(_abi.NPU_ST_OK, *times)

    def queue_create(self, entries: int, priority: int) -> QueueInfo:
        self._note("queue_create", entries, priority)
        with self._lock:
            self.fileno()
            if self._faulted is not None:
                raise _err(errno.EBADFD)
            return self._queues.create(entries, priority)

    def queue_destroy(self, index: int) -> None:
        self._note("queue_destroy", index)
        with self._lock:
            self.fileno()
            self._queues.destroy(index)
