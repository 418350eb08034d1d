"""Device: the ioctls it issues and how it reports their failures (fake driver)."""

from __future__ import annotations

import ctypes
import errno

import pytest

import npu
from fake_driver import PAGE, FakeDriver
from npu import _abi, ops


def test_info_reports_get_info_fields(device: npu.Device) -> None:
    info = device.info
    assert (info.hw_version_str, info.driver_version_str) == ("1.0", "1.2")
    assert (info.pci_vendor, info.pci_device) == (0x1234, 0x4E50)
    assert info.has(npu.Cap.GEMM_FP32 | npu.Cap.COPY)
    assert info.max_submit == _abi.NPU_SUBMIT_MAX_OPS


def test_info_is_queried_once(device: npu.Device, driver: FakeDriver) -> None:
    assert device.info is device.info
    assert [req for req, _ in driver.calls].count(_abi.NPU_IOCTL_GET_INFO) == 1


def test_device_info_is_frozen(device: npu.Device) -> None:
    with pytest.raises(AttributeError):
        device.info.num_cores = 1  # type: ignore[misc]


def test_bo_create_returns_handle_offset_and_rounded_size(device: npu.Device) -> None:
    handle, offset, alloc_size = device.bo_create(100)
    assert handle != 0
    assert offset % PAGE == 0
    assert alloc_size >= 100


def test_bo_create_failure_keeps_errno_and_names_the_call(device: npu.Device) -> None:
    with pytest.raises(npu.NpuError) as info:
        device.bo_create(0)
    assert info.value.errno == errno.EINVAL
    assert info.value.context == "BO_CREATE(size=0)"


def test_bo_create_rejects_a_negative_size_before_the_driver(
    device: npu.Device, driver: FakeDriver
) -> None:
    with pytest.raises(ValueError):
        device.bo_create(-1)
    assert not any(req == _abi.NPU_IOCTL_BO_CREATE for req, _ in driver.calls)


def test_alloc_accepts_a_numpy_integer_size(device: npu.Device) -> None:
    import numpy as np

    with device.alloc(np.int64(64)) as buf:
        assert (type(buf.size), buf.size) == (int, 64)


def test_bo_destroy_of_an_unknown_handle_names_the_handle(device: npu.Device) -> None:
    with pytest.raises(npu.NpuError) as info:
        device.bo_destroy(42)
    assert info.value.errno == errno.ENOENT
    assert info.value.context == "BO_DESTROY(handle=42)"


def test_submit_passes_an_array_of_npu_op_with_its_size(
    device: npu.Device, driver: FakeDriver
) -> None:
    with device.alloc(64) as buf:
        fence = device.submit([ops.nop(), ops.fill(buf, 0xAB, 64)])
    submit = _abi.NpuSubmit.from_buffer_copy(
        next(raw for req, raw in driver.calls if req == _abi.NPU_IOCTL_SUBMIT)
    )
    assert (submit.num_ops, submit.queue, submit.flags) == (2, 0, 0)
    assert submit.op_size == ctypes.sizeof(_abi.NpuOp)
    assert [op.opcode for op in driver.submitted] == [_abi.NPU_OP_NOP, _abi.NPU_OP_FILL]
    assert fence == 2


def test_submit_rejects_an_empty_batch(device: npu.Device) -> None:
    with pytest.raises(ValueError, match="no ops"):
        device.submit([])


def test_submit_rejects_more_than_npu_submit_max_ops(device: npu.Device) -> None:
    with pytest.raises(ValueError, match="at most"):
        device.submit([ops.nop()] * (_abi.NPU_SUBMIT_MAX_OPS + 1))


def test_submit_rejects_a_freed_buffer_with_ebadf(device: npu.Device) -> None:
    buf = device.alloc(64)
    op = ops.fill(buf, 0, 64)
    buf.free()
    with pytest.raises(npu.NpuError) as info:
        device.submit([op])
    assert info.value.errno == errno.EBADF


def test_submit_rejects_a_buffer_of_another_device(device: npu.Device, driver: FakeDriver) -> None:
    with (
        npu.Device(driver.path) as other,
        other.alloc(64) as foreign,
        pytest.raises(ValueError, match="uses"),
    ):
        device.submit([ops.fill(foreign, 0, 64)])


def test_submit_failure_names_the_queue_and_ops(device: npu.Device) -> None:
    with pytest.raises(npu.NpuError) as info:
        device.submit([ops.nop()], queue=1)
    assert info.value.errno == errno.EINVAL
    assert info.value.context.startswith("SUBMIT(queue=1, num_ops=1, ops=[NOP(")


def test_wait_returns_once_the_fence_completed(device: npu.Device) -> None:
    device.wait(device.submit([ops.nop()]))


def test_wait_raises_device_error_with_status_fence_and_op(
    device: npu.Device, driver: FakeDriver
) -> None:
    driver.fail_opcode[_abi.NPU_OP_FILL] = _abi.NPU_ST_BAD_ARGS
    with device.alloc(64) as buf:
        bad = ops.fill(buf, 1, 64)
        fence = device.submit([ops.nop(), bad, ops.nop()])
        with pytest.raises(npu.NpuDeviceError) as info:
            device.wait(fence)
    err = info.value
    assert (err.errno, err.status, err.status_name) == (errno.EIO, 4, "NPU_ST_BAD_ARGS")
    assert err.fence == fence - 1
    assert err.op == bad
    assert err.context.startswith(f"WAIT(fence={fence}")


def test_wait_raises_timeout_error_when_the_fence_does_not_complete(
    device: npu.Device, driver: FakeDriver
) -> None:
    fence = device.submit([ops.nop()])
    driver.hang = True
    with pytest.raises(npu.NpuTimeoutError) as info:
        device.wait(fence, timeout_s=0.01)
    assert (info.value.errno, info.value.fence, info.value.timeout_s) == (
        errno.ETIMEDOUT,
        fence,
        0.01,
    )


def test_wait_converts_the_timeout_to_nanoseconds(device: npu.Device, driver: FakeDriver) -> None:
    device.wait(device.submit([ops.nop()]), timeout_s=2.0)
    wait = _abi.NpuWait.from_buffer_copy(driver.calls[-1][1])
    assert 1_900_000_000 < wait.timeout_ns <= 2_000_000_000


def test_wait_with_zero_timeout_polls(device: npu.Device, driver: FakeDriver) -> None:
    device.wait(device.submit([ops.nop()]), timeout_s=0)
    assert _abi.NpuWait.from_buffer_copy(driver.calls[-1][1]).timeout_ns == 0


def test_wait_retries_after_a_signal_interrupted_it(
    device: npu.Device, driver: FakeDriver, monkeypatch: pytest.MonkeyPatch
) -> None:
    import fcntl

    fence = device.submit([ops.nop()])
    interrupted: list[bool] = []

    def ioctl(fd: int, request: int, arg: object, mutate: bool = True) -> int:
        if not interrupted:
            interrupted.append(True)
            raise InterruptedError(errno.EINTR, "Interrupted system call")
        return driver.ioctl(fd, request, arg, mutate)

    monkeypatch.setattr(fcntl, "ioctl", ioctl)
    device.wait(fence)
    assert interrupted == [True]


def test_submit_retries_after_a_signal_interrupted_it(
    device: npu.Device, driver: FakeDriver, monkeypatch: pytest.MonkeyPatch
) -> None:
    import fcntl

    interrupted: list[bool] = []

    def ioctl(fd: int, request: int, arg: object, mutate: bool = True) -> int:
        if not interrupted:
            interrupted.append(True)
            raise InterruptedError(errno.EINTR, "Interrupted system call")
        return driver.ioctl(fd, request, arg, mutate)

    monkeypatch.setattr(fcntl, "ioctl", ioctl)
    assert device.submit([ops.nop()]) == 1
    assert len(driver.submitted) == 1


def test_wait_for_a_fence_never_submitted_is_an_npu_error(device: npu.Device) -> None:
    with pytest.raises(npu.NpuError) as info:
        device.wait(99)
    assert info.value.errno == errno.EINVAL
    assert type(info.value) is npu.NpuError


def test_wait_rejects_a_negative_timeout(device: npu.Device) -> None:
    with pytest.raises(ValueError, match="timeout_s"):
        device.wait(1, timeout_s=-1)


def test_closed_device_raises_ebadf(driver: FakeDriver) -> None:
    dev = npu.Device(driver.path)
    dev.close()
    with pytest.raises(npu.NpuError) as info:
        dev.alloc(64)
    assert info.value.errno == errno.EBADF


def test_close_is_idempotent(driver: FakeDriver) -> None:
    dev = npu.Device(driver.path)
    dev.close()
    dev.close()
    assert dev.closed


def test_close_frees_the_buffers_still_allocated(driver: FakeDriver) -> None:
    dev = npu.Device(driver.path)
    buf = dev.alloc(64)
    dev.close()
    assert buf.freed
    assert driver.bos == {}
