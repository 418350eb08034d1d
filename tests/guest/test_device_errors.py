"""Errors detected by the device itself, and recovery from them.

``SUBMIT`` validates every op, so a well-formed op cannot make the device
fail; ``/sys/kernel/debug/npu/npu0/inject_cmd`` queues a raw descriptor that
bypasses that validation to exercise the device's rejection path. The one
device-side failure a user's own op can see through ``WAIT`` is ``ABORTED``:
the device is removed (PCI unbind) while the op is in flight.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import fcntl
import mmap
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator

import kmsg
import numpy as np
import pytest

import npu
from npu import _abi, ops

SYSFS = "/sys/class/accel/accel0/device/npu"
INJECT = "/sys/kernel/debug/npu/npu0/inject_cmd"
PCI_DRIVER = "/sys/bus/pci/drivers/npu"
BAD_DMESG = ("Oops", "BUG:", "WARNING:", "general protection", "Call Trace")
MiB = 1 << 20


def read_int(attr: str) -> int:
    with open(f"{SYSFS}/{attr}") as f:
        return int(f.read().split()[0])


def fences() -> tuple[int, int]:
    with open(f"{SYSFS}/fences") as f:
        submitted, completed = f.read().split()
    return int(submitted), int(completed)


def poll(predicate: Callable[[], bool], timeout_s: float = 5.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return True


def inject(opcode: int | str) -> None:
    with open(INJECT, "w") as f:
        f.write(f"{opcode}\n")


def dmesg() -> str:
    return subprocess.run(["dmesg"], capture_output=True, text=True, check=True).stdout


def assert_no_oops(log: str) -> None:
    bad = [line for line in log.splitlines() if any(word in line for word in BAD_DMESG)]
    assert not bad, "kernel log:\n" + "\n".join(bad)


def assert_gemm_works(dev: npu.Device) -> None:
    m, n, k = 24, 13, 37
    rng = np.random.default_rng(11)
    a = rng.standard_normal((m, k), dtype=np.float32)
    b = rng.standard_normal((k, n), dtype=np.float32)
    with dev.alloc(a.nbytes) as ba, dev.alloc(b.nbytes) as bb, dev.alloc(m * n * 4) as bc:
        ba.write(a)
        bb.write(b)
        fence = dev.submit([ops.gemm(ba, bb, bc, m, n, k)])
        dev.wait(fence)
        np.testing.assert_allclose(bc.numpy(np.float32, (m, n)), a @ b, rtol=1e-4, atol=1e-4)


@pytest.fixture
def idle() -> None:
    assert poll(lambda: fences()[0] == fences()[1], 30), f"device busy: {fences()}"


# --------------------------------------------------------------------------
# Descriptors the device rejects
# --------------------------------------------------------------------------


def test_injected_invalid_opcode_counts_one_op_error(idle):
    before = read_int("op_errors")
    inject(65535)
    assert poll(lambda: read_int("op_errors") == before + 1), "op_errors did not go up by one"
    assert poll(lambda: fences()[0] == fences()[1])
    assert read_int("op_errors") == before + 1


def test_device_computes_correctly_after_rejecting_a_descriptor(dev, idle):
    dmesg_before = dmesg()
    before = read_int("op_errors")
    inject(65535)
    assert poll(lambda: read_int("op_errors") == before + 1)
    assert_gemm_works(dev)
    assert read_int("op_errors") == before + 1
    assert_no_oops(dmesg()[len(dmesg_before) :] if dmesg().startswith(dmesg_before) else dmesg())


@pytest.mark.parametrize(
    "opcode",
    [4, 0x8000, 65535, _abi.NPU_OP_COPY, _abi.NPU_OP_FILL, _abi.NPU_OP_GEMM],
    ids=[
        "opcode_4",
        "opcode_0x8000",
        "opcode_65535",
        "copy_of_nothing",
        "fill_of_nothing",
        "gemm_of_nothing",
    ],
)
def test_each_descriptor_the_device_rejects_counts_one_op_error(idle, opcode):
    before = read_int("op_errors")
    inject(opcode)
    assert poll(lambda: fences()[0] == fences()[1])
    assert poll(lambda: read_int("op_errors") == before + 1)


def test_injected_nop_completes_without_an_op_error(idle):
    before = read_int("op_errors")
    submitted_before, _ = fences()
    inject(_abi.NPU_OP_NOP)
    assert poll(lambda: fences() == (submitted_before + 1, submitted_before + 1))
    assert read_int("op_errors") == before


def test_rejected_descriptor_does_not_reset_the_device(idle):
    before = read_int("recoveries")
    inject(65535)
    assert poll(lambda: fences()[0] == fences()[1])
    assert read_int("recoveries") == before


def test_injected_descriptor_takes_the_next_fence_between_submits(dev, idle):
    first = dev.submit([ops.nop()])
    inject(65535)
    second = dev.submit([ops.nop()])
    assert second == first + 2
    dev.wait(second)


def test_failure_of_a_descriptor_of_no_fd_is_not_reported_to_another_fds_wait(dev, idle):
    before = read_int("op_errors")
    first = dev.submit([ops.nop()])
    inject(65535)
    second = dev.submit([ops.nop()])
    dev.wait(second)  # no NpuDeviceError: the failed op is not this fd's
    dev.wait(first)
    assert read_int("op_errors") == before + 1


@pytest.mark.parametrize(
    "text", ["65536", "-1", "nop", ""], ids=["too_big", "negative", "word", "empty"]
)
def test_inject_cmd_refuses_text_that_is_not_a_16_bit_opcode(idle, text):
    submitted_before, _ = fences()
    with pytest.raises(OSError) as info:
        inject(text)
    assert info.value.errno in (errno.EINVAL, errno.ERANGE)
    assert fences()[0] == submitted_before


def test_many_rejected_descriptors_in_a_row_leave_the_device_working(dev, idle):
    before = read_int("op_errors")
    for _ in range(50):
        inject(65535)
    assert poll(lambda: read_int("op_errors") == before + 50, 10)
    assert_gemm_works(dev)


# --------------------------------------------------------------------------
# Device removal: WAIT reports ABORTED, everything else ENODEV
# --------------------------------------------------------------------------


def pci_address() -> str:
    return os.path.basename(os.path.realpath(os.path.dirname(SYSFS)))


def ioctl(fd: int, request: int, arg) -> None:
    fcntl.ioctl(fd, request, arg, True)


class Removed:
    """An fd whose device was unbound while a lot of its work was in flight."""

    fd: int
    last_fence: int
    num_jobs: int
    mapping: mmap.mmap
    handle: int
    mmap_offset: int
    waiter: tuple[int, int, int]  # errno, status, error_fence of a WAIT across removal


# Known, left to the DRM accel rewrite (issue 16; docs/reliability.md): the
# ring, completion and MMU memory, and user-queue memory still mapped into
# processes, outlive the unbind (files and mappings keep them), so the
# DMA-API debug code reports coherent allocations pending at release. A
# strict xfail on the debug kernel: it fails once the report is gone.
UNBIND_KEEPS_DMA_MEMORY = pytest.mark.known_kernel_report(
    kmsg.KNOWN_REPORTS["unbind-keeps-dma-memory"],
    reason="DMA memory outlives the unbind (issue 16)",
    when="/sys/kernel/debug/dma-api",
)


@pytest.fixture
def removed(dev_path, idle) -> Iterator[Removed]:
    address = pci_address()
    r = Removed()
    r.fd = os.open(dev_path, os.O_RDWR)
    try:
        bos = []
        for _ in range(2):
            arg = _abi.NpuBoCreate(size=4 * MiB)
            ioctl(r.fd, _abi.DRM_IOCTL_NPU_BO_CREATE, arg)
            bos.append(arg)
        r.handle = bos[0].handle
        r.mmap_offset = bos[0].mmap_offset
        r.mapping = mmap.mmap(
            r.fd,
            4 * MiB,
            mmap.MAP_SHARED,
            mmap.PROT_READ | mmap.PROT_WRITE,
            offset=bos[0].mmap_offset,
        )
        r.mapping[:8] = b"survivor"
        refs = [_abi.NpuBufRef(handle=bo.handle, offset=0, size=4 * MiB) for bo in bos]
        op_list = []
        for i in range(256):
            op = _abi.NpuOp(opcode=_abi.NPU_OP_COPY, num_bufs=2)
            op.bufs[0], op.bufs[1] = refs[i % 2], refs[1 - i % 2]
            op_list.append(op)
        raw = (_abi.NpuOp * 256)(*op_list)
        # 8 GiB of copies: seconds of work; the unbind comes within milliseconds.
        r.num_jobs = 8
        for _ in range(r.num_jobs):
            arg = _abi.NpuSubmit(
                ops_ptr=ctypes.addressof(raw),
                num_ops=256,
                queue=0,
                op_size=ctypes.sizeof(_abi.NpuOp),
            )
            ioctl(r.fd, _abi.DRM_IOCTL_NPU_SUBMIT, arg)
            r.last_fence = int(arg.fence)

        # A WAIT asleep on the last job when the device goes.
        def waiter() -> None:
            arg = _abi.NpuWait(fence=r.last_fence, deadline_ns=_abi.deadline_after(60 * 10**9))
            try:
                ioctl(r.fd, _abi.DRM_IOCTL_NPU_WAIT, arg)
                r.waiter = (0, int(arg.status), int(arg.error_fence))
            except OSError as exc:
                r.waiter = (exc.errno, int(arg.status), int(arg.error_fence))

        thread = threading.Thread(target=waiter)
        thread.start()
        time.sleep(0.2)
        with open(f"{PCI_DRIVER}/unbind", "w") as f:
            f.write(address)
        thread.join()
        yield r
    finally:
        with contextlib.suppress(AttributeError):
            r.mapping.close()
        os.close(r.fd)
        if not os.path.exists(f"{PCI_DRIVER}/{address}"):
            with open(f"{PCI_DRIVER}/bind", "w") as f:
                f.write(address)
        assert poll(lambda: os.path.exists(dev_path) and os.path.exists(INJECT), 10), (
            "the device did not come back after bind"
        )


@UNBIND_KEEPS_DMA_MEMORY
def test_a_wait_asleep_at_removal_returns_eio_with_status_aborted(removed):
    # Removal fails the jobs in flight and wakes their waiters.
    code, status, error_fence = removed.waiter
    assert code == errno.EIO, errno.errorcode.get(code, code)
    assert status == _abi.NPU_ST_ABORTED
    assert 0 < error_fence <= removed.last_fence


@UNBIND_KEEPS_DMA_MEMORY
def test_every_call_fails_with_enodev_after_removal(removed):
    # WAIT too: DRM refuses every ioctl of an unplugged device.
    fd = removed.fd
    wait = _abi.NpuWait(fence=removed.last_fence, deadline_ns=_abi.deadline_after(10**9))
    calls = {
        "WAIT": lambda: ioctl(fd, _abi.DRM_IOCTL_NPU_WAIT, wait),
        "GET_INFO": lambda: ioctl(fd, _abi.DRM_IOCTL_NPU_GET_INFO, _abi.NpuInfo()),
        "BO_CREATE": lambda: ioctl(fd, _abi.DRM_IOCTL_NPU_BO_CREATE, _abi.NpuBoCreate(size=4096)),
        "BO_DESTROY": lambda: ioctl(
            fd, _abi.DRM_IOCTL_NPU_BO_DESTROY, _abi.NpuBoDestroy(handle=removed.handle)
        ),
        "SUBMIT": lambda: ioctl(
            fd,
            _abi.DRM_IOCTL_NPU_SUBMIT,
            _abi.NpuSubmit(
                ops_ptr=ctypes.addressof(_keep), num_ops=1, op_size=ctypes.sizeof(_abi.NpuOp)
            ),
        ),
        "mmap": lambda: mmap.mmap(
            fd, 4096, mmap.MAP_SHARED, mmap.PROT_READ, offset=removed.mmap_offset
        ),
    }
    _keep = _abi.NpuOp()
    got = {}
    for name, call in calls.items():
        try:
            call()
            got[name] = "success"
        except OSError as exc:
            got[name] = errno.errorcode.get(exc.errno, exc.errno)
    assert got == {name: "ENODEV" for name in calls}


@UNBIND_KEEPS_DMA_MEMORY
def test_a_mapping_made_before_removal_is_zapped(removed):
    # drm_dev_unplug() unmaps every CPU mapping of the device: a touch is
    # SIGBUS (in a child, which it kills).
    sys.stdout.flush()
    pid = os.fork()
    if pid == 0:
        try:
            removed.mapping[:8]
        finally:
            os._exit(0)
    _, status = os.waitpid(pid, 0)
    assert os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGBUS, status


def test_device_works_again_after_rebind(dev_path):
    # Runs after the removal tests; their fixture rebinds the driver.
    with npu.Device(dev_path) as dev:
        assert dev.info.max_submit == 256
        assert_gemm_works(dev)
