"""An in-process stand-in for the /dev/npuN driver, for host tests.

The "device node" is a regular file: buffer objects are page-aligned regions
of it, so mmap() of the real fd works. ``ioctl`` replaces ``fcntl.ioctl`` and
implements GET_INFO, BO_CREATE, BO_DESTROY, SUBMIT (executing the ops with
numpy at submit time) and WAIT, including the -EIO path that fills in
``status`` and ``error_fence`` before failing, as the uapi header specifies.
"""

from __future__ import annotations

import ctypes
import errno
import mmap
import os
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from npu import _abi

PAGE = mmap.PAGESIZE


def _err(code: int) -> OSError:
    return OSError(code, os.strerror(code))


@dataclass
class FakeDriver:
    path: str
    fd: int = -1
    next_handle: int = 1
    next_offset: int = 0
    bos: dict[int, tuple[int, int]] = field(default_factory=dict)  # handle -> offset, size
    fence: int = 0
    completed: int = 0
    failed: tuple[int, int] | None = None  # (fence, status)
    fail_opcode: dict[int, int] = field(default_factory=dict)  # opcode -> status
    hang: bool = False
    calls: list[tuple[int, bytes]] = field(default_factory=list)
    submitted: list[_abi.NpuOp] = field(default_factory=list)

    # -- helpers ---------------------------------------------------------------

    def _region(self, ref: _abi.NpuBufRef) -> np.ndarray[Any, np.dtype[np.uint8]]:
        if ref.handle not in self.bos:
            raise _err(errno.ENOENT)
        base, size = self.bos[ref.handle]
        if ref.rsvd or ref.offset + ref.size > size:
            raise _err(errno.EINVAL)
        mm = mmap.mmap(self.fd, size, offset=base)
        return np.frombuffer(mm, dtype=np.uint8)[ref.offset : ref.offset + ref.size]

    def _matrix(
        self, ref: _abi.NpuBufRef, rows: int, cols: int, ld: int
    ) -> np.ndarray[Any, np.dtype[np.float32]]:
        flat = self._region(ref).view(np.float32)
        return np.lib.stride_tricks.as_strided(flat, shape=(rows, cols), strides=(ld * 4, 4))

    def _execute(self, op: _abi.NpuOp) -> int:
        if op.opcode in self.fail_opcode:
            return self.fail_opcode[op.opcode]
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

    # -- the ioctl entry point ------------------------------------------------------

    def ioctl(self, fd: int, request: int, arg: Any, mutate: bool = True) -> int:
        self.fd = fd
        self.calls.append((request, bytes(arg)))
        if request == _abi.NPU_IOCTL_GET_INFO:
            arg.hw_version = _abi.NPU_HW_VERSION
            arg.abi_version = _abi.NPU_ABI_VERSION
            arg.driver_version = 0x00010002
            arg.caps = 0x1F
            arg.num_queues = 1
            arg.num_cores = 4
            arg.max_submit = _abi.NPU_SUBMIT_MAX_OPS
            arg.ring_entries = 256
            arg.max_bo_size = _abi.NPU_BO_MAX_SIZE
            arg.pci_vendor = _abi.NPU_PCI_VENDOR_ID
            arg.pci_device = _abi.NPU_PCI_DEVICE_ID
            return 0
        if request == _abi.NPU_IOCTL_BO_CREATE:
            if arg.size == 0 or arg.size > _abi.NPU_BO_MAX_SIZE or arg.flags:
                raise _err(errno.EINVAL)
            alloc = -(-arg.size // PAGE) * PAGE
            offset = self.next_offset
            self.next_offset += alloc
            os.ftruncate(fd, self.next_offset)
            arg.handle = self.next_handle
            self.next_handle += 1
            arg.mmap_offset = offset
            arg.alloc_size = alloc
            self.bos[arg.handle] = (offset, alloc)
            return 0
        if request == _abi.NPU_IOCTL_BO_DESTROY:
            if arg.rsvd or arg.handle not in self.bos:
                raise _err(errno.ENOENT if not arg.rsvd else errno.EINVAL)
            del self.bos[arg.handle]
            return 0
        if request == _abi.NPU_IOCTL_SUBMIT:
            if arg.op_size != ctypes.sizeof(_abi.NpuOp) or arg.flags or arg.queue:
                raise _err(errno.EINVAL)
            if not 1 <= arg.num_ops <= _abi.NPU_SUBMIT_MAX_OPS:
                raise _err(errno.EINVAL)
            ops = (_abi.NpuOp * arg.num_ops).from_address(arg.ops_ptr)
            for op in ops:
                self.submitted.append(_abi.NpuOp.from_buffer_copy(op))
            for op in ops:
                self.fence += 1
                if self.failed is None:
                    status = self._execute(op)
                    if status != _abi.NPU_ST_OK:
                        self.failed = (self.fence, status)
                    else:
                        self.completed = self.fence
            arg.fence = self.fence
            return 0
        if request == _abi.NPU_IOCTL_WAIT:
            if arg.flags or arg.rsvd or arg.fence > self.fence:
                raise _err(errno.EINVAL)
            if self.failed is not None and arg.fence >= self.failed[0]:
                arg.error_fence, arg.status = self.failed
                raise _err(errno.EIO)
            if self.hang or arg.fence > self.completed:
                raise _err(errno.ETIMEDOUT)
            return 0
        raise _err(errno.ENOTTY)
