"""PCI unbind and rebind while a file is open and a buffer is mapped.

What the driver guarantees (docs/uapi.md, docs/reliability.md):

- after removal every call on an old file fails with ENODEV, WAIT and
  mmap too (DRM refuses the ioctls of an unplugged device);
- a WAIT sleeping at removal time returns;
- removal zaps every CPU mapping of the device's files, host BOs and
  device-memory (BAR2) BOs alike: a later touch is SIGBUS, so no process
  keeps reaching device memory the next binding gives to others;
- close() works, and the memory of the old device's BOs is freed when the
  last file and mapping are gone; then the old device's accel minor is
  free too, and a rebind is accel0 (/dev/npu0) again;
- bind brings /dev/npu0 back, working, with fresh counters.

A second test unbinds while processes submit in a loop (ioctls racing the
removal), ten times.
"""

from __future__ import annotations

import ctypes
import errno
import os
import signal
import sys
import time
from collections.abc import Callable

import numpy as np
import pytest

from npu import _abi, ops

from . import stress_util as su

DRIVER = "/sys/bus/pci/drivers/npu"
BIG = 128 * su.MiB


def _unbind(addr: str) -> None:
    with open(f"{DRIVER}/unbind", "w") as f:
        f.write(addr)
    su.wait_dev(False)


def _bind(addr: str) -> None:
    with open(f"{DRIVER}/bind", "w") as f:
        f.write(addr)
    su.wait_dev(True)


@pytest.fixture
def pci_addr():
    addr = su.pci_address()
    yield addr
    if not os.path.exists(f"{DRIVER}/{addr}"):  # a failed test left it unbound
        _bind(addr)


def _errno_of(call) -> int:
    try:
        call()
    except OSError as e:
        return e.errno
    return 0


def _computes() -> None:
    fd = os.open(su.DEV_PATH, os.O_RDWR)
    try:
        a, b = su.Bo(fd, 64 * 1024), su.Bo(fd, 64 * 1024)
        ma, mb = a.map(), b.map()
        ma[:] = os.urandom(len(ma))
        su.wait(fd, su.submit(fd, [ops.copy(a, b, a.size).pack()]))
        assert ma[:] == mb[:]
        ma.close()
        mb.close()
    finally:
        os.close(fd)


def _dies_of_sigbus(touch: Callable[[], object]) -> bool:
    """Does a child process that runs ``touch`` die of SIGBUS?"""
    sys.stdout.flush()
    pid = os.fork()
    if pid == 0:
        try:
            touch()
        finally:
            os._exit(0)
    _, status = os.waitpid(pid, 0)
    return os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGBUS


def test_unbind_with_an_open_file_and_a_mapped_bo_then_rebind(pci_addr, record_property):
    fd = os.open(su.DEV_PATH, os.O_RDWR)
    bo = su.Bo(fd, BIG)
    m = bo.map()
    su.wait(fd, su.submit(fd, [ops.fill(bo, 0xFEEDF00D, bo.size).pack()]))
    # A device-memory BO mapped through BAR2, which the next binding reuses.
    dev_bo = su.Bo(fd, su.PAGE, flags=_abi.NPU_BO_DEVICE)
    dev_map = dev_bo.map()
    np.frombuffer(dev_map, np.uint32)[:] = 0xD0D0D0D0
    # Work in flight at removal: GEMMs on 1024 x 1024 matrices.
    g = [su.Bo(fd, 1024 * 1024 * 4) for _ in range(3)]
    fence = 0
    for _ in range(32):
        fence = su.submit(fd, [ops.gemm(*g, 1024, 1024, 1024).pack()] * 8)
    # A process sleeping in WAIT (on its own file) at removal time.
    r, w = os.pipe()
    sys.stdout.flush()
    pid = os.fork()
    if pid == 0:
        code = 0
        try:
            os.close(r)
            f2 = os.open(su.DEV_PATH, os.O_RDWR)
            os.write(w, b"S")
            code = _errno_of(lambda: su.wait(f2, fence, timeout_s=300))
            os.write(w, bytes([code]))
            os.close(f2)
        except BaseException as e:
            print(e, file=sys.stderr)
            code = 255
        finally:
            os._exit(code)
    os.close(w)
    assert os.read(r, 1) == b"S"
    time.sleep(0.2)
    inject = "/sys/kernel/debug/npu/npu0/inject_cmd"
    assert os.path.exists(inject)

    submitted, completed = su.fences()
    t0 = time.monotonic()
    _unbind(pci_addr)
    unbind_s = time.monotonic() - t0
    assert not os.path.exists("/sys/class/accel/accel0/device/npu")
    assert not os.path.exists(inject)

    # The sleeping waiter came back (0: its file had no failed op).
    os.set_blocking(r, True)
    got = os.read(r, 1)
    _, status = os.waitpid(pid, 0)
    os.close(r)
    assert got == b"\x00" and status == 0, (got, status)

    # Every call, WAIT too (DRM refuses the ioctls of an unplugged device): ENODEV.
    assert (
        _errno_of(lambda: su.check_ioctl(fd, _abi.DRM_IOCTL_NPU_GET_INFO, _abi.NpuInfo()))
        == errno.ENODEV
    )
    assert _errno_of(lambda: su.Bo(fd, 4096)) == errno.ENODEV
    assert _errno_of(bo.destroy) == errno.ENODEV
    assert _errno_of(lambda: su.submit(fd, [ops.nop().pack()])) == errno.ENODEV
    buf = su.anon_map(su.PAGE)
    up = _abi.NpuBoUserptr(addr=buf, size=su.PAGE)
    assert _errno_of(lambda: su.check_ioctl(fd, _abi.DRM_IOCTL_NPU_BO_USERPTR, up)) == errno.ENODEV
    assert _errno_of(lambda: bo.map()) == errno.ENODEV
    fi = _abi.NpuFenceInfo(fence=1, queue=0)
    assert _errno_of(lambda: su.check_ioctl(fd, _abi.DRM_IOCTL_NPU_FENCE_INFO, fi)) == errno.ENODEV
    arg = _abi.NpuWait(fence=fence, deadline_ns=_abi.deadline_after(10**9), queue=0)
    e = su.raw_ioctl(fd, _abi.DRM_IOCTL_NPU_WAIT, ctypes.addressof(arg))
    assert e == errno.ENODEV, su.errname(e)
    # The in-flight ops were aborted (or had finished): the sleeping
    # waiter above saw it.
    aborted = submitted - completed > 0
    # fdinfo of an unplugged device is empty (DRM prints nothing then).
    assert not any(k.startswith(("drm-", "npu-")) for k in su.fdinfo(fd)), su.fdinfo(fd)

    # Unplugging zapped every CPU mapping of the device's files: a touch of
    # host or device memory is SIGBUS, not a page of a BO that is gone or
    # of BAR2 memory the next binding hands to someone else.
    assert _dies_of_sigbus(lambda: np.frombuffer(m, np.uint32)[0])
    assert _dies_of_sigbus(lambda: np.frombuffer(dev_map, np.uint32)[0])
    os.close(fd)

    # The old device's 128 MiB go back to the system with the last mapping
    # (at least 3/4 of it: free memory moves by some MiB on its own).
    su.drop_caches()
    before = su.free_kb()
    dev_map.close()
    m.close()
    su.drop_caches()
    after = su.free_kb()

    # With the last file and mapping of the old device gone, its accel
    # minor is free again: the rebound device is accel0, /dev/npu0.
    t0 = time.monotonic()
    _bind(pci_addr)
    bind_s = time.monotonic() - t0
    assert su.bo_counters()[0] == 0, su.bo_counters()  # the new device's: none yet
    _computes()
    record_property("unbind_seconds", round(unbind_s, 2))
    record_property("rebind_seconds", round(bind_s, 2))
    record_property("unbind_aborted_in_flight", aborted)
    print(
        f"unbind {unbind_s:.2f} s (in-flight ops aborted: {aborted}), bind {bind_s:.2f} s; "
        f"freed {after - before} kB with the last mapping"
    )
    assert after - before >= (BIG >> 10) * 3 // 4, f"free memory {before} -> {after} kB"


def _submitter(w: int) -> None:
    fd = os.open(su.DEV_PATH, os.O_RDWR)
    a, b = su.Bo(fd, su.MiB), su.Bo(fd, su.MiB)
    ma = a.map()
    os.write(w, b"S")
    n = 0
    while True:
        try:
            f = su.submit(fd, [ops.copy(a, b, a.size).pack(), ops.fill(a, n, a.size).pack()])
            if n % 4 == 0:
                su.wait(fd, f)
            if n % 7 == 0:
                su.Bo(fd, 64 * 1024)
            n += 1
        except OSError as e:
            if e.errno == errno.ENODEV:
                break
            if e.errno == errno.EIO:  # an aborted op reported by WAIT
                continue
            raise
    ma.close()  # zapped by the unplug (a touch would be SIGBUS); unmapping works
    os.write(w, b"D")
    os.close(fd)


@pytest.mark.parametrize("rounds", [10])
def test_unbind_rebind_while_processes_submit(pci_addr, rounds, record_property):
    for rnd in range(rounds):
        pids = []
        for _ in range(3):
            r, w = os.pipe()
            sys.stdout.flush()
            pid = os.fork()
            if pid == 0:
                code = 1
                try:
                    os.close(r)
                    _submitter(w)
                    code = 0
                except BaseException as e:
                    print(f"submitter: {e!r}", file=sys.stderr)
                finally:
                    os._exit(code)
            os.close(w)
            assert os.read(r, 1) == b"S"
            pids.append((pid, r))
        time.sleep(0.05 + 0.05 * rnd)
        _unbind(pci_addr)
        for pid, r in pids:
            done = os.read(r, 1)
            os.close(r)
            _, status = os.waitpid(pid, 0)
            assert done == b"D" and status == 0, f"round {rnd}: submitter status {status:#x}"
        _bind(pci_addr)
        _computes()
        assert su.bo_counters()[0] == 0
    record_property("unbind_rebind_rounds", rounds + 1)


def test_rmmod_after_unbind_then_insmod_binds_again(pci_addr):
    """With the device unbound and no file open the module unloads; loading
    it again binds the device."""
    _unbind(pci_addr)
    su.rmmod()
    su.insmod()
    _computes()
