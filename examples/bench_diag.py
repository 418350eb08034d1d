#!/usr/bin/env python3
"""Hang triage benchmark: does ``npu-smi diag`` place each injected fault right?

Runs inside the guest as root (``make bench`` runs it; tests/guest/test_smi.py
uses its cases). Each case pauses the driver's watchdog (debugfs
``watchdog`` = 0, so that the state it makes stays put), keeps the device
awake, makes one kind of stuck job, runs the diagnosis
(:func:`npu.smi.diag.run`), then resumes the watchdog and waits until the
device recovered:

=========== ============================================================== ===========
case        how                                                            verdict
=========== ============================================================== ===========
host        a thread waits on a syncobj point nobody submits                 ``host``
firmware    ``inject fw_crash``, then a NOP submitted: never taken           ``firmware``
engine      ``inject hang``, then a NOP submitted: taken, never finished     ``engine``
interrupt   ``inject drop_irq``, then a FILL: done, its interrupt lost       ``interrupt``
=========== ============================================================== ===========

The driver's ``hang_timeout_ms`` is 300 during the run (restored after), so
that the hang's recovery is quick. Progress goes to stderr; the last line
of stdout is one JSON object (docs/benchmarks.md): ``diag_verdicts_correct``
(0..4), ``diag_cases`` (each case's verdict) and ``diag_bench_s``::

    python3 examples/bench_diag.py
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import logging
import os
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TypeVar

import npu
from npu import _abi, ops
from npu.smi import debugfs, diag
from npu.smi.debugfs import QueueState
from npu.smi.fs import Roots
from npu.smi.sysfs import find_devices, select_device

INDEX = 0
SYSFS = f"/sys/class/accel/accel{INDEX}/device/npu"
POWER_CONTROL = f"/sys/class/accel/accel{INDEX}/device/power/control"
DEBUGFS = f"/sys/kernel/debug/npu/npu{INDEX}"
TIMEOUT_PARAM = "/sys/module/npu/parameters/hang_timeout_ms"
HANG_TIMEOUT_MS = 300
WAIT_FOR_SUBMIT = _abi.DRM_SYNCOBJ_WAIT_FLAGS_WAIT_ALL | _abi.DRM_SYNCOBJ_WAIT_FLAGS_WAIT_FOR_SUBMIT
EXPECTED = {"host": "host", "firmware": "firmware", "engine": "engine", "interrupt": "interrupt"}

log = logging.getLogger("bench_diag")
T = TypeVar("T")
_libc = ctypes.CDLL(None, use_errno=True)


def read(path: str) -> str:
    with open(path) as f:
        return f.read()


def write(path: str, text: str) -> None:
    with open(path, "w") as f:
        f.write(text)


def read_int(attr: str) -> int:
    return int(read(f"{SYSFS}/{attr}").split()[0])


def wait_until(predicate: Callable[[], bool], timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            raise RuntimeError(f"timed out after {timeout_s:g} s waiting for {what}")
        time.sleep(0.01)


def queue0() -> QueueState:
    """The driver's queue as debugfs ``queues`` shows it now."""
    for q in debugfs.read_queues(Path(DEBUGFS)).queues:
        if q.index == 0:
            return q
    raise RuntimeError(f"{DEBUGFS}/queues shows no queue 0")


def diagnose() -> diag.Diagnosis:
    """``npu-smi diag -i 0``, as a library call."""
    roots = Roots()
    (ref,) = select_device(find_devices(roots), INDEX)
    d = diag.run(roots, ref, interval_s=0.2)
    log.info("verdict %s: %s", d.verdict.value, d.explanation)
    return d


@contextlib.contextmanager
def watchdog_paused() -> Iterator[None]:
    """The watchdog paused and the device kept awake (power/control = on), both restored."""
    control = read(POWER_CONTROL).strip()
    write(POWER_CONTROL, "on")
    write(f"{DEBUGFS}/watchdog", "0")
    try:
        yield
    finally:
        write(f"{DEBUGFS}/watchdog", "1")
        write(POWER_CONTROL, control)


@contextlib.contextmanager
def hang_timeout(ms: int = HANG_TIMEOUT_MS) -> Iterator[None]:
    """The driver's ``hang_timeout_ms`` set to ``ms``, restored after."""
    saved = read(TIMEOUT_PARAM).strip()
    write(TIMEOUT_PARAM, f"{ms}\n")
    try:
        yield
    finally:
        write(TIMEOUT_PARAM, f"{saved}\n")


def _ioctl(fd: int, request: int, arg: ctypes.Structure) -> int:
    """ioctl through libc: ctypes lets go of the GIL while it blocks."""
    ret: int = _libc.ioctl(fd, ctypes.c_ulong(request), ctypes.byref(arg))
    return 0 if ret == 0 else ctypes.get_errno()


@contextlib.contextmanager
def waiter_on_unsubmitted_point(dev: npu.Device) -> Iterator[int]:
    """A thread blocked in SYNCOBJ_TIMELINE_WAIT (WAIT_FOR_SUBMIT) on point 1 of a new
    syncobj nobody submits to; yields its thread id. The point is signalled on exit."""
    fd = dev.fileno()
    create = _abi.DrmSyncobjCreate(flags=0)
    if _ioctl(fd, _abi.DRM_IOCTL_SYNCOBJ_CREATE, create):
        raise RuntimeError("SYNCOBJ_CREATE failed")
    handle = ctypes.c_uint32(create.handle)
    point = ctypes.c_uint64(1)
    tid: list[int] = []
    result: list[int] = []

    def wait() -> None:
        tid.append(threading.get_native_id())
        arg = _abi.DrmSyncobjTimelineWait(
            handles=ctypes.addressof(handle),
            points=ctypes.addressof(point),
            timeout_nsec=_abi.deadline_after(60 * 10**9),
            count_handles=1,
            flags=WAIT_FOR_SUBMIT,
        )
        result.append(_ioctl(fd, _abi.DRM_IOCTL_SYNCOBJ_TIMELINE_WAIT, arg))

    thread = threading.Thread(target=wait, name="npu-waiter", daemon=True)
    thread.start()
    try:
        wait_until(lambda: bool(tid), 5, "the waiter thread")
        syscall = f"/proc/self/task/{tid[0]}/syscall"
        wait_until(lambda: read(syscall).startswith("16 "), 5, "the waiter to block in ioctl")
        yield tid[0]
    finally:
        sig = _abi.DrmSyncobjTimelineArray(
            handles=ctypes.addressof(handle), points=ctypes.addressof(point), count_handles=1
        )
        _ioctl(fd, _abi.DRM_IOCTL_SYNCOBJ_TIMELINE_SIGNAL, sig)
        thread.join(10)
        _ioctl(fd, _abi.DRM_IOCTL_SYNCOBJ_DESTROY, _abi.DrmSyncobjDestroy(handle=handle.value))
    if result != [0]:
        raise RuntimeError(f"the waiter ended with errno {result}, not released by the signal")


# --------------------------------------------------------------------------
# The four cases: each makes its stuck job, probes it and recovers
# --------------------------------------------------------------------------


def case_host(dev: npu.Device, probe: Callable[[], T]) -> T:
    """A wait on a point nobody submitted: nothing reached the device."""
    with watchdog_paused(), waiter_on_unsubmitted_point(dev):
        return probe()


def case_firmware(dev: npu.Device, probe: Callable[[], T]) -> T:
    """A crashed firmware: the NOP stays in the ring, untaken."""
    count = read_int("recoveries")
    with watchdog_paused():
        write(f"{DEBUGFS}/inject", "fw_crash")
        fence = dev.submit([ops.nop()])
        wait_until(lambda: queue0().outstanding > 0, 5, "the NOP in the ring")
        d = probe()
    # The heartbeat check finds the firmware lost: reset, reboot, replay.
    wait_until(lambda: read_int("recoveries") > count, 15, "the firmware recovery")
    dev.wait(fence, timeout_s=15)
    return d


def case_engine(dev: npu.Device, probe: Callable[[], T]) -> T:
    """An injected hang: the NOP was taken (ACTIVE) and never finishes."""
    with watchdog_paused():
        write(f"{DEBUGFS}/inject", "hang")
        fence = dev.submit([ops.nop()])
        wait_until(lambda: queue0().active, 5, "the NOP to start")
        d = probe()
    # The hang check resets the device and fails the NOP (NPU_ST_TIMEOUT).
    try:
        dev.wait(fence, timeout_s=30)
    except npu.NpuDeviceError as e:
        if e.status != _abi.NPU_ST_TIMEOUT:
            raise
    else:
        raise RuntimeError("the hung NOP completed")
    return d


def case_interrupt(dev: npu.Device, probe: Callable[[], T]) -> T:
    """A dropped completion interrupt: the FILL is done, the driver does not know."""
    with dev.alloc(4096) as buf:
        with watchdog_paused():
            write(f"{DEBUGFS}/inject", "drop_irq")
            fence = dev.submit([ops.fill(buf, 0xD1A60001, 4096)])
            wait_until(lambda: queue0().fence_mem >= fence, 5, "the FILL's fence write-back")
            d = probe()
        # The watchdog's lost-interrupt fallback retires it.
        dev.wait(fence, timeout_s=10)
    return d


#: Each case makes its stuck job on ``dev``, returns what ``probe`` (run while the
#: job is stuck, e.g. :func:`diagnose`) returned, and leaves the device recovered.
CASES: dict[str, Callable[[npu.Device, Callable[[], diag.Diagnosis]], diag.Diagnosis]] = {
    "host": case_host,
    "firmware": case_firmware,
    "engine": case_engine,
    "interrupt": case_interrupt,
}


def run_case(name: str) -> str:
    """One case on a fresh file (a hang counts against its file); the verdict."""
    with npu.open_device(INDEX) as dev:
        d = CASES[name](dev, diagnose)
    return d.verdict.value


def main() -> int:
    """Run the four cases; print the JSON result; 0 unless the run itself failed."""
    logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="bench_diag: %(message)s")
    for path in (SYSFS, f"{DEBUGFS}/queues", f"{DEBUGFS}/watchdog", TIMEOUT_PARAM):
        if not os.path.exists(path):
            log.error("%s is missing (driver without it, or debugfs not mounted?)", path)
            return 1
    t0 = time.perf_counter()
    verdicts: dict[str, str] = {}
    with hang_timeout():
        for name in CASES:
            try:
                verdicts[name] = run_case(name)
            except (RuntimeError, OSError) as e:
                log.error("case %s: %s", name, e)
                verdicts[name] = f"error: {e}"
            log.info("case %s: %s (expected %s)", name, verdicts[name], EXPECTED[name])
    result = {
        "diag_verdicts_correct": sum(verdicts[n] == EXPECTED[n] for n in CASES),
        "diag_cases": verdicts,
        "diag_bench_s": time.perf_counter() - t0,
    }
    print(json.dumps(result, sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.exit(main())
