"""npu.hal: naming a backend, and the CPU backend's own behaviour."""

from __future__ import annotations

import errno
import mmap
import os

import numpy as np
import pytest

import npu
from npu import _abi, ops
from npu.core.device import node_path
from npu.hal import Backend, CpuBackend, DriverBackend


def test_cpu_names_the_cpu_backend() -> None:
    with npu.Device("cpu") as dev:
        assert (dev.kind, dev.path) == ("cpu", "cpu")
        assert isinstance(dev.backend, CpuBackend)


def test_npu_colon_index_names_the_device_node() -> None:
    assert node_path("npu:3") == "/dev/npu3"
    assert node_path(3) == "/dev/npu3"


def test_a_missing_node_named_npu_colon_index_is_device_not_found() -> None:
    with pytest.raises(npu.DeviceNotFoundError) as info:
        npu.Device("npu:97")
    assert info.value.errno == errno.ENOENT
    assert "/dev/npu97" in str(info.value)


def test_both_backends_implement_the_protocol() -> None:
    assert isinstance(CpuBackend(), Backend)
    driver = DriverBackend(os.devnull)  # any file opens; no ioctl is made
    try:
        assert isinstance(driver, Backend)
    finally:
        driver.close()


def test_npu_backend_cpu_makes_the_cpu_backend_the_default_device(
    no_default_device: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("NPU_BACKEND", "cpu")
    assert npu.default_device().kind == "cpu"
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    np.testing.assert_array_equal((npu.tensor(x) * 2).numpy(), x * 2)


def test_an_unknown_npu_backend_is_a_value_error(
    no_default_device: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("NPU_BACKEND", "gpu")
    with pytest.raises(ValueError, match="NPU_BACKEND='gpu'"):
        npu.default_device()


def test_npu_device_cpu_also_names_the_cpu_backend(
    no_default_device: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("NPU_DEVICE", "cpu")
    assert npu.default_device().kind == "cpu"


def test_the_cpu_backend_has_no_device_memory_or_userptr(device: npu.Device) -> None:
    with pytest.raises(npu.NpuError) as info:
        device.alloc(4096, device_memory=True)
    assert info.value.errno == errno.EOPNOTSUPP
    with pytest.raises(npu.NpuError) as info:
        device.userptr(np.zeros(1024, np.float32))
    assert info.value.errno == errno.EOPNOTSUPP


def test_a_mapping_of_a_destroyed_buffer_is_refused(driver: CpuBackend) -> None:
    bo = driver.bo_create(4096, 0)
    driver.bo_destroy(bo.handle)
    with pytest.raises(OSError) as info:
        driver.map(bo.mmap_offset, 4096, mmap.PROT_READ)
    assert info.value.errno == errno.EINVAL


def test_buffer_offsets_are_never_reused(driver: CpuBackend) -> None:
    first = driver.bo_create(4096, 0)
    driver.bo_destroy(first.handle)
    second = driver.bo_create(4096, 0)
    assert second.mmap_offset != first.mmap_offset
    assert second.handle != first.handle


def test_a_destroyed_buffer_gives_its_memory_file_back(driver: CpuBackend) -> None:
    before = len(os.listdir("/proc/self/fd"))
    handles = [driver.bo_create(4096, 0).handle for _ in range(50)]
    for handle in handles:
        driver.bo_destroy(handle)
    assert len(os.listdir("/proc/self/fd")) == before


def test_an_injected_failure_stops_the_queue_like_the_device(
    device: npu.Device, driver: CpuBackend
) -> None:
    driver.fail_opcode[_abi.NPU_OP_NOP] = _abi.NPU_ST_BAD_ARGS
    fence = device.submit([ops.nop()])
    with pytest.raises(npu.NpuDeviceError) as info:
        device.wait(fence)
    assert (info.value.status, info.value.fence) == (_abi.NPU_ST_BAD_ARGS, fence)
    with pytest.raises(npu.NpuDeviceError):
        device.wait(device.submit([ops.nop()]))


def test_fence_info_keeps_the_last_ring_entries_records(device: npu.Device) -> None:
    entries = device.info.ring_entries
    first = device.run([ops.nop()])
    for _ in range(entries):
        device.run([ops.nop()])
    with pytest.raises(npu.NpuError) as info:
        device.fence_info(first)
    assert info.value.errno == errno.ENOENT
    times = device.fence_info(first + entries)
    assert times.status == _abi.NPU_ST_OK and times.t_end_ns >= times.t_start_ns


def test_closing_the_device_closes_its_backend(driver: CpuBackend) -> None:
    dev = npu.Device(driver)
    dev.close()
    with pytest.raises(OSError) as info:
        driver.fileno()
    assert info.value.errno == errno.EBADF
