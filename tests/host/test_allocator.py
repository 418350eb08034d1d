"""The caching allocator (npu.allocator) on the CPU backend: reuse, splitting,
merging, uploads that never race queued ops, statistics and out-of-memory."""

from __future__ import annotations

import errno
import gc

import numpy as np
import pytest

import npu
from npu.allocator import (
    ALIGN,
    LARGE_ROUND,
    SMALL_SEGMENT,
    CachingAllocator,
    allocator,
)
from npu.hal import CpuBackend

MiB = 1 << 20


def bo_creates(driver: CpuBackend) -> int:
    return sum(1 for call in driver.calls if call.name == "bo_create")


def bo_destroys(driver: CpuBackend) -> int:
    return sum(1 for call in driver.calls if call.name == "bo_destroy")


def test_small_allocations_share_one_segment(device: npu.Device, driver: CpuBackend) -> None:
    alloc = allocator(device)
    blocks = [alloc.allocate(1000) for _ in range(8)]
    assert bo_creates(driver) == 1
    assert len({b.buffer.handle for b in blocks}) == 1
    offsets = sorted(b.offset for b in blocks)
    assert offsets == [i * 1024 for i in range(8)]  # 1000 rounded up to ALIGN multiples


def test_a_freed_block_is_reused_without_an_ioctl(device: npu.Device, driver: CpuBackend) -> None:
    alloc = allocator(device)
    first = alloc.allocate(4096)
    where = (first.buffer.handle, first.offset)
    del first
    calls = len(driver.calls)
    again = alloc.allocate(4096)
    assert (again.buffer.handle, again.offset) == where
    assert len(driver.calls) == calls


def test_ten_thousand_alloc_free_cycles_end_at_the_baseline(
    device: npu.Device, driver: CpuBackend
) -> None:
    alloc = allocator(device)
    for i in range(10_000):
        block = alloc.allocate(1 + (i * 7919) % (3 * MiB))
        del block
    stats = alloc.memory_stats()
    assert stats["allocated_bytes.all.current"] == 0
    assert stats["allocation.all.current"] == 0
    assert stats["allocation.all.allocated"] == 10_000
    assert bo_creates(driver) <= 4
    alloc.empty_cache()
    assert alloc.memory_stats()["reserved_bytes.all.current"] == 0
    assert driver.handles == set()


def test_freed_neighbours_merge_and_empty_cache_returns_the_segment(
    device: npu.Device, driver: CpuBackend
) -> None:
    alloc = allocator(device)
    a, b, c = (alloc.allocate(64 * 1024) for _ in range(3))
    assert alloc.empty_cache() == 0  # the segment still holds allocations
    del b
    del a, c
    assert alloc.empty_cache() == SMALL_SEGMENT
    assert bo_destroys(driver) == 1
    assert alloc.memory_reserved() == 0


def test_a_merged_block_serves_a_request_larger_than_its_parts(device: npu.Device) -> None:
    alloc = allocator(device)
    parts = [alloc.allocate(256 * 1024) for _ in range(8)]  # the whole segment
    handle, start = parts[0].buffer.handle, parts[0].offset
    del parts
    whole = alloc.allocate(MiB)
    assert (whole.buffer.handle, whole.offset) == (handle, start)


def test_large_requests_get_a_segment_rounded_to_2_mib(
    device: npu.Device, driver: CpuBackend
) -> None:
    alloc = allocator(device)
    big = alloc.allocate(3 * MiB + 1)
    assert big.offset == 0 and big.buffer.size == 2 * LARGE_ROUND
    stats = alloc.memory_stats()
    assert stats["segment.large_pool.current"] == 1
    assert stats["reserved_bytes.large_pool.current"] == 4 * MiB
    assert stats["requested_bytes.all.current"] == 3 * MiB + 1


def test_a_large_cached_block_is_split_for_a_smaller_large_request(device: npu.Device) -> None:
    alloc = allocator(device)
    big = alloc.allocate(16 * MiB)
    handle = big.buffer.handle
    del big
    a = alloc.allocate(4 * MiB)
    b = alloc.allocate(4 * MiB)
    assert a.buffer.handle == b.buffer.handle == handle
    assert {a.offset, b.offset} == {0, 4 * MiB}


def test_memory_stats_use_pytorch_key_names_and_track_the_peak(device: npu.Device) -> None:
    alloc = allocator(device)
    a = alloc.allocate(ALIGN)
    b = alloc.allocate(ALIGN)
    del a, b
    stats = alloc.memory_stats()
    for key in (
        "allocated_bytes.all.current",
        "allocated_bytes.all.peak",
        "allocated_bytes.all.allocated",
        "allocated_bytes.all.freed",
        "reserved_bytes.all.current",
        "reserved_bytes.all.peak",
        "allocation.small_pool.current",
        "segment.large_pool.current",
        "num_alloc_retries",
        "num_ooms",
    ):
        assert key in stats, key
    assert stats["allocated_bytes.all.peak"] == 2 * ALIGN
    assert stats["allocated_bytes.all.freed"] == 2 * ALIGN
    alloc.reset_peak_stats()
    assert alloc.memory_stats()["allocated_bytes.all.peak"] == 0


def test_module_functions_use_the_default_device(default_device: npu.Device) -> None:
    t = npu.tensor(np.ones(1000, np.float32))
    assert npu.memory_allocated() == 4096
    assert npu.memory_reserved() == SMALL_SEGMENT
    assert npu.memory_stats()["allocation.all.current"] == 1
    del t
    assert npu.memory_allocated() == 0
    assert npu.empty_cache() == SMALL_SEGMENT


def test_an_upload_never_takes_a_block_a_queued_op_may_still_use(
    default_device: npu.Device, driver: CpuBackend
) -> None:
    x = npu.tensor(np.ones(256, np.float32))
    y = npu.relu(x)  # queued; no WAIT yet, so x's block is busy once freed
    busy = (x.buffer.handle if x.buffer else -1, x.offset)
    del x
    z = npu.tensor(np.full(256, 2, np.float32))
    assert (z.buffer.handle if z.buffer else -1, z.offset) != busy
    np.testing.assert_array_equal(y.numpy(), np.ones(256))
    del z
    gc.collect()
    # After the WAIT of y.numpy() the block is idle: the next upload may take it.
    w = npu.tensor(np.full(256, 3, np.float32))
    assert (w.buffer.handle if w.buffer else -1, w.offset) == busy
    assert npu.memory_stats()["num_host_waits"] == 0


def test_device_ops_reuse_a_busy_block_because_the_queue_is_in_order(
    default_device: npu.Device,
) -> None:
    x = npu.tensor(np.arange(256, dtype=np.float32))
    y = npu.relu(x)
    place = (x.buffer.handle if x.buffer else -1, x.offset)
    del x
    z = npu.relu(y)  # its output may take x's block at once
    assert (z.buffer.handle if z.buffer else -1, z.offset) == place
    np.testing.assert_array_equal(z.numpy(), np.arange(256))


def refuse_one_bo_create(device: npu.Device, monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The device's next BO_CREATE fails with ENOMEM; the list gets its size."""
    real = device.bo_create
    refused: list[int] = []

    def bo_create_once_enomem(size: int) -> tuple[int, int, int]:
        if not refused:
            refused.append(size)
            raise npu.NpuError(errno.ENOMEM, "no memory", f"BO_CREATE(size={size})")
        return real(size)

    monkeypatch.setattr(device, "bo_create", bo_create_once_enomem)
    return refused


class FakeStreamKey:
    """A stream's timeline as the allocator sees it: completed up to ``done``."""

    def __init__(self) -> None:
        self.done = 0
        self.waits: list[int] = []

    def completed(self, fence: int) -> bool:
        return fence <= self.done

    def wait(self, fence: int, timeout_s: float | None = None) -> None:
        self.waits.append(fence)
        self.done = max(self.done, fence)


def freed_while_stream_busy(device: npu.Device, key: FakeStreamKey) -> tuple[int, int]:
    """Allocate a block on ``key``'s stream and free it while fence 1 there is pending."""
    alloc = allocator(device)
    device.note_timeline(key, 1)
    block = alloc.allocate(4096, stream=key)
    where = (block.buffer.handle, block.offset)
    del block
    return where


def test_a_block_freed_while_a_stream_uses_it_is_reused_by_that_stream_only(
    device: npu.Device,
) -> None:
    alloc = allocator(device)
    key, other = FakeStreamKey(), FakeStreamKey()
    where = freed_while_stream_busy(device, key)
    on_other = alloc.allocate(4096, stream=other)  # type: ignore[arg-type]
    on_default = alloc.allocate(4096)
    assert (on_other.buffer.handle, on_other.offset) != where
    assert (on_default.buffer.handle, on_default.offset) != where
    on_same = alloc.allocate(4096, stream=key)
    assert (on_same.buffer.handle, on_same.offset) == where
    assert key.waits == [] and alloc.num_host_waits == 0


def test_a_block_of_a_stream_is_free_for_all_once_the_stream_passed_its_fence(
    device: npu.Device,
) -> None:
    alloc = allocator(device)
    key = FakeStreamKey()
    where = freed_while_stream_busy(device, key)
    key.done = 1
    upload = alloc.allocate(4096, host_write=True)
    assert (upload.buffer.handle, upload.offset) == where
    assert key.waits == []


def test_empty_cache_waits_for_the_stream_still_using_a_segment_before_destroying_it(
    device: npu.Device, driver: CpuBackend
) -> None:
    alloc = allocator(device)
    key = FakeStreamKey()
    freed_while_stream_busy(device, key)
    destroyed = bo_destroys(driver)
    assert alloc.empty_cache() == SMALL_SEGMENT
    assert key.waits == [1]  # the stream passed fence 1 before BO_DESTROY
    assert bo_destroys(driver) == destroyed + 1


def test_a_stream_that_does_not_finish_keeps_its_segment_through_empty_cache(
    device: npu.Device, driver: CpuBackend
) -> None:
    alloc = allocator(device)
    key = FakeStreamKey()

    def timed_out(fence: int, timeout_s: float | None = None) -> None:
        raise npu.NpuTimeoutError(fence, 10.0, "stream wait")

    key.wait = timed_out  # type: ignore[method-assign]
    where = freed_while_stream_busy(device, key)
    destroyed = bo_destroys(driver)
    assert alloc.empty_cache() == 0
    assert bo_destroys(driver) == destroyed
    key.done = 1  # the stream finishes later: the segment is reused, then released
    again = alloc.allocate(4096, stream=key)
    assert (again.buffer.handle, again.offset) == where
    del again
    assert alloc.empty_cache() == SMALL_SEGMENT


def test_the_out_of_memory_retry_waits_for_the_stream_before_destroying_its_segment(
    device: npu.Device, monkeypatch: pytest.MonkeyPatch
) -> None:
    alloc = allocator(device)
    key = FakeStreamKey()
    freed_while_stream_busy(device, key)
    refused = refuse_one_bo_create(device, monkeypatch)
    block = alloc.allocate(10 * MiB)
    assert refused and key.waits == [1]
    del block


def test_without_caching_a_block_a_stream_uses_is_destroyed_only_after_the_stream(
    device: npu.Device, driver: CpuBackend
) -> None:
    alloc = CachingAllocator(device, caching=False)
    key = FakeStreamKey()
    device.note_timeline(key, 1)
    block = alloc.allocate(4096, stream=key)
    del block
    alloc.memory_stats()  # processes the queued free
    assert bo_destroys(driver) == 0  # fence 1 of the stream is pending
    key.done = 1
    alloc.memory_stats()
    assert bo_destroys(driver) == 1
    assert key.waits == []


def test_a_view_keeps_the_block_allocated(default_device: npu.Device) -> None:
    t = npu.tensor(np.arange(12, dtype=np.float32).reshape(3, 4))
    view = t.T
    del t
    assert npu.memory_allocated() == ALIGN
    other = npu.tensor(np.zeros(12, np.float32))
    assert other.offset != view.offset or other.buffer is not view.buffer
    np.testing.assert_array_equal(view.numpy(), np.arange(12).reshape(3, 4).T)
    del view
    assert npu.memory_allocated() == ALIGN


def test_out_of_memory_empties_the_cache_and_retries_once(
    device: npu.Device, monkeypatch: pytest.MonkeyPatch
) -> None:
    alloc = allocator(device)
    cached = alloc.allocate(8 * MiB)
    del cached
    refuse_one_bo_create(device, monkeypatch)
    block = alloc.allocate(10 * MiB)
    assert block.buffer.size == 10 * MiB
    stats = alloc.memory_stats()
    assert stats["num_alloc_retries"] == 1 and stats["num_ooms"] == 0
    assert stats["reserved_bytes.all.current"] == 10 * MiB  # the 8 MiB segment was released


def test_out_of_memory_after_the_retry_raises_enomem(
    device: npu.Device, monkeypatch: pytest.MonkeyPatch
) -> None:
    alloc = allocator(device)
    keep = alloc.allocate(ALIGN)

    def no_memory(size: int) -> tuple[int, int, int]:
        raise npu.NpuError(errno.ENOMEM, "no memory", f"BO_CREATE(size={size})")

    monkeypatch.setattr(device, "bo_create", no_memory)
    with pytest.raises(npu.NpuError) as info:
        alloc.allocate(64 * MiB)
    assert info.value.errno == errno.ENOMEM
    assert alloc.memory_stats()["num_ooms"] == 1
    assert alloc.memory_allocated() == ALIGN
    del keep


def test_no_caching_mode_gives_each_allocation_its_own_buffer_object(
    device: npu.Device, driver: CpuBackend
) -> None:
    alloc = CachingAllocator(device, caching=False)
    a = alloc.allocate(100)
    b = alloc.allocate(100)
    assert a.buffer is not b.buffer and bo_creates(driver) == 2
    del a
    alloc.memory_stats()  # processes the queued free
    assert bo_destroys(driver) == 1
    del b


def test_no_caching_env_variable_turns_caching_off(
    device: npu.Device, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("NPU_NO_MEMORY_CACHING", "1")
    assert CachingAllocator(device).caching is False
    monkeypatch.setenv("NPU_NO_MEMORY_CACHING", "0")
    assert CachingAllocator(device).caching is True


def test_closing_the_device_drops_its_allocator(driver: CpuBackend) -> None:
    dev = npu.Device(driver)
    alloc = allocator(dev)
    block = alloc.allocate(ALIGN)
    dev.close()
    assert allocator(dev) is not alloc  # a new one, were the device used again
    assert block.buffer.freed
    del block  # a free after close is harmless
    assert driver.handles == set()


def test_allocate_rejects_a_non_positive_size(device: npu.Device) -> None:
    with pytest.raises(ValueError, match="positive"):
        allocator(device).allocate(0)
