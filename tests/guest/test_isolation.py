"""Isolation between open files: each has its own device address space.

A buffer object is mapped only in the address space of the file that
created it, and a user queue's commands are confined to its file's space:
any other device address (another file's buffer, an unmapped VA, past the
end of the file's buffers, a write to a read-only userptr buffer, a
descriptor that names an address space with ``ctx``) faults. The device
stops the queue, the driver marks the file faulted (its SUBMIT and
QUEUE_CREATE fail with EBADFD), and every other file keeps working.

Separate ``npu.Device`` objects are separate open files; the cross-process
case runs file B in a forked process that had opened nothing before.
"""

from __future__ import annotations

import errno
import fcntl
import mmap
import multiprocessing
import time
import traceback
from collections.abc import Callable, Iterator
from multiprocessing.connection import Connection
from typing import Any

import numpy as np
import pytest
from guest_util import soak_cycles, wait_until

import npu
from npu import _abi, ops

PAGE = mmap.PAGESIZE
MiB = 1 << 20
SYSFS = "/sys/class/accel/accel0/device/npu"
WAIT_NS = 10 * 10**9
SECRET = 0x5EC2E7A5  # A's pattern
UNTOUCHED = 0x5A  # B's destination bytes before the faulting copy
NBYTES = 64 * 1024
# Where every file's address space mapped queue 0's shared parameter arena
# before each file got its own (npu_ctx_params()): now the first buffers.
PARAMS_VA = 2 * MiB
PARAMS_BYTES = 4096 * 256  # one 256-byte block per ring slot of queue 0
GEMMS = 64  # of 1024^3: A's work in flight while B faults (B takes ~20 ms)


# --------------------------------------------------------------------------
# Helpers
# --------------------------------------------------------------------------


def fdinfo(fd: int) -> dict[str, str]:
    out = {}
    with open(f"/proc/self/fdinfo/{fd}") as f:
        for line in f:
            key, _, value = line.partition(":")
            if key.startswith("npu-"):
                out[key] = value.strip()
    return out


def sysfs_int(name: str) -> int:
    with open(f"{SYSFS}/{name}") as f:
        return int(f.read())


def queue0_completed() -> int:
    with open(f"{SYSFS}/fences") as f:
        return int(f.read().split()[1])


def errno_of(call: Callable[[], object]) -> int:
    """The errno ``call`` fails with, 0 if it succeeds."""
    try:
        call()
    except OSError as exc:
        return exc.errno if exc.errno is not None else -1
    return 0


def raw_wait(fd: int, queue: int, fence: int, timeout_ns: int = WAIT_NS) -> tuple[int, int, int]:
    """WAIT; returns (errno or 0, status, error_fence)."""
    arg = _abi.NpuWait(fence=fence, deadline_ns=_abi.deadline_after(timeout_ns), queue=queue)
    try:
        fcntl.ioctl(fd, _abi.DRM_IOCTL_NPU_WAIT, arg, True)
    except OSError as exc:
        return exc.errno or -1, int(arg.status), int(arg.error_fence)
    return 0, int(arg.status), int(arg.error_fence)


def copy_cmd(src_va: int, dst_va: int, nbytes: int, ctx: int = 0) -> _abi.NpuCmd:
    c = _abi.NpuCmd(opcode=_abi.NPU_OP_COPY, ctx=ctx)
    c.copy.src, c.copy.dst, c.copy.len = src_va, dst_va, nbytes
    return c


def fill_cmd(dst_va: int, nbytes: int, pattern: int, ctx: int = 0) -> _abi.NpuCmd:
    c = _abi.NpuCmd(opcode=_abi.NPU_OP_FILL, ctx=ctx)
    c.fill.dst, c.fill.len, c.fill.pattern = dst_va, nbytes, pattern
    return c


def irq_nop() -> _abi.NpuCmd:
    return _abi.NpuCmd(opcode=_abi.NPU_OP_NOP, flags=_abi.NPU_CMD_F_IRQ)


def covers(bufs: list[npu.Buffer], va: int, nbytes: int = 1) -> bool:
    """Does any of ``bufs`` map a byte of [va, va + nbytes)?"""
    return any(b.va < va + nbytes and va < b.va + b.alloc_size for b in bufs)


def fault_with(q: npu.UserQueue, bad: _abi.NpuCmd) -> tuple[int, tuple[int, int, int]]:
    """Push ``bad`` and an interrupting NOP after it, WAIT (raw) for the NOP.

    The queue stops at ``bad``, so the WAIT reports the stop. Returns bad's
    fence and the WAIT's (errno, status, error_fence).
    """
    fence = q.push(bad)
    after = q.push(irq_nop())
    q.kick()
    return fence, raw_wait(q.device.fileno(), q.index, after)


def a_secret(a: npu.Device) -> tuple[npu.Buffer, npu.Buffer]:
    """A's buffer of SECRET words, at a VA above what B allocates, and the
    spacer (16 MiB of A's space below it) that keeps it there."""
    spacer = a.alloc(16 * MiB)
    secret = a.alloc(NBYTES)
    secret.numpy(np.uint32)[:] = SECRET
    return secret, spacer


def read_only_page(values: np.ndarray) -> np.ndarray:
    """A read-only, page-aligned page of ``values`` (uint8), for BO_USERPTR."""
    page = np.frombuffer(mmap.mmap(-1, PAGE), np.uint8)
    page[:] = values
    page.flags.writeable = False
    return page


def b_dst(b: npu.Device) -> npu.Buffer:
    dst = b.alloc(NBYTES)
    dst.numpy()[:] = UNTOUCHED
    return dst


@pytest.fixture
def a(dev_path: str) -> Iterator[npu.Device]:
    with npu.Device(dev_path) as d:
        yield d


@pytest.fixture
def b(dev_path: str) -> Iterator[npu.Device]:
    with npu.Device(dev_path) as d:
        yield d


@pytest.fixture
def faulted(a: npu.Device, b: npu.Device) -> dict[str, Any]:
    """B's user queue copied from A's secret's VA (B maps nothing there)."""
    secret, _spacer = a_secret(a)
    dst = b_dst(b)
    assert not covers([dst], secret.va, NBYTES)
    q = b.create_queue(16)
    fence, result = fault_with(q, copy_cmd(secret.va, dst.va, NBYTES))
    return {
        "secret": secret,
        "spacer": _spacer,
        "dst": dst,
        "queue": q,
        "fence": fence,
        "wait": result,
    }


# --------------------------------------------------------------------------
# A file's user queue reaches nothing of another file
# --------------------------------------------------------------------------


def test_copy_from_another_files_va_stops_the_queue_and_wait_gives_ebadfd(
    faulted: dict[str, Any],
) -> None:
    assert faulted["wait"] == (errno.EBADFD, _abi.NPU_ST_MMU_FAULT, faulted["fence"])


def test_copy_from_another_files_va_completes_with_mmu_fault(faulted: dict[str, Any]) -> None:
    q = faulted["queue"]
    assert q.completed() == faulted["fence"]  # the fault completed; nothing after it ran
    assert q.status(faulted["fence"]) == npu.Status.MMU_FAULT


def test_copy_from_another_files_va_reads_nothing_of_it(faulted: dict[str, Any]) -> None:
    dst = faulted["dst"].numpy()
    assert (dst == UNTOUCHED).all()
    assert (faulted["secret"].numpy(np.uint32) == SECRET).all()  # nor wrote to it


def test_a_fault_marks_only_the_faulting_file_in_fdinfo(
    a: npu.Device, b: npu.Device, faulted: dict[str, Any]
) -> None:
    assert fdinfo(b.fileno())["npu-faulted"] == "1"
    assert fdinfo(a.fileno())["npu-faulted"] == "0"
    assert fdinfo(a.fileno())["npu-ctx"] != fdinfo(b.fileno())["npu-ctx"]


def test_a_faulted_file_refuses_submit_queue_create_and_wait_with_ebadfd(
    b: npu.Device, faulted: dict[str, Any]
) -> None:
    del faulted
    for call in (
        lambda: b.submit([ops.nop()]),
        lambda: b.create_queue(16),
        lambda: b.wait(0),
    ):
        with pytest.raises(npu.NpuError) as info:
            call()
        assert info.value.errno == errno.EBADFD


def test_the_runtime_reports_the_fault_as_npu_device_error_ebadfd(
    faulted: dict[str, Any],
) -> None:
    q = faulted["queue"]
    with pytest.raises(npu.NpuDeviceError) as info:
        q.wait(faulted["fence"])
    assert info.value.errno == errno.EBADFD
    assert info.value.status == npu.Status.MMU_FAULT
    assert info.value.fence == faulted["fence"]
    with pytest.raises(npu.NpuError) as again:
        q.nop()  # the queue has stopped
    assert again.value.errno == errno.EBADFD


def test_other_files_keep_working_after_a_fault(
    a: npu.Device, faulted: dict[str, Any], dev_path: str
) -> None:
    secret = faulted["secret"]
    out = a.alloc(NBYTES)
    a.run([ops.copy(secret, out, NBYTES)])
    with a.create_queue(16) as q:
        q.wait(q.fill(out, 7, PAGE))
    want = np.full(NBYTES // 4, SECRET, np.uint32)
    want[: PAGE // 4] = 7
    np.testing.assert_array_equal(out.numpy(np.uint32), want)
    with npu.Device(dev_path) as c, c.alloc(PAGE) as buf:
        c.run([ops.fill(buf, 9, PAGE)])  # and files opened later
        assert (buf.numpy(np.uint32) == 9).all()


def test_a_faulted_file_reports_its_pending_op_error_with_eio_before_ebadfd(
    b: npu.Device,
) -> None:
    if not b.info.has(npu.Cap.QUANT):
        pytest.skip("needs REQUANT (Cap.QUANT) for an op the device fails")
    acc, scale, out = b.alloc(64), b.alloc(4), b.alloc(16)
    scale.numpy(np.float32)[:] = np.nan  # the device fails it with BAD_QUANT
    op = ops.requant_op(
        ops.tensor_ref(acc, npu.DType.INT32, (1, 16)),
        ops.tensor_ref(scale, npu.DType.FP32, (1, 1)),
        ops.tensor_ref(out, npu.DType.INT8, (1, 16)),
    )
    fence = b.submit([op])
    assert wait_until(lambda: queue0_completed() >= fence)  # without taking its error
    dst = b_dst(b)
    q = b.create_queue(16)
    result = fault_with(q, fill_cmd(dst.va + 64 * MiB, PAGE, 1))[1]
    assert result[:2] == (errno.EBADFD, _abi.NPU_ST_MMU_FAULT)
    assert raw_wait(b.fileno(), 0, fence) == (errno.EIO, _abi.NPU_ST_BAD_QUANT, fence)
    assert raw_wait(b.fileno(), 0, fence)[0] == errno.EBADFD


def test_wait_on_the_faulting_fence_itself_gives_ebadfd(a: npu.Device, b: npu.Device) -> None:
    secret, _spacer = a_secret(a)
    dst = b_dst(b)
    q = b.create_queue(16)
    bad = copy_cmd(secret.va, dst.va, NBYTES)
    bad.flags = _abi.NPU_CMD_F_IRQ
    fence = q.push(bad)
    q.kick()
    assert raw_wait(b.fileno(), q.index, fence) == (
        errno.EBADFD,
        _abi.NPU_ST_MMU_FAULT,
        fence,
    )


# --------------------------------------------------------------------------
# Addresses a file's queue may not use
# --------------------------------------------------------------------------


def test_a_copy_into_a_read_only_userptr_buffer_faults(b: npu.Device) -> None:
    mem = read_only_page(np.full(PAGE, 3, np.uint8))
    ro, offset = b.userptr(mem)
    assert ro.readonly and offset == 0
    src = b.alloc(PAGE)
    src.numpy()[:] = 0xEE
    q = b.create_queue(16)
    fence, result = fault_with(q, copy_cmd(src.va, ro.va, PAGE))
    assert result == (errno.EBADFD, _abi.NPU_ST_MMU_FAULT, fence)
    assert (mem == 3).all()
    assert fdinfo(b.fileno())["npu-faulted"] == "1"


def test_a_read_only_userptr_buffer_can_still_be_read(b: npu.Device) -> None:
    mem = read_only_page(np.arange(PAGE, dtype=np.uint8))
    ro, offset = b.userptr(mem)
    assert offset == 0
    dst = b.alloc(PAGE)
    with b.create_queue(16) as q:
        q.wait(q.copy(ro, dst, PAGE))
    np.testing.assert_array_equal(dst.numpy(), mem)


def test_a_copy_past_the_end_of_the_files_last_buffer_faults(b: npu.Device) -> None:
    first, last = b.alloc(4 * PAGE), b.alloc(4 * PAGE)
    first.numpy()[:] = 1
    top = max(first, last, key=lambda buf: buf.va)
    end = top.va + top.alloc_size
    assert not covers([first, last], end)
    other = first if top is last else last
    q = b.create_queue(16)
    fence, result = fault_with(q, copy_cmd(top.va + PAGE, other.va, 4 * PAGE))
    assert result == (errno.EBADFD, _abi.NPU_ST_MMU_FAULT, fence)
    assert q.status(fence) == npu.Status.MMU_FAULT


@pytest.mark.parametrize(
    "va",
    [0, PAGE, 64 * MiB, (8 << 30) - PAGE, 8 << 30, 1 << 47],
    ids=["zero", "first_page", "unmapped", "last_page", "past_the_va_space", "huge"],
)
def test_a_fill_of_an_address_the_file_does_not_map_faults(b: npu.Device, va: int) -> None:
    dst = b_dst(b)
    assert not covers([dst], va, PAGE)
    q = b.create_queue(16)
    fence, result = fault_with(q, fill_cmd(va, PAGE, 0xFFFFFFFF))
    assert result == (errno.EBADFD, _abi.NPU_ST_MMU_FAULT, fence)


@pytest.mark.parametrize("which", ["own", "another_files", "unused", "beyond_the_table"])
def test_a_descriptor_naming_an_address_space_with_ctx_faults(
    a: npu.Device, b: npu.Device, which: str
) -> None:
    ctx = {
        "own": int(fdinfo(b.fileno())["npu-ctx"]),
        "another_files": int(fdinfo(a.fileno())["npu-ctx"]),
        "unused": 1000,
        "beyond_the_table": 0xFFFF,
    }[which]
    secret, _spacer = a_secret(a)
    dst = b_dst(b)
    q = b.create_queue(16)
    fence, result = fault_with(q, copy_cmd(secret.va, dst.va, NBYTES, ctx=ctx))
    assert result == (errno.EBADFD, _abi.NPU_ST_MMU_FAULT, fence)
    assert (dst.numpy() == UNTOUCHED).all()


def test_a_user_queue_cannot_read_other_files_tensor_op_parameters(
    a: npu.Device, b: npu.Device
) -> None:
    x = a.alloc(PAGE)
    shape = (37, 11)  # 407 fp32 elements: a recognisable pair in the block
    t_in = ops.tensor_ref(x, npu.DType.FP32, shape)
    t_out = ops.tensor_ref(x, npu.DType.FP32, (1, 1))
    a.run([ops.reduce(npu.ReduceKind.SUM, t_in, t_out, axes=(0, 1))])
    dst = b.alloc(PARAMS_BYTES)
    q = b.create_queue(16)
    fence, result = fault_with(q, copy_cmd(PARAMS_VA, dst.va, PARAMS_BYTES))
    words = dst.numpy(np.uint32)
    leaked = np.flatnonzero((words[:-1] == shape[0]) & (words[1:] == shape[1]))
    del fence, result
    assert leaked.size == 0, f"A's shape {shape} found at words {leaked[:4]}"


# --------------------------------------------------------------------------
# Another process
# --------------------------------------------------------------------------


def process_b(conn: Connection, dev_path: str) -> None:
    """File B in its own process: probe A's handles and queue, then fault."""
    report: dict[str, Any] = {}
    try:
        with npu.Device(dev_path) as b:
            fd = b.fileno()
            dst = b_dst(b)
            # Priority 1, the kernel queue's: B's commands take turns with A's
            # SUBMITs instead of waiting for all of them.
            q = b.create_queue(16, priority=1)
            report["b_queue"] = q.index
            conn.send("ready")
            info = conn.recv()
            t0 = time.monotonic()
            handle = info["handle"]
            report["bo_destroy"] = errno_of(lambda: b.bo_destroy(handle))
            ref = ops.BufRef(handle, 0, PAGE)
            report["submit"] = errno_of(lambda: b.submit([ops.Op(npu.Opcode.FILL, (ref,), (0,))]))
            report["mmap"] = errno_of(
                lambda: mmap.mmap(fd, PAGE, mmap.MAP_SHARED, offset=info["mmap_offset"])
            )
            qa = info["queue"]
            report["wait_on_a_queue"] = raw_wait(fd, qa, 1, 0)[0]
            report["destroy_a_queue"] = errno_of(
                lambda: fcntl.ioctl(
                    fd, _abi.DRM_IOCTL_NPU_QUEUE_DESTROY, _abi.NpuQueueDestroy(queue=qa), True
                )
            )
            report["map_a_doorbell"] = errno_of(
                lambda: mmap.mmap(fd, PAGE, mmap.MAP_SHARED, offset=qa << 24)
            )
            report["b_maps_a_secret"] = covers([dst], info["va"], NBYTES)
            fence, report["wait"] = fault_with(q, copy_cmd(info["va"], dst.va, NBYTES))
            report["seconds_to_fault"] = time.monotonic() - t0
            report["fence"] = fence
            report["status"] = q.status(fence)
            report["dst_untouched"] = bool((dst.numpy() == UNTOUCHED).all())
            report["faulted"] = fdinfo(fd)["npu-faulted"]
            report["submit_after"] = errno_of(lambda: b.submit([ops.nop()]))
            report["queue_create_after"] = errno_of(lambda: b.create_queue(16))
            report["wait0_after"] = raw_wait(fd, 0, 0)[0]
    except BaseException:
        report["error"] = traceback.format_exc()
    conn.send(report)
    conn.close()


def test_a_process_faulting_on_another_processs_memory_leaves_it_running(dev_path: str) -> None:
    """A keeps a long stream of work in flight (GEMMs through SUBMIT, FILLs
    through its user queue) while B, another process, probes A's handles and
    queue and then faults on A's buffer's VA; A's results stay right."""
    ctx = multiprocessing.get_context("fork")
    parent_end, child_end = ctx.Pipe()
    child = ctx.Process(target=process_b, args=(child_end, dev_path))
    child.start()  # before A opens anything: B inherits no NPU file
    try:
        assert parent_end.poll(60) and parent_end.recv() == "ready", "process B did not start"
        with npu.Device(dev_path) as a:
            secret, _spacer = a_secret(a)
            n = 1024
            rng = np.random.default_rng(3)
            x = rng.standard_normal((n, n), dtype=np.float32)
            ma, eye, mc = a.alloc(n * n * 4), a.alloc(n * n * 4), a.alloc(n * n * 4)
            ma.numpy(np.float32, (n, n))[:] = x
            eye.numpy(np.float32, (n, n))[:] = np.eye(n, dtype=np.float32)
            gemms = a.submit([ops.gemm(ma, eye, mc, n, n, n)] * GEMMS)  # ~1 s of work
            stream = a.alloc(256 * PAGE)
            qa = a.create_queue(256)
            for i in range(255):
                qa.fill(stream, i * 0x01010101, PAGE, i * PAGE)
            qa.kick()

            parent_end.send(
                {
                    "va": secret.va,
                    "handle": secret.handle,
                    "mmap_offset": secret.mmap_offset,
                    "queue": qa.index,
                }
            )
            assert parent_end.poll(120), "process B did not report"
            report = parent_end.recv()
            with pytest.raises(npu.NpuTimeoutError):  # A's work was still in flight
                a.wait(gemms, timeout_s=0)

            a.wait(gemms, timeout_s=120)
            qa.synchronize(timeout_s=60)
            np.testing.assert_array_equal(mc.numpy(np.float32, (n, n)), x)
            want = np.repeat(np.arange(256, dtype=np.uint32) * 0x01010101, PAGE // 4)
            want[-PAGE // 4 :] = 0
            np.testing.assert_array_equal(stream.numpy(np.uint32), want)
            # and after B's fault, new work too
            a.run([ops.copy(secret, ma, NBYTES)])
            qa.wait(qa.fill(stream, 1, PAGE))
            assert (ma.numpy(np.uint32)[: NBYTES // 4] == SECRET).all()
            assert (stream.numpy(np.uint32)[: PAGE // 4] == 1).all()
            assert fdinfo(a.fileno())["npu-faulted"] == "0"
    finally:
        child.join(30)
        if child.is_alive():
            child.kill()
    assert "error" not in report, report.get("error")
    assert report["bo_destroy"] == errno.ENOENT
    assert report["submit"] == errno.ENOENT
    assert report["mmap"] == errno.EINVAL
    assert report["wait_on_a_queue"] == errno.ENOENT
    assert report["destroy_a_queue"] == errno.ENOENT
    assert report["map_a_doorbell"] == errno.EINVAL
    assert report["b_queue"] != qa.index
    assert not report["b_maps_a_secret"]
    assert report["wait"] == (errno.EBADFD, _abi.NPU_ST_MMU_FAULT, report["fence"])
    assert report["status"] == npu.Status.MMU_FAULT
    assert report["dst_untouched"]
    assert report["faulted"] == "1"
    assert report["submit_after"] == errno.EBADFD
    assert report["queue_create_after"] == errno.EBADFD
    assert report["wait0_after"] == errno.EBADFD
    assert child.exitcode == 0


# --------------------------------------------------------------------------
# Address space reuse: nothing leaks across a soak of buffer objects
# (10,000 at NPU_STRESS_SCALE=full, a tenth in make test)
# --------------------------------------------------------------------------


def test_bo_cycles_reuse_the_address_space_and_leave_the_counters_at_baseline(
    dev: npu.Device,
) -> None:
    """Raw BO_CREATE/BO_DESTROY on a file with a user queue: the VAs are
    recycled (a reused VA reaches the new buffer's pages), and the file's
    fdinfo and the device's sysfs counters come back to where they were."""
    fd = dev.fileno()
    device_before = (sysfs_int("bo_count"), sysfs_int("bo_bytes"))
    file_before = fdinfo(fd)
    q = dev.create_queue(16)
    vas = set()
    for i in range(soak_cycles(10_000)):
        size = PAGE * (1 + i % 8)
        arg = _abi.NpuBoCreate(size=size)
        fcntl.ioctl(fd, _abi.DRM_IOCTL_NPU_BO_CREATE, arg, True)
        vas.add(int(arg.va))
        if i % 1000 == 999:  # the device writes the new buffer through the reused VA
            view = mmap.mmap(fd, size, mmap.MAP_SHARED, offset=arg.mmap_offset)
            q.wait(q.push(fill_cmd(arg.va, size, i)))
            assert (np.frombuffer(view, np.uint32) == i).all()
            view.close()
        fcntl.ioctl(fd, _abi.DRM_IOCTL_NPU_BO_DESTROY, _abi.NpuBoDestroy(handle=arg.handle), True)
    q.close()
    assert max(vas) - min(vas) < 64 * PAGE, "VAs are not recycled"
    assert fdinfo(fd)["npu-bo-count"] == file_before["npu-bo-count"]
    assert fdinfo(fd)["npu-memory-host"] == file_before["npu-memory-host"]
    assert (sysfs_int("bo_count"), sysfs_int("bo_bytes")) == device_before


def test_a_destroyed_buffers_va_faults_for_the_user_queue(b: npu.Device) -> None:
    keep, gone = b.alloc(PAGE), b.alloc(PAGE)
    va = gone.va
    gone.free()
    assert not covers([keep], va)
    q = b.create_queue(16)
    fence, result = fault_with(q, fill_cmd(va, PAGE, 1))
    assert result == (errno.EBADFD, _abi.NPU_ST_MMU_FAULT, fence)
