"""The ioctl fuzzer's model: every call's argument, how to make it, what it may return.

``tests/stress/test_fuzz.py`` is the test that drives it (docs/reliability.md);
``python3 -m tests.stress.fuzz_model --calls N`` (in the guest, from
/mnt/npu) runs N calls alone and prints ``fuzz_calls_per_s`` as JSON on its
last line (``make bench``, scripts/bench.py).

What it makes, all of it real and then passed along stale, foreign or at
boundary values:

- three open device files (*slots*) shared by THREADS worker threads; a
  slot is now and then closed with whatever it has in flight and opened
  again under the same number (``dup2``, so no thread ever calls into an
  unrelated file);
- BOs (host, device memory, userptr over anonymous, read-only, unmapped and
  device-mapped memory, PRIME imports), their mappings (munmapped at random
  with work in flight), dma-bufs, user queues with their memory mapped and
  NOPs pushed through their doorbells (rung by a helper process the file is
  passed to: a store to a doorbell the driver zapped raises SIGBUS);
- DRM syncobjs (binary and timeline), their fds, sync_files exported from
  them or merged, sw_sync fences (debugfs ``sync/sw_sync``, the debug kernel
  has it) imported into syncobjs and signalled at random by a signaller
  thread, and eventfds registered on syncobjs;
- SUBMITs in both op formats with ``in_syncs`` (syncobj points, user-queue
  fence values), ``out_syncobj``/``out_point``, and the 32-byte struct of
  driver 1.0;
- forked children that make a few calls on the inherited files (and a file
  of their own they never close) and ``_exit``.

Every call must return 0 or an errno that ALLOWED (docs/uapi.md's errno
table, and DRM core's and the dma-buf core's own errnos for their ioctls)
has for it; a violation names the seed, the thread, its call number and the
call. The interleaving of the threads is not reproducible; each thread's
choices are, from the seed.
"""

from __future__ import annotations

import argparse
import array
import ctypes
import errno as E
import itertools
import json
import mmap
import os
import random
import select
import signal
import socket
import struct
import subprocess
import sys
import threading
import time
import traceback
import warnings
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

from npu import _abi

from . import stress_util as su

PAGE = su.PAGE
U32 = (1 << 32) - 1
U64 = (1 << 64) - 1
S64_MAX = (1 << 63) - 1
THREADS = 3
SLOTS = 3
# The fuzzing files run under a per-file memory limit (random sizes get
# ENOMEM, not the OOM killer) and a short hang timeout (a dependency that
# never comes, a far sw_sync point or a user-queue value never pushed, is a
# hang: it costs a second of queue 0, not ten).
PARAMS = {
    "/sys/module/npu/parameters/ctx_mem_limit_mib": "8",
    "/sys/module/npu/parameters/hang_timeout_ms": "1000",
}
SW_SYNC = "/sys/kernel/debug/sync/sw_sync"
BOUNDARY = [
    0, 1, 2, 3, 4, 7, 8, 15, 16, 63, 64, 255, 256, 257, 4095, 4096, 4097, 8192,
    65535, 65536, 65537, 1 << 20, (1 << 24) - 1, 1 << 24, (1 << 24) + 1, 1 << 28,
    (1 << 30) - 1, 1 << 30, (1 << 30) + 1, (1 << 31) - 1, 1 << 31, (1 << 31) + 1,
    (1 << 32) - 4096, (1 << 32) - 1, 1 << 32, (1 << 32) + 1, 1 << 40, (1 << 63) - 1,
    1 << 63, U64 - 4095, U64 - 1, U64,
]  # fmt: skip
NB2 = 2 * len(BOUNDARY)
KERNEL_PTRS = [0xFFFFFFFF81000000, 0xFFFF888000000000, 0xFFFFFFFFFFFFF000, 0x0000800000000000]
# Counts of DRM core's handle arrays (syncobj WAIT, RESET, QUERY, ...). DRM
# allocates count-sized arrays before it reads them, without __GFP_NOWARN:
# a count of 2^32 - 1 makes the page allocator warn in DRM core, not in the
# driver, so the counts stay at sizes an allocation can serve.
COUNTS = [0, 1, 1, 1, 2, 2, 3, 4, 8, 16, 17, 64, 255, 256, 1024, 4096]


def _ioc(direction: int, typ: int, nr: int, size: int) -> int:
    return (direction << 30) | (size << 16) | (typ << 8) | nr


def s64(v: int) -> int:
    return v - (1 << 64) if v >= 1 << 63 else v


# --------------------------------------------------------------------------
# DRM core and dma-buf structs the runtime does not need (drm.h, sync_file.h,
# drivers/dma-buf/sw_sync.c)
# --------------------------------------------------------------------------


class DrmSyncobjWait(ctypes.Structure):
    """``struct drm_syncobj_wait`` (SYNCOBJ_WAIT); absolute CLOCK_MONOTONIC timeout."""

    _fields_ = [
        ("handles", ctypes.c_uint64),
        ("timeout_nsec", ctypes.c_int64),
        ("count_handles", ctypes.c_uint32),
        ("flags", ctypes.c_uint32),
        ("first_signaled", ctypes.c_uint32),
        ("pad", ctypes.c_uint32),
        ("deadline_nsec", ctypes.c_uint64),
    ]


class DrmSyncobjTimelineWait(ctypes.Structure):
    """``struct drm_syncobj_timeline_wait`` with 6.12's ``deadline_nsec``."""

    _fields_ = [
        ("handles", ctypes.c_uint64),
        ("points", ctypes.c_uint64),
        ("timeout_nsec", ctypes.c_int64),
        ("count_handles", ctypes.c_uint32),
        ("flags", ctypes.c_uint32),
        ("first_signaled", ctypes.c_uint32),
        ("pad", ctypes.c_uint32),
        ("deadline_nsec", ctypes.c_uint64),
    ]


class DrmSyncobjArray(ctypes.Structure):
    """``struct drm_syncobj_array`` (SYNCOBJ_RESET, SYNCOBJ_SIGNAL)."""

    _fields_ = [
        ("handles", ctypes.c_uint64),
        ("count_handles", ctypes.c_uint32),
        ("pad", ctypes.c_uint32),
    ]


class DrmSyncobjTransfer(ctypes.Structure):
    """``struct drm_syncobj_transfer`` (SYNCOBJ_TRANSFER)."""

    _fields_ = [
        ("src_handle", ctypes.c_uint32),
        ("dst_handle", ctypes.c_uint32),
        ("src_point", ctypes.c_uint64),
        ("dst_point", ctypes.c_uint64),
        ("flags", ctypes.c_uint32),
        ("pad", ctypes.c_uint32),
    ]


class DrmSyncobjEventfd(ctypes.Structure):
    """``struct drm_syncobj_eventfd`` (SYNCOBJ_EVENTFD)."""

    _fields_ = [
        ("handle", ctypes.c_uint32),
        ("flags", ctypes.c_uint32),
        ("point", ctypes.c_uint64),
        ("fd", ctypes.c_int32),
        ("pad", ctypes.c_uint32),
    ]


class SwSyncCreateFence(ctypes.Structure):
    """``struct sw_sync_create_fence_data`` (sw_sync's debugfs ABI)."""

    _fields_ = [("value", ctypes.c_uint32), ("name", ctypes.c_char * 32), ("fence", ctypes.c_int32)]


class SyncMergeData(ctypes.Structure):
    """``struct sync_merge_data`` (SYNC_IOC_MERGE)."""

    _fields_ = [
        ("name", ctypes.c_char * 32),
        ("fd2", ctypes.c_int32),
        ("fence", ctypes.c_int32),
        ("flags", ctypes.c_uint32),
        ("pad", ctypes.c_uint32),
    ]


class SyncFileInfo(ctypes.Structure):
    """``struct sync_file_info`` (SYNC_IOC_FILE_INFO)."""

    _fields_ = [
        ("name", ctypes.c_char * 32),
        ("status", ctypes.c_int32),
        ("flags", ctypes.c_uint32),
        ("num_fences", ctypes.c_uint32),
        ("pad", ctypes.c_uint32),
        ("sync_fence_info", ctypes.c_uint64),
    ]


D = _abi.NPU_DRM_IOCTL_BASE
DRM_IOCTL_SYNCOBJ_WAIT = _ioc(3, D, 0xC3, ctypes.sizeof(DrmSyncobjWait))
DRM_IOCTL_SYNCOBJ_RESET = _ioc(3, D, 0xC4, ctypes.sizeof(DrmSyncobjArray))
DRM_IOCTL_SYNCOBJ_SIGNAL = _ioc(3, D, 0xC5, ctypes.sizeof(DrmSyncobjArray))
DRM_IOCTL_SYNCOBJ_TIMELINE_WAIT = _ioc(3, D, 0xCA, ctypes.sizeof(DrmSyncobjTimelineWait))
DRM_IOCTL_SYNCOBJ_TRANSFER = _ioc(3, D, 0xCC, ctypes.sizeof(DrmSyncobjTransfer))
DRM_IOCTL_SYNCOBJ_EVENTFD = _ioc(3, D, 0xCF, ctypes.sizeof(DrmSyncobjEventfd))
# SUBMIT with the 32-byte struct of driver 1.0 (no dependencies).
DRM_IOCTL_NPU_SUBMIT_V10 = _ioc(3, D, _abi.NPU_DRM_COMMAND_BASE + _abi.DRM_NPU_SUBMIT, 32)
SW_SYNC_IOC_CREATE_FENCE = _ioc(3, ord("W"), 0, ctypes.sizeof(SwSyncCreateFence))
SW_SYNC_IOC_INC = _ioc(1, ord("W"), 1, 4)
SYNC_IOC_MERGE = _ioc(3, ord(">"), 3, ctypes.sizeof(SyncMergeData))
SYNC_IOC_FILE_INFO = _ioc(3, ord(">"), 4, ctypes.sizeof(SyncFileInfo))
SYNC_FENCE_INFO_SIZE = 80  # struct sync_fence_info
SYNCOBJ_WAIT_ALL = _abi.DRM_SYNCOBJ_WAIT_FLAGS_WAIT_ALL
SYNCOBJ_WAIT_FOR_SUBMIT = _abi.DRM_SYNCOBJ_WAIT_FLAGS_WAIT_FOR_SUBMIT
SYNCOBJ_WAIT_AVAILABLE = 1 << 2
SYNCOBJ_WAIT_DEADLINE = 1 << 3
SYNCOBJ_QUERY_LAST_SUBMITTED = 1 << 0
EXPORT_SYNC_FILE = _abi.DRM_SYNCOBJ_HANDLE_TO_FD_FLAGS_EXPORT_SYNC_FILE
IMPORT_SYNC_FILE = _abi.DRM_SYNCOBJ_FD_TO_HANDLE_FLAGS_IMPORT_SYNC_FILE

# --------------------------------------------------------------------------
# What each call may return
# --------------------------------------------------------------------------

# Any call on the device: a bad argument pointer, and ENOTTY for the ioctl
# numbers DRM does not know.
ANY = {E.ENOTTY, E.EFAULT}
# Calls on an fd that may be of another kind than the call is for (a
# dma-buf, a sync_file, a syncobj fd, the device, an eventfd).
NOT_THIS_KIND = {E.ENOTTY, E.EINVAL, E.EBADF}
ALLOWED: dict[str, set[int]] = {
    # docs/uapi.md's errno table.
    "GET_INFO": set(),
    "BO_CREATE": {E.EINVAL, E.E2BIG, E.ENOMEM, E.EOPNOTSUPP},
    "BO_DESTROY": {E.EINVAL, E.ENOENT},
    "BO_USERPTR": {E.EINVAL, E.E2BIG, E.EFAULT, E.ENOMEM},
    # EIO: the file is banned (three hangs: dependencies that never came).
    "SUBMIT": {E.EINVAL, E.ENOENT, E.ERANGE, E.EACCES, E.EOPNOTSUPP, E.EBUSY, E.EIO},
    "SUBMIT_T": {E.EINVAL, E.ENOENT, E.ERANGE, E.EACCES, E.EOPNOTSUPP, E.EBUSY, E.EIO},
    # ENOENT: a user queue index the file was not lent.
    "WAIT": {E.EINVAL, E.ETIMEDOUT, E.EIO, E.ENOENT},
    "FENCE_INFO": {E.EINVAL, E.EBUSY, E.ENOENT},
    # EBUSY: all seven user queues are lent; EACCES: priority above 1; EIO: banned.
    "QUEUE_CREATE": {E.EINVAL, E.EBUSY, E.EACCES, E.ENOMEM, E.EIO},
    "QUEUE_DESTROY": {E.EINVAL, E.ENOENT},
    "BO_INFO": {E.EINVAL, E.ENOENT},
    # DRM core: GEM_CLOSE's unknown handle is EINVAL; PRIME export of an
    # unknown handle ENOENT, of a device-memory or userptr BO EOPNOTSUPP;
    # import of a closed fd EBADF, of a file that is no dma-buf EINVAL.
    "GEM_CLOSE": {E.EINVAL},
    "PRIME_EXPORT": {E.EINVAL, E.ENOENT, E.EOPNOTSUPP, E.EMFILE},
    "PRIME_IMPORT": {E.EINVAL, E.EBADF, E.ENOMEM},
    # DRM core's syncobj ioctls (drivers/gpu/drm/drm_syncobj.c): EINVAL for
    # flags, pad, a zero count and, where DRM looks a handle up itself,
    # an unknown handle (DESTROY, HANDLE_TO_FD without flags); ENOENT for an
    # unknown handle in a handle array, an export of a sync_file, an import
    # or a transfer; EINVAL for a point without a fence (unless waiting for
    # submit); ETIME for a wait that timed out; EFAULT for the arrays.
    "SYNCOBJ_CREATE": {E.EINVAL, E.ENOMEM},
    "SYNCOBJ_DESTROY": {E.EINVAL},
    "SYNCOBJ_HANDLE_TO_FD": {E.EINVAL, E.ENOENT, E.EMFILE, E.ENFILE, E.ENOMEM},
    "SYNCOBJ_FD_TO_HANDLE": {E.EINVAL, E.ENOENT, E.ENOMEM},
    "SYNCOBJ_WAIT": {E.EINVAL, E.ENOENT, E.ENOMEM, E.ETIME},
    "SYNCOBJ_TIMELINE_WAIT": {E.EINVAL, E.ENOENT, E.ENOMEM, E.ETIME},
    "SYNCOBJ_RESET": {E.EINVAL, E.ENOENT, E.ENOMEM},
    "SYNCOBJ_SIGNAL": {E.EINVAL, E.ENOENT, E.ENOMEM},
    "SYNCOBJ_QUERY": {E.EINVAL, E.ENOENT, E.ENOMEM},
    "SYNCOBJ_TIMELINE_SIGNAL": {E.EINVAL, E.ENOENT, E.ENOMEM},
    "SYNCOBJ_TRANSFER": {E.EINVAL, E.ENOENT, E.ENOMEM, E.ETIME},
    # eventfd_ctx_fdget(): EBADF for no file, EINVAL for a file that is no eventfd.
    "SYNCOBJ_EVENTFD": {E.EINVAL, E.ENOENT, E.ENOMEM, E.EBADF},
    # sw_sync's own ioctls (the test's tool): only running out of fds or memory.
    "SW_FENCE": {E.EMFILE, E.ENOMEM},
    "SW_INC": set(),
    # sync_file ioctls (drivers/dma-buf/sync_file.c) on an fd from a pool:
    # EINVAL for flags and pad or an array too short, ENOENT for a second
    # fd that is no sync_file (MERGE); another kind of fd: ENOTTY.
    "SYNC_FILE_INFO": {E.EINVAL, E.ENOMEM} | NOT_THIS_KIND,
    "SYNC_MERGE": {E.EINVAL, E.ENOENT, E.ENOMEM, E.EMFILE} | NOT_THIS_KIND,
    "BAD_NR": set(),
    # mmap(2) of the device: the driver's EINVAL, and the core's own checks.
    "MMAP": {E.EINVAL, E.ENOMEM, E.EOVERFLOW},
    "MUNMAP": set(),
    "POLL": set(),
}
# Type letters of ioctls the VFS handles itself before the driver (FIOCLEX,
# FIONBIO, FIFREEZE, FIGETBSZ, FS_IOC_*, FICLONE, ...): never sent.
VFS_TYPES = {0x00, 0x12, 0x15, ord("T"), ord("X"), ord("f"), 0x94}
VALID_REQUESTS = {
    _abi.DRM_IOCTL_NPU_GET_INFO,
    _abi.DRM_IOCTL_NPU_BO_CREATE,
    _abi.DRM_IOCTL_NPU_BO_DESTROY,
    _abi.DRM_IOCTL_NPU_BO_USERPTR,
    _abi.DRM_IOCTL_NPU_SUBMIT,
    DRM_IOCTL_NPU_SUBMIT_V10,
    _abi.DRM_IOCTL_NPU_WAIT,
    _abi.DRM_IOCTL_NPU_FENCE_INFO,
    _abi.DRM_IOCTL_NPU_QUEUE_CREATE,
    _abi.DRM_IOCTL_NPU_QUEUE_DESTROY,
    _abi.DRM_IOCTL_NPU_BO_INFO,
}

# How often each action is chosen (relative). Actions a forked child may take
# are in CHILD_ACTIONS: nothing that destroys what the parent's threads keep
# track of in the files they share.
WEIGHTS = {
    "GET_INFO": 2,
    "BO_CREATE": 6,
    "BO_DESTROY": 4,
    "BO_USERPTR": 5,
    "SUBMIT": 12,
    "SUBMIT_T": 6,
    "WAIT": 10,
    "FENCE_INFO": 3,
    "QUEUE_CREATE": 2,
    "QUEUE_DESTROY": 2,
    "QUEUE_PUSH": 0.6,  # through the ring helper
    "BO_INFO": 3,
    "GEM_CLOSE": 2,
    "PRIME_EXPORT": 3,
    "PRIME_IMPORT": 3,
    "BAD_NR": 6,
    "MMAP": 4,
    "MUNMAP": 2,
    "SYNCOBJ_CREATE": 4,
    "SYNCOBJ_DESTROY": 2,
    "SYNCOBJ_HANDLE_TO_FD": 3,
    "SYNCOBJ_FD_TO_HANDLE": 3,
    "SYNCOBJ_WAIT": 3,
    "SYNCOBJ_TIMELINE_WAIT": 3,
    "SYNCOBJ_RESET": 1,
    "SYNCOBJ_SIGNAL": 1,
    "SYNCOBJ_QUERY": 2,
    "SYNCOBJ_TIMELINE_SIGNAL": 2,
    "SYNCOBJ_TRANSFER": 2,
    "SYNCOBJ_EVENTFD": 1,
    "SW_FENCE": 3,
    "SW_INC": 1,
    "SW_REOPEN": 0.03,
    "SYNC_FILE_INFO": 1,
    "SYNC_MERGE": 1,
    "POLL": 1,
    # A fork of this process costs ~0.5 s on the debug kernel under TCG, a
    # reopen ~0.1 s: a few dozen of each in 100,000 calls.
    "FORK": 0.01,
    "REOPEN": 0.1,
}
SW_ACTIONS = {"SW_FENCE", "SW_INC", "SW_REOPEN"}
CHILD_ACTIONS = [
    "GET_INFO",
    "BO_CREATE",
    "BO_USERPTR",
    "SUBMIT",
    "SUBMIT_T",
    "WAIT",
    "FENCE_INFO",
    "BO_INFO",
    "PRIME_EXPORT",
    "PRIME_IMPORT",
    "MMAP",
    "SYNCOBJ_CREATE",
    "SYNCOBJ_HANDLE_TO_FD",
    "SYNCOBJ_FD_TO_HANDLE",
    "SYNCOBJ_WAIT",
    "SYNCOBJ_QUERY",
    "SYNCOBJ_SIGNAL",
    "SYNCOBJ_TIMELINE_SIGNAL",
    "SW_FENCE",
    "SYNC_FILE_INFO",
    "BAD_NR",
]
MAX_VIOLATIONS = 20
# The ring helper: gets (doorbell offset, tail) and the device file, maps the
# doorbell, answers "M" (mapped) or "E" (the driver refused: the queue is
# gone), stores the tail and answers "R". A store to a doorbell zapped in
# between (QUEUE_DESTROY, a reset) kills it with SIGBUS: started again.
RING_HELPER = r"""
import ctypes, mmap, os, socket, struct, sys
s = socket.socket(fileno=int(sys.argv[1]))
while True:
    msg, anc, _, _ = s.recvmsg(12, socket.CMSG_SPACE(4))
    if not msg:
        break
    off, tail = struct.unpack("<QI", msg)
    fd = struct.unpack("<i", anc[0][2][:4])[0]
    try:
        m = mmap.mmap(fd, mmap.PAGESIZE, mmap.MAP_SHARED, mmap.PROT_WRITE, offset=off)
    except OSError:
        os.close(fd)
        s.send(b"E")
        continue
    os.close(fd)
    s.send(b"M")
    v = ctypes.c_uint32.from_buffer(m)
    v.value = tail
    del v
    m.close()
    s.send(b"R")
"""
CHILD_TIMEOUT_S = 120.0

# Scratch pages of each worker: 0..29 op arrays (v1 from 0, tensor ops from
# OPS_T_PAGE: up to 256 of each), 30 arguments (and sync_file
# fence infos from +1024), 31 handle, point and dependency arrays, 32
# read-only, 33 unmapped (a hole), 34..49 user memory for BO_USERPTR, 50..53
# read-only user memory.
SCRATCH_PAGES = 54
OPS_T_PAGE = 8
AUX_HANDLES, AUX_POINTS, AUX_SYNCS = 0, 1024, 2048
AUX_HANDLES_MAX, AUX_POINTS_MAX, AUX_SYNCS_MAX = 256, 128, 128


# --------------------------------------------------------------------------
# What the workers share
# --------------------------------------------------------------------------


@dataclass
class UQueue:
    """A user queue of a slot, its memory mapped (mem) and the NOPs rung (tail)."""

    index: int
    entries: int
    mem_size: int
    fence_offset: int
    doorbell_offset: int
    mem: int = 0
    tail: int = 0
    busy: bool = False


@dataclass
class Mapping:
    addr: int
    length: int
    queue: UQueue | None = None


class Slot:
    """An open device file shared by the workers, under a fixed fd number.

    ``bos`` is exact for its ``epoch``: every call that makes or destroys a
    handle holds ``bo_lock`` until it has written down what it did, and a
    reopen holds it too (forked children never destroy handles). ``gen``
    counts reopens; the rest (syncobjs, queues, fences) is only a source of
    likely-valid values.
    """

    def __init__(self, index: int) -> None:
        self.index = index
        self.fd = os.open(su.DEV_PATH, os.O_RDWR)
        self.gen = 0
        self.epoch = 0
        self.bo_lock = threading.Lock()
        self.bos: dict[int, tuple[int, bool, int]] = {}  # handle: (size, userptr, mmap offset)
        self.stale_bos: list[int] = []
        # syncobj handle: -1 no fence known, 0 a fence (binary), n: timeline point n has one
        self.syncobjs: dict[int, int] = {}
        self.stale_syncobjs: list[int] = []
        self.queues: dict[int, UQueue] = {}
        self.last_fence = 0

    def reset(self) -> None:
        self.gen += 1
        self.epoch += 1
        self.stale_bos = list(self.bos)[:16]
        self.stale_syncobjs = list(self.syncobjs)[:16]
        self.bos, self.syncobjs, self.queues = {}, {}, {}
        self.last_fence = 0


class Shared:
    """The files, pools of fds and mappings, the sw_sync timeline, the results."""

    def __init__(self, seed: int) -> None:
        self.seed = seed
        # Reentrant: a violation is written down (under the lock) from a call
        # made under it.
        self.lock = threading.RLock()
        self.sw_lock = threading.Lock()
        self.stop = threading.Event()
        self.fds_before = _open_fds()
        self.slots = [Slot(i) for i in range(SLOTS)]
        self.dmabufs: list[int] = []
        self.sync_files: list[int] = []
        self.syncobj_fds: list[int] = []
        self.eventfds = [os.eventfd(0, os.EFD_NONBLOCK) for _ in range(2)]
        self.maps: list[Mapping] = []
        self.sw = os.open(SW_SYNC, os.O_RDWR) if os.path.exists(SW_SYNC) else -1
        self.sw_value = 0
        self.sw_max = 0  # the furthest point a fence was made for
        self.sw_signals = 0
        self.violations: list[str] = []
        self.forks = 0
        self.child_calls = 0
        self.ring_lock = threading.Lock()
        self.helper: subprocess.Popen[bytes] | None = None
        self.helper_sock: socket.socket | None = None
        self.rings = Counter[str]()

    def ring(self, fd: int, offset: int, tail: int) -> str:
        """Ring a doorbell through the helper: "rang", "gone" (the mmap was
        refused) or "sigbus" (the doorbell was zapped before the store)."""
        with self.ring_lock:
            if self.helper is None:
                ours, theirs = socket.socketpair()
                self.helper = subprocess.Popen(
                    [sys.executable, "-S", "-c", RING_HELPER, str(theirs.fileno())],
                    pass_fds=[theirs.fileno()],
                )
                theirs.close()
                ours.settimeout(120)
                self.helper_sock = ours
            sock = self.helper_sock
            assert sock is not None
            rights = [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", [fd]))]
            answer = b""
            try:
                sock.sendmsg([struct.pack("<QI", offset, tail & U32)], rights)
                answer = sock.recv(1)
                if answer == b"M":
                    answer = sock.recv(1)
            except OSError:
                pass
            if answer == b"E":
                outcome = "gone"
            elif answer == b"R":
                outcome = "rang"
            else:
                outcome = self.stop_helper()
            self.rings[outcome] += 1
            return outcome

    def stop_helper(self) -> str:
        """Stop the helper (caller holds ring_lock); how it ended."""
        assert self.helper is not None and self.helper_sock is not None
        self.helper_sock.close()
        try:
            rc = self.helper.wait(60)
        except subprocess.TimeoutExpired:
            self.helper.kill()
            rc = self.helper.wait()
        self.helper, self.helper_sock = None, None
        if rc == -signal.SIGBUS:
            return "sigbus"
        if rc != 0:
            self.violation(f"the ring helper exited {rc}")
        return "helper-exited"

    def sw_signal_all(self) -> None:
        """Signal the sw_sync timeline up to every fence made on it (caller
        holds sw_lock), before it is closed. A timeline closed with fences
        pending signals them from its release with its lock held; a fence
        callback that drops the last reference then takes that lock again
        (timeline_fence_release): lockdep reports recursive locking, and on
        one CPU the kernel deadlocks. That is sw_sync's (Linux 6.12), a test
        tool's, not the driver's; the fuzzer keeps clear of it."""
        if self.sw < 0 or self.sw_max <= self.sw_value:
            return
        n = ctypes.c_uint32(min(self.sw_max - self.sw_value, U32))
        e = su.raw_ioctl(self.sw, SW_SYNC_IOC_INC, ctypes.addressof(n))
        if e:
            self.violation(f"SW_SYNC_IOC_INC to the last point: {su.errname(e)}")
        else:
            self.sw_value += n.value

    def all_fds(self) -> list[int]:
        with self.lock:
            fds = [s.fd for s in self.slots] + self.dmabufs + self.sync_files + self.syncobj_fds
        return fds + self.eventfds + ([self.sw] if self.sw >= 0 else [])

    def violation(self, text: str) -> None:
        with self.lock:
            self.violations.append(f"seed {self.seed}: {text}")
            if len(self.violations) >= MAX_VIOLATIONS:
                self.stop.set()

    def close(self) -> int:
        """Close and unmap everything; the number of fds left to us by failed
        copy-outs (the kernel had installed them), closed too."""
        with self.ring_lock:
            if self.helper is not None:
                self.stop_helper()
        for m in self.maps:
            su.libc.munmap(m.addr, m.length)
        self.maps = []
        for fd in [s.fd for s in self.slots] + self.dmabufs + self.sync_files + self.syncobj_fds:
            os.close(fd)
        with self.sw_lock:
            self.sw_signal_all()
        for fd in self.eventfds + ([self.sw] if self.sw >= 0 else []):
            os.close(fd)
        self.dmabufs, self.sync_files, self.syncobj_fds = [], [], []
        leaked = 0
        for fd in _open_fds() - self.fds_before:
            try:
                target = os.readlink(f"/proc/self/fd/{fd}")
            except OSError:
                continue
            # dma-bufs ("/dmabuf:"), sync_files, syncobj fds, the device, sw_sync.
            kinds = ("dmabuf", "anon_inode:sync_file", "anon_inode:syncobj", "/dev/accel/")
            if any(k in target for k in kinds) or target == SW_SYNC:
                os.close(fd)
                leaked += 1
        return leaked


def _open_fds() -> set[int]:
    return {int(n) for n in os.listdir("/proc/self/fd")}


# --------------------------------------------------------------------------
# A worker: one thread's generator and caller
# --------------------------------------------------------------------------


class Worker:
    def __init__(self, fz: Shared, index: int) -> None:
        self.fz = fz
        self.index = index
        self.rng = random.Random(f"{fz.seed}/{index}")
        self.child = False
        self.calls = 0
        self.by_cmd: Counter[str] = Counter()
        self.by_errno: Counter[str] = Counter()
        self.ok: Counter[str] = Counter()
        self.busy: Counter[str] = Counter()  # seconds in the ioctl, by command
        self.spent: Counter[str] = Counter()  # seconds of each action, all told
        self.max_wait_ns = 200 * 10**6  # syncobj waits; children: shorter
        self.bo_items: list[tuple[int, tuple[int, bool, int]]] = []
        self.base = su.anon_map(SCRATCH_PAGES * PAGE)
        self.ops_addr = self.base
        self.last_ops = {False: 0, True: 0}  # ops in the last array made, per format
        self.arg_addr = self.base + 30 * PAGE
        self.aux = self.base + 31 * PAGE
        self.ro_page = self.base + 32 * PAGE
        self.hole = self.base + 33 * PAGE
        self.user = self.base + 34 * PAGE
        self.user_ro = self.base + 50 * PAGE
        ctypes.memset(self.user, 0x11, 16 * PAGE)
        assert su.libc.munmap(self.hole, PAGE) == 0
        assert su.libc.mprotect(self.user_ro, 4 * PAGE, mmap.PROT_READ) == 0
        assert su.libc.mprotect(self.ro_page, PAGE, mmap.PROT_READ) == 0
        # What a forked child reports back: stage, calls, then violations.
        self.result = mmap.mmap(-1, PAGE, mmap.MAP_SHARED | mmap.MAP_ANONYMOUS)

    def close(self) -> None:
        su.libc.munmap(self.base, SCRATCH_PAGES * PAGE)
        self.result.close()

    # -- values ------------------------------------------------------------

    def val(self, bits: int) -> int:
        """A boundary value (1/2), random bits (1/4) or a small number (1/4)."""
        r = self.rng.random()
        if r < 0.5:
            return BOUNDARY[int(r * NB2)] & ((1 << bits) - 1)
        if r < 0.75:
            return self.rng.getrandbits(bits)
        return int((r - 0.75) * 256) & ((1 << bits) - 1)

    def maybe(self, p: float, bits: int, default: int = 0) -> int:
        return self.val(bits) if self.rng.random() < p else default

    def other(self, slot: Slot) -> Slot:
        return self.rng.choice([s for s in self.fz.slots if s is not slot])

    def handle(self, slot: Slot, p_live: float = 0.8) -> int:
        """A BO handle: the slot's own, stale (destroyed), another file's, or any value."""
        with self.fz.lock:
            pools = (list(slot.bos), list(slot.stale_bos), list(self.other(slot).bos))
        return self.from_pools(*pools, p_live, 0.08)

    def sync_handle(self, slot: Slot, p_live: float = 0.8) -> int:
        """A syncobj handle: the slot's own, stale, another file's, or any value."""
        with self.fz.lock:
            pools = (
                list(slot.syncobjs),
                list(slot.stale_syncobjs),
                list(self.other(slot).syncobjs),
            )
        return self.from_pools(*pools, p_live, 0.07)

    def from_pools(
        self, live: list[int], stale: list[int], foreign: list[int], p_live: float, step: float
    ) -> int:
        """An id: live with ``p_live``, then stale and foreign ``step`` each, else any value."""
        r = self.rng.random()
        for pool, limit in ((live, p_live), (stale, p_live + step), (foreign, p_live + 2 * step)):
            if pool and r < limit:
                return self.rng.choice(pool)
        return self.val(32)

    def sync_point(self, slot: Slot, handle: int) -> int:
        """A point of a syncobj: 0 (binary), one it has, one past it, or any value."""
        rng = self.rng
        with self.fz.lock:
            known = slot.syncobjs.get(handle, -1)
        r = rng.random()
        if known <= 0 or r < 0.45:
            return 0 if r < 0.95 else self.val(64)
        if r < 0.9:
            return rng.randint(1, known)
        return known + 1 if r < 0.95 else self.val(64)

    def next_point(self, slot: Slot, handle: int) -> int:
        """A point to signal or to attach a fence at: mostly the next ones."""
        rng = self.rng
        with self.fz.lock:
            known = max(slot.syncobjs.get(handle, 0), 0)
        r = rng.random()
        if r < 0.8:
            return known + rng.randint(1, 3)
        return max(known - 1, 0) if r < 0.9 else self.val(64)

    def deadline(self) -> int:
        """An absolute CLOCK_MONOTONIC timeout for DRM's syncobj waits, at
        most max_wait_ns ahead: past ones (poll), near ones and boundaries."""
        rng = self.rng
        r = rng.random()
        if r < 0.55:
            return _abi.deadline_after(rng.choice([0, 10**5, 10**6, 10**7]))
        if r < 0.65:
            return _abi.deadline_after(self.max_wait_ns)
        if r < 0.85:
            return rng.choice([0, 1, -1, -(1 << 63), 10**9, time.monotonic_ns() - 10**6])
        v = s64(self.val(64))
        if v > time.monotonic_ns() + self.max_wait_ns:
            v = _abi.deadline_after(rng.randrange(self.max_wait_ns))
        return v

    def pick(self, pool: list[int], p: float = 0.8) -> int:
        """An fd from a pool, else another kind of fd, a closed one or any value."""
        rng = self.rng
        with self.fz.lock:
            fds = list(pool)
            others = [
                *self.fz.dmabufs,
                *self.fz.sync_files,
                *self.fz.syncobj_fds,
                rng.choice(self.fz.slots).fd,
            ]
        if fds and rng.random() < p:
            return rng.choice(fds)
        r = rng.random()
        if r < 0.5 and others:
            return rng.choice(others)
        if r < 0.6:
            return rng.choice(self.fz.eventfds)
        return rng.choice([-1, 0, 1 << 20, 999, self.val(32)])

    def pool_add(self, pool: list[int], fd: int, cap: int = 16) -> None:
        gone = -1
        with self.fz.lock:
            pool.append(fd)
            if len(pool) > cap:
                gone = pool.pop(self.rng.randrange(len(pool)))
        if gone >= 0:
            os.close(gone)

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
        """Copy the argument to `ptr` when that is scratch memory of ours."""
        n = ctypes.sizeof(arg)
        if ptr == self.arg_addr:
            ctypes.memmove(ptr, ctypes.addressof(arg), n)
        elif ptr in (self.ro_page, self.hole - n // 2):
            su.libc.mprotect(self.ro_page, PAGE, mmap.PROT_READ | mmap.PROT_WRITE)
            ctypes.memmove(ptr, ctypes.addressof(arg), min(n, self.hole - ptr))
            su.libc.mprotect(self.ro_page, PAGE, mmap.PROT_READ)

    def read_back(self, arg: ctypes.Structure, ptr: int) -> bool:
        if ptr != self.arg_addr:
            return False
        ctypes.memmove(ctypes.addressof(arg), ptr, ctypes.sizeof(arg))
        return True

    def where(self) -> str:
        who = f"thread {self.index}" + (" (forked child)" if self.child else "")
        return f"{who} call {self.calls}"

    def note(self, cmd: str, e: int, what: str, allowed: set[int] | None = None) -> None:
        name = su.errname(e) if e else "OK"
        self.by_errno[name] += 1
        if not e:
            self.ok[cmd] += 1
        if allowed is None:
            allowed = {E.ENOTTY, E.EINVAL} if cmd == "BAD_NR" else ALLOWED[cmd] | ANY
        if e and e not in allowed:
            self.fz.violation(
                f"{self.where()} {cmd} {what}: {name} not in "
                f"{sorted(su.errname(x) for x in allowed)}"
            )

    def call(self, cmd: str, fd: int, request: int, ptr: int, what: str = "") -> int:
        self.calls += 1
        self.by_cmd[cmd] += 1
        t0 = time.perf_counter()
        e = su.raw_ioctl(fd, request, ptr)
        self.busy[cmd] += time.perf_counter() - t0
        self.note(cmd, e, f"fd={fd} request={request:#x} ptr={ptr:#x} {what}")
        return e

    def arg_call(
        self, cmd: str, fd: int, request: int, arg: ctypes.Structure, p_bad: float, what: str
    ) -> tuple[int, bool]:
        """Put arg at a (mostly good) pointer and call; (errno, read back)."""
        p = self.ptr(self.arg_addr, ctypes.sizeof(arg), p_bad)
        self.put_arg(arg, p)
        e = self.call(cmd, fd, request, p, what)
        return e, e == 0 and self.read_back(arg, p)

    # -- BOs -----------------------------------------------------------------

    def get_info(self, slot: Slot) -> None:
        p = self.ptr(self.arg_addr, 72)
        if self.call("GET_INFO", slot.fd, _abi.DRM_IOCTL_NPU_GET_INFO, p) == 0 and (
            p == self.arg_addr
        ):
            info = _abi.NpuInfo.from_address(p)
            if list(info.rsvd) != [0] * len(info.rsvd) or info.max_bo_size != 1 << 30:
                self.fz.violation(f"{self.where()}: GET_INFO returned {list(info.rsvd)}")

    def record_bo(self, slot: Slot, handle: int, entry: tuple[int, bool, int]) -> None:
        """Caller holds slot.bo_lock."""
        with self.fz.lock:
            slot.bos[handle] = entry
            slot.epoch += 1

    def forget_bo(self, slot: Slot, handle: int) -> None:
        """Caller holds slot.bo_lock."""
        with self.fz.lock:
            if slot.bos.pop(handle, None) is not None:
                slot.stale_bos = [*slot.stale_bos[-15:], handle]
            slot.epoch += 1

    def bo_create(self, slot: Slot) -> None:
        rng = self.rng
        size = rng.randrange(1, 64 * 1024) if rng.random() < 0.6 else self.val(64)
        flags = _abi.NPU_BO_DEVICE if rng.random() < 0.1 else self.maybe(0.05, 32)
        arg = _abi.NpuBoCreate(size=size, flags=flags, handle=self.maybe(0.02, 32))
        with slot.bo_lock:
            _, back = self.arg_call(
                "BO_CREATE", slot.fd, _abi.DRM_IOCTL_NPU_BO_CREATE, arg, 0.08, f"size={size}"
            )
            if back:
                entry = (int(arg.alloc_size), False, int(arg.mmap_offset))
                self.record_bo(slot, int(arg.handle), entry)
        if len(slot.bos) > 40 and not self.child:
            self.destroy(slot, self.handle(slot, 1.0))

    def destroy(self, slot: Slot, handle: int, rsvd: int = 0) -> None:
        arg = _abi.NpuBoDestroy(handle=handle, rsvd=rsvd)
        with slot.bo_lock:
            e, _ = self.arg_call(
                "BO_DESTROY", slot.fd, _abi.DRM_IOCTL_NPU_BO_DESTROY, arg, 0.03, f"handle={handle}"
            )
            if e == 0:
                self.forget_bo(slot, handle)

    def bo_destroy(self, slot: Slot) -> None:
        self.destroy(slot, self.handle(slot, 0.7), self.maybe(0.05, 32))

    def gem_close(self, slot: Slot) -> None:
        handle = self.handle(slot, 0.7)
        arg = _abi.DrmGemClose(handle=handle, pad=self.maybe(0.05, 32))
        with slot.bo_lock:
            e, _ = self.arg_call(
                "GEM_CLOSE", slot.fd, _abi.DRM_IOCTL_GEM_CLOSE, arg, 0.03, f"handle={handle}"
            )
            if e == 0:
                self.forget_bo(slot, handle)

    def bo_userptr(self, slot: Slot) -> None:
        rng = self.rng
        r = rng.random()
        size = rng.randrange(1, 17) * PAGE if rng.random() < 0.6 else self.val(64)
        flags = rng.choice([0, 0, 1]) if rng.random() < 0.9 else self.val(32)
        with slot.bo_lock:
            # A device mapping as the memory: held under the lock, so that no
            # other thread unmaps it (and the range is reused for our heap,
            # which the device could then write) before the pin.
            with self.fz.lock if r < 0.1 else _nolock():
                areas = [(self.user, 16 * PAGE)]
                if r < 0.1 and self.fz.maps:
                    addr = rng.choice(self.fz.maps).addr
                    areas += [(m.addr, m.length) for m in self.fz.maps]
                elif r < 0.5:
                    addr = self.user + rng.randrange(16) * PAGE
                elif r < 0.6:
                    addr = self.user_ro + rng.randrange(4) * PAGE
                elif r < 0.8:
                    addr = rng.choice([self.hole, self.ro_page, 0, *KERNEL_PTRS])
                else:
                    addr = self.val(64)
                if not any(a <= addr and addr + size <= a + n for a, n in areas):
                    # Any other range may hold this process's own live memory
                    # (a boundary value like 16 MiB can land in the brk heap, a
                    # range can run past a mapping): the device must not write
                    # there, or the fuzzer corrupts itself.
                    flags |= _abi.NPU_BO_USERPTR_READONLY
                arg = _abi.NpuBoUserptr(
                    addr=addr, size=size, flags=flags, handle=self.maybe(0.05, 32)
                )
                what = f"addr={addr:#x} size={size:#x} flags={flags:#x}"
                _, back = self.arg_call(
                    "BO_USERPTR", slot.fd, _abi.DRM_IOCTL_NPU_BO_USERPTR, arg, 0.08, what
                )
            if back:
                self.record_bo(slot, int(arg.handle), (size, True, 0))  # no mmap

    def bo_info(self, slot: Slot) -> None:
        handle = self.handle(slot, 0.8)
        with self.fz.lock:
            epoch, known = slot.epoch, slot.bos.get(handle)
        arg = _abi.NpuBoInfo(handle=handle, flags=self.maybe(0.05, 32), va=self.maybe(0.03, 64))
        _, back = self.arg_call(
            "BO_INFO", slot.fd, _abi.DRM_IOCTL_NPU_BO_INFO, arg, 0.03, f"handle={handle}"
        )
        if back and known is not None and not self.child:
            with self.fz.lock:
                same = slot.epoch == epoch
            userptr = int(arg.flags) & _abi.NPU_BO_INFO_USERPTR
            if same and int(arg.size) != known[0] and not userptr:
                self.fz.violation(
                    f"{self.where()}: BO_INFO handle {handle} size {arg.size} != {known[0]}"
                )

    def prime_export(self, slot: Slot) -> None:
        handle = self.handle(slot, 0.85)
        flags = _abi.DRM_CLOEXEC | _abi.DRM_RDWR if self.rng.random() < 0.9 else self.val(32)
        arg = _abi.DrmPrimeHandle(handle=handle, flags=flags, fd=self.maybe(0.05, 32))
        what = f"handle={handle} flags={flags:#x}"
        _, back = self.arg_call(
            "PRIME_EXPORT", slot.fd, _abi.DRM_IOCTL_PRIME_HANDLE_TO_FD, arg, 0.03, what
        )
        if back:
            self.pool_add(self.fz.dmabufs, int(arg.fd))

    def prime_import(self, slot: Slot) -> None:
        dmabuf = self.pick(self.fz.dmabufs, 0.8)
        arg = _abi.DrmPrimeHandle(fd=dmabuf, flags=self.maybe(0.05, 32))
        with slot.bo_lock:
            _, back = self.arg_call(
                "PRIME_IMPORT", slot.fd, _abi.DRM_IOCTL_PRIME_FD_TO_HANDLE, arg, 0.03,
                f"fd={dmabuf}",
            )  # fmt: skip
            if back:
                info = _abi.NpuBoInfo(handle=arg.handle)
                e = su.raw_ioctl(slot.fd, _abi.DRM_IOCTL_NPU_BO_INFO, ctypes.addressof(info))
                if e == 0:
                    self.record_bo(slot, int(arg.handle), (int(info.size), False, info.mmap_offset))
                elif not self.child:
                    self.fz.violation(
                        f"{self.where()}: BO_INFO of handle {arg.handle}, just imported from "
                        f"fd {dmabuf}: {su.errname(e)}"
                    )

    # -- ops -------------------------------------------------------------------

    def sized(self, slot: Slot) -> tuple[int, int]:
        """A live handle of the slot and its size (or a bogus one), from the
        BOs the slot had when the SUBMIT being made started."""
        items = self.bo_items
        if not items:
            return self.val(32), 4096
        h, entry = items[int(self.rng.random() * len(items))]
        return h, entry[0]

    def valid_v1(self, slot: Slot) -> _abi.NpuOp:
        rng = self.rng
        op = _abi.NpuOp()
        kind = rng.choice(["nop", "copy", "copy", "fill", "fill", "gemm", "gemm", "extreme"])
        if kind == "nop":
            return op
        if kind == "extreme":
            return self.extreme_v1(slot)
        if kind == "fill":
            h, s = self.sized(slot)
            off = rng.randrange(0, max(s // 4, 1)) * 4
            n = rng.randrange(1, max((s - off) // 4, 1) + 1) * 4
            op.opcode, op.num_bufs = _abi.NPU_OP_FILL, 1
            op.bufs[0] = _abi.NpuBufRef(handle=h, offset=off, size=n)
            op.params[0] = rng.getrandbits(32)
            return op
        if kind == "copy":
            (h1, s1), (h2, s2) = self.sized(slot), self.sized(slot)
            n = rng.randrange(1, max(2, min(s1, s2) // 2))
            o1, o2 = rng.randrange(0, max(s1 - n, 0) + 1), rng.randrange(0, max(s2 - n, 0) + 1)
            if h1 == h2 and rng.random() < 0.7:  # usually not overlapping
                o1, o2 = 0, min(n, s1 - n)
            op.opcode, op.num_bufs = _abi.NPU_OP_COPY, 2
            op.bufs[0] = _abi.NpuBufRef(handle=h1, offset=o1, size=n)
            op.bufs[1] = _abi.NpuBufRef(handle=h2, offset=o2, size=n)
            return op
        # GEMM that fits: dims so that each matrix fits its buffer.
        (ha, sa), (hb, sb), (hc, sc) = self.sized(slot), self.sized(slot), self.sized(slot)
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

    def extreme_v1(self, slot: Slot) -> _abi.NpuOp:
        """Valid ops at the edges: whole-BO copies and fills, GEMMs with
        one long dimension, the largest row stride, adjacent ranges."""
        rng = self.rng
        op = _abi.NpuOp()
        (h1, s1), (h2, s2) = self.sized(slot), self.sized(slot)
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
            elif rng.random() < 0.5:
                op.rsvd = self.val(64)
            else:
                op.bufs[i].rsvd = self.val(32)

    def random_struct(self, struct: type[ctypes.Structure]) -> ctypes.Structure:
        return struct.from_buffer_copy(self.rng.randbytes(ctypes.sizeof(struct)))

    def tref(self, slot: Slot, dtype: int, shape: list[int], bcast: bool = False) -> object:
        h, s = self.sized(slot)
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

    def valid_tensor(self, slot: Slot) -> _abi.NpuTensorOp:
        rng = self.rng
        op = _abi.NpuTensorOp()
        rows, cols = rng.choice([(1, 1), (1, 64), (4, 16), (16, 16), (3, 1000), (64, 256)])
        shape = [rows, cols] if rng.random() < 0.7 else [rows * cols]
        kind = rng.randrange(3)
        if kind == 0:
            op.opcode, op.kind = _abi.NPU_OP_ELTWISE, rng.randrange(6)
            op.t[0] = self.tref(slot, 0, shape, bcast=True)
            op.t[1] = self.tref(slot, 0, shape, bcast=True)
            op.t[2] = self.tref(slot, 0, shape)
        elif kind == 1:
            op.opcode, op.kind = _abi.NPU_OP_UNARY, rng.randrange(9)
            op.t[0] = self.tref(slot, 0, shape, bcast=True)
            op.t[1] = self.tref(slot, 0, shape)
        else:
            op.opcode = _abi.NPU_OP_CONVERT
            op.t[0] = self.tref(slot, rng.randrange(5), shape, bcast=True)
            op.t[1] = self.tref(slot, rng.randrange(5), shape)
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

    # -- SUBMIT and its dependencies -------------------------------------------

    def user_queue(self, slot: Slot) -> tuple[int, int] | None:
        """(index, NOPs rung) of one of the slot's user queues, or None."""
        with self.fz.lock:
            queues = [(q.index, q.tail) for q in slot.queues.values()]
        return self.rng.choice(queues) if queues else None

    def dependency(self, slot: Slot) -> _abi.NpuSync:
        rng = self.rng
        r = rng.random()
        if r < 0.6:  # a syncobj point (binary: point 0)
            h = self.sync_handle(slot)
            flags = 0 if rng.random() < 0.97 else self.val(32)
            return _abi.NpuSync(handle=h, flags=flags, point=self.sync_point(slot, h))
        if r < 0.93:  # a fence value of a user queue
            q = self.user_queue(slot)
            if q is not None and rng.random() < 0.85:
                index, rung = q
                # Values rung are met once the NOPs ran; a value never pushed
                # is a hang (hang_timeout_ms), so only now and then.
                r2 = rng.random()
                point = rng.randint(0, rung) if r2 < 0.98 else rung + rng.randint(1, 3)
            else:
                index = rng.choice([0, 1, 2, 5, 7, 8, 64]) if rng.random() < 0.8 else self.val(32)
                point = rng.randrange(4) if rng.random() < 0.9 else self.val(64)
            return _abi.NpuSync(handle=index, flags=_abi.NPU_SYNC_USER_QUEUE, point=point)
        return _abi.NpuSync(handle=self.val(32), flags=self.val(32), point=self.val(64))

    def dependencies(self, slot: Slot) -> tuple[int, int, str]:
        """(in_syncs, num_in_syncs, description)."""
        rng = self.rng
        r = rng.random()
        if r < 0.55:
            return (0 if rng.random() < 0.97 else self.val(64)), 0, ""
        if r < 0.9:
            n = rng.randint(1, 3)
        elif r < 0.98:
            n = rng.randint(4, _abi.NPU_SUBMIT_MAX_SYNCS)
        else:
            n = rng.choice([_abi.NPU_SUBMIT_MAX_SYNCS + 1, 255, self.val(32)])
        base = self.aux + AUX_SYNCS
        deps = []
        for i in range(min(n, AUX_SYNCS_MAX)):
            dep = self.dependency(slot) if i < 17 else self.random_struct(_abi.NpuSync)
            ctypes.memmove(base + i * 16, ctypes.addressof(dep), 16)
            if i < 4:
                deps.append(f"({dep.handle},{dep.flags:#x},{dep.point})")
        p = self.ptr(base, 16 * min(n, AUX_SYNCS_MAX), 0.04)
        return p, n, f" in_syncs={p:#x}x{n} [{' '.join(deps)}]"

    def out_sync(self, slot: Slot) -> tuple[int, int]:
        rng = self.rng
        if rng.random() < 0.55:
            return 0, (0 if rng.random() < 0.97 else self.val(64))
        h = self.sync_handle(slot, 0.9)
        return h, (0 if rng.random() < 0.5 else self.next_point(slot, h))

    def submit(self, slot: Slot, tensor: bool) -> None:
        rng = self.rng
        with self.fz.lock:
            self.bo_items = list(slot.bos.items())
        struct = _abi.NpuTensorOp if tensor else _abi.NpuOp
        size = ctypes.sizeof(struct)
        ops_addr = self.ops_addr + (OPS_T_PAGE * PAGE if tensor else 0)
        if self.last_ops[tensor] and rng.random() < 0.6:
            # The previous array of this format again (making ops is most of
            # a SUBMIT's cost under TCG): its handles may be stale by now, or
            # another file's.
            n = self.last_ops[tensor]
        else:
            n = rng.choice([1, 1, 1, 2, 3, 4, 8]) if rng.random() < 0.9 else rng.choice([16, 256])
            # At most 8 ops are made; longer arrays repeat them (the driver
            # checks each op all the same).
            distinct = min(n, 8)
            for i in range(distinct):
                r = rng.random()
                if r < 0.55:
                    op = self.valid_tensor(slot) if tensor else self.valid_v1(slot)
                elif r < 0.9:
                    op = self.valid_tensor(slot) if tensor else self.valid_v1(slot)
                    (self.mutate_tensor if tensor else self.mutate_v1)(op)
                else:
                    op = self.random_struct(struct)
                ctypes.memmove(ops_addr + i * size, ctypes.addressof(op), size)
            done = distinct
            while done < n:
                chunk = min(done, n - done)
                ctypes.memmove(ops_addr + done * size, ops_addr, chunk * size)
                done += chunk
            self.last_ops[tensor] = n
        num_ops = n if rng.random() < 0.95 else self.val(32)
        op_size = size if rng.random() < 0.95 else self.val(32)
        if rng.random() < 0.05:  # the op array ends in the hole
            ops_ptr = self.hole - rng.randrange(1, 3) * size  # on the read-only page
        else:
            ops_ptr = self.ptr(ops_addr, size * n, 0.04)
        in_syncs, num_in_syncs, deps = self.dependencies(slot)
        out, out_point = self.out_sync(slot)
        arg = _abi.NpuSubmit(
            ops_ptr=ops_ptr,
            num_ops=num_ops,
            queue=self.maybe(0.04, 32),
            flags=self.maybe(0.04, 32),
            op_size=op_size,
            in_syncs=in_syncs,
            num_in_syncs=num_in_syncs,
            out_syncobj=out,
            out_point=out_point,
        )
        # Now and then the 32-byte struct of driver 1.0 (no dependencies).
        request = _abi.DRM_IOCTL_NPU_SUBMIT if rng.random() < 0.95 else DRM_IOCTL_NPU_SUBMIT_V10
        p = self.ptr(self.arg_addr, 56, 0.04)
        self.put_arg(arg, p)
        what = (
            f"num_ops={num_ops} op_size={op_size} ops_ptr={ops_ptr:#x}{deps} "
            f"out_syncobj={out} out_point={out_point}"
        )
        gen = slot.gen
        cmd = "SUBMIT_T" if tensor else "SUBMIT"
        if self.call(cmd, slot.fd, request, p, what) == 0 and self.read_back(arg, p):
            with self.fz.lock:
                if slot.gen == gen:
                    slot.last_fence = max(slot.last_fence, int(arg.fence))
                    if out in slot.syncobjs and request == _abi.DRM_IOCTL_NPU_SUBMIT:
                        slot.syncobjs[out] = max(slot.syncobjs[out], out_point)

    def wait(self, slot: Slot) -> None:
        rng = self.rng
        last = slot.last_fence
        r = rng.random()
        if r < 0.6:
            fence = last
        elif r < 0.8:
            fence = rng.randrange(0, last + 1)
        else:
            fence = self.val(64)
        timeout = rng.choice([0, 1000, 10**6, 10**9, 60 * 10**9, U64]) if r < 0.9 else self.val(64)
        if self.child:
            timeout = min(timeout, 10**8)
        arg = _abi.NpuWait(
            fence=fence,
            deadline_ns=_abi.deadline_after(timeout),
            queue=self.maybe(0.04, 32),
            flags=self.maybe(0.04, 32),
            rsvd=self.maybe(0.04, 32),
            status=self.maybe(0.1, 32),
            error_fence=self.maybe(0.1, 64),
        )
        q = self.user_queue(slot)
        if q is not None and rng.random() < 0.1:
            arg.queue, arg.fence = q[0], rng.randint(0, q[1] + 1)
        if arg.queue:
            # A user queue's fences are the process's own: nothing tells the
            # driver that a fence will never come, so a long timeout would
            # just sleep. Keep those waits short.
            arg.deadline_ns = min(arg.deadline_ns, _abi.deadline_after(10**6))
        what = f"queue={arg.queue} fence={arg.fence} timeout={timeout}"
        self.arg_call("WAIT", slot.fd, _abi.DRM_IOCTL_NPU_WAIT, arg, 0.04, what)

    def fence_info(self, slot: Slot) -> None:
        rng = self.rng
        last = slot.last_fence
        r = rng.random()
        fence = last if r < 0.5 else rng.randrange(0, last + 1) if r < 0.8 else self.val(64)
        arg = _abi.NpuFenceInfo(
            fence=fence,
            queue=self.maybe(0.05, 32),
            status=self.maybe(0.2, 32),
            t_start=self.maybe(0.2, 64),
            t_end=self.maybe(0.2, 64),
        )
        _, back = self.arg_call(
            "FENCE_INFO", slot.fd, _abi.DRM_IOCTL_NPU_FENCE_INFO, arg, 0.04, f"fence={fence}"
        )
        if back and arg.status >= _abi.NPU_ST_COUNT:
            self.fz.violation(f"{self.where()}: FENCE_INFO fence {fence} status {arg.status}")

    # -- user queues -------------------------------------------------------------

    def queue_create(self, slot: Slot) -> None:
        rng = self.rng
        arg = _abi.NpuQueueCreate(
            entries=rng.choice([0, 1, 8, 16, 16, 17, 64, 4096, 8192]) if rng.random() < 0.9
            else self.val(32),
            priority=rng.choice([0, 0, 1, 2, 3, 4]) if rng.random() < 0.9 else self.val(32),
            flags=self.maybe(0.05, 32),
            queue=self.maybe(0.05, 32),
            mem_offset=self.maybe(0.03, 64),
        )  # fmt: skip
        gen = slot.gen
        _, back = self.arg_call(
            "QUEUE_CREATE", slot.fd, _abi.DRM_IOCTL_NPU_QUEUE_CREATE, arg, 0.04,
            f"entries={arg.entries} priority={arg.priority}",
        )  # fmt: skip
        if not back or self.child:
            return
        q = UQueue(
            index=int(arg.queue),
            entries=int(arg.entries),
            mem_size=int(arg.mem_size),
            fence_offset=int(arg.fence_offset),
            doorbell_offset=int(arg.doorbell_offset),
        )
        # Its memory, to push NOPs into and read the fence record from.
        self.calls += 1
        self.by_cmd["MMAP"] += 1
        addr = su.libc.mmap(None, q.mem_size, su.RW, mmap.MAP_SHARED, slot.fd, int(arg.mem_offset))
        if addr in (None, su.MAP_FAILED):
            # Destroyed by another thread meanwhile: EINVAL.
            self.note("MMAP", ctypes.get_errno(), f"queue {q.index} memory")
            addr = 0
        else:
            self.note("MMAP", 0, "")
        with self.fz.lock:
            if addr:
                q.mem = int(addr)
                self.fz.maps.append(Mapping(q.mem, q.mem_size, q))
            if slot.gen == gen:
                slot.queues[q.index] = q

    def queue_destroy(self, slot: Slot) -> None:
        rng = self.rng
        q = self.user_queue(slot)
        if q is not None and rng.random() < 0.5:
            queue = q[0]
        else:
            queue = rng.randrange(9) if rng.random() < 0.9 else self.val(32)
        arg = _abi.NpuQueueDestroy(queue=queue, rsvd=self.maybe(0.05, 32))
        gen = slot.gen
        e, _ = self.arg_call(
            "QUEUE_DESTROY", slot.fd, _abi.DRM_IOCTL_NPU_QUEUE_DESTROY, arg, 0.04, f"queue={queue}"
        )
        if e == 0:
            with self.fz.lock:
                if slot.gen == gen:
                    slot.queues.pop(queue, None)

    def queue_push(self, slot: Slot) -> None:
        """Write NOPs into a user queue's ring and ring its doorbell (through
        the ring helper: a doorbell the driver zapped raises SIGBUS)."""
        rng = self.rng
        with self.fz.lock:
            cands = [q for q in slot.queues.values() if q.mem and not q.busy]
            if not cands:
                return
            q = rng.choice(cands)
            done = ctypes.c_uint64.from_address(q.mem + q.fence_offset).value
            room = q.entries - (q.tail - done)
            if room <= 0 or q.tail - done > q.entries:
                return
            k = rng.randint(1, min(8, room))
            for i in range(k):
                c = _abi.NpuCmd(opcode=_abi.NPU_OP_NOP, fence=q.tail + i + 1)
                c.flags = _abi.NPU_CMD_F_IRQ if rng.random() < 0.5 else 0
                slot_addr = q.mem + ((q.tail + i) % q.entries) * ctypes.sizeof(_abi.NpuCmd)
                ctypes.memmove(slot_addr, ctypes.addressof(c), ctypes.sizeof(c))
            q.busy = True
            tail = q.tail + k
        self.calls += 1
        self.by_cmd["QUEUE_PUSH"] += 1
        outcome = "gone"
        try:
            outcome = self.fz.ring(slot.fd, q.doorbell_offset, tail)
        finally:
            with self.fz.lock:
                q.busy = False
                if outcome == "rang":
                    q.tail = max(q.tail, tail)
        self.by_errno["OK" if outcome == "rang" else outcome] += 1
        if outcome == "rang":
            self.ok["QUEUE_PUSH"] += 1

    # -- syncobjs ------------------------------------------------------------

    def syncobj_array(self, slot: Slot, n: int, points: bool = False) -> tuple[int, int, str]:
        """(handles pointer, points pointer, description) of n handles (and points)."""
        hs, ps = [], []
        for _ in range(min(n, 8)):
            h = self.sync_handle(slot, 0.85)
            hs.append(h)
            if points:
                ps.append(self.sync_point(slot, h))
        if hs:
            (ctypes.c_uint32 * len(hs)).from_address(self.aux + AUX_HANDLES)[:] = hs
        if ps:
            (ctypes.c_uint64 * len(ps)).from_address(self.aux + AUX_POINTS)[:] = ps
        if n > 8:  # the rest: random handles and points
            more = min(n, AUX_HANDLES_MAX) - 8
            ctypes.memmove(self.aux + AUX_HANDLES + 32, self.rng.randbytes(4 * more), 4 * more)
            if points:
                more = min(n, AUX_POINTS_MAX) - 8
                ctypes.memmove(self.aux + AUX_POINTS + 64, self.rng.randbytes(8 * more), 8 * more)
        hp = self.ptr(self.aux + AUX_HANDLES, 4 * max(n, 1), 0.04)
        pp = self.ptr(self.aux + AUX_POINTS, 8 * max(n, 1), 0.04) if points else 0
        return hp, pp, f"handles={hs[:4]} points={ps[:4]}"

    def set_sync_state(self, slot: Slot, gen: int, handles: list[int], state: int) -> None:
        with self.fz.lock:
            if slot.gen == gen:
                for h in handles:
                    if h in slot.syncobjs:
                        slot.syncobjs[h] = state if state <= 0 else max(slot.syncobjs[h], state)

    def syncobj_create(self, slot: Slot) -> None:
        rng = self.rng
        flags = (
            rng.choice([0, _abi.DRM_SYNCOBJ_CREATE_SIGNALED])
            if rng.random() < 0.93
            else (self.val(32))
        )
        arg = _abi.DrmSyncobjCreate(handle=self.maybe(0.05, 32), flags=flags)
        gen = slot.gen
        _, back = self.arg_call(
            "SYNCOBJ_CREATE", slot.fd, _abi.DRM_IOCTL_SYNCOBJ_CREATE, arg, 0.03, f"flags={flags:#x}"
        )
        if back:
            with self.fz.lock:
                if slot.gen == gen:
                    slot.syncobjs[int(arg.handle)] = 0 if flags & 1 else -1
        if len(slot.syncobjs) > 32 and not self.child:
            self.syncobj_destroy(slot, self.sync_handle(slot, 1.0))

    def syncobj_destroy(self, slot: Slot, handle: int | None = None) -> None:
        if handle is None:
            handle = self.sync_handle(slot, 0.7)
        arg = _abi.DrmSyncobjDestroy(handle=handle, pad=self.maybe(0.05, 32))
        gen = slot.gen
        e, _ = self.arg_call(
            "SYNCOBJ_DESTROY", slot.fd, _abi.DRM_IOCTL_SYNCOBJ_DESTROY, arg, 0.03,
            f"handle={handle} pad={arg.pad}",
        )  # fmt: skip
        if e == 0:
            with self.fz.lock:
                if slot.gen == gen and slot.syncobjs.pop(handle, None) is not None:
                    slot.stale_syncobjs = [*slot.stale_syncobjs[-15:], handle]

    def syncobj_handle_to_fd(self, slot: Slot) -> None:
        rng = self.rng
        handle = self.sync_handle(slot, 0.85)
        flags = rng.choice([0, EXPORT_SYNC_FILE]) if rng.random() < 0.95 else self.val(32)
        arg = _abi.DrmSyncobjHandle(
            handle=handle, flags=flags, fd=rng.choice([-1, 0, 5]), pad=self.maybe(0.05, 32)
        )
        _, back = self.arg_call(
            "SYNCOBJ_HANDLE_TO_FD", slot.fd, _abi.DRM_IOCTL_SYNCOBJ_HANDLE_TO_FD, arg, 0.03,
            f"handle={handle} flags={flags:#x} pad={arg.pad}",
        )  # fmt: skip
        if back:
            pool = self.fz.sync_files if flags == EXPORT_SYNC_FILE else self.fz.syncobj_fds
            self.pool_add(pool, int(arg.fd))

    def syncobj_fd_to_handle(self, slot: Slot) -> None:
        rng = self.rng
        sync_file = rng.random() < 0.5
        flags = IMPORT_SYNC_FILE if sync_file else 0
        if rng.random() < 0.05:
            flags = self.val(32)
        if sync_file:
            fd, handle = self.pick(self.fz.sync_files, 0.8), self.sync_handle(slot, 0.85)
        else:
            fd, handle = self.pick(self.fz.syncobj_fds, 0.8), self.maybe(0.05, 32)
        arg = _abi.DrmSyncobjHandle(handle=handle, flags=flags, fd=fd, pad=self.maybe(0.05, 32))
        gen = slot.gen
        _, back = self.arg_call(
            "SYNCOBJ_FD_TO_HANDLE", slot.fd, _abi.DRM_IOCTL_SYNCOBJ_FD_TO_HANDLE, arg, 0.03,
            f"fd={fd} handle={handle} flags={flags:#x} pad={arg.pad}",
        )  # fmt: skip
        if back:
            with self.fz.lock:
                if slot.gen == gen:
                    if flags == IMPORT_SYNC_FILE:
                        if handle in slot.syncobjs:
                            slot.syncobjs[handle] = 0
                    else:
                        slot.syncobjs.setdefault(int(arg.handle), -1)

    def syncobj_wait(self, slot: Slot, timeline: bool) -> None:
        rng = self.rng
        n = rng.choice(COUNTS)
        hp, pp, hs = self.syncobj_array(slot, n, points=timeline)
        count = n if rng.random() < 0.97 else self.val(32) & 0xFFFF
        flags = rng.randrange(16 if timeline else 4) if rng.random() < 0.95 else self.val(32)
        if not timeline and rng.random() < 0.2:
            flags |= SYNCOBJ_WAIT_DEADLINE
        if flags & (SYNCOBJ_WAIT_FOR_SUBMIT | SYNCOBJ_WAIT_AVAILABLE) and rng.random() < 0.7:
            flags &= ~(SYNCOBJ_WAIT_FOR_SUBMIT | SYNCOBJ_WAIT_AVAILABLE)
        timeout = self.deadline()
        deadline = self.maybe(0.5, 64, _abi.deadline_after(10**6))
        if timeline:
            arg: ctypes.Structure = DrmSyncobjTimelineWait(
                handles=hp, points=pp, timeout_nsec=timeout, count_handles=count, flags=flags,
                first_signaled=self.maybe(0.1, 32), pad=self.maybe(0.05, 32),
                deadline_nsec=deadline,
            )  # fmt: skip
            cmd, request = "SYNCOBJ_TIMELINE_WAIT", DRM_IOCTL_SYNCOBJ_TIMELINE_WAIT
        else:
            arg = DrmSyncobjWait(
                handles=hp, timeout_nsec=timeout, count_handles=count, flags=flags,
                first_signaled=self.maybe(0.1, 32), pad=self.maybe(0.05, 32),
                deadline_nsec=deadline,
            )  # fmt: skip
            cmd, request = "SYNCOBJ_WAIT", DRM_IOCTL_SYNCOBJ_WAIT
        what = f"count={count} flags={flags:#x} timeout={timeout} {hs}"
        _, back = self.arg_call(cmd, slot.fd, request, arg, 0.03, what)
        if back and count and not flags & SYNCOBJ_WAIT_ALL and arg.first_signaled >= count:
            self.fz.violation(
                f"{self.where()} {cmd} {what}: first_signaled {arg.first_signaled} >= {count}"
            )

    def syncobj_array_call(self, slot: Slot, cmd: str) -> None:
        """RESET, SIGNAL (drm_syncobj_array) and QUERY, TIMELINE_SIGNAL
        (drm_syncobj_timeline_array)."""
        rng = self.rng
        n = rng.choice(COUNTS)
        count = n if rng.random() < 0.97 else self.val(32) & 0xFFFF
        gen = slot.gen
        if cmd in ("SYNCOBJ_RESET", "SYNCOBJ_SIGNAL"):
            hp, _, hs = self.syncobj_array(slot, n)
            arg: ctypes.Structure = DrmSyncobjArray(
                handles=hp, count_handles=count, pad=self.maybe(0.05, 32)
            )
            request = (
                DRM_IOCTL_SYNCOBJ_RESET if cmd == "SYNCOBJ_RESET" else DRM_IOCTL_SYNCOBJ_SIGNAL
            )
            what = f"count={count} pad={arg.pad} {hs}"
            state = -1 if cmd == "SYNCOBJ_RESET" else 0
        else:
            hp, pp, hs = self.syncobj_array(slot, n, points=cmd == "SYNCOBJ_QUERY")
            flags = rng.choice([0, SYNCOBJ_QUERY_LAST_SUBMITTED]) if cmd == "SYNCOBJ_QUERY" else 0
            if rng.random() < 0.05:
                flags = self.val(32)
            if cmd == "SYNCOBJ_TIMELINE_SIGNAL":
                handles = list((ctypes.c_uint32 * min(n, 8)).from_address(self.aux + AUX_HANDLES))
                pts = [self.next_point(slot, h) for h in handles]
                if pts:
                    (ctypes.c_uint64 * len(pts)).from_address(self.aux + AUX_POINTS)[:] = pts
                pp = self.ptr(self.aux + AUX_POINTS, 8 * max(n, 1), 0.04)
                hs += f" signal={pts[:4]}"
            arg = _abi.DrmSyncobjTimelineArray(
                handles=hp, points=pp, count_handles=count, flags=flags
            )
            request = {
                "SYNCOBJ_QUERY": _abi.DRM_IOCTL_SYNCOBJ_QUERY,
                "SYNCOBJ_TIMELINE_SIGNAL": _abi.DRM_IOCTL_SYNCOBJ_TIMELINE_SIGNAL,
            }[cmd]
            what = f"count={count} flags={flags:#x} {hs}"
            state = 1
        e, _ = self.arg_call(cmd, slot.fd, request, arg, 0.03, what)
        if e == 0 and hp == self.aux + AUX_HANDLES and cmd != "SYNCOBJ_QUERY":
            handles = list((ctypes.c_uint32 * min(n, 8)).from_address(self.aux + AUX_HANDLES))
            if state == 1:
                pts = list((ctypes.c_uint64 * min(n, 8)).from_address(self.aux + AUX_POINTS))
                for h, pt in zip(handles, pts, strict=True):
                    self.set_sync_state(slot, gen, [h], pt)
            else:
                self.set_sync_state(slot, gen, handles, state)

    def syncobj_transfer(self, slot: Slot) -> None:
        rng = self.rng
        src, dst = self.sync_handle(slot, 0.85), self.sync_handle(slot, 0.85)
        src_point = self.sync_point(slot, src)
        dst_point = 0 if rng.random() < 0.5 else self.next_point(slot, dst)
        # A flag DRM does not check; WAIT_FOR_SUBMIT on a point without a
        # fence sleeps up to 5 s (DRM_SYNCOBJ_WAIT_FOR_SUBMIT_TIMEOUT).
        flags = 0 if rng.random() < 0.995 else self.val(32)
        arg = DrmSyncobjTransfer(
            src_handle=src, dst_handle=dst, src_point=src_point, dst_point=dst_point,
            flags=flags, pad=self.maybe(0.04, 32),
        )  # fmt: skip
        gen = slot.gen
        what = f"src={src}:{src_point} dst={dst}:{dst_point} flags={flags:#x} pad={arg.pad}"
        e, _ = self.arg_call(
            "SYNCOBJ_TRANSFER", slot.fd, DRM_IOCTL_SYNCOBJ_TRANSFER, arg, 0.03, what
        )
        if e == 0:
            self.set_sync_state(slot, gen, [dst], dst_point)

    def syncobj_eventfd(self, slot: Slot) -> None:
        rng = self.rng
        handle = self.sync_handle(slot, 0.85)
        fd = rng.choice(self.fz.eventfds) if rng.random() < 0.8 else self.pick([], 0)
        flags = rng.choice([0, SYNCOBJ_WAIT_AVAILABLE]) if rng.random() < 0.95 else self.val(32)
        arg = DrmSyncobjEventfd(
            handle=handle, flags=flags, point=self.sync_point(slot, handle), fd=fd,
            pad=self.maybe(0.05, 32),
        )  # fmt: skip
        what = f"handle={handle} point={arg.point} fd={fd} flags={flags:#x} pad={arg.pad}"
        self.arg_call("SYNCOBJ_EVENTFD", slot.fd, DRM_IOCTL_SYNCOBJ_EVENTFD, arg, 0.03, what)

    # -- sw_sync and sync_files ----------------------------------------------

    def sw_fence(self, slot: Slot) -> None:
        """A sw_sync fence (a sync_file), mostly a few points ahead of the
        timeline (the signaller reaches it soon), now and then one far ahead
        (a dependency that never comes) or one already passed; most are
        imported into a syncobj of the slot."""
        rng = self.rng
        r = rng.random()
        with self.fz.sw_lock:
            cur = self.fz.sw_value
            value = cur + rng.randint(1, 3) if r < 0.95 else cur if r < 0.98 else cur + 100000
            self.fz.sw_max = max(self.fz.sw_max, value)
            arg = SwSyncCreateFence(value=value & U32, name=b"npu-fuzz", fence=-1)
            _, back = self.arg_call(
                "SW_FENCE", self.fz.sw, SW_SYNC_IOC_CREATE_FENCE, arg, 0.02, f"value={value}"
            )
        if not back:
            return
        fence = int(arg.fence)
        with self.fz.lock:
            live = list(slot.syncobjs)
        if live and rng.random() < 0.7:
            handle = rng.choice(live)
            imp = _abi.DrmSyncobjHandle(handle=handle, flags=IMPORT_SYNC_FILE, fd=fence)
            gen = slot.gen
            e, _ = self.arg_call(
                "SYNCOBJ_FD_TO_HANDLE", slot.fd, _abi.DRM_IOCTL_SYNCOBJ_FD_TO_HANDLE, imp, 0.0,
                f"sw_sync fence {value} fd={fence} into handle={handle}",
            )  # fmt: skip
            if e == 0:
                self.set_sync_state(slot, gen, [handle], 0)
        self.pool_add(self.fz.sync_files, fence)

    def sw_inc(self, slot: Slot) -> None:
        by = self.rng.choice([1, 1, 2, 3])
        with self.fz.sw_lock:
            n = ctypes.c_uint32(by)
            if self.call("SW_INC", self.fz.sw, SW_SYNC_IOC_INC, ctypes.addressof(n)) == 0:
                self.fz.sw_value += by

    def sw_reopen(self, slot: Slot) -> None:
        """Signal the timeline to its last point and close it for a new one."""
        new = os.open(SW_SYNC, os.O_RDWR)
        with self.fz.sw_lock:
            self.fz.sw_signal_all()
            os.dup2(new, self.fz.sw)
            self.fz.sw_value = self.fz.sw_max = 0
        os.close(new)
        self.calls += 1
        self.by_cmd["SW_REOPEN"] += 1

    def sync_file_info(self, slot: Slot) -> None:
        rng = self.rng
        fd = self.pick(self.fz.sync_files, 0.8)
        n = rng.choice([0, 0, 0, 1, 2, 8, 40]) if rng.random() < 0.95 else self.val(32)
        arrays = self.arg_addr + 1024
        arg = SyncFileInfo(
            flags=self.maybe(0.05, 32),
            pad=self.maybe(0.05, 32),
            num_fences=n,
            sync_fence_info=self.ptr(arrays, SYNC_FENCE_INFO_SIZE * n, 0.05) if n else 0,
        )
        what = f"fd={fd} num_fences={n} flags={arg.flags:#x} pad={arg.pad}"
        _, back = self.arg_call("SYNC_FILE_INFO", fd, SYNC_IOC_FILE_INFO, arg, 0.03, what)
        if back and arg.status not in (0, 1) and not -4095 <= arg.status < 0:
            self.fz.violation(f"{self.where()} SYNC_FILE_INFO {what}: status {arg.status}")

    def sync_merge(self, slot: Slot) -> None:
        fd = self.pick(self.fz.sync_files, 0.85)
        fd2 = self.pick(self.fz.sync_files, 0.8)
        arg = SyncMergeData(
            name=b"npu-merge", fd2=fd2, fence=-1, flags=self.maybe(0.04, 32),
            pad=self.maybe(0.04, 32),
        )  # fmt: skip
        what = f"fd={fd} fd2={fd2} flags={arg.flags:#x} pad={arg.pad}"
        _, back = self.arg_call("SYNC_MERGE", fd, SYNC_IOC_MERGE, arg, 0.03, what)
        if back:
            self.pool_add(self.fz.sync_files, int(arg.fence))

    def poll(self, slot: Slot) -> None:
        """poll() with no timeout: the device file's (its jobs, its faults), a
        sync_file's, a dma-buf's, a syncobj fd's."""
        with self.fz.lock:
            fds = self.fz.sync_files + self.fz.dmabufs + self.fz.syncobj_fds
        fd = slot.fd if not fds or self.rng.random() < 0.4 else self.rng.choice(fds)
        self.calls += 1
        self.by_cmd["POLL"] += 1
        p = select.poll()
        p.register(fd, select.POLLIN | select.POLLOUT | select.POLLPRI)
        p.poll(0)
        self.note("POLL", 0, "")

    # -- ioctl numbers, mmap, munmap, files, processes ------------------------

    def bad_nr(self, slot: Slot) -> None:
        rng = self.rng
        while True:
            r = rng.random()
            typ = ord("N") if r < 0.6 else D if r < 0.8 else rng.randrange(256)
            if typ in VFS_TYPES:
                continue
            if typ == D:
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
        self.call("BAD_NR", slot.fd, request, self.arg_addr, f"nr={nr} size={size}")

    def do_mmap(self, slot: Slot) -> None:
        rng = self.rng
        with self.fz.lock:
            items = list(slot.bos.items())
        if items and rng.random() < 0.7:
            _, (s, _, mmap_offset) = rng.choice(items)
            pages = max(1, s // PAGE)
            off = mmap_offset + rng.randrange(pages + 1) * PAGE
            length = rng.randrange(1, pages + 2) * PAGE
        else:
            off = self.val(64) & ~(PAGE - 1) & ((1 << 63) - 1)
            length = self.val(40)
        prot = rng.choice([mmap.PROT_READ, mmap.PROT_READ | mmap.PROT_WRITE])
        flags = mmap.MAP_SHARED if rng.random() < 0.9 else mmap.MAP_PRIVATE
        self.calls += 1
        self.by_cmd["MMAP"] += 1
        addr = su.libc.mmap(None, length, prot, flags, slot.fd, off)
        what = f"fd={slot.fd} off={off:#x} len={length:#x} prot={prot} flags={flags:#x}"
        if addr in (None, su.MAP_FAILED):
            self.note("MMAP", ctypes.get_errno(), what)
            return
        self.note("MMAP", 0, what)
        if off >= 1 << 32:
            # A BO: the page is there. (Not a queue region: another thread's
            # QUEUE_DESTROY zaps a doorbell, and a read would raise SIGBUS.)
            ctypes.string_at(addr, 1)
        gone = None
        with self.fz.lock:
            self.fz.maps.append(Mapping(int(addr), length))
            if len(self.fz.maps) > 12:
                gone = self.fz.maps.pop(0)
                if gone.queue is not None:
                    gone.queue.mem = 0
        if gone is not None:
            su.libc.munmap(gone.addr, gone.length)

    def munmap(self, slot: Slot) -> None:
        """Unmap a BO or queue mapping (or, in a child, its copy) with work in flight."""
        with self.fz.lock:
            if not self.fz.maps:
                return
            m = self.fz.maps.pop(self.rng.randrange(len(self.fz.maps)))
            if m.queue is not None:
                m.queue.mem = 0
        self.calls += 1
        self.by_cmd["MUNMAP"] += 1
        e = 0 if su.libc.munmap(m.addr, m.length) == 0 else ctypes.get_errno()
        self.note("MUNMAP", e, f"addr={m.addr:#x} len={m.length:#x}")

    def reopen(self, slot: Slot) -> None:
        """Close the slot's file with whatever it has in flight (jobs, queues,
        mappings keep parts of it alive) and open a new one in its place."""
        new = os.open(su.DEV_PATH, os.O_RDWR)
        with slot.bo_lock:
            with self.fz.lock:
                slot.reset()  # its queues' mappings stay, pushed no more
            os.dup2(new, slot.fd)
            with self.fz.lock:
                slot.epoch += 1
        os.close(new)
        self.calls += 1
        self.by_cmd["REOPEN"] += 1

    def fork(self, slot: Slot) -> None:
        """Fork a child that makes a few calls on the files it inherited
        (their mappings too), maybe on a file of its own that it never
        closes, maybe closing its copies of the fds, then _exits."""
        rng = self.rng
        n_calls = rng.randint(1, 8)
        own = rng.random() < 0.3
        close = rng.random() < 0.3
        child_seed = rng.getrandbits(32)
        self.result.seek(0)
        self.result.write(bytes(16))
        self.calls += 1
        self.by_cmd["FORK"] += 1
        pid = os.fork()
        if pid == 0:
            self.child_main(n_calls, own, close, child_seed)  # never returns
        status = self.reap(pid)
        stage, calls, nviol, length = (
            int.from_bytes(self.result[i : i + 4], "little") for i in range(0, 16, 4)
        )
        text = self.result[16 : 16 + min(length, PAGE - 16)].decode("utf-8", "replace")
        with self.fz.lock:
            self.fz.forks += 1
            self.fz.child_calls += calls
        self.calls += calls
        what = f"child {pid} (seed {child_seed}, {n_calls} calls)"
        if status is None:
            self.fz.violation(f"{self.where()}: {what} did not exit in {CHILD_TIMEOUT_S:.0f} s")
        elif os.WIFSIGNALED(status):
            sig = signal.Signals(os.WTERMSIG(status)).name
            self.fz.violation(f"{self.where()}: {what} killed by {sig} at stage {stage}")
        elif os.WEXITSTATUS(status) != 0 or nviol:
            self.fz.violation(f"{self.where()}: {what} exited {os.WEXITSTATUS(status)}:\n{text}")

    def reap(self, pid: int) -> int | None:
        """The child's wait status, or None if it had to be killed (asleep
        on a pidfd meanwhile, not polling: a fork is slow enough already)."""
        pidfd = os.pidfd_open(pid)
        try:
            ready, _, _ = select.select([pidfd], [], [], CHILD_TIMEOUT_S)
        finally:
            os.close(pidfd)
        if not ready:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            return None
        return os.waitpid(pid, 0)[1]

    def child_main(self, n_calls: int, own: bool, close: bool, seed: int) -> None:
        """The forked child: raw calls only, new locks (another thread may
        have held one at the fork), results into the shared page."""
        code = 4
        res = self.result
        stage = 0
        violations: list[str] = []
        try:
            fz = self.fz
            fz.lock, fz.sw_lock = threading.RLock(), threading.Lock()
            for s in fz.slots:
                s.bo_lock = threading.Lock()
            base = len(fz.violations)
            fz.stop = threading.Event()
            self.child = True
            self.rng = random.Random(seed)
            self.max_wait_ns = 50 * 10**6
            self.calls = 0
            stage = 1
            slots = list(fz.slots)
            if own:
                mine = Slot(len(slots))  # never closed: _exit closes it, work in flight
                slots = [*slots, mine]
                self.bo_create(mine)
                self.submit(mine, False)
            stage = 2
            for _ in range(n_calls):
                name = self.rng.choice(CHILD_ACTIONS)
                if name in SW_ACTIONS and fz.sw < 0:
                    continue
                ACTIONS[name](self, self.rng.choice(slots))
            stage = 3
            if close:
                for fd in fz.all_fds():
                    os.close(fd)
            violations = fz.violations[base:]
            code = 0
        except BaseException:  # reported to the parent
            violations.append(traceback.format_exc())
            code = 3
        finally:
            text = "\n".join(violations).encode()[: PAGE - 16]
            res[0:16] = b"".join(
                v.to_bytes(4, "little") for v in (stage, self.calls, len(violations), len(text))
            )
            res[16 : 16 + len(text)] = text
            os._exit(code)

    # -- the loop ----------------------------------------------------------------

    def run(self, quota: int, names: list[str], weights: list[float]) -> None:
        rng = self.rng
        slots = self.fz.slots
        clock = time.perf_counter
        cum = list(itertools.accumulate(weights))
        while self.calls < quota and not self.fz.stop.is_set():
            name = rng.choices(names, cum_weights=cum)[0]
            t0 = clock()
            ACTIONS[name](self, rng.choice(slots))
            self.spent[name] += clock() - t0


@contextmanager
def _nolock() -> Iterator[None]:
    yield


ACTIONS: dict[str, Callable[[Worker, Slot], None]] = {
    "GET_INFO": Worker.get_info,
    "BO_CREATE": Worker.bo_create,
    "BO_DESTROY": Worker.bo_destroy,
    "BO_USERPTR": Worker.bo_userptr,
    "SUBMIT": lambda w, s: w.submit(s, False),
    "SUBMIT_T": lambda w, s: w.submit(s, True),
    "WAIT": Worker.wait,
    "FENCE_INFO": Worker.fence_info,
    "QUEUE_CREATE": Worker.queue_create,
    "QUEUE_DESTROY": Worker.queue_destroy,
    "QUEUE_PUSH": Worker.queue_push,
    "BO_INFO": Worker.bo_info,
    "GEM_CLOSE": Worker.gem_close,
    "PRIME_EXPORT": Worker.prime_export,
    "PRIME_IMPORT": Worker.prime_import,
    "BAD_NR": Worker.bad_nr,
    "MMAP": Worker.do_mmap,
    "MUNMAP": Worker.munmap,
    "SYNCOBJ_CREATE": Worker.syncobj_create,
    "SYNCOBJ_DESTROY": lambda w, s: w.syncobj_destroy(s),
    "SYNCOBJ_HANDLE_TO_FD": Worker.syncobj_handle_to_fd,
    "SYNCOBJ_FD_TO_HANDLE": Worker.syncobj_fd_to_handle,
    "SYNCOBJ_WAIT": lambda w, s: w.syncobj_wait(s, False),
    "SYNCOBJ_TIMELINE_WAIT": lambda w, s: w.syncobj_wait(s, True),
    "SYNCOBJ_RESET": lambda w, s: w.syncobj_array_call(s, "SYNCOBJ_RESET"),
    "SYNCOBJ_SIGNAL": lambda w, s: w.syncobj_array_call(s, "SYNCOBJ_SIGNAL"),
    "SYNCOBJ_QUERY": lambda w, s: w.syncobj_array_call(s, "SYNCOBJ_QUERY"),
    "SYNCOBJ_TIMELINE_SIGNAL": lambda w, s: w.syncobj_array_call(s, "SYNCOBJ_TIMELINE_SIGNAL"),
    "SYNCOBJ_TRANSFER": Worker.syncobj_transfer,
    "SYNCOBJ_EVENTFD": Worker.syncobj_eventfd,
    "SW_FENCE": Worker.sw_fence,
    "SW_INC": Worker.sw_inc,
    "SW_REOPEN": Worker.sw_reopen,
    "SYNC_FILE_INFO": Worker.sync_file_info,
    "SYNC_MERGE": Worker.sync_merge,
    "POLL": Worker.poll,
    "FORK": Worker.fork,
    "REOPEN": Worker.reopen,
}
assert set(ACTIONS) == set(WEIGHTS), set(ACTIONS) ^ set(WEIGHTS)


# --------------------------------------------------------------------------
# A run
# --------------------------------------------------------------------------


@dataclass
class Result:
    seed: int
    threads: int
    calls: int = 0
    seconds: float = 0.0
    by_cmd: Counter[str] = field(default_factory=Counter)
    by_errno: Counter[str] = field(default_factory=Counter)
    ok: Counter[str] = field(default_factory=Counter)
    busy: Counter[str] = field(default_factory=Counter)
    spent: Counter[str] = field(default_factory=Counter)
    violations: list[str] = field(default_factory=list)
    forks: int = 0
    child_calls: int = 0
    rings: Counter[str] = field(default_factory=Counter)
    sw_signals: int = 0
    leaked_fds: int = 0
    sw_sync: bool = False

    @property
    def rate(self) -> float:
        return self.calls / self.seconds if self.seconds else 0.0


@contextmanager
def module_params(params: dict[str, str] = PARAMS) -> Iterator[None]:
    """Set the driver's module parameters for the run, and put them back."""
    old = {}
    for path, value in params.items():
        with open(path) as f:
            old[path] = f.read().strip()
        with open(path, "w") as f:
            f.write(value)
    try:
        yield
    finally:
        for path, value in old.items():
            with open(path, "w") as f:
                f.write(value)


def _signaller(fz: Shared, seed: int) -> None:
    """Signal the sw_sync timeline every 20-60 ms, by 1 or 2, until told to
    stop: a fence a few points ahead is met within ~100 ms."""
    rng = random.Random(f"{seed}/signaller")
    n = ctypes.c_uint32(1)
    while not fz.stop.wait(rng.uniform(0.02, 0.06)):
        by = rng.choice([1, 1, 2])
        n.value = by
        with fz.sw_lock:
            e = su.raw_ioctl(fz.sw, SW_SYNC_IOC_INC, ctypes.addressof(n))
            if e == 0:
                fz.sw_value += by
                fz.sw_signals += 1
        if e:
            fz.violation(f"signaller: SW_SYNC_IOC_INC: {su.errname(e)}")


def run(seed: int, n_calls: int, threads: int = THREADS) -> Result:
    """n_calls calls (at least) from `threads` workers over SLOTS shared files."""
    fz = Shared(seed)
    res = Result(seed=seed, threads=threads, sw_sync=fz.sw >= 0)
    names = [k for k in WEIGHTS if fz.sw >= 0 or k not in SW_ACTIONS]
    weights = [WEIGHTS[k] for k in names]
    workers = [Worker(fz, i) for i in range(threads)]
    try:
        w0 = workers[0]
        for slot in fz.slots:  # something to work with
            for _ in range(4):
                w0.bo_create(slot)
            for _ in range(2):
                w0.syncobj_create(slot)
        quotas = [n_calls // threads + (i < n_calls % threads) for i in range(threads)]

        def body(w: Worker, quota: int) -> None:
            try:
                w.run(quota, names, weights)
            except BaseException:  # reported as a violation
                fz.violation(f"{w.where()}: exception\n{traceback.format_exc()}")

        ts = [
            threading.Thread(target=body, args=(w, q), name=f"fuzz-{w.index}")
            for w, q in zip(workers, quotas, strict=True)
        ]
        sig = threading.Thread(target=_signaller, args=(fz, seed), name="fuzz-signaller")
        t0 = time.monotonic()
        with warnings.catch_warnings():
            # os.fork() in a threaded process: the children make raw calls only.
            warnings.filterwarnings(
                "ignore", r".*fork\(\) may lead to deadlocks", DeprecationWarning
            )
            if fz.sw >= 0:
                sig.start()
            for t in ts:
                t.start()
            for t in ts:
                t.join()
            res.seconds = time.monotonic() - t0
            fz.stop.set()
            if fz.sw >= 0:
                sig.join()
    finally:
        fz.stop.set()
        res.leaked_fds = fz.close()
        for w in workers:
            w.close()
    for w in workers:
        res.calls += w.calls
        res.by_cmd.update(w.by_cmd)
        res.by_errno.update(w.by_errno)
        res.ok.update(w.ok)
        res.busy.update(w.busy)
        res.spent.update(w.spent)
    res.violations = fz.violations
    res.forks, res.child_calls, res.rings = fz.forks, fz.child_calls, fz.rings
    res.sw_signals = fz.sw_signals
    return res


def main(argv: list[str] | None = None) -> int:
    """Benchmark: N calls, then one JSON line with fuzz_calls_per_s."""
    ap = argparse.ArgumentParser(description=main.__doc__)
    quick = os.environ.get("BENCH_QUICK", "") == "1"
    ap.add_argument("--calls", type=int, default=5000 if quick else 20000)
    ap.add_argument("--threads", type=int, default=THREADS)
    ap.add_argument("--seed", type=int, default=int(time.time_ns() % 2**32))
    args = ap.parse_args(argv)
    su.wait_idle()
    with module_params():
        res = run(args.seed, args.calls, args.threads)
    for v in res.violations:
        print(v, file=sys.stderr)
    print(
        f"fuzz: {res.calls} calls in {res.seconds:.1f} s = {res.rate:.0f} calls/s "
        f"({res.threads} threads, seed {res.seed}); results {dict(res.by_errno.most_common())}",
        file=sys.stderr,
    )
    print(
        json.dumps(
            {
                "fuzz_calls_per_s": round(res.rate, 1),
                "fuzz_bench_calls": res.calls,
                "fuzz_bench_threads": res.threads,
                "fuzz_bench_s": round(res.seconds, 1),
            }
        )
    )
    return 1 if res.violations else 0


if __name__ == "__main__":
    sys.exit(main())
