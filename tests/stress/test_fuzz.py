"""ioctl fuzzer: every command, random and boundary arguments, 0 oopses.

A seeded generator (NPU_STRESS_SEED, printed; a failure names it and the
call) makes calls over two open files:

- every ioctl (GET_INFO, BO_CREATE, BO_DESTROY, BO_USERPTR, BO_INFO, SUBMIT
  in both op formats, WAIT, FENCE_INFO, QUEUE_*, and DRM's GEM_CLOSE and
  PRIME export/import with dma-bufs passed between the two files) with
  each field drawn from boundary values (0, 1, -1, page boundaries, 2^24,
  2^31, 2^32, 2^63, U64_MAX, ...), random bits, or valid values (live
  handles, sizes that fit, this file's fences);
- SUBMIT op arrays mixing valid ops on live handles (COPY/FILL/GEMM,
  ELTWISE/UNARY/CONVERT, broadcasting views), valid ops with a few fields
  mutated, and random bytes; op arrays and arguments at bad pointers
  (NULL, kernel addresses, unmapped pages, read-only pages, arrays running
  into unmapped memory);
- raw ioctl numbers with other sizes, directions, numbers and type letters;
- mmap() of random offsets and lengths, userptr BOs of anonymous, read-only,
  unmapped and device-mapped memory, and files closed with work in flight.

Each call must return 0 or an errno the table in docs/uapi.md allows for
it. Afterwards the BO counters are back at their baseline, the device still
computes correctly, and the module unloads and loads cleanly. The fuzzing
files run under ctx_mem_limit_mib=64, so that random sizes cannot push the
guest into the OOM killer (they get ENOMEM, which the table allows).

Size: NPU_STRESS_FUZZ_CALLS (full 100,000, short 10,000).
"""

from __future__ import annotations

import ctypes
import errno as E
import fcntl
import mmap
import os
import random
import time

import numpy as np

from npu import _abi, ops

from . import stress_util as su

PAGE = su.PAGE
U32 = (1 << 32) - 1
U64 = (1 << 64) - 1
LIMIT_MIB = 64
LIMIT_PARAM = "/sys/module/npu/parameters/ctx_mem_limit_mib"
BOUNDARY = [
    0, 1, 2, 3, 4, 7, 8, 15, 16, 63, 64, 255, 256, 257, 4095, 4096, 4097, 8192,
    65535, 65536, 65537, 1 << 20, (1 << 24) - 1, 1 << 24, (1 << 24) + 1, 1 << 28,
    (1 << 30) - 1, 1 << 30, (1 << 30) + 1, (1 << 31) - 1, 1 << 31, (1 << 31) + 1,
    (1 << 32) - 4096, (1 << 32) - 1, 1 << 32, (1 << 32) + 1, 1 << 40, (1 << 63) - 1,
    1 << 63, U64 - 4095, U64 - 1, U64,
]  # fmt: skip
KERNEL_PTRS = [0xFFFFFFFF81000000, 0xFFFF888000000000, 0xFFFFFFFFFFFFF000, 0x0000800000000000]

ANY = {E.ENOTTY, E.EFAULT}
ALLOWED = {
    "GET_INFO": set(),
    "BO_CREATE": {E.EINVAL, E.E2BIG, E.ENOMEM},
    "BO_DESTROY": {E.EINVAL, E.ENOENT},
    "BO_USERPTR": {E.EINVAL, E.E2BIG, E.EFAULT, E.ENOMEM},
    "SUBMIT": {E.EINVAL, E.ENOENT, E.ERANGE, E.EACCES, E.EOPNOTSUPP, E.EBUSY},
    "SUBMIT_T": {E.EINVAL, E.ENOENT, E.ERANGE, E.EACCES, E.EOPNOTSUPP, E.EBUSY},
    # ENOENT: a user queue index the file was not lent.
    "WAIT": {E.EINVAL, E.ETIMEDOUT, E.EIO, E.ENOENT},
    "FENCE_INFO": {E.EINVAL, E.EBUSY, E.ENOENT},
    # EBUSY: all seven user queues are lent; EACCES: priority above 1.
    "QUEUE_CREATE": {E.EINVAL, E.EBUSY, E.EACCES, E.ENOMEM},
    "QUEUE_DESTROY": {E.EINVAL, E.ENOENT},
    "BO_INFO": {E.EINVAL, E.ENOENT},
    # DRM core: GEM_CLOSE's unknown handle is EINVAL; PRIME export of an
    # unknown handle ENOENT, of a device-memory or userptr BO EOPNOTSUPP;
    # import of a closed fd EBADF, of a file that is no dma-buf EINVAL.
    "GEM_CLOSE": {E.EINVAL},
    "PRIME_EXPORT": {E.EINVAL, E.ENOENT, E.EOPNOTSUPP, E.EMFILE},
    "PRIME_IMPORT": {E.EINVAL, E.EBADF, E.ENOMEM},
    "BAD_NR": set(),
    # mmap(2) of the device: the driver's EINVAL, and the core's own checks.
    "MMAP": {E.EINVAL, E.ENOMEM, E.EOVERFLOW},
}
REQUESTS = {
    "GET_INFO": _abi.DRM_IOCTL_NPU_GET_INFO,
    "BO_CREATE": _abi.DRM_IOCTL_NPU_BO_CREATE,
    "BO_DESTROY": _abi.DRM_IOCTL_NPU_BO_DESTROY,
    "BO_USERPTR": _abi.DRM_IOCTL_NPU_BO_USERPTR,
    "SUBMIT": _abi.DRM_IOCTL_NPU_SUBMIT,
    "SUBMIT_T": _abi.DRM_IOCTL_NPU_SUBMIT,
    "WAIT": _abi.DRM_IOCTL_NPU_WAIT,
    "FENCE_INFO": _abi.DRM_IOCTL_NPU_FENCE_INFO,
    "QUEUE_CREATE": _abi.DRM_IOCTL_NPU_QUEUE_CREATE,
    "QUEUE_DESTROY": _abi.DRM_IOCTL_NPU_QUEUE_DESTROY,
    "BO_INFO": _abi.DRM_IOCTL_NPU_BO_INFO,
    "GEM_CLOSE": _abi.DRM_IOCTL_GEM_CLOSE,
    "PRIME_EXPORT": _abi.DRM_IOCTL_PRIME_HANDLE_TO_FD,
    "PRIME_IMPORT": _abi.DRM_IOCTL_PRIME_FD_TO_HANDLE,
}
VALID_REQUESTS = set(REQUESTS.values())
# Type letters of ioctls the VFS handles itself before the driver (FIOCLEX,
# FIONBIO, FIFREEZE, FIGETBSZ, FS_IOC_*, FICLONE, ...): never sent.
VFS_TYPES = {0x00, 0x12, 0x15, ord("T"), ord("X"), ord("f"), 0x94}
WEIGHTS = {
    "GET_INFO": 3,
    "BO_CREATE": 10,
    "BO_DESTROY": 7,
    "BO_USERPTR": 7,
    "SUBMIT": 28,
    "SUBMIT_T": 18,
    "WAIT": 12,
    "FENCE_INFO": 5,
    "QUEUE_CREATE": 2,
    "QUEUE_DESTROY": 2,
    "BO_INFO": 3,
    "GEM_CLOSE": 2,
    "PRIME_EXPORT": 3,
    "PRIME_IMPORT": 3,
    "BAD_NR": 8,
    "MMAP": 5,
    "REOPEN": 0.2,
}


def _ioc(direction: int, typ: int, nr: int, size: int) -> int:
    return (direction << 30) | (size << 16) | (typ << 8) | nr


class Fuzzer:
    def __init__(self, seed: int) -> None:
        self.seed = seed
        self.rng = random.Random(seed)
        self.fds = [os.open(su.DEV_PATH, os.O_RDWR) for _ in range(2)]
        self.dmabufs: list[int] = []  # exported dma-buf fds, shared by both files
        self.bos: dict[int, dict[int, tuple[int, bool, int]]] = {f: {} for f in self.fds}
        self.last_fence = {f: 0 for f in self.fds}
        self.calls = 0
        self.by_cmd: dict[str, int] = {}
        self.by_errno: dict[str, int] = {}
        self.violations: list[str] = []
        # Scratch: pages 0..29 op arrays, 30..31 arguments, 32 read-only,
        # 33 unmapped (a hole), 34..49 user memory for BO_USERPTR, 50..53
        # read-only user memory.
        self.base = su.anon_map(54 * PAGE)
        self.ops_addr = self.base
        self.arg_addr = self.base + 30 * PAGE
        self.ro_page = self.base + 32 * PAGE
        self.hole = self.base + 33 * PAGE
        self.user = self.base + 34 * PAGE
        self.user_ro = self.base + 50 * PAGE
        ctypes.memset(self.user, 0x11, 16 * PAGE)
        assert su.libc.munmap(self.hole, PAGE) == 0
        assert su.libc.mprotect(self.user_ro, 4 * PAGE, mmap.PROT_READ) == 0
        assert su.libc.mprotect(self.ro_page, PAGE, mmap.PROT_READ) == 0
        self.maps: list[tuple[int, int]] = []  # (addr, length) of kept device mappings

    # -- values ------------------------------------------------------------

    def val(self, bits: int) -> int:
        r = self.rng.random()
        mask = (1 << bits) - 1
        if r < 0.5:
            return self.rng.choice(BOUNDARY) & mask
        if r < 0.75:
            return self.rng.getrandbits(bits)
        return self.rng.randrange(0, 64) & mask

    def maybe(self, p: float, bits: int, default: int = 0) -> int:
        return self.val(bits) if self.rng.random() < p else default

    def live(self, fd: int) -> list[int]:
        return list(self.bos[fd])

    def handle(self, fd: int, p_live: float = 0.8) -> int:
        live = self.live(fd)
        if live and self.rng.random() < p_live:
            return self.rng.choice(live)
        other = self.live(self.other(fd))
        if other and self.rng.random() < 0.3:
            return self.rng.choice(other)
        return self.val(32)

    def other(self, fd: int) -> int:
        return self.fds[1] if fd == self.fds[0] else self.fds[0]

    def ptr(self, good: int, size: int, p_bad: float = 0.08) -> int:
        """A pointer to an argument of `size` bytes: mostly `good`."""
        if self.rng.random() >= p_bad:
            return good
        return self.rng.choice(
            [
                0,
                0x10,
                *KERNEL_PTRS,
                self.hole,
                self.hole - size // 2,  # read-only page, then the hole
                self.ro_page,
                U64 & ~7,
                self.rng.getrandbits(64),
            ]
        )

    # -- the call ------------------------------------------------------------

    def put_arg(self, arg: ctypes.Structure, ptr: int) -> None:
        """Copy the argument to `ptr` when that is writable scratch memory."""
        n = ctypes.sizeof(arg)
        if ptr == self.arg_addr:
            ctypes.memmove(ptr, ctypes.addressof(arg), n)
        elif ptr in (self.ro_page, self.hole - n // 2):
            su.libc.mprotect(self.ro_page, PAGE, mmap.PROT_READ | mmap.PROT_WRITE)
            ctypes.memmove(ptr, ctypes.addressof(arg), min(n, self.hole - ptr))
            su.libc.mprotect(self.ro_page, PAGE, mmap.PROT_READ)

    def call(self, cmd: str, fd: int, request: int, ptr: int, what: str = "") -> int:
        self.calls += 1
        self.by_cmd[cmd] = self.by_cmd.get(cmd, 0) + 1
        e = su.raw_ioctl(fd, request, ptr)
        self.by_errno[su.errname(e) if e else "OK"] = (
            self.by_errno.get(su.errname(e) if e else "OK", 0) + 1
        )
        # DRM: ENOTTY for a foreign type letter, EINVAL past the driver's table.
        allowed = {E.ENOTTY, E.EINVAL} if cmd == "BAD_NR" else ALLOWED[cmd] | ANY
        if e and e not in allowed:
            self.violations.append(
                f"call {self.calls} {cmd} request={request:#x} ptr={ptr:#x}: "
                f"{su.errname(e)} not in {sorted(su.errname(x) for x in allowed)} {what}"
            )
        return e

    def read_back(self, arg: ctypes.Structure, ptr: int) -> bool:
        if ptr != self.arg_addr:
            return False
        ctypes.memmove(ctypes.addressof(arg), ptr, ctypes.sizeof(arg))
        return True

    # -- commands ------------------------------------------------------------

    def get_info(self, fd: int) -> None:
        p = self.ptr(self.arg_addr, 72)
        if self.call("GET_INFO", fd, _abi.DRM_IOCTL_NPU_GET_INFO, p) == 0 and p == self.arg_addr:
            info = _abi.NpuInfo.from_address(p)
            if list(info.rsvd) != [0] * len(info.rsvd) or info.max_bo_size != 1 << 30:
                self.violations.append(f"call {self.calls}: GET_INFO returned {list(info.rsvd)}")

    def bo_create(self, fd: int) -> None:
        rng = self.rng
        size = rng.randrange(1, 256 * 1024) if rng.random() < 0.6 else self.val(64)
        arg = _abi.NpuBoCreate(size=size, flags=self.maybe(0.05, 32))
        p = self.ptr(self.arg_addr, 32)
        self.put_arg(arg, p)
        e = self.call("BO_CREATE", fd, _abi.DRM_IOCTL_NPU_BO_CREATE, p, f"size={size}")
        if e == 0 and self.read_back(arg, p):
            self.bos[fd][int(arg.handle)] = (int(arg.alloc_size), False, int(arg.mmap_offset))
        if len(self.bos[fd]) > 40:
            self.destroy(fd, rng.choice(self.live(fd)))

    def destroy(self, fd: int, handle: int, rsvd: int = 0) -> None:
        arg = _abi.NpuBoDestroy(handle=handle, rsvd=rsvd)
        p = self.ptr(self.arg_addr, 8, 0.03)
        self.put_arg(arg, p)
        if self.call("BO_DESTROY", fd, _abi.DRM_IOCTL_NPU_BO_DESTROY, p, f"handle={handle}") == 0:
            self.bos[fd].pop(handle, None)

    def bo_destroy(self, fd: int) -> None:
        self.destroy(fd, self.handle(fd, 0.7), self.maybe(0.05, 32))

    def bo_userptr(self, fd: int) -> None:
        rng = self.rng
        r = rng.random()
        if r < 0.5:
            addr = self.user + rng.randrange(16) * PAGE
        elif r < 0.6:
            addr = self.user_ro + rng.randrange(4) * PAGE
        elif r < 0.7 and self.maps:
            addr = rng.choice(self.maps)[0]
        elif r < 0.8:
            addr = rng.choice([self.hole, self.ro_page, 0, *KERNEL_PTRS])
        else:
            addr = self.val(64)
        size = rng.randrange(1, 17) * PAGE if rng.random() < 0.6 else self.val(64)
        flags = rng.choice([0, 0, 1]) if rng.random() < 0.9 else self.val(32)
        areas = [(self.user, 16 * PAGE), *self.maps]
        if not any(a <= addr and addr + size <= a + n for a, n in areas):
            # Any other range may hold this process's own live memory (a
            # boundary value like 16 MiB can land in the brk heap, a range
            # can run past a mapping): the device must not write there, or
            # the fuzzer corrupts itself.
            flags |= _abi.NPU_BO_USERPTR_READONLY
        arg = _abi.NpuBoUserptr(addr=addr, size=size, flags=flags, handle=self.maybe(0.05, 32))
        p = self.ptr(self.arg_addr, 24)
        self.put_arg(arg, p)
        what = f"addr={addr:#x} size={size:#x} flags={flags:#x}"
        e = self.call("BO_USERPTR", fd, _abi.DRM_IOCTL_NPU_BO_USERPTR, p, what)
        if e == 0 and self.read_back(arg, p):
            self.bos[fd][int(arg.handle)] = (size, bool(flags & 1), 0)  # no mmap

    # v1 ops ------------------------------------------------------------------

    def sized(self, fd: int) -> tuple[int, int]:
        """A live handle of fd and its size (or a bogus one)."""
        live = self.live(fd)
        if not live:
            return self.val(32), 4096
        h = self.rng.choice(live)
        return h, self.bos[fd][h][0]

    def valid_v1(self, fd: int) -> _abi.NpuOp:
        rng = self.rng
        op = _abi.NpuOp()
        kind = rng.choice(["nop", "copy", "copy", "fill", "fill", "gemm", "gemm", "extreme"])
        if kind == "nop":
            return op
        if kind == "extreme":
            return self.extreme_v1(fd)
        if kind == "fill":
            h, s = self.sized(fd)
            off = rng.randrange(0, s // 4) * 4
            n = rng.randrange(1, (s - off) // 4 + 1) * 4
            op.opcode, op.num_bufs = _abi.NPU_OP_FILL, 1
            op.bufs[0] = _abi.NpuBufRef(handle=h, offset=off, size=n)
            op.params[0] = rng.getrandbits(32)
            return op
        if kind == "copy":
            (h1, s1), (h2, s2) = self.sized(fd), self.sized(fd)
            n = rng.randrange(1, max(2, min(s1, s2) // 2))
            o1, o2 = rng.randrange(0, s1 - n + 1), rng.randrange(0, s2 - n + 1)
            if h1 == h2 and rng.random() < 0.7:  # usually not overlapping
                o1, o2 = 0, min(n, s1 - n)
            op.opcode, op.num_bufs = _abi.NPU_OP_COPY, 2
            op.bufs[0] = _abi.NpuBufRef(handle=h1, offset=o1, size=n)
            op.bufs[1] = _abi.NpuBufRef(handle=h2, offset=o2, size=n)
            return op
        # GEMM that fits: dims so that each matrix fits its buffer.
        (ha, sa), (hb, sb), (hc, sc) = self.sized(fd), self.sized(fd), self.sized(fd)
        cap = max(1, min(sa, sb, sc) // 4)
        m = rng.choice([1, 2, 3, 8, 16, 31, 64])
        n = rng.choice([1, 2, 5, 16, 64])
        k = rng.choice([1, 4, 7, 32, 128, 1024])
        while m * k > cap or k * n > cap or m * n > cap:
            m, n, k = max(1, m // 2), max(1, n // 2), max(1, k // 2)
            if m == n == k == 1:
                break
        flags = rng.randrange(4)
        ar, ac = (k, m) if flags & 1 else (m, k)
        br, bc = (n, k) if flags & 2 else (k, n)
        op.opcode, op.num_bufs = _abi.NPU_OP_GEMM, 3
        op.bufs[0] = _abi.NpuBufRef(handle=ha, offset=0, size=min(sa, ar * ac * 4))
        op.bufs[1] = _abi.NpuBufRef(handle=hb, offset=0, size=min(sb, br * bc * 4))
        op.bufs[2] = _abi.NpuBufRef(handle=hc, offset=0, size=min(sc, m * n * 4))
        for i, v in enumerate([m, n, k, ac, bc, n, 0, flags]):
            op.params[i] = v
        return op

    def extreme_v1(self, fd: int) -> _abi.NpuOp:
        """Valid ops at the edges: whole-BO copies and fills, GEMMs with
        one long dimension, the largest row stride, adjacent ranges."""
        rng = self.rng
        op = _abi.NpuOp()
        (h1, s1), (h2, s2) = self.sized(fd), self.sized(fd)
        r = rng.randrange(5)
        if r == 0:  # the whole of the smaller BO
            n = min(s1, s2)
            op.opcode, op.num_bufs = _abi.NPU_OP_COPY, 2
            op.bufs[0] = _abi.NpuBufRef(handle=h1, offset=s1 - n, size=n)
            op.bufs[1] = _abi.NpuBufRef(handle=h2, offset=s2 - n, size=n)
        elif r == 1:  # two adjacent halves of one BO (touching, not overlapping)
            n = s1 // 2
            op.opcode, op.num_bufs = _abi.NPU_OP_COPY, 2
            op.bufs[0] = _abi.NpuBufRef(handle=h1, offset=0, size=n)
            op.bufs[1] = _abi.NpuBufRef(handle=h1, offset=n, size=n)
        elif r == 2:  # fill the last 4 bytes / the whole BO
            n = 4 if rng.random() < 0.5 else s1
            op.opcode, op.num_bufs = _abi.NPU_OP_FILL, 1
            op.bufs[0] = _abi.NpuBufRef(handle=h1, offset=s1 - n, size=n)
            op.params[0] = U32
        else:  # GEMM: a long k (dot product) or a long m, stride 2^24 on one row
            k = min(s1, s2) // 4
            m, n = (1, 1) if r == 3 else (min(k, 65536), 1)
            k = min(k, 65536) if r == 3 else 1
            lda = (1 << 24) if m == 1 else k
            op.opcode, op.num_bufs = _abi.NPU_OP_GEMM, 3
            op.bufs[0] = _abi.NpuBufRef(handle=h1, offset=0, size=((m - 1) * lda + k) * 4)
            op.bufs[1] = _abi.NpuBufRef(handle=h2, offset=0, size=k * n * 4)
            op.bufs[2] = _abi.NpuBufRef(handle=h2, offset=0, size=m * n * 4)
            for i, v in enumerate([m, n, k, lda, n, n, 0, 0]):
                op.params[i] = v
        return op

    def mutate_v1(self, op: _abi.NpuOp) -> None:
        rng = self.rng
        for _ in range(rng.randrange(1, 4)):
            f = rng.randrange(8)
            i = rng.randrange(3)
            if f == 0:
                op.opcode = self.val(16)
            elif f == 1:
                op.flags = self.val(16)
            elif f == 2:
                op.num_bufs = self.val(32)
            elif f == 3:
                op.bufs[i].handle = self.val(32)
            elif f == 4:
                op.bufs[i].offset = self.val(64)
            elif f == 5:
                op.bufs[i].size = self.val(64)
            elif f == 6:
                op.params[rng.randrange(8)] = self.val(32)
            else:
                if rng.random() < 0.5:
                    op.rsvd = self.val(64)
                else:
                    op.bufs[i].rsvd = self.val(32)

    def random_struct(self, struct: type) -> ctypes.Structure:
        return struct.from_buffer_copy(self.rng.randbytes(ctypes.sizeof(struct)))

    # tensor ops ------------------------------------------------------------------

    def tref(self, fd: int, dtype: int, shape: list[int], bcast: bool = False) -> _abi.NpuTensorRef:
        h, s = self.sized(fd)
        t = _abi.NpuTensorRef(handle=h, dtype=dtype, ndim=len(shape))
        esz = _abi.DType(dtype).itemsize
        stride = 1
        strides = []
        for d in reversed(shape):
            strides.append(0 if bcast and self.rng.random() < 0.5 else stride)
            stride *= d
        for i, (d, st) in enumerate(zip(shape, reversed(strides), strict=True)):
            t.shape[i], t.strides[i] = d, st
        extent = (
            sum((d - 1) * st for d, st in zip(shape, reversed(strides), strict=True)) + 1
        ) * esz
        if extent < s:
            t.offset = self.rng.randrange(0, (s - extent) // esz + 1) * esz
        return t

    def valid_tensor(self, fd: int) -> _abi.NpuTensorOp:
        rng = self.rng
        op = _abi.NpuTensorOp()
        rows, cols = rng.choice([(1, 1), (1, 64), (4, 16), (16, 16), (3, 1000), (64, 256)])
        shape = [rows, cols] if rng.random() < 0.7 else [rows * cols]
        kind = rng.randrange(3)
        if kind == 0:
            op.opcode, op.kind = _abi.NPU_OP_ELTWISE, rng.randrange(6)
            op.t[0] = self.tref(fd, 0, shape, bcast=True)
            op.t[1] = self.tref(fd, 0, shape, bcast=True)
            op.t[2] = self.tref(fd, 0, shape)
        elif kind == 1:
            op.opcode, op.kind = _abi.NPU_OP_UNARY, rng.randrange(9)
            op.t[0] = self.tref(fd, 0, shape, bcast=True)
            op.t[1] = self.tref(fd, 0, shape)
        else:
            op.opcode = _abi.NPU_OP_CONVERT
            op.t[0] = self.tref(fd, rng.randrange(5), shape, bcast=True)
            op.t[1] = self.tref(fd, rng.randrange(5), shape)
        return op

    def mutate_tensor(self, op: _abi.NpuTensorOp) -> None:
        rng = self.rng
        for _ in range(rng.randrange(1, 4)):
            f = rng.randrange(12)
            t = op.t[rng.randrange(4)]
            d = rng.randrange(4)
            if f == 0:
                op.opcode = self.val(16) if rng.random() < 0.5 else rng.randrange(20)
            elif f == 1:
                op.flags = self.val(16)
            elif f == 2:
                op.kind = self.val(32)
            elif f == 3:
                t.handle = self.val(32)
            elif f == 4:
                t.dtype = self.val(32)
            elif f == 5:
                t.offset = self.val(64)
            elif f == 6:
                t.ndim = self.val(32)
            elif f == 7:
                t.shape[d] = self.val(32)
            elif f == 8:
                t.strides[d] = self.val(32)
            elif f == 9:
                op.params[rng.randrange(12)] = self.val(32)
            elif f == 10:
                t.rsvd, t.rsvd2 = self.maybe(0.5, 32), self.maybe(0.5, 64)
            else:
                op.rsvd = self.val(64)

    def submit(self, fd: int, tensor: bool) -> None:
        rng = self.rng
        struct = _abi.NpuTensorOp if tensor else _abi.NpuOp
        size = ctypes.sizeof(struct)
        n = rng.choice([1, 1, 1, 2, 3, 4, 8]) if rng.random() < 0.9 else rng.choice([16, 255, 256])
        for i in range(n):
            r = rng.random()
            if r < 0.55:
                op = self.valid_tensor(fd) if tensor else self.valid_v1(fd)
            elif r < 0.9:
                op = self.valid_tensor(fd) if tensor else self.valid_v1(fd)
                (self.mutate_tensor if tensor else self.mutate_v1)(op)
            else:
                op = self.random_struct(struct)
            ctypes.memmove(self.ops_addr + i * size, ctypes.addressof(op), size)
        num_ops = n if rng.random() < 0.95 else self.val(32)
        op_size = size if rng.random() < 0.95 else self.val(32)
        if rng.random() < 0.05:  # the op array ends in the hole
            ops_ptr = self.hole - rng.randrange(1, 3) * size  # on the read-only page
        else:
            ops_ptr = self.ptr(self.ops_addr, size * n, 0.04)
        arg = _abi.NpuSubmit(
            ops_ptr=ops_ptr,
            num_ops=num_ops,
            queue=self.maybe(0.04, 32),
            flags=self.maybe(0.04, 32),
            op_size=op_size,
        )
        p = self.ptr(self.arg_addr, 32, 0.04)
        self.put_arg(arg, p)
        what = f"num_ops={num_ops} op_size={op_size} ops_ptr={ops_ptr:#x}"
        cmd = "SUBMIT_T" if tensor else "SUBMIT"
        if self.call(cmd, fd, _abi.DRM_IOCTL_NPU_SUBMIT, p, what) == 0 and self.read_back(arg, p):
            self.last_fence[fd] = int(arg.fence)

    def wait(self, fd: int) -> None:
        rng = self.rng
        last = self.last_fence[fd]
        r = rng.random()
        if r < 0.6:
            fence = last
        elif r < 0.8:
            fence = rng.randrange(0, last + 1)
        else:
            fence = self.val(64)
        timeout = rng.choice([0, 1000, 10**6, 10**9, 60 * 10**9, U64]) if r < 0.9 else self.val(64)
        arg = _abi.NpuWait(
            fence=fence,
            deadline_ns=_abi.deadline_after(timeout),
            queue=self.maybe(0.04, 32),
            flags=self.maybe(0.04, 32),
            rsvd=self.maybe(0.04, 32),
            status=self.maybe(0.1, 32),
            error_fence=self.maybe(0.1, 64),
        )
        if arg.queue:
            # A user queue's fences are the process's own: nothing tells the
            # driver that a fence will never come, so a long timeout would
            # just sleep. Keep those waits short.
            arg.deadline_ns = min(arg.deadline_ns, _abi.deadline_after(10**6))
        p = self.ptr(self.arg_addr, 40, 0.04)
        self.put_arg(arg, p)
        self.call("WAIT", fd, _abi.DRM_IOCTL_NPU_WAIT, p, f"fence={fence} timeout={timeout}")

    def fence_info(self, fd: int) -> None:
        rng = self.rng
        last = self.last_fence[fd]
        r = rng.random()
        fence = last if r < 0.5 else rng.randrange(0, last + 1) if r < 0.8 else self.val(64)
        arg = _abi.NpuFenceInfo(
            fence=fence,
            queue=self.maybe(0.05, 32),
            status=self.maybe(0.2, 32),
            t_start=self.maybe(0.2, 64),
            t_end=self.maybe(0.2, 64),
        )
        p = self.ptr(self.arg_addr, 32, 0.04)
        self.put_arg(arg, p)
        e = self.call("FENCE_INFO", fd, _abi.DRM_IOCTL_NPU_FENCE_INFO, p, f"fence={fence}")
        if e == 0 and self.read_back(arg, p) and arg.status >= _abi.NPU_ST_COUNT:
            self.violations.append(f"call {self.calls}: FENCE_INFO status {arg.status}")

    def queue_create(self, fd: int) -> None:
        rng = self.rng
        arg = _abi.NpuQueueCreate(
            entries=rng.choice([0, 1, 8, 16, 17, 64, 4096, 8192]) if rng.random() < 0.9
            else self.val(32),
            priority=rng.choice([0, 0, 1, 2, 3, 4]) if rng.random() < 0.9 else self.val(32),
            flags=self.maybe(0.05, 32),
            queue=self.maybe(0.05, 32),
            mem_offset=self.maybe(0.03, 64),
        )  # fmt: skip
        p = self.ptr(self.arg_addr, 56, 0.04)
        self.put_arg(arg, p)
        self.call("QUEUE_CREATE", fd, _abi.DRM_IOCTL_NPU_QUEUE_CREATE, p, f"entries={arg.entries}")

    def queue_destroy(self, fd: int) -> None:
        queue = self.rng.randrange(9) if self.rng.random() < 0.9 else self.val(32)
        arg = _abi.NpuQueueDestroy(queue=queue, rsvd=self.maybe(0.05, 32))
        p = self.ptr(self.arg_addr, 8, 0.04)
        self.put_arg(arg, p)
        self.call("QUEUE_DESTROY", fd, _abi.DRM_IOCTL_NPU_QUEUE_DESTROY, p, f"queue={queue}")

    def bo_info(self, fd: int) -> None:
        handle = self.handle(fd, 0.8)
        arg = _abi.NpuBoInfo(handle=handle, flags=self.maybe(0.05, 32), va=self.maybe(0.03, 64))
        p = self.ptr(self.arg_addr, 32, 0.03)
        self.put_arg(arg, p)
        e = self.call("BO_INFO", fd, _abi.DRM_IOCTL_NPU_BO_INFO, p, f"handle={handle}")
        if e == 0 and self.read_back(arg, p) and handle in self.bos[fd]:
            size = self.bos[fd][handle][0]
            if int(arg.size) != size and not int(arg.flags) & _abi.NPU_BO_INFO_USERPTR:
                self.violations.append(f"call {self.calls}: BO_INFO size {arg.size} != {size}")

    def gem_close(self, fd: int) -> None:
        handle = self.handle(fd, 0.7)
        arg = _abi.DrmGemClose(handle=handle, pad=self.maybe(0.05, 32))
        p = self.ptr(self.arg_addr, 8, 0.03)
        self.put_arg(arg, p)
        if self.call("GEM_CLOSE", fd, _abi.DRM_IOCTL_GEM_CLOSE, p, f"handle={handle}") == 0:
            self.bos[fd].pop(handle, None)

    def prime_export(self, fd: int) -> None:
        handle = self.handle(fd, 0.85)
        flags = _abi.DRM_CLOEXEC | _abi.DRM_RDWR if self.rng.random() < 0.9 else self.val(32)
        arg = _abi.DrmPrimeHandle(handle=handle, flags=flags, fd=self.maybe(0.05, 32))
        p = self.ptr(self.arg_addr, 12, 0.03)
        self.put_arg(arg, p)
        what = f"handle={handle} flags={flags:#x}"
        if self.call("PRIME_EXPORT", fd, _abi.DRM_IOCTL_PRIME_HANDLE_TO_FD, p, what) == 0:
            if self.read_back(arg, p):
                self.dmabufs.append(int(arg.fd))
            if len(self.dmabufs) > 16:
                os.close(self.dmabufs.pop(self.rng.randrange(len(self.dmabufs))))

    def prime_import(self, fd: int) -> None:
        rng = self.rng
        if self.dmabufs and rng.random() < 0.8:
            dmabuf = rng.choice(self.dmabufs)
        else:  # not a dma-buf: the device file, stdin, a closed or bogus fd
            dmabuf = rng.choice([fd, 0, -1, 1 << 20, self.val(32)])
        arg = _abi.DrmPrimeHandle(fd=dmabuf, flags=self.maybe(0.05, 32))
        p = self.ptr(self.arg_addr, 12, 0.03)
        self.put_arg(arg, p)
        e = self.call("PRIME_IMPORT", fd, _abi.DRM_IOCTL_PRIME_FD_TO_HANDLE, p, f"fd={dmabuf}")
        if e == 0 and self.read_back(arg, p):
            info = _abi.NpuBoInfo(handle=arg.handle)
            fcntl.ioctl(fd, _abi.DRM_IOCTL_NPU_BO_INFO, info, True)
            self.bos[fd][int(arg.handle)] = (int(info.size), False, int(info.mmap_offset))

    def bad_nr(self, fd: int) -> None:
        rng = self.rng
        while True:
            r = rng.random()
            typ = (
                ord("N") if r < 0.6 else _abi.NPU_DRM_IOCTL_BASE if r < 0.8 else rng.randrange(256)
            )
            if typ in VFS_TYPES:
                continue
            if typ == _abi.NPU_DRM_IOCTL_BASE:
                # Driver numbers past the table (DRM's core ones are valid calls).
                nr = rng.randrange(_abi.NPU_DRM_COMMAND_BASE + 10, 0xA0)
            else:
                nr = rng.randrange(8) if rng.random() < 0.7 else rng.randrange(256)
            size = rng.choice([0, 8, 24, 32, 40, 72, 16, 48, 64]) + rng.choice([0, 0, 8, -8])
            if rng.random() < 0.2:
                size = rng.randrange(1 << 14)
            request = _ioc(rng.randrange(4), typ, nr, max(size, 0))
            if request not in VALID_REQUESTS:
                break
        self.call("BAD_NR", fd, request, self.arg_addr, f"nr={nr} size={size}")

    def do_mmap(self, fd: int) -> None:
        rng = self.rng
        live = self.live(fd)
        if live and rng.random() < 0.7:
            h = rng.choice(live)
            s = self.bos[fd][h][0]
            pages = max(1, s // PAGE)
            off = self.bos[fd][h][2] + rng.randrange(pages + 1) * PAGE
            length = rng.randrange(1, pages + 2) * PAGE
        else:
            off = self.val(64) & ~(PAGE - 1) & ((1 << 63) - 1)
            length = self.val(40)
        prot = rng.choice([mmap.PROT_READ, mmap.PROT_READ | mmap.PROT_WRITE])
        flags = mmap.MAP_SHARED if rng.random() < 0.9 else mmap.MAP_PRIVATE
        self.calls += 1
        self.by_cmd["MMAP"] = self.by_cmd.get("MMAP", 0) + 1
        addr = su.libc.mmap(None, length, prot, flags, fd, off)
        if addr in (None, su.MAP_FAILED):
            e = ctypes.get_errno()
            self.by_errno[su.errname(e)] = self.by_errno.get(su.errname(e), 0) + 1
            if e not in ALLOWED["MMAP"]:
                self.violations.append(
                    f"call {self.calls} MMAP off={off:#x} len={length:#x}: {su.errname(e)}"
                )
            return
        self.by_errno["OK"] = self.by_errno.get("OK", 0) + 1
        ctypes.string_at(addr, 1)  # the page is there
        self.maps.append((int(addr), length))
        if len(self.maps) > 4:
            a, n = self.maps.pop(0)
            su.libc.munmap(a, n)

    def reopen(self, i: int) -> None:
        """Close a file with whatever it has in flight, open a new one."""
        fd = self.fds[i]
        os.close(fd)
        del self.bos[fd], self.last_fence[fd]
        fd = os.open(su.DEV_PATH, os.O_RDWR)
        self.fds[i] = fd
        self.bos[fd], self.last_fence[fd] = {}, 0

    def run(self, n_calls: int) -> None:
        names = list(WEIGHTS)
        weights = [WEIGHTS[k] for k in names]
        for fd in self.fds:  # something to work with
            for _ in range(4):
                self.bo_create(fd)
        while self.calls < n_calls:
            cmd = self.rng.choices(names, weights)[0]
            i = self.rng.randrange(2)
            fd = self.fds[i]
            if cmd == "GET_INFO":
                self.get_info(fd)
            elif cmd == "BO_CREATE":
                self.bo_create(fd)
            elif cmd == "BO_DESTROY":
                self.bo_destroy(fd)
            elif cmd == "BO_USERPTR":
                self.bo_userptr(fd)
            elif cmd in ("SUBMIT", "SUBMIT_T"):
                self.submit(fd, cmd == "SUBMIT_T")
            elif cmd == "WAIT":
                self.wait(fd)
            elif cmd == "FENCE_INFO":
                self.fence_info(fd)
            elif cmd == "QUEUE_CREATE":
                self.queue_create(fd)
            elif cmd == "QUEUE_DESTROY":
                self.queue_destroy(fd)
            elif cmd == "BO_INFO":
                self.bo_info(fd)
            elif cmd == "GEM_CLOSE":
                self.gem_close(fd)
            elif cmd == "PRIME_EXPORT":
                self.prime_export(fd)
            elif cmd == "PRIME_IMPORT":
                self.prime_import(fd)
            elif cmd == "BAD_NR":
                self.bad_nr(fd)
            elif cmd == "MMAP":
                self.do_mmap(fd)
            else:
                self.reopen(i)
            if len(self.violations) >= 20:
                break

    def close(self) -> None:
        for fd in self.fds + self.dmabufs:
            os.close(fd)
        for a, n in self.maps:
            su.libc.munmap(a, n)
        su.libc.munmap(self.base, 54 * PAGE)


def _device_computes() -> None:
    """A GEMM, an ELTWISE and a FILL give the right results."""
    fd = os.open(su.DEV_PATH, os.O_RDWR)
    try:
        rng = np.random.default_rng(5)
        m, n, k = 19, 23, 41
        av = rng.standard_normal((m, k), dtype=np.float32)
        bv = rng.standard_normal((k, n), dtype=np.float32)
        a, b, c = su.Bo(fd, av.nbytes), su.Bo(fd, bv.nbytes), su.Bo(fd, m * n * 4)
        maps = [x.map() for x in (a, b, c)]
        np.frombuffer(maps[0], np.float32)[: av.size] = av.ravel()
        np.frombuffer(maps[1], np.float32)[: bv.size] = bv.ravel()
        su.wait(fd, su.submit(fd, [ops.gemm(a, b, c, m, n, k).pack()]))
        got = np.frombuffer(maps[2], np.float32)[: m * n].reshape(m, n)
        np.testing.assert_allclose(got, av @ bv, rtol=1e-4, atol=1e-4)
        x, y = ops.tensor_ref(a, _abi.DType.FP32, [64]), ops.tensor_ref(b, _abi.DType.FP32, [64])
        out = ops.tensor_ref(c, _abi.DType.FP32, [64])
        op = ops.eltwise(_abi.EltwiseKind.ADD, x, y, out)
        su.wait(fd, su.submit(fd, [op.pack()], tensor=True))
        want = av.ravel()[:64] + bv.ravel()[:64]
        np.testing.assert_allclose(np.frombuffer(maps[2], np.float32)[:64], want, rtol=1e-6)
        su.wait(fd, su.submit(fd, [ops.fill(c, 0x01020304, c.size).pack()]))
        assert (np.frombuffer(maps[2], np.uint32) == 0x01020304).all()
        del got
        for mm in maps:
            mm.close()
    finally:
        os.close(fd)


def test_ioctl_fuzzer_no_oops_only_documented_errnos_then_clean_unload(record_property):
    n_calls = su.size("FUZZ_CALLS")
    seed = int(os.environ.get("NPU_STRESS_SEED", "") or time.time_ns() % 2**32)
    print(f"fuzz: {n_calls} calls, seed {seed} (NPU_STRESS_SEED={seed} reproduces)")
    su.wait_idle()
    base = su.bo_counters()
    base_pins = su.pinned_pages()
    with open(LIMIT_PARAM) as f:
        old_limit = f.read().strip()
    with open(LIMIT_PARAM, "w") as f:
        f.write(str(LIMIT_MIB))
    fz = Fuzzer(seed)
    t0 = time.monotonic()
    try:
        fz.run(n_calls)
    finally:
        seconds = time.monotonic() - t0
        fz.close()
        with open(LIMIT_PARAM, "w") as f:
            f.write(old_limit)
    rate = fz.calls / seconds
    print(f"fuzz: {fz.calls} calls in {seconds:.1f} s = {rate:.0f} calls/s (seed {seed})")
    print(f"fuzz: by command {fz.by_cmd}")
    print(f"fuzz: results {dict(sorted(fz.by_errno.items(), key=lambda kv: -kv[1]))}")
    record_property("fuzz_seed", seed)
    record_property("fuzz_calls", fz.calls)
    record_property("fuzz_seconds", round(seconds, 1))
    record_property("fuzz_calls_per_s", round(rate))
    record_property("fuzz_results", repr(fz.by_errno))
    assert not fz.violations, f"seed {seed}: undocumented results:\n" + "\n".join(fz.violations)
    assert fz.calls >= n_calls
    assert fz.by_errno.get("OK", 0) > n_calls // 20, f"seed {seed}: few calls succeeded"

    su.wait_idle()
    assert su.poll(lambda: su.bo_counters() == base, 30), (
        f"seed {seed}: BO counters {su.bo_counters()} != baseline {base}"
    )
    assert su.poll(lambda: su.pinned_pages() == base_pins, 5), "userptr pages still pinned"
    _device_computes()
    # A clean unload (nothing holds the module), and back.
    assert su.read_int("/sys/module/npu/refcnt") == 0
    su.rmmod()
    su.insmod()
    _device_computes()
