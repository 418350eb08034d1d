"""Every bad ioctl/mmap input gets the errno of the table in docs/uapi.md.

The calls are made with raw ``fcntl.ioctl`` on the ctypes structs of
``npu._abi`` so that the runtime's own argument checks cannot hide what the
kernel does. A few checks at the end go through the high-level API to see
the runtime turn these errors into ``NpuError`` subclasses.
"""

from __future__ import annotations

import ctypes
import errno
import fcntl
import mmap
import os
import time
from collections.abc import Callable, Iterator

import pytest
from ioctl_opt import IOC, IOC_READ, IOC_WRITE

import npu
from npu import _abi, ops

U64_MAX = _abi.U64_MAX
PAGE = mmap.PAGESIZE
BO_SIZE = 64 * 1024
FENCES = "/sys/class/accel/accel0/device/npu/fences"
RW = mmap.PROT_READ | mmap.PROT_WRITE


# --------------------------------------------------------------------------
# Raw helpers
# --------------------------------------------------------------------------


def ioctl(fd: int, request: int, arg) -> None:
    fcntl.ioctl(fd, request, arg, True)


def assert_errno(expected: int, call: Callable[[], object]) -> None:
    with pytest.raises(OSError) as info:
        call()
    assert info.value.errno == expected, (
        f"expected {errno.errorcode[expected]}, got "
        f"{errno.errorcode.get(info.value.errno, info.value.errno)}"
    )


def bo_create(fd: int, size: int = BO_SIZE) -> _abi.NpuBoCreate:
    arg = _abi.NpuBoCreate(size=size)
    ioctl(fd, _abi.DRM_IOCTL_NPU_BO_CREATE, arg)
    return arg


def bo_destroy(fd: int, handle: int) -> None:
    ioctl(fd, _abi.DRM_IOCTL_NPU_BO_DESTROY, _abi.NpuBoDestroy(handle=handle))


class Submit:
    """A SUBMIT argument with its op array kept alive."""

    def __init__(self, op_list: list[_abi.NpuOp]) -> None:
        self.ops = (_abi.NpuOp * max(len(op_list), 1))(*op_list)
        self.arg = _abi.NpuSubmit(
            ops_ptr=ctypes.addressof(self.ops),
            num_ops=len(op_list),
            queue=0,
            flags=0,
            op_size=ctypes.sizeof(_abi.NpuOp),
        )

    def __call__(self, fd: int) -> int:
        ioctl(fd, _abi.DRM_IOCTL_NPU_SUBMIT, self.arg)
        return int(self.arg.fence)


def submit(fd: int, op_list: list[_abi.NpuOp]) -> int:
    return Submit(op_list)(fd)


def wait(fd: int, fence: int, timeout_ns: int = 10 * 10**9, **fields) -> _abi.NpuWait:
    arg = _abi.NpuWait(fence=fence, deadline_ns=_abi.deadline_after(timeout_ns), queue=0, **fields)
    ioctl(fd, _abi.DRM_IOCTL_NPU_WAIT, arg)
    return arg


def ref(handle: int, offset: int = 0, size: int = 4096) -> _abi.NpuBufRef:
    return _abi.NpuBufRef(handle=handle, rsvd=0, offset=offset, size=size)


def make_op(opcode: int, refs=(), params=(), num_bufs: int | None = None) -> _abi.NpuOp:
    op = _abi.NpuOp()
    op.opcode = opcode
    op.num_bufs = len(refs) if num_bufs is None else num_bufs
    for i, r in enumerate(refs):
        op.bufs[i] = r
    for i, p in enumerate(params):
        op.params[i] = p
    return op


def last_submitted_fence() -> int:
    with open(FENCES) as f:
        return int(f.read().split()[0])


class Bos:
    """Three 64 KiB BOs (a, b, c) on one fd."""

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self.a, self.b, self.c = (bo_create(fd).handle for _ in range(3))


@pytest.fixture
def bos(fd) -> Iterator[Bos]:
    yield Bos(fd)  # released when the fd fixture closes the fd


@pytest.fixture
def other_fd(dev_path) -> Iterator[int]:
    f = os.open(dev_path, os.O_RDWR)
    yield f
    os.close(f)


# --------------------------------------------------------------------------
# Any ioctl
# --------------------------------------------------------------------------

IOCTLS = {
    "GET_INFO": (_abi.DRM_IOCTL_NPU_GET_INFO, _abi.NpuInfo, IOC_READ),
    "BO_CREATE": (_abi.DRM_IOCTL_NPU_BO_CREATE, _abi.NpuBoCreate, IOC_READ | IOC_WRITE),
    "BO_DESTROY": (_abi.DRM_IOCTL_NPU_BO_DESTROY, _abi.NpuBoDestroy, IOC_WRITE),
    "SUBMIT": (_abi.DRM_IOCTL_NPU_SUBMIT, _abi.NpuSubmit, IOC_READ | IOC_WRITE),
    "WAIT": (_abi.DRM_IOCTL_NPU_WAIT, _abi.NpuWait, IOC_READ | IOC_WRITE),
}


@pytest.mark.parametrize("nr", [10, 0x10, 0x5F])
def test_unknown_driver_ioctl_number_fails_with_einval(fd, nr):
    # DRM's rule for a driver ioctl number past the driver's table.
    request = IOC(IOC_READ | IOC_WRITE, _abi.NPU_DRM_IOCTL_BASE, _abi.NPU_DRM_COMMAND_BASE + nr, 8)
    assert_errno(errno.EINVAL, lambda: ioctl(fd, request, bytearray(8)))


def test_ioctl_of_another_type_letter_fails_with_enotty(fd):
    request = IOC(IOC_READ, ord("Q"), 0, ctypes.sizeof(_abi.NpuInfo))
    assert_errno(errno.ENOTTY, lambda: ioctl(fd, request, bytearray(ctypes.sizeof(_abi.NpuInfo))))


def _get_info_sized(fd: int, size: int, fill: int = 0) -> bytes:
    request = IOC(IOC_READ, _abi.NPU_DRM_IOCTL_BASE, _abi.NPU_DRM_COMMAND_BASE, size)
    buf = bytearray([fill]) * size
    ioctl(fd, request, buf)
    return bytes(buf)


def _get_info(fd: int) -> bytes:
    info = _abi.NpuInfo()
    ioctl(fd, _abi.DRM_IOCTL_NPU_GET_INFO, info)
    return bytes(info)


def test_a_caller_with_a_shorter_struct_gets_the_fields_it_knows(fd):
    # An older caller of a grown struct: DRM copies out what fits.
    full = _get_info(fd)
    short = ctypes.sizeof(_abi.NpuInfo) - 16
    assert _get_info_sized(fd, short, fill=0xAA) == full[:short]


def test_a_caller_with_a_longer_struct_gets_zeros_past_the_drivers(fd):
    # A newer caller on an older driver: fields the driver lacks read as zero.
    full = _get_info(fd)
    longer = _get_info_sized(fd, len(full) + 16, fill=0xAA)
    assert longer == full + bytes(16)


def test_a_zero_extended_argument_means_the_old_behaviour(fd):
    # BO_CREATE without its last field (va, an output): DRM zero-fills it,
    # so the call is valid and the caller gets the fields it passed room for.
    size = ctypes.sizeof(_abi.NpuBoCreate) - 8
    request = IOC(IOC_READ | IOC_WRITE, _abi.NPU_DRM_IOCTL_BASE,
                  _abi.NPU_DRM_COMMAND_BASE + _abi.DRM_NPU_BO_CREATE, size)  # fmt: skip
    arg = _abi.NpuBoCreate(size=4096)
    buf = bytearray(bytes(arg)[:size])
    ioctl(fd, request, buf)
    out = _abi.NpuBoCreate.from_buffer_copy(bytes(buf) + bytes(8))
    assert out.handle and out.alloc_size == 4096
    ioctl(fd, _abi.DRM_IOCTL_NPU_BO_DESTROY, _abi.NpuBoDestroy(handle=out.handle))


@pytest.mark.parametrize("name", list(IOCTLS))
def test_ioctl_with_an_unreadable_argument_pointer_fails_with_efault(fd, name):
    request = IOCTLS[name][0]
    # An int argument is passed to the kernel as the pointer value itself.
    assert_errno(errno.EFAULT, lambda: fcntl.ioctl(fd, request, 0))
    assert_errno(errno.EFAULT, lambda: fcntl.ioctl(fd, request, 0x10))


# --------------------------------------------------------------------------
# GET_INFO
# --------------------------------------------------------------------------


def test_get_info_reports_the_documented_limits_and_zero_reserved(fd):
    info = _abi.NpuInfo()
    for i in range(2):
        info.rsvd[i] = 0xFFFFFFFF
    ioctl(fd, _abi.DRM_IOCTL_NPU_GET_INFO, info)
    assert info.max_submit == 256
    assert info.ring_entries == 4096
    assert info.max_bo_size == 1 << 30
    assert (info.pci_vendor, info.pci_device) == (0x1234, 0x4E50)
    assert info.num_queues >= 1
    assert info.user_queues == 7  # the device's 8 queues but the driver's
    assert list(info.rsvd) == [0] * 2


# --------------------------------------------------------------------------
# BO_CREATE / BO_DESTROY
# --------------------------------------------------------------------------


def test_bo_create_rounds_up_to_pages_and_returns_a_nonzero_handle(fd):
    arg = bo_create(fd, 1)
    assert arg.handle != 0
    assert arg.alloc_size == PAGE
    assert arg.mmap_offset % PAGE == 0


@pytest.mark.parametrize("flags", [2, 0x80000000])
def test_bo_create_with_unknown_flags_fails_with_einval(fd, flags):
    arg = _abi.NpuBoCreate(size=4096, flags=flags)
    assert_errno(errno.EINVAL, lambda: ioctl(fd, _abi.DRM_IOCTL_NPU_BO_CREATE, arg))


@pytest.mark.parametrize("field", ["handle", "mmap_offset", "alloc_size", "va"])
def test_bo_create_with_an_output_field_set_fails_with_einval(fd, field):
    arg = _abi.NpuBoCreate(size=4096)
    setattr(arg, field, 1)
    assert_errno(errno.EINVAL, lambda: ioctl(fd, _abi.DRM_IOCTL_NPU_BO_CREATE, arg))


def test_bo_create_of_size_zero_fails_with_einval(fd):
    arg = _abi.NpuBoCreate(size=0)
    assert_errno(errno.EINVAL, lambda: ioctl(fd, _abi.DRM_IOCTL_NPU_BO_CREATE, arg))


@pytest.mark.parametrize(
    "size",
    [(1 << 30) + 1, 1 << 40, U64_MAX - 4095, U64_MAX],
    ids=["1GiB+1", "1TiB", "U64_MAX-4095", "U64_MAX"],
)
def test_bo_create_larger_than_max_bo_size_fails_with_e2big(fd, size):
    arg = _abi.NpuBoCreate(size=size)
    assert_errno(errno.E2BIG, lambda: ioctl(fd, _abi.DRM_IOCTL_NPU_BO_CREATE, arg))


def test_bo_destroy_with_reserved_field_set_fails_with_einval(fd):
    handle = bo_create(fd).handle
    arg = _abi.NpuBoDestroy(handle=handle, rsvd=1)
    assert_errno(errno.EINVAL, lambda: ioctl(fd, _abi.DRM_IOCTL_NPU_BO_DESTROY, arg))
    bo_destroy(fd, handle)  # the failed call did not destroy it


@pytest.mark.parametrize("handle", [0, 12345, 0xFFFFFFFF])
def test_bo_destroy_of_an_unknown_handle_fails_with_enoent(fd, handle):
    assert_errno(errno.ENOENT, lambda: bo_destroy(fd, handle))


def test_bo_destroy_twice_fails_with_enoent(fd):
    handle = bo_create(fd).handle
    bo_destroy(fd, handle)
    assert_errno(errno.ENOENT, lambda: bo_destroy(fd, handle))


def test_bo_destroy_of_another_fds_handle_fails_with_enoent(fd, other_fd):
    handle = bo_create(other_fd).handle
    assert_errno(errno.ENOENT, lambda: bo_destroy(fd, handle))
    bo_destroy(other_fd, handle)  # still alive on its own fd


# --------------------------------------------------------------------------
# SUBMIT: the submit struct
# --------------------------------------------------------------------------


def nop_submit() -> Submit:
    return Submit([make_op(_abi.NPU_OP_NOP)])


def test_submit_of_one_nop_succeeds(fd):
    fence = nop_submit()(fd)
    assert fence > 0
    wait(fd, fence)


@pytest.mark.parametrize("flags", [1, 0x80000000])
def test_submit_with_flags_fails_with_einval(fd, flags):
    s = nop_submit()
    s.arg.flags = flags
    assert_errno(errno.EINVAL, lambda: s(fd))


@pytest.mark.parametrize("op_size", [0, 112, 119, 121, 128, 0xFFFFFFFF])
def test_submit_with_wrong_op_size_fails_with_einval(fd, op_size):
    s = nop_submit()
    s.arg.op_size = op_size
    assert_errno(errno.EINVAL, lambda: s(fd))


def test_submit_of_zero_ops_fails_with_einval(fd):
    s = nop_submit()
    s.arg.num_ops = 0
    assert_errno(errno.EINVAL, lambda: s(fd))


@pytest.mark.parametrize("num_ops", [257, 0xFFFFFFFF])
def test_submit_of_more_than_256_ops_fails_with_einval(fd, num_ops):
    s = Submit([make_op(_abi.NPU_OP_NOP)] * 257)
    s.arg.num_ops = num_ops
    assert_errno(errno.EINVAL, lambda: s(fd))


def test_submit_of_exactly_256_nops_succeeds(fd):
    s = Submit([make_op(_abi.NPU_OP_NOP)] * 256)
    wait(fd, s(fd))


@pytest.mark.parametrize("queue", [1, 16, 0xFFFFFFFF])
def test_submit_to_a_queue_that_does_not_exist_fails_with_einval(fd, queue):
    s = nop_submit()
    s.arg.queue = queue
    assert_errno(errno.EINVAL, lambda: s(fd))


@pytest.mark.parametrize("ptr", [0, 0x10, 0xFFFF_FFFF_FFFF_F000], ids=["null", "low", "kernel"])
def test_submit_with_unreadable_ops_ptr_fails_with_efault(fd, ptr):
    s = nop_submit()
    s.arg.ops_ptr = ptr
    assert_errno(errno.EFAULT, lambda: s(fd))


def test_submit_whose_op_array_runs_into_unmapped_memory_fails_with_efault(fd):
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mmap.restype = ctypes.c_void_p
    libc.mmap.argtypes = [
        ctypes.c_void_p,
        ctypes.c_size_t,
        ctypes.c_int,
        ctypes.c_int,
        ctypes.c_int,
        ctypes.c_long,
    ]
    libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
    base = libc.mmap(None, 2 * PAGE, RW, mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS, -1, 0)
    assert base not in (None, ctypes.c_void_p(-1).value)
    try:
        assert libc.munmap(base + PAGE, PAGE) == 0  # the second page is gone
        op_size = ctypes.sizeof(_abi.NpuOp)
        s = nop_submit()
        ctypes.memmove(base + PAGE - op_size, ctypes.addressof(s.ops), op_size)
        s.arg.ops_ptr = base + PAGE - op_size  # op 0 readable, op 1 unmapped
        s.arg.num_ops = 2
        assert_errno(errno.EFAULT, lambda: s(fd))
    finally:
        libc.munmap(base, PAGE)


def test_rejected_submit_queues_nothing(fd, bos):
    before = last_submitted_fence()
    good = make_op(_abi.NPU_OP_NOP)
    bad = make_op(_abi.NPU_OP_NOP)
    bad.flags = 1
    assert_errno(errno.EINVAL, lambda: submit(fd, [good, good, bad]))
    assert last_submitted_fence() == before


# --------------------------------------------------------------------------
# SUBMIT: one bad op
# --------------------------------------------------------------------------


def good_op(kind: str, b: Bos) -> _abi.NpuOp:
    if kind == "nop":
        return make_op(_abi.NPU_OP_NOP)
    if kind == "copy":
        return make_op(_abi.NPU_OP_COPY, [ref(b.a), ref(b.b)])
    if kind == "fill":
        return make_op(_abi.NPU_OP_FILL, [ref(b.a)], [0xDEADBEEF])
    if kind == "gemm":  # 8x8x8, tightly packed
        return make_op(
            _abi.NPU_OP_GEMM,
            [ref(b.a, 0, 256), ref(b.b, 0, 256), ref(b.c, 0, 256)],
            [8, 8, 8, 8, 8, 8, 0, 0],
        )
    raise AssertionError(kind)


@pytest.mark.parametrize("kind", ["nop", "copy", "fill", "gemm"])
def test_valid_op_of_each_kind_is_accepted(fd, bos, kind):
    wait(fd, submit(fd, [good_op(kind, bos)]))


def _set(attr: str, value: int):
    def mutate(op: _abi.NpuOp) -> None:
        setattr(op, attr, value)

    return mutate


def _set_buf(i: int, attr: str, value: int):
    def mutate(op: _abi.NpuOp) -> None:
        setattr(op.bufs[i], attr, value)

    return mutate


def _set_param(i: int, value: int):
    def mutate(op: _abi.NpuOp) -> None:
        op.params[i] = value

    return mutate


# (kind, mutation, errno): each case breaks exactly one thing of a valid op.
EINVAL, ENOENT, ERANGE = errno.EINVAL, errno.ENOENT, errno.ERANGE
OP_CASES = {
    # op header
    "unknown_opcode_4": ("nop", _set("opcode", 4), EINVAL),
    "unknown_opcode_0xffff": ("nop", _set("opcode", 0xFFFF), EINVAL),
    "op_flags_set": ("copy", _set("flags", 1), EINVAL),
    "op_flags_high_bit": ("nop", _set("flags", 0x8000), EINVAL),
    "op_rsvd_set": ("fill", _set("rsvd", 1), EINVAL),
    "op_rsvd_high_bit": ("gemm", _set("rsvd", 1 << 63), EINVAL),
    # number of buffers
    "nop_with_num_bufs_1": ("nop", _set("num_bufs", 1), EINVAL),
    "copy_with_num_bufs_1": ("copy", _set("num_bufs", 1), EINVAL),
    "copy_with_num_bufs_3": ("copy", _set("num_bufs", 3), EINVAL),
    "fill_with_num_bufs_0": ("fill", _set("num_bufs", 0), EINVAL),
    "gemm_with_num_bufs_2": ("gemm", _set("num_bufs", 2), EINVAL),
    "num_bufs_4": ("gemm", _set("num_bufs", 4), EINVAL),
    "num_bufs_u32_max": ("copy", _set("num_bufs", 0xFFFFFFFF), EINVAL),
    # unused slots must be zero
    "nop_unused_buf_handle": ("nop", _set_buf(0, "handle", 1), EINVAL),
    "nop_unused_buf_size": ("nop", _set_buf(2, "size", 1), EINVAL),
    "nop_unused_param": ("nop", _set_param(0, 1), EINVAL),
    "copy_unused_buf2_offset": ("copy", _set_buf(2, "offset", 8), EINVAL),
    "copy_unused_param0": ("copy", _set_param(0, 1), EINVAL),
    "copy_unused_param7": ("copy", _set_param(7, 1), EINVAL),
    "fill_unused_buf1_handle": ("fill", _set_buf(1, "handle", 1), EINVAL),
    "fill_unused_param1": ("fill", _set_param(1, 1), EINVAL),
    # buffer references
    "buf_rsvd_set": ("copy", _set_buf(1, "rsvd", 1), EINVAL),
    "buf_size_zero": ("fill", _set_buf(0, "size", 0), EINVAL),
    "gemm_buf_size_zero": ("gemm", _set_buf(2, "size", 0), EINVAL),
    "buf_handle_zero": ("copy", _set_buf(0, "handle", 0), ENOENT),
    "buf_handle_unknown": ("fill", _set_buf(0, "handle", 999), ENOENT),
    "buf_handle_u32_max": ("gemm", _set_buf(1, "handle", 0xFFFFFFFF), ENOENT),
    "buf_past_end": ("fill", _set_buf(0, "offset", BO_SIZE - 4096 + 4), ERANGE),
    "buf_offset_at_end": ("fill", _set_buf(0, "offset", BO_SIZE), ERANGE),
    "buf_size_past_end": ("fill", _set_buf(0, "size", BO_SIZE + 4), ERANGE),
    "buf_offset_u64_max": ("fill", _set_buf(0, "offset", U64_MAX), ERANGE),
    "buf_offset_size_overflow": ("fill", _set_buf(0, "offset", U64_MAX - 4092), ERANGE),
    "buf_size_u64_max": ("copy", _set_buf(0, "size", U64_MAX), ERANGE),
    "buf_offset_2_pow_63": ("fill", _set_buf(0, "offset", 1 << 63), ERANGE),
    # op-specific
    "copy_sizes_differ": ("copy", _set_buf(1, "size", 4100), EINVAL),
    "copy_same_range": ("copy", _set_buf(1, "handle", 1), EINVAL),
    "fill_size_not_multiple_of_4": ("fill", _set_buf(0, "size", 4098), EINVAL),
    "fill_size_2": ("fill", _set_buf(0, "size", 2), EINVAL),
}


@pytest.mark.parametrize("case", list(OP_CASES))
def test_submit_of_an_invalid_op_fails_with_its_errno(fd, bos, case):
    kind, mutate, expected = OP_CASES[case]
    assert (bos.a, bos.b, bos.c) == (1, 2, 3)  # cases above name handle 1 as "a"
    op = good_op(kind, bos)
    mutate(op)
    assert_errno(expected, lambda: submit(fd, [op]))


def test_submit_with_the_bad_op_last_fails_and_queues_nothing(fd, bos):
    before = last_submitted_fence()
    bad = good_op("fill", bos)
    bad.bufs[0].size = 3
    assert_errno(errno.EINVAL, lambda: submit(fd, [good_op("copy", bos)] * 10 + [bad]))
    assert last_submitted_fence() == before


@pytest.mark.parametrize(
    ("src_off", "dst_off", "size"),
    [(0, 2048, 4096), (2048, 0, 4096), (0, 4095, 4096), (100, 100, 8)],
)
def test_copy_between_overlapping_ranges_of_one_bo_fails_with_einval(
    fd, bos, src_off, dst_off, size
):
    op = make_op(_abi.NPU_OP_COPY, [ref(bos.a, src_off, size), ref(bos.a, dst_off, size)])
    assert_errno(errno.EINVAL, lambda: submit(fd, [op]))


def test_copy_between_adjacent_ranges_of_one_bo_is_accepted(fd, bos):
    op = make_op(_abi.NPU_OP_COPY, [ref(bos.a, 0, 4096), ref(bos.a, 4096, 4096)])
    wait(fd, submit(fd, [op]))


def test_op_naming_a_destroyed_bo_fails_with_enoent(fd, bos):
    bo_destroy(fd, bos.b)
    assert_errno(errno.ENOENT, lambda: submit(fd, [good_op("copy", bos)]))


def test_op_naming_another_fds_bo_fails_with_enoent(fd, other_fd):
    mine = bo_create(fd).handle
    for _ in range(mine + 1):
        theirs = bo_create(other_fd).handle
    assert theirs != mine
    op = make_op(_abi.NPU_OP_COPY, [ref(mine), ref(theirs)])
    assert_errno(errno.ENOENT, lambda: submit(fd, [op]))


# --------------------------------------------------------------------------
# SUBMIT: GEMM
# --------------------------------------------------------------------------


def gemm_op(
    b: Bos,
    m=8,
    n=8,
    k=8,
    lda=None,
    ldb=None,
    ldc=None,
    dtype=0,
    flags=0,
    a_size=None,
    b_size=None,
    c_size=None,
) -> _abi.NpuOp:
    ta, tb = flags & _abi.NPU_GEMM_TRANS_A, flags & _abi.NPU_GEMM_TRANS_B
    a_rows, a_cols = (k, m) if ta else (m, k)
    b_rows, b_cols = (n, k) if tb else (k, n)
    lda = a_cols if lda is None else lda
    ldb = b_cols if ldb is None else ldb
    ldc = n if ldc is None else ldc

    def extent(rows, cols, ld):
        return max(((rows - 1) * ld + cols) * 4, 4)

    a_size = min(extent(a_rows, a_cols, lda), BO_SIZE) if a_size is None else a_size
    b_size = min(extent(b_rows, b_cols, ldb), BO_SIZE) if b_size is None else b_size
    c_size = min(extent(m, n, ldc), BO_SIZE) if c_size is None else c_size
    return make_op(
        _abi.NPU_OP_GEMM,
        [ref(b.a, 0, a_size), ref(b.b, 0, b_size), ref(b.c, 0, c_size)],
        [m, n, k, lda, ldb, ldc, dtype, flags],
    )


GEMM_CASES = {
    "m_zero": dict(m=0),
    "n_zero": dict(n=0),
    "k_zero": dict(k=0),
    "m_above_65536": dict(m=65537, a_size=BO_SIZE, c_size=BO_SIZE),
    "n_above_65536": dict(n=65537, b_size=BO_SIZE, c_size=BO_SIZE),
    "k_u32_max": dict(k=0xFFFFFFFF, a_size=BO_SIZE, b_size=BO_SIZE),
    "lda_below_k": dict(lda=7),
    "ldb_below_n": dict(ldb=7),
    "ldc_below_n": dict(ldc=7),
    "lda_zero": dict(lda=0),
    # One row: the stride does not change the extent, only the limit catches it.
    "lda_above_2_pow_24_with_one_row": dict(m=1, lda=(1 << 24) + 1),
    "ldc_2_pow_31_with_one_row": dict(m=1, ldc=1 << 31),
    "lda_below_m_with_trans_a": dict(m=16, k=4, lda=8, flags=_abi.NPU_GEMM_TRANS_A),
    "ldb_below_k_with_trans_b": dict(n=4, k=16, ldb=8, flags=_abi.NPU_GEMM_TRANS_B),
    "dtype_1": dict(dtype=1),
    "dtype_u32_max": dict(dtype=0xFFFFFFFF),
    "flags_bit_2": dict(flags=4),
    "flags_high_bit": dict(flags=0x80000000),
    "a_buffer_too_small": dict(a_size=8 * 8 * 4 - 4),
    "b_buffer_too_small": dict(b_size=8 * 8 * 4 - 4),
    "c_buffer_too_small": dict(c_size=8 * 8 * 4 - 4),
    "c_too_small_for_its_stride": dict(ldc=16, c_size=8 * 8 * 4),
    "a_too_small_when_transposed": dict(
        m=16, k=4, flags=_abi.NPU_GEMM_TRANS_A, a_size=3 * 16 * 4 + 15 * 4
    ),
    "b_too_small_when_transposed": dict(
        n=16, k=4, flags=_abi.NPU_GEMM_TRANS_B, b_size=15 * 4 * 4 + 3 * 4
    ),
    "huge_matrix_in_small_buffers": dict(
        m=65536, n=65536, k=65536, a_size=BO_SIZE, b_size=BO_SIZE, c_size=BO_SIZE
    ),
}


@pytest.mark.parametrize("case", list(GEMM_CASES))
def test_gemm_with_invalid_shape_stride_dtype_flags_or_buffer_fails_with_einval(fd, bos, case):
    op = gemm_op(bos, **GEMM_CASES[case])
    assert_errno(errno.EINVAL, lambda: submit(fd, [op]))


@pytest.mark.parametrize(
    "params",
    [
        dict(),
        dict(flags=3),
        dict(m=16, k=4, flags=1),
        dict(n=16, k=4, flags=2),
        dict(lda=9, ldb=10, ldc=11),
        dict(m=1, n=1, k=1),
    ],
    ids=["packed", "trans_both", "trans_a", "trans_b", "strided", "1x1x1"],
)
def test_gemm_whose_buffers_are_exactly_large_enough_is_accepted(fd, bos, params):
    wait(fd, submit(fd, [gemm_op(bos, **params)]))


# --------------------------------------------------------------------------
# WAIT
# --------------------------------------------------------------------------


@pytest.mark.parametrize("flags", [1, 0x80000000])
def test_wait_with_flags_fails_with_einval(fd, flags):
    fence = nop_submit()(fd)
    assert_errno(errno.EINVAL, lambda: wait(fd, fence, flags=flags))
    wait(fd, fence)


def test_wait_with_reserved_field_set_fails_with_einval(fd):
    fence = nop_submit()(fd)
    assert_errno(errno.EINVAL, lambda: wait(fd, fence, rsvd=1))
    wait(fd, fence)


@pytest.mark.parametrize("queue", [8, 0xFFFFFFFF])
def test_wait_on_a_queue_that_does_not_exist_fails_with_einval(fd, queue):
    fence = nop_submit()(fd)
    arg = _abi.NpuWait(fence=fence, deadline_ns=_abi.deadline_after(10**9), queue=queue)
    assert_errno(errno.EINVAL, lambda: ioctl(fd, _abi.DRM_IOCTL_NPU_WAIT, arg))


@pytest.mark.parametrize("queue", [1, 7])
def test_wait_on_a_queue_not_lent_to_the_file_fails_with_enoent(fd, queue):
    arg = _abi.NpuWait(fence=1, deadline_ns=_abi.deadline_after(10**9), queue=queue)
    assert_errno(errno.ENOENT, lambda: ioctl(fd, _abi.DRM_IOCTL_NPU_WAIT, arg))


@pytest.mark.parametrize("beyond", [1, 2, None], ids=["last+1", "last+2", "U64_MAX"])
def test_wait_on_a_fence_beyond_the_last_submitted_fails_with_einval(fd, beyond):
    fence = nop_submit()(fd)
    wait(fd, fence)
    target = U64_MAX if beyond is None else fence + beyond
    assert_errno(errno.EINVAL, lambda: wait(fd, target))


def test_wait_on_fence_zero_returns_at_once(fd):
    arg = wait(fd, 0, timeout_ns=0)
    assert arg.status == 0
    assert arg.error_fence == 0


def test_wait_reports_ok_status_and_no_error_fence_on_success(fd):
    fence = nop_submit()(fd)
    arg = _abi.NpuWait(
        fence=fence, deadline_ns=_abi.deadline_after(10**10), queue=0, status=77, error_fence=99
    )
    ioctl(fd, _abi.DRM_IOCTL_NPU_WAIT, arg)
    assert (arg.status, arg.error_fence) == (0, 0)


def test_wait_on_a_fence_of_another_fd_succeeds(fd, other_fd):
    fence = nop_submit()(other_fd)
    wait(fd, fence)


GEMM_BIG = 1024  # 1024 x 1024 fp32 = 4 MiB per matrix
GEMM_BIG_COUNT = 16  # ~34 GFLOP in all: far longer than a few ioctls


@pytest.fixture
def big_gemm(fd) -> Iterator[tuple[int, int]]:
    """Queue 16 GEMMs of 1024^3 on fd; yield (fence, last fence before them)."""
    nbytes = GEMM_BIG * GEMM_BIG * 4
    a, b, c = (bo_create(fd, nbytes).handle for _ in range(3))
    d = GEMM_BIG
    op = make_op(
        _abi.NPU_OP_GEMM,
        [ref(a, 0, nbytes), ref(b, 0, nbytes), ref(c, 0, nbytes)],
        [d, d, d, d, d, d, 0, 0],
    )
    before = last_submitted_fence()
    fence = submit(fd, [op] * GEMM_BIG_COUNT)
    yield fence, before
    wait(fd, fence, timeout_ns=120 * 10**9)


def test_wait_with_zero_timeout_on_running_work_fails_with_etimedout(fd, big_gemm):
    fence, _ = big_gemm
    assert_errno(errno.ETIMEDOUT, lambda: wait(fd, fence, timeout_ns=0))


def test_wait_with_short_timeout_on_running_work_fails_with_etimedout(fd, big_gemm):
    fence, _ = big_gemm
    assert_errno(errno.ETIMEDOUT, lambda: wait(fd, fence, timeout_ns=1_000_000))


def long_job(fd) -> int:
    """Queue 64 GEMMs of 1024^3 (seconds of work); return the last fence."""
    nbytes = GEMM_BIG * GEMM_BIG * 4
    a, b, c = (bo_create(fd, nbytes).handle for _ in range(3))
    d = GEMM_BIG
    refs = [ref(a, 0, nbytes), ref(b, 0, nbytes), ref(c, 0, nbytes)]
    op = make_op(_abi.NPU_OP_GEMM, refs, [d, d, d, d, d, d, 0, 0])
    fence = 0
    for _ in range(4):
        fence = submit(fd, [op] * GEMM_BIG_COUNT)
    return fence


def test_a_wait_never_times_out_before_its_deadline(fd):
    # Deadlines of 1 to 21 ms, not whole scheduler ticks: a jiffies-based
    # sleep (the old driver) rounds the time left down to whole ticks and
    # then wakes at a tick boundary, up to a tick before the deadline.
    fence = long_job(fd)
    early, timed_out = [], 0
    for i in range(40):
        deadline = time.monotonic_ns() + 1_000_000 + i * 513_000
        arg = _abi.NpuWait(fence=fence, deadline_ns=deadline, queue=0)
        try:
            ioctl(fd, _abi.DRM_IOCTL_NPU_WAIT, arg)
            break  # the job is done: no later WAIT can time out
        except OSError as exc:
            assert exc.errno == errno.ETIMEDOUT, errno.errorcode.get(exc.errno or 0)
        now = time.monotonic_ns()
        timed_out += 1
        if now < deadline:
            early.append(deadline - now)
    wait(fd, fence, timeout_ns=300 * 10**9)
    assert timed_out >= 10, timed_out
    assert not early, f"{len(early)} of {timed_out} WAITs ended early, by up to {max(early)} ns"


def test_a_wait_restarted_after_signals_still_ends_at_its_deadline(fd):
    # Signals every 20 ms with SA_RESTART: the kernel restarts the WAIT with
    # the same argument. The deadline is absolute, so the restarted calls
    # give up when the first would have; a relative timeout (the old ABI)
    # started again at each restart and waited for the whole job (64 GEMMs
    # of 1024^3, seconds).
    import signal

    fence = long_job(fd)
    hits = []
    old = signal.signal(signal.SIGALRM, lambda *_: hits.append(1))
    signal.siginterrupt(signal.SIGALRM, False)
    signal.setitimer(signal.ITIMER_REAL, 0.02, 0.02)
    try:
        t0 = time.monotonic()
        assert_errno(errno.ETIMEDOUT, lambda: wait(fd, fence, timeout_ns=200_000_000))
        took = time.monotonic() - t0
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)
    wait(fd, fence, timeout_ns=300 * 10**9)
    # The handler runs once the call returns (Python queues signals), so
    # one run stands for the ten interruptions the kernel restarted.
    assert hits
    assert 0.2 <= took < 1.0, took


def test_wait_on_work_queued_before_a_long_job_does_not_wait_for_it(fd, big_gemm):
    fence, before = big_gemm
    wait(fd, before, timeout_ns=10**9)
    assert_errno(errno.ETIMEDOUT, lambda: wait(fd, fence, timeout_ns=0))


# --------------------------------------------------------------------------
# mmap
# --------------------------------------------------------------------------


def test_mmap_of_a_whole_bo_and_of_one_page_of_it_succeeds(fd):
    bo = bo_create(fd, 4 * PAGE)
    whole = mmap.mmap(fd, 4 * PAGE, mmap.MAP_SHARED, RW, offset=bo.mmap_offset)
    part = mmap.mmap(fd, PAGE, mmap.MAP_SHARED, RW, offset=bo.mmap_offset + 2 * PAGE)
    part[:4] = b"abcd"
    assert whole[2 * PAGE : 2 * PAGE + 4] == b"abcd"
    part.close()
    whole.close()


@pytest.mark.parametrize(
    ("start_pages", "length_pages"),
    [(0, 17), (16, 1), (15, 2), (1, 16), (1 << 19, 1)],
    ids=["too_long", "starts_at_end", "crosses_end", "offset_plus_length", "far_page"],
)
def test_mmap_past_the_end_of_a_bo_fails_with_einval(fd, start_pages, length_pages):
    bo = bo_create(fd, 16 * PAGE)
    assert_errno(
        errno.EINVAL,
        lambda: mmap.mmap(
            fd, length_pages * PAGE, mmap.MAP_SHARED, RW, offset=bo.mmap_offset + start_pages * PAGE
        ),
    )


@pytest.mark.parametrize("beyond", [1 << 40, 1 << 46, (1 << 62) - (1 << 32)])  # off_t is signed
def test_mmap_at_an_offset_that_names_no_bo_fails_with_einval(fd, beyond):
    bo = bo_create(fd)
    assert_errno(
        errno.EINVAL,
        lambda: mmap.mmap(fd, PAGE, mmap.MAP_SHARED, RW, offset=bo.mmap_offset + beyond),
    )


def test_mmap_of_a_destroyed_bo_fails_with_einval(fd):
    bo = bo_create(fd)
    bo_destroy(fd, bo.handle)
    assert_errno(
        errno.EINVAL, lambda: mmap.mmap(fd, PAGE, mmap.MAP_SHARED, RW, offset=bo.mmap_offset)
    )


def test_mmap_of_another_fds_bo_fails_with_einval(fd, other_fd):
    bo = bo_create(other_fd)
    assert_errno(
        errno.EINVAL, lambda: mmap.mmap(fd, PAGE, mmap.MAP_SHARED, RW, offset=bo.mmap_offset)
    )


@pytest.mark.parametrize("prot", [mmap.PROT_READ, RW], ids=["read", "read_write"])
def test_mmap_private_fails_with_einval(fd, prot):
    bo = bo_create(fd)
    assert_errno(
        errno.EINVAL, lambda: mmap.mmap(fd, PAGE, mmap.MAP_PRIVATE, prot, offset=bo.mmap_offset)
    )


# --------------------------------------------------------------------------
# The runtime's errors
# --------------------------------------------------------------------------


def test_runtime_bo_create_of_size_zero_raises_npuerror_einval_with_context(dev):
    with pytest.raises(npu.NpuError) as info:
        dev.bo_create(0)
    assert info.value.errno == errno.EINVAL
    assert "BO_CREATE" in info.value.context
    assert "BO_CREATE" in str(info.value)


def test_runtime_alloc_beyond_max_bo_size_raises_npuerror_e2big(dev):
    with pytest.raises(npu.NpuError) as info:
        dev.alloc((1 << 30) + 1)
    assert info.value.errno == errno.E2BIG
    assert "BO_CREATE" in info.value.context


def test_runtime_bo_destroy_of_unknown_handle_raises_npuerror_enoent(dev):
    with pytest.raises(npu.NpuError) as info:
        dev.bo_destroy(4242)
    assert info.value.errno == errno.ENOENT
    assert "BO_DESTROY" in info.value.context
    assert "4242" in info.value.context


def test_runtime_submit_of_an_op_on_an_unknown_handle_raises_npuerror_enoent(dev):
    op = npu.Op(npu.Opcode.FILL, (npu.BufRef(4243, 0, 4096),), (0,))
    with pytest.raises(npu.NpuError) as info:
        dev.submit([op])
    assert info.value.errno == errno.ENOENT
    assert "SUBMIT" in info.value.context


def test_runtime_submit_of_an_out_of_range_op_raises_npuerror_erange(dev):
    with dev.alloc(4096) as buf:
        op = npu.Op(npu.Opcode.FILL, (npu.BufRef(buf.handle, 4096, 4096),), (0,), (buf,))
        with pytest.raises(npu.NpuError) as info:
            dev.submit([op])
    assert info.value.errno == errno.ERANGE
    assert "SUBMIT" in info.value.context


def test_runtime_wait_beyond_the_last_fence_raises_npuerror_einval(dev):
    fence = dev.run([ops.nop()])
    with pytest.raises(npu.NpuError) as info:
        dev.wait(fence + 1000)
    assert info.value.errno == errno.EINVAL
    assert "WAIT" in info.value.context
    assert not isinstance(info.value, (npu.NpuTimeoutError, npu.NpuDeviceError))


def test_runtime_wait_with_zero_timeout_on_running_work_raises_npu_timeout_error(dev):
    d = GEMM_BIG
    nbytes = d * d * 4
    with dev.alloc(nbytes) as a, dev.alloc(nbytes) as b, dev.alloc(nbytes) as c:
        fence = dev.submit([ops.gemm(a, b, c, d, d, d)] * GEMM_BIG_COUNT)
        with pytest.raises(npu.NpuTimeoutError) as info:
            dev.wait(fence, timeout_s=0)
        dev.wait(fence, timeout_s=120)
    assert info.value.errno == errno.ETIMEDOUT
    assert isinstance(info.value, TimeoutError)
    assert isinstance(info.value, npu.NpuError)
    assert info.value.fence == fence
    assert "WAIT" in info.value.context
