"""Failed kernel allocations during driver calls: a clean errno, no leak, no splat.

Each scenario (a short life of a device file: open, buffers, mappings,
submissions, user queues, pinned user memory, tensor ops) runs in a forked
child while the kernel fails its allocations:

- systematically, with ``/proc/thread-self/fail-nth``: the child's n-th
  slab or page allocation made with npu.ko on the stack (the stack filter,
  ``require-start``/``require-end``) fails, for n = 1, 2, ... until the
  scenario runs to its end without reaching the n-th one (within
  ``MAX_NTH``);
- at random, aimed at the child only (``task-filter`` and
  ``/proc/self/make-it-fail``), ``RANDOM_RUNS`` times per scenario.

Every run must end with the scenario done or an ``OSError`` whose errno is
in ``CLEAN_ERRNOS``; never another exception, a signal or a hang. After
them, the device still computes, the driver's live BO memory is back to
its baseline, kmemleak finds nothing from npu.ko (conftest) and the kernel
log has no report beyond the expected allocation-failure warnings.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import signal
import subprocess
import traceback
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import guest_util
import numpy as np
import pytest

import npu
from npu import ops

DEV_PATH = "/dev/npu0"
SYSFS = "/sys/class/accel/accel0/device/npu"
DEBUGFS = "/sys/kernel/debug"
# The errnos a failed allocation may surface as: ENOMEM, and EFAULT where
# the failed allocation is the page a copy from or to user memory faults in.
CLEAN_ERRNOS = {errno.ENOMEM, errno.EFAULT}
MAX_NTH = int(os.environ.get("NPU_FAULT_MAX_NTH", "") or 200)
RANDOM_RUNS = int(os.environ.get("NPU_FAULT_RANDOM_RUNS", "") or 20)
CHILD_TIMEOUT_S = 120
# Writable knobs of both fault attributes while the suite runs.
KNOBS = {
    "failslab": {"ignore-gfp-wait": "N", "verbose": "0", "task-filter": "Y"},
    "fail_page_alloc": {
        "ignore-gfp-wait": "N",
        "ignore-gfp-highmem": "N",
        "min-order": "0",
        "verbose": "0",
        "task-filter": "Y",
    },
}
RANDOM_KNOBS = {"probability": "5", "interval": "1", "times": "-1"}


# --------------------------------------------------------------------------
# Scenarios: each one a short, complete use of the driver
# --------------------------------------------------------------------------


# Each scenario gets the device opened before the injection is armed (the
# runtime's own start-up, covered by open_close, would otherwise take most
# of the allocations) and closes it under injection.


def open_close(dev: npu.Device) -> None:
    dev.close()
    os.close(os.open(DEV_PATH, os.O_RDWR | os.O_CLOEXEC))


def buffer_map_write_free(dev: npu.Device) -> None:
    with dev:
        buf = dev.alloc(64 << 10)
        buf.write(b"\x07" * 16)
        assert buf.read(16) == b"\x07" * 16
        buf.close()


def submit_fill_and_wait(dev: npu.Device) -> None:
    with dev:
        buf = dev.alloc(1 << 16)
        dev.run([ops.fill(buf, 0xA5A5A5A5, 1 << 16)])
        assert buf.read(4) == b"\xa5" * 4


def user_queue_nop(dev: npu.Device) -> None:
    with dev:
        q = dev.create_queue(entries=16)
        q.nop()
        q.synchronize(timeout_s=30)
        q.close()


SRC = np.arange(4096, dtype=np.uint32)


def pinned_user_memory_copy(dev: npu.Device) -> None:
    with dev:
        ubuf, off = dev.userptr(SRC)
        dst = dev.alloc(SRC.nbytes)
        dev.run([ops.copy(ubuf, dst, SRC.nbytes, src_offset=off)])
        assert np.array_equal(np.frombuffer(dst.read(SRC.nbytes), dtype=np.uint32), SRC)
        dst.close()
        ubuf.close()


A = np.ones((16, 8), dtype=np.float32)
AAT = A @ A.T


def tensor_matmul(dev: npu.Device) -> None:
    with dev:
        assert np.allclose(npu.matmul(A, A.T, device=dev), AAT)


SCENARIOS: dict[str, Callable[[npu.Device], None]] = {
    f.__name__: f
    for f in (
        open_close,
        buffer_map_write_free,
        submit_fill_and_wait,
        user_queue_nop,
        pinned_user_memory_copy,
        tensor_matmul,
    )
}


# --------------------------------------------------------------------------
# The fault injection
# --------------------------------------------------------------------------


def _write(path: str, value: str) -> None:
    with open(path, "w") as f:
        f.write(value)


def _read(path: str) -> str:
    with open(path) as f:
        return f.read().strip()


@contextlib.contextmanager
def knobs(values: dict[str, dict[str, str]]) -> Iterator[None]:
    """Set debugfs fault-attribute files; restore them afterwards."""
    old = {(a, k): _read(f"{DEBUGFS}/{a}/{k}") for a, kv in values.items() for k in kv}
    try:
        for a, kv in values.items():
            for k, v in kv.items():
                _write(f"{DEBUGFS}/{a}/{k}", v)
        yield
    finally:
        for (a, k), v in old.items():
            _write(f"{DEBUGFS}/{a}/{k}", v)


@dataclass
class Outcome:
    result: str  # "done", "clean" (an allowed errno), "bad" (anything else)
    injected: bool  # the armed failure happened (fail-nth counted down to 0)
    detail: str = ""


def _child(
    scenario: Callable[[npu.Device], None], nth: int, random_faults: bool
) -> dict[str, object]:
    """In the forked child: open the device, arm the injection, run, disarm, report."""
    dev = npu.Device(DEV_PATH)
    fd = os.open("/proc/thread-self/fail-nth", os.O_RDWR)
    mif = os.open("/proc/self/make-it-fail", os.O_WRONLY) if random_faults else -1
    left = -1
    try:
        if nth:
            os.pwrite(fd, str(nth).encode(), 0)
        if mif >= 0:
            os.pwrite(mif, b"1", 0)
        try:
            scenario(dev)
        finally:
            # Read and disarm before anything else makes a system call.
            if mif >= 0:
                os.pwrite(mif, b"0", 0)
            if nth:
                left = int(os.pread(fd, 32, 0))
                os.pwrite(fd, b"0", 0)
        return {"result": "done", "left": left}
    except OSError as e:
        ok = e.errno in CLEAN_ERRNOS
        return {
            "result": "clean" if ok else "bad",
            "left": left,
            "detail": f"{type(e).__name__} {errno.errorcode.get(e.errno or 0)}: {e}",
        }
    except MemoryError:
        return {"result": "clean", "left": left, "detail": "MemoryError"}
    except BaseException:
        return {"result": "bad", "left": left, "detail": traceback.format_exc()}


def run_once(name: str, nth: int = 0, random_faults: bool = False) -> Outcome:
    """Run scenario `name` in a child with the n-th allocation failing (or at random)."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # child
        os.close(r)
        try:
            rep = _child(SCENARIOS[name], nth, random_faults)
            os.write(w, json.dumps(rep).encode())
        finally:
            os._exit(0)
    os.close(w)
    signal.alarm(CHILD_TIMEOUT_S)
    try:
        chunks = []
        while chunk := os.read(r, 65536):
            chunks.append(chunk)
        _, status = os.waitpid(pid, 0)
    except InterruptedError:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        return Outcome("bad", False, f"hung for {CHILD_TIMEOUT_S} s")
    finally:
        signal.alarm(0)
        os.close(r)
    if os.WIFSIGNALED(status):
        return Outcome("bad", False, f"killed by signal {os.WTERMSIG(status)}")
    if not chunks:
        return Outcome("bad", False, f"child reported nothing (status {status:#x})")
    rep = json.loads(b"".join(chunks))
    injected = bool(nth) and rep["left"] == 0
    return Outcome(rep["result"], injected, rep.get("detail", ""))


def bo_bytes() -> int:
    return int(_read(f"{SYSFS}/bo_bytes"))


def driver_text() -> dict[str, str]:
    """require-start/require-end: the address range of npu.ko (/proc/modules),
    so that only allocations with the driver on the stack are failed."""
    with open("/proc/modules") as f:
        for line in f:
            name, size, *_, base = line.split()[:6]
            if name == "npu":
                start = int(base, 16)
                assert start, "/proc/modules hides addresses (kptr_restrict)"
                return {"require-start": str(start), "require-end": str(start + int(size))}
    raise AssertionError("npu.ko is not loaded")


@pytest.fixture(scope="module")
def injection() -> Iterator[None]:
    if not os.path.exists(f"{DEBUGFS}/failslab/require-start") or not os.path.exists(
        "/proc/thread-self/fail-nth"
    ):
        pytest.skip("needs failslab, fail-nth and the stack filter (the debug kernel has them)")
    text = driver_text()
    with knobs({a: {**kv, **text} for a, kv in KNOBS.items()}):
        yield


@pytest.fixture
def baseline(injection: None) -> Iterator[int]:
    """Live BO bytes before the test; checked to be back after it."""
    before = bo_bytes()
    yield before
    assert bo_bytes() == before, f"BO memory {bo_bytes()} bytes live, {before} before the test"
    tensor_matmul(npu.Device(DEV_PATH))  # the device still computes


@pytest.mark.parametrize("name", list(SCENARIOS))
def test_every_failed_allocation_of_a_scenario_gives_a_clean_errno(
    name: str, baseline: int, record_property: Callable[[str, object], None]
) -> None:
    assert run_once(name).result == "done", "the scenario fails without any injection"
    bad, injected = [], 0
    for nth in range(1, MAX_NTH + 1):
        out = run_once(name, nth=nth)
        if out.result == "bad":
            bad.append(f"allocation #{nth}: {out.detail}")
        if not out.injected:
            break  # the scenario made fewer than nth allocations: all were tried
        injected += 1
    else:
        bad.append(f"still allocating after {MAX_NTH} failures: raise NPU_FAULT_MAX_NTH")
    record_property(f"{name}_allocations_failed", injected)
    assert not bad, f"{len(bad)} of {injected} injected failures were not clean:\n" + "\n".join(
        bad[:10]
    )
    assert injected > 0, "no allocation was ever failed: is fail-nth working?"


@pytest.mark.parametrize("name", list(SCENARIOS))
def test_random_allocation_failures_in_a_scenario_give_clean_errnos(
    name: str, baseline: int, record_property: Callable[[str, object], None]
) -> None:
    bad, failed_runs = [], 0
    with knobs({"failslab": RANDOM_KNOBS, "fail_page_alloc": RANDOM_KNOBS}):
        for i in range(RANDOM_RUNS):
            out = run_once(name, random_faults=True)
            failed_runs += out.result != "done"
            if out.result == "bad":
                bad.append(f"run {i}: {out.detail}")
    record_property(f"{name}_random_runs_failed", failed_runs)
    assert not bad, f"{len(bad)} of {RANDOM_RUNS} runs were not clean:\n" + "\n".join(bad[:10])


def test_the_driver_unloads_and_reloads_cleanly_after_the_injection(injection: None) -> None:
    subprocess.run(["rmmod", "npu"], check=True, capture_output=True)
    assert guest_util.load_driver() is None
    tensor_matmul(npu.Device(DEV_PATH))
