"""Device: the backend calls it makes and how it reports their failures (CPU backend)."""

from __future__ import annotations

import ctypes
import errno
import mmap
from typing import Any

import pytest

import npu
from npu import _abi, ops
from npu.hal import CpuBackend, HalCall

PAGE = mmap.PAGESIZE


def test_info_reports_get_info_fields(device: npu.Device) -> None:
    info = device.info
    assert (info.hw_version_str, info.driver_version_str) == ("1.0", "1.0")
    assert (info.pci_vendor, info.pci_device) == (0x1234, 0x4E50)
    assert info.has(npu.Cap.GEMM_FP32 | npu.Cap.COPY)
    assert info.max_submit == _abi.NPU_SUBMIT_MAX_OPS


def test_info_is_queried_once(device: npu.Device, driver: CpuBackend) -> None:
    assert device.info is device.info
    assert [call.name for call in driver.calls].count("query") == 1


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
    device: npu.Device, driver: CpuBackend
) -> None:
    with pytest.raises(ValueError):
        device.bo_create(-1)
    assert not any(call.name == "bo_create" for call in driver.calls)


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
    device: npu.Device, driver: CpuBackend
) -> None:
    with device.alloc(64) as buf:
        fence = device.submit([ops.nop(), ops.fill(buf, 0xAB, 64)])
    submit = next(call for call in driver.calls if call.name == "submit")
    assert submit.args == (ctypes.sizeof(_abi.NpuOp), 2, 0)  # op_size, num_ops, queue
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


def test_submit_rejects_a_buffer_of_another_device(device: npu.Device, driver: CpuBackend) -> None:
    with (
        npu.Device(driver) as other,
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
    device: npu.Device, driver: CpuBackend
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
    device: npu.Device, driver: CpuBackend
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


def test_wait_converts_the_timeout_to_nanoseconds(device: npu.Device, driver: CpuBackend) -> None:
    device.wait(device.submit([ops.nop()]), timeout_s=2.0)
    _, timeout_ns, _ = driver.calls[-1].args
    assert driver.calls[-1].name == "wait"
    assert 1_900_000_000 < timeout_ns <= 2_000_000_000


def test_wait_with_zero_timeout_polls(device: npu.Device, driver: CpuBackend) -> None:
    device.wait(device.submit([ops.nop()]), timeout_s=0)
    assert driver.calls[-1] == HalCall("wait", (1, 0, 0))  # fence, timeout_ns, queue


def test_wait_retries_after_a_signal_interrupted_it(
    device: npu.Device, driver: CpuBackend, monkeypatch: pytest.MonkeyPatch
) -> None:
    fence = device.submit([ops.nop()])
    interrupted: list[bool] = []
    wait = driver.wait

    def interrupted_once(fence: int, timeout_ns: int, queue: int) -> None:
        if not interrupted:
            interrupted.append(True)
            raise InterruptedError(errno.EINTR, "Interrupted system call")
        wait(fence, timeout_ns, queue)

    monkeypatch.setattr(driver, "wait", interrupted_once)
    device.wait(fence)
    assert interrupted == [True]


def test_submit_retries_after_a_signal_interrupted_it(
    device: npu.Device, driver: CpuBackend, monkeypatch: pytest.MonkeyPatch
) -> None:
    interrupted: list[bool] = []
    submit = driver.submit

    def interrupted_once(ops: ctypes.Array[Any], op_size: int, queue: int) -> int:
        if not interrupted:
            interrupted.append(True)
            raise InterruptedError(errno.EINTR, "Interrupted system call")
        return submit(ops, op_size, queue)

    monkeypatch.setattr(driver, "submit", interrupted_once)
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


def test_closed_device_raises_ebadf(driver: CpuBackend) -> None:
    dev = npu.Device(driver)
    dev.close()
    with pytest.raises(npu.NpuError) as info:
        dev.alloc(64)
    assert info.value.errno == errno.EBADF


def test_close_is_idempotent(driver: CpuBackend) -> None:
    dev = npu.Device(driver)
    dev.close()
    dev.close()
    assert dev.closed


def test_close_frees_the_buffers_still_allocated(driver: CpuBackend) -> None:
    dev = npu.Device(driver)
    buf = dev.alloc(64)
    dev.close()
    assert buf.freed
    assert driver.handles == set()


def test_an_attachment_is_made_once_per_factory_and_dropped_at_close() -> None:
    made: list[object] = []

    def factory(device: npu.Device) -> object:
        made.append(object())
        return made[-1]

    dev = npu.Device("cpu")
    first = dev.attachment(factory)
    assert dev.attachment(factory) is first
    assert dev.attachment(lambda d: "other") == "other"
    dev.close()
    assert dev.attachment(factory) is not first
    assert len(made) == 2
