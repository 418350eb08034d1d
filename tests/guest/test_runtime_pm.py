"""Runtime power management (docs/uapi.md "Power management", kernel_module/npu_pm.c).

After ``power/autosuspend_delay_ms`` with nothing to do the device suspends
to D3hot, where it loses its state (registers, queues, firmware); the next
SUBMIT resumes it: the driver programs it again and boots the firmware, and
the work runs as if nothing happened. A job in flight, a user queue and a
CPU mapping of device memory keep the device awake. Device memory keeps its
contents across D3hot.
"""

from __future__ import annotations

import ctypes
import fcntl
import mmap
import os
import time
from collections.abc import Iterator

import numpy as np
import pytest
from test_user_queues import RawQueue

from npu import _abi, ops

PCI = "/sys/class/accel/accel0/device"
POWER = f"{PCI}/power"
SYSFS = f"{PCI}/npu"
FW_STATUS = "/sys/kernel/debug/npu/npu0/fw_status"
PAGE = mmap.PAGESIZE
RW = mmap.PROT_READ | mmap.PROT_WRITE
DELAY_MS = 100
FW_RUNNING = 1  # NPU_FW_RUNNING, enum npu_fw_state (npu_hw.h)
WAIT_NS = 30 * 10**9


def read(path: str) -> str:
    with open(path) as f:
        return f.read().strip()


def write(path: str, value: str) -> None:
    with open(path, "w") as f:
        f.write(value)


def status() -> str:
    return read(f"{POWER}/runtime_status")


def counter(name: str) -> int:
    return int(read(f"{SYSFS}/{name}"))


def until(pred, timeout_s: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while not pred():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    return True


def suspended() -> None:
    assert until(lambda: status() == "suspended"), f"still {status()} after 10 s"


@pytest.fixture(autouse=True)
def short_delay() -> Iterator[None]:
    old_delay, old_control = read(f"{POWER}/autosuspend_delay_ms"), read(f"{POWER}/control")
    write(f"{POWER}/control", "auto")
    write(f"{POWER}/autosuspend_delay_ms", str(DELAY_MS))
    yield
    write(f"{POWER}/autosuspend_delay_ms", old_delay)
    write(f"{POWER}/control", old_control)


def ioctl(fd: int, request: int, arg: ctypes.Structure) -> None:
    fcntl.ioctl(fd, request, arg, True)


class Bo:
    def __init__(self, fd: int, size: int, flags: int = 0) -> None:
        arg = _abi.NpuBoCreate(size=size, flags=flags)
        ioctl(fd, _abi.DRM_IOCTL_NPU_BO_CREATE, arg)
        self.fd, self.handle, self.size = fd, int(arg.handle), size
        self.offset = int(arg.mmap_offset)

    def map(self) -> mmap.mmap:
        return mmap.mmap(self.fd, self.size, mmap.MAP_SHARED, RW, offset=self.offset)


def run(fd: int, op_list: list) -> int:
    raw = (_abi.NpuOp * len(op_list))(*(op.pack() for op in op_list))
    arg = _abi.NpuSubmit(
        ops_ptr=ctypes.addressof(raw), num_ops=len(op_list), op_size=ctypes.sizeof(_abi.NpuOp)
    )
    ioctl(fd, _abi.DRM_IOCTL_NPU_SUBMIT, arg)
    return int(arg.fence)


def wait(fd: int, fence: int, timeout_ns: int = WAIT_NS) -> None:
    arg = _abi.NpuWait(fence=fence, deadline_ns=_abi.deadline_after(timeout_ns))
    ioctl(fd, _abi.DRM_IOCTL_NPU_WAIT, arg)


def test_the_device_has_runtime_pm_allowed_with_autosuspend() -> None:
    assert os.path.exists(f"{POWER}/autosuspend_delay_ms")
    assert read(f"{POWER}/control") == "auto"


def test_an_idle_device_suspends_after_its_delay(fd) -> None:
    suspended()


def test_a_submit_resumes_a_suspended_device_and_computes_right(fd) -> None:
    src, dst = Bo(fd, 1 << 20), Bo(fd, 1 << 20)
    data = np.random.default_rng(5).integers(0, 256, 1 << 20, dtype=np.uint8).tobytes()
    with src.map() as m:
        m[:] = data
    suspended()
    resumes = counter("runtime_resumes")
    wait(fd, run(fd, [ops.copy(src, dst, 1 << 20)]))
    assert counter("runtime_resumes") == resumes + 1
    assert counter("last_resume_us") > 0
    with dst.map() as m:
        assert m[:] == data
    suspended()


def test_the_firmware_is_booted_again_on_resume(fd) -> None:
    version = read(f"{SYSFS}/fw_version")
    dst = Bo(fd, PAGE)
    suspended()
    wait(fd, run(fd, [ops.fill(dst, 7, PAGE)]))
    state = dict(line.split(": ", 1) for line in read(FW_STATUS).splitlines())
    assert int(state["state"]) == FW_RUNNING
    assert read(f"{SYSFS}/fw_version") == version


def test_no_work_is_lost_across_many_suspend_cycles(fd) -> None:
    dst = Bo(fd, PAGE)
    with dst.map() as m:
        for i in range(5):
            suspended()
            wait(fd, run(fd, [ops.fill(dst, 0x1000 + i, PAGE)]))
            assert np.frombuffer(m, np.uint32)[0] == 0x1000 + i


def test_completion_records_and_fences_go_on_across_a_suspend(fd) -> None:
    dst = Bo(fd, PAGE)
    first = run(fd, [ops.fill(dst, 3, PAGE)])
    wait(fd, first)
    suspended()
    second = run(fd, [ops.fill(dst, 4, PAGE)])  # resumes the device
    wait(fd, second)
    assert second == first + 1
    info = _abi.NpuFenceInfo(fence=first, queue=0)
    ioctl(fd, _abi.DRM_IOCTL_NPU_FENCE_INFO, info)
    assert info.status == _abi.NPU_ST_OK and 0 < info.t_start <= info.t_end


def test_a_job_in_flight_keeps_the_device_awake(fd) -> None:
    size = 16 << 20
    src, dst = Bo(fd, size), Bo(fd, size)
    suspended()
    fence = run(fd, [ops.copy(src, dst, size) if i % 2 else ops.copy(dst, src, size)
                     for i in range(64)])  # fmt: skip
    seen = []
    while True:
        try:
            wait(fd, fence, 0)
            break
        except TimeoutError:
            seen.append(status())
    assert "suspended" not in seen, seen


def test_a_user_queue_keeps_the_device_awake_until_it_is_destroyed(fd) -> None:
    suspended()
    q = RawQueue(fd)
    try:
        time.sleep(5 * DELAY_MS / 1000)
        assert status() == "active"
    finally:
        q.close()
    arg = _abi.NpuQueueDestroy(queue=q.index)
    ioctl(fd, _abi.DRM_IOCTL_NPU_QUEUE_DESTROY, arg)
    suspended()


def test_a_device_memory_mapping_keeps_the_device_awake(fd) -> None:
    bo = Bo(fd, 64 * PAGE, _abi.NPU_BO_DEVICE)  # the device always has BAR2 memory
    m = bo.map()
    m[:20] = b"kept in self-refresh"
    time.sleep(5 * DELAY_MS / 1000)
    assert status() == "active"
    m.close()
    suspended()
    with bo.map() as m2:
        assert m2[:20] == b"kept in self-refresh"


def test_a_suspend_disarms_an_injected_fault(fd) -> None:
    dst = Bo(fd, PAGE)
    write("/sys/kernel/debug/npu/npu0/inject", "hw_error")  # armed in the device
    suspended()  # D3hot: the device's state, the armed fault too, is gone
    wait(fd, run(fd, [ops.fill(dst, 1, PAGE)]))
    with dst.map() as m:
        assert np.frombuffer(m, np.uint32)[0] == 1
