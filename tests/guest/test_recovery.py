"""Hang detection and recovery, and the device faults the driver survives.

The device's fault injection is armed through debugfs
(``/sys/kernel/debug/npu/npu0/inject``: ``hang``, ``hw_error``,
``drop_irq``, ``dma_fault``) and fires on the next command the device starts
(or, for ``drop_irq``, the next completion interrupt). The driver's
watchdog looks at every hardware queue each 100 ms: a command running longer
than ``hang_timeout_ms`` (a module parameter; 300 ms here, restored after the
module) hung. The driver then resets the device, fails the hung op's job
(WAIT: ``EIO``, status ``NPU_ST_TIMEOUT``), replays the other unfinished ops
of its queue, stops the user queues and counts the hang against the file
that submitted it; a file with three hangs is banned (SUBMIT and
QUEUE_CREATE: ``EIO``). The same watchdog retires completions whose
interrupt was lost.

The kernel-log gate (conftest.py) still applies: the driver's
"command hung ... resetting" error lines are expected, an oops or WARNING is
not.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import faulthandler
import fcntl
import os
import select
import signal
import socket
import time
from collections.abc import Callable, Iterator

import numpy as np
import pytest
from guest_util import wait_until

import npu
from npu import _abi, ops

SYSFS = "/sys/class/accel/accel0/device/npu"
INJECT = "/sys/kernel/debug/npu/npu0/inject"
TIMEOUT_PARAM = "/sys/module/npu/parameters/hang_timeout_ms"
HANG_TIMEOUT_MS = 300
WD_PERIOD_MS = 100  # NPU_WD_PERIOD (kernel_module/npu_reset.c)
# Beyond the watchdog's own bound (timeout + 2 periods): the reset, the
# WAIT's wake-up and a guest under TCG.
SLACK_MS = 300
ST_HW_ERROR, ST_TIMEOUT = _abi.NPU_ST_HW_ERROR, _abi.NPU_ST_TIMEOUT
OP_SIGNAL, OP_WAIT = _abi.NPU_OP_SIGNAL, _abi.NPU_OP_WAIT
STATUS_NAMES = {
    ST_TIMEOUT: "NPU_ST_TIMEOUT",
    ST_HW_ERROR: "NPU_ST_HW_ERROR",
    _abi.NPU_ST_DMA_ERROR: "NPU_ST_DMA_ERROR",
    _abi.NPU_ST_ABORTED: "NPU_ST_ABORTED",
}
NETLINK_KOBJECT_UEVENT = 15
MiB = 1 << 20

pytestmark = pytest.mark.skipif(
    not os.path.exists(TIMEOUT_PARAM), reason="driver without hang detection"
)


# --------------------------------------------------------------------------
# Helpers
# --------------------------------------------------------------------------


def read_int(attr: str) -> int:
    with open(f"{SYSFS}/{attr}") as f:
        return int(f.read().split()[0])


def counters() -> dict[str, int]:
    return {a: read_int(a) for a in ("hangs", "recoveries", "op_errors", "irq_count")}


def fences() -> tuple[int, int]:
    with open(f"{SYSFS}/fences") as f:
        submitted, completed = f.read().split()
    return int(submitted), int(completed)


def inject(fault: str) -> None:
    with open(INJECT, "w") as f:
        f.write(fault)


def armed() -> int:
    with open(INJECT) as f:
        return int(f.read().strip(), 0)


def set_timeout(ms: int) -> None:
    with open(TIMEOUT_PARAM, "w") as f:
        f.write(f"{ms}\n")


def expect_device_error(wait: Callable[[], object], status: int) -> npu.NpuDeviceError:
    with pytest.raises(npu.NpuDeviceError) as info:
        wait()
    assert info.value.errno == errno.EIO, info.value
    assert info.value.status == status, info.value
    assert info.value.status_name == STATUS_NAMES.get(status, info.value.status_name), info.value
    return info.value


def hang_and_wait(dev: npu.Device, op: npu.ops.Op | None = None) -> tuple[int, float]:
    """Arm a hang, submit one op (a NOP by default) and wait for its EIO; (fence, seconds)."""
    inject("hang")
    fence = dev.submit([op or ops.nop()])
    t0 = time.monotonic()
    err = expect_device_error(lambda: dev.wait(fence, timeout_s=30), ST_TIMEOUT)
    assert err.fence == fence
    return fence, time.monotonic() - t0


def wait_cmd(va: int, value: int) -> _abi.NpuCmd:
    """A raw NPU_OP_WAIT descriptor (struct npu_cmd.sync: va, value)."""
    cmd = _abi.NpuCmd()
    cmd.opcode = OP_WAIT
    cmd.raw[0] = va
    cmd.raw[1] = value
    return cmd


@pytest.fixture(scope="module", autouse=True)
def hang_timeout() -> Iterator[int]:
    """hang_timeout_ms = HANG_TIMEOUT_MS for this module's tests, restored after."""
    if not os.path.exists(INJECT):
        pytest.skip(f"{INJECT} missing (debugfs not mounted?)")
    with open(TIMEOUT_PARAM) as f:
        saved = f.read().strip()
    set_timeout(HANG_TIMEOUT_MS)
    try:
        yield HANG_TIMEOUT_MS
    finally:
        set_timeout(int(saved))


@pytest.fixture(autouse=True)
def quiet_device() -> Iterator[None]:
    """Each test starts and ends with the device idle and nothing armed."""
    assert wait_until(lambda: fences()[0] == fences()[1], 30), f"device busy: {fences()}"
    assert armed() == 0, f"a fault is armed before the test: {armed():#x}"
    yield
    left = armed()
    if left:  # fire it on a NOP of our own so that the next test starts clean
        with npu.open_device(0) as d, contextlib.suppress(npu.NpuError):
            d.wait(d.submit([ops.nop()]), timeout_s=30)
    assert not left, f"the test left faults armed: {left:#x}"


@pytest.fixture
def other() -> Iterator[npu.Device]:
    """A second open file of the device (another client)."""
    d = npu.open_device(0)
    try:
        yield d
    finally:
        d.close()


# --------------------------------------------------------------------------
# Hangs
# --------------------------------------------------------------------------


def test_a_hang_is_detected_within_the_timeout_and_the_op_fails_with_timeout(
    dev: npu.Device,
) -> None:
    _, took = hang_and_wait(dev)
    bound = (HANG_TIMEOUT_MS + 2 * WD_PERIOD_MS + SLACK_MS) / 1e3
    assert HANG_TIMEOUT_MS / 1e3 <= took <= bound, f"WAIT returned after {took:.3f} s"
    # The device works again, for the same file too.
    with dev.alloc(4096) as buf:
        dev.wait(dev.submit([ops.fill(buf, 0xABCD1234, 4096)]), timeout_s=5)
        assert (buf.numpy(np.uint32) == 0xABCD1234).all()


# A GEMM of about half a second on two host cores (25.8 GMAC), inside the
# device's own cmd-budget-ms (2 s) even beside a busy guest.
LONG_M, LONG_N, LONG_K = 4096, 4096, 1536


def test_a_long_command_that_makes_progress_is_not_a_hang(dev: npu.Device) -> None:
    with dev.alloc(LONG_M * LONG_K * 4) as ab, dev.alloc(LONG_M * LONG_N * 4) as c:
        # A and B share one buffer: m x k and k x n are the same 24 MiB.
        gemm = [ops.gemm(ab, ab, c, LONG_M, LONG_N, LONG_K)]
        set_timeout(0)  # detection off: how long the GEMM takes here
        t0 = time.monotonic()
        dev.wait(dev.submit(gemm), timeout_s=60)
        alone = time.monotonic() - t0
        # A quarter of that: the watchdog looks several times past it.
        timeout_ms = max(100, int(alone * 1e3 / 4))
        set_timeout(timeout_ms)
        try:
            before = counters()
            t0 = time.monotonic()
            dev.wait(dev.submit(gemm), timeout_s=60)
            took = time.monotonic() - t0
        finally:
            set_timeout(HANG_TIMEOUT_MS)
    # Q_PROGRESS moved at the GEMM's control points: the watchdog let it run.
    assert took * 1e3 > timeout_ms + 2 * WD_PERIOD_MS, f"{took:.3f} s: too short to tell"
    assert counters()["hangs"] == before["hangs"]
    assert counters()["recoveries"] == before["recoveries"]


def test_a_hang_moves_the_sysfs_counters(dev: npu.Device) -> None:
    before = counters()
    hang_and_wait(dev)
    after = counters()
    assert after["hangs"] == before["hangs"] + 1
    assert after["recoveries"] == before["recoveries"] + 1
    detect = read_int("last_hang_detect_ms")
    # Counted from the first watchdog look that saw the command running.
    assert HANG_TIMEOUT_MS <= detect <= HANG_TIMEOUT_MS + WD_PERIOD_MS + SLACK_MS, detect
    assert 0 < read_int("last_reset_recovery_us") < 1_000_000


def test_the_hung_ops_whole_job_fails_and_writes_nothing(dev: npu.Device) -> None:
    with dev.alloc(8192) as buf:
        buf.numpy(np.uint32)[:] = 7
        inject("hang")
        fence = dev.submit([ops.fill(buf, 0x11111111, 4096), ops.fill(buf, 0x22222222, 4096, 4096)])
        err = expect_device_error(lambda: dev.wait(fence, timeout_s=30), ST_TIMEOUT)
        assert err.fence == fence - 1, "the first op hung"
        assert (buf.numpy(np.uint32) == 7).all(), "neither op of the job ran"


def test_the_hung_files_later_jobs_are_replayed(dev: npu.Device) -> None:
    with dev.alloc(4096) as a, dev.alloc(4096) as b:
        a.numpy(np.uint32)[:] = 0
        b.numpy(np.uint32)[:] = 0
        inject("hang")
        f1 = dev.submit([ops.fill(a, 0xAAAA0001, 4096)])
        f2 = dev.submit([ops.fill(b, 0xBBBB0002, 4096)])
        expect_device_error(lambda: dev.wait(f1, timeout_s=30), ST_TIMEOUT)
        dev.wait(f2, timeout_s=5)
        assert (a.numpy(np.uint32) == 0).all()
        assert (b.numpy(np.uint32) == 0xBBBB0002).all()


def test_another_files_ops_queued_behind_the_hang_complete_correctly(
    dev: npu.Device, other: npu.Device
) -> None:
    rng = np.random.default_rng(5)
    m, n, k = 33, 17, 29
    x = rng.standard_normal(4096, dtype=np.float32)
    y = rng.standard_normal(4096, dtype=np.float32)
    am = rng.standard_normal((m, k), dtype=np.float32)
    bm = rng.standard_normal((k, n), dtype=np.float32)
    bufs = [other.alloc(16384) for _ in range(7)]
    try:
        bx, by, bcopy, bfill, bsum, ba, bb = bufs
        bx.write(x)
        by.write(y)
        ba.write(am)
        bb.write(bm)
        bc = other.alloc(m * n * 4)
        bufs.append(bc)
        for b in (bcopy, bfill, bsum, bc):
            b.numpy(np.uint8)[:] = 0
        f32 = _abi.DType.FP32
        refs = [ops.tensor_ref(b, f32, [4096]) for b in (bx, by, bsum)]

        inject("hang")
        hung = dev.submit([ops.nop()])
        t0 = time.monotonic()
        f1 = other.submit(
            [
                ops.copy(bx, bcopy, x.nbytes),
                ops.fill(bfill, 0x5EED5EED, 16384),
                ops.gemm(ba, bb, bc, m, n, k),
            ]
        )
        f2 = other.submit([ops.eltwise(_abi.EltwiseKind.ADD, *refs)])  # a parameter block
        other.wait(f2, timeout_s=30)
        held = time.monotonic() - t0
        other.wait(f1, timeout_s=0)

        expect_device_error(lambda: dev.wait(hung, timeout_s=30), ST_TIMEOUT)
        assert held >= HANG_TIMEOUT_MS / 1e3 / 2, f"done after {held:.3f} s: not behind the hang"
        assert np.array_equal(bcopy.numpy(np.float32, 4096), x)
        assert (bfill.numpy(np.uint32) == 0x5EED5EED).all()
        np.testing.assert_allclose(bc.numpy(np.float32, (m, n)), am @ bm, rtol=1e-4, atol=1e-4)
        np.testing.assert_allclose(bsum.numpy(np.float32, 4096), x + y, rtol=1e-6)
        # The innocent file is neither banned nor charged.
        other.wait(other.submit([ops.nop()]), timeout_s=5)
    finally:
        for b in bufs:
            b.free()


def test_a_file_is_banned_after_three_hangs_and_a_fresh_file_still_works(
    dev: npu.Device, other: npu.Device
) -> None:
    for i in range(3):
        if i:
            dev.wait(dev.submit([ops.nop()]), timeout_s=5)  # not banned before the third
        hang_and_wait(dev)
    with pytest.raises(npu.NpuError) as info:
        dev.submit([ops.nop()])
    assert info.value.errno == errno.EIO
    if hasattr(dev, "create_queue"):
        with pytest.raises(npu.NpuError) as info:
            dev.create_queue(16)
        assert info.value.errno == errno.EIO
    with other.alloc(4096) as buf:
        other.wait(other.submit([ops.fill(buf, 0x600D600D, 4096)]), timeout_s=5)
        assert (buf.numpy(np.uint32) == 0x600D600D).all()
    with npu.open_device(0) as fresh:
        fresh.wait(fresh.submit([ops.nop()]), timeout_s=5)


def test_hang_timeout_0_turns_detection_off_and_a_new_value_applies_at_once(
    dev: npu.Device,
) -> None:
    before = read_int("hangs")
    set_timeout(0)
    try:
        inject("hang")
        fence = dev.submit([ops.nop()])
        with pytest.raises(npu.NpuTimeoutError):
            dev.wait(fence, timeout_s=(HANG_TIMEOUT_MS + 3 * WD_PERIOD_MS) / 1e3)
        assert read_int("hangs") == before, "detected with hang_timeout_ms=0"
    finally:
        set_timeout(HANG_TIMEOUT_MS)
    t0 = time.monotonic()
    expect_device_error(lambda: dev.wait(fence, timeout_s=30), ST_TIMEOUT)
    took = time.monotonic() - t0
    assert took <= (HANG_TIMEOUT_MS + 2 * WD_PERIOD_MS + SLACK_MS) / 1e3, took
    assert read_int("hangs") == before + 1


def test_a_reset_sends_a_change_uevent_with_the_reason(dev: npu.Device) -> None:
    try:
        sock = socket.socket(socket.AF_NETLINK, socket.SOCK_DGRAM, NETLINK_KOBJECT_UEVENT)
        sock.bind((0, 1))  # the kernel's multicast group
    except OSError as e:
        pytest.skip(f"no uevent netlink socket: {e}")
    with sock:
        hang_and_wait(dev)
        events = []
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:
            if not select.select([sock], [], [], 0.2)[0]:
                if any(e.get("NPU_RESET") for e in events):
                    break
                continue
            head, *fields = sock.recv(65536).decode(errors="replace").split("\0")
            events.append(dict(f.split("=", 1) for f in fields if "=" in f) | {"@": head})
    resets = [e for e in events if e.get("NPU_RESET") == "1"]
    assert resets, f"no NPU_RESET uevent among {events}"
    (ev,) = resets
    assert ev["ACTION"] == "change" and ev["NPU_REASON"] == "hang", ev
    assert ev["DEVPATH"].endswith("/accel/accel0") and ev.get("SUBSYSTEM") == "accel", ev


# --------------------------------------------------------------------------
# Errors without a reset
# --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("fault", "status"),
    [("hw_error", ST_HW_ERROR), ("dma_fault", _abi.NPU_ST_DMA_ERROR)],
)
def test_an_injected_error_fails_the_op_with_its_status_and_nothing_else(
    dev: npu.Device, fault: str, status: int
) -> None:
    before = counters()
    with dev.alloc(8192) as buf:
        buf.numpy(np.uint32)[:] = 3
        inject(fault)
        assert armed() != 0
        fence = dev.submit([ops.fill(buf, 0xE7707E77, 8192)])
        err = expect_device_error(lambda: dev.wait(fence, timeout_s=10), status)
        assert err.fence == fence
        assert err.op is not None and err.op.opcode == _abi.Opcode.FILL
        assert f"{STATUS_NAMES[status]} ({status})" in str(err)
        assert armed() == 0
        assert (buf.numpy(np.uint32) == 3).all(), "the op did not run"
        # Reported once; the file goes on, the device was not reset.
        dev.wait(fence, timeout_s=0)
        dev.wait(dev.submit([ops.fill(buf, 0x0C0C0C0C, 8192)]), timeout_s=10)
        assert (buf.numpy(np.uint32) == 0x0C0C0C0C).all()
    after = counters()
    assert after["op_errors"] == before["op_errors"] + 1
    assert (after["hangs"], after["recoveries"]) == (before["hangs"], before["recoveries"])


def test_a_lost_completion_interrupt_still_completes_a_sleeping_wait(dev: npu.Device) -> None:
    size = 64 * MiB  # long enough that WAIT sleeps rather than spins
    with dev.alloc(size) as buf:
        buf.numpy(np.uint32)[:4] = 0
        irqs = read_int("irq_count")
        inject("drop_irq")
        t0 = time.monotonic()
        dev.wait(dev.submit([ops.fill(buf, 0xD1A60001, size)]), timeout_s=5)
        took = time.monotonic() - t0
        assert armed() == 0, "the interrupt was dropped"
        assert read_int("irq_count") == irqs, "no interrupt came"
        w = buf.numpy(np.uint32)
        assert w[0] == w[-1] == 0xD1A60001 and (w == 0xD1A60001).all()
        # The watchdog's 100 ms poll retires it, not the WAIT's timeout.
        assert took < 0.5, f"WAIT took {took:.3f} s"


# --------------------------------------------------------------------------
# SIGNAL/WAIT are for user queues; a blocked WAIT is not a hang
# --------------------------------------------------------------------------


@pytest.mark.parametrize("opcode", [OP_SIGNAL, OP_WAIT], ids=["signal", "wait"])
@pytest.mark.parametrize("tensor", [False, True], ids=["op", "tensor_op"])
def test_submit_refuses_signal_and_wait(dev: npu.Device, opcode: int, tensor: bool) -> None:
    struct_ = _abi.NpuTensorOp if tensor else _abi.NpuOp
    raw = (struct_ * 1)()
    raw[0].opcode = opcode
    arg = _abi.NpuSubmit(
        ops_ptr=ctypes.addressof(raw), num_ops=1, queue=0, flags=0, op_size=ctypes.sizeof(struct_)
    )
    with pytest.raises(OSError) as info:
        fcntl.ioctl(dev.fileno(), _abi.DRM_IOCTL_NPU_SUBMIT, arg, True)
    assert info.value.errno == errno.EINVAL


needs_user_queues = pytest.mark.skipif(
    not hasattr(npu.Device, "create_queue"), reason="runtime without user queues"
)


@needs_user_queues
def test_a_user_queue_blocked_on_a_wait_is_not_a_hang(dev: npu.Device) -> None:
    before = counters()
    with dev.alloc(4096) as sync, dev.alloc(4096) as out, dev.create_queue(16) as q:
        cell = sync.numpy(np.uint64)
        cell[0] = 0
        out.numpy(np.uint32)[:] = 0
        q.push(wait_cmd(sync.va, 2))
        done = q.fill(out, 0x51640001, 4096, irq=True)
        q.kick()
        time.sleep((3 * HANG_TIMEOUT_MS + 2 * WD_PERIOD_MS) / 1e3)
        assert q.completed() == 0, "the WAIT passed too early"
        assert counters()["hangs"] == before["hangs"], "a blocked WAIT was taken for a hang"
        cell[0] = 1  # below the value: still blocked
        time.sleep(0.05)
        assert q.completed() == 0
        cell[0] = 2  # a CPU store releases it, no doorbell needed
        q.wait(done, timeout_s=5)
        assert (out.numpy(np.uint32) == 0x51640001).all()
        assert q.status(1) == q.status(done) == _abi.NPU_ST_OK
    assert counters()["recoveries"] == before["recoveries"]


@needs_user_queues
def test_a_hung_user_queue_reports_timeout(dev: npu.Device) -> None:
    before = read_int("hangs")
    with dev.create_queue(16) as q:
        inject("hang")
        fence = q.nop(irq=True)
        q.kick()
        expect_device_error(lambda: q.wait(fence, timeout_s=30), ST_TIMEOUT)
        with pytest.raises(npu.NpuError) as info:
            q.nop()  # the runtime knows the queue stopped
        assert info.value.errno == errno.EIO
        bell = getattr(q, "_bell", None)  # the runtime's doorbell view
        if bell is not None:
            pid = os.fork()
            if pid == 0:  # the stop zapped the doorbell mapping, as QUEUE_DESTROY does
                try:
                    faulthandler.disable()  # no traceback dump for the expected SIGBUS
                    bell.value = fence + 1
                finally:
                    os._exit(0)
            _, st = os.waitpid(pid, 0)
            assert os.WIFSIGNALED(st) and os.WTERMSIG(st) == signal.SIGBUS, hex(st)
            del bell  # else the doorbell mapping (and its fd) outlive the queue's close
    assert read_int("hangs") == before + 1
    dev.wait(dev.submit([ops.nop()]), timeout_s=5)  # one hang: not banned


@needs_user_queues
def test_another_files_user_queue_resumes_where_it_was_after_the_reset(
    dev: npu.Device, other: npu.Device
) -> None:
    buf = other.alloc(4096)
    with other.create_queue(16) as q:
        q.wait(q.fill(buf, 0x11111111, 4096), timeout_s=30)  # before the hang
        inject("hang")
        hung = dev.submit([ops.nop()])
        assert wait_until(lambda: armed() == 0, 5.0), "the hang did not fire"
        fence = q.fill(buf, 0x22222222, 4096)  # queued while the device hangs
        q.kick()
        q.wait(fence, timeout_s=30)  # run after the reset, on the same ring
        assert (buf.numpy(np.uint32) == 0x22222222).all()
        expect_device_error(lambda: dev.wait(hung, timeout_s=30), ST_TIMEOUT)
        q.wait(q.fill(buf, 0x33333333, 4096), timeout_s=30)  # and it goes on
        assert (buf.numpy(np.uint32) == 0x33333333).all()
    other.wait(other.submit([ops.nop()]), timeout_s=5)
