"""Events and FENCE_INFO on the device: device-clock timing of queued work,
and the errno of each bad FENCE_INFO."""

from __future__ import annotations

import errno
import time

import numpy as np
import pytest

import npu
from npu import _abi, ops


def fence_info_errno(dev: npu.Device, fence: int, queue: int = 0) -> int:
    with pytest.raises(npu.NpuError) as info:
        dev.fence_info(fence, queue)
    return info.value.errno


def test_elapsed_time_measures_the_device_work_between_markers(dev: npu.Device) -> None:
    a = npu.tensor(np.ones((512, 512), np.float32), device=dev)
    start, end = npu.Event(dev, enable_timing=True), npu.Event(dev, enable_timing=True)
    t0 = time.perf_counter()
    start.record()
    for _ in range(4):
        a = npu.matmul(a, a) * (1 / 512)
    end.record()
    end.synchronize()
    wall_ms = (time.perf_counter() - t0) * 1e3
    ms = start.elapsed_time(end)
    assert 0.0 < ms <= wall_ms
    np.testing.assert_allclose(a.numpy(), np.ones((512, 512)), rtol=1e-5)


def test_query_turns_true_when_the_marker_is_passed(dev: npu.Device) -> None:
    e = npu.Event(dev)
    npu.relu(npu.tensor(np.ones(1024, np.float32), device=dev))
    e.record()
    e.synchronize()
    assert e.query()


def test_fence_info_gives_the_status_and_ordered_timestamps(dev: npu.Device) -> None:
    fence = dev.run([ops.nop(), ops.nop()])
    first, second = dev.fence_info(fence - 1), dev.fence_info(fence)
    assert first.status == second.status == _abi.NPU_ST_OK
    assert first.t_start_ns <= first.t_end_ns <= second.t_start_ns <= second.t_end_ns


def test_fence_info_of_another_files_fence_is_enoent(dev: npu.Device, dev_path: str) -> None:
    # Only the file that submitted an op learns when and how it ran.
    fence = dev.run([ops.nop()])
    with npu.Device(dev_path) as other:
        assert fence_info_errno(other, fence) == errno.ENOENT
    assert dev.fence_info(fence).status == _abi.NPU_ST_OK


def test_fence_info_of_bad_fences_and_queues_is_einval(dev: npu.Device) -> None:
    last = dev.run([ops.nop()])
    assert fence_info_errno(dev, 0) == errno.EINVAL
    assert fence_info_errno(dev, last + 1000) == errno.EINVAL  # never submitted
    assert fence_info_errno(dev, last, queue=7) == errno.EINVAL


def test_fence_info_of_a_running_op_is_ebusy(dev: npu.Device) -> None:
    with dev.alloc(1 << 20) as buf:
        gemm = ops.gemm(buf, buf, buf, 256, 256, 256)
        last = dev.submit([gemm] * 128)  # hundreds of ms of device work
        assert fence_info_errno(dev, last) == errno.EBUSY
        dev.wait(last, timeout_s=120)
        assert dev.fence_info(last).status == _abi.NPU_ST_OK


def test_fence_info_of_a_record_the_ring_reused_is_enoent(dev: npu.Device) -> None:
    old = dev.run([ops.nop()])
    entries = dev.info.ring_entries
    batch = [ops.nop()] * _abi.NPU_SUBMIT_MAX_OPS
    for _ in range(entries // len(batch) + 1):
        last = dev.submit(batch)
    dev.wait(last, timeout_s=60)
    assert fence_info_errno(dev, old) == errno.ENOENT
