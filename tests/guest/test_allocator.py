"""The caching allocator on the real driver: tensors reuse cached device
memory without BO_CREATE, results stay right while blocks are recycled under
queued ops, and the driver's own accounting returns to its baseline."""

from __future__ import annotations

import numpy as np
from guest_util import soak_cycles

import npu
from npu import allocator as alloc_mod

SYSFS = "/sys/class/accel/accel0/device/npu"
MiB = 1 << 20


def live_bo_bytes() -> int:
    with open(f"{SYSFS}/bo_bytes") as f:
        return int(f.read())


def test_a_soak_of_tensor_alloc_free_cycles_leave_the_driver_at_baseline(
    dev: npu.Device,
) -> None:
    baseline = live_bo_bytes()
    alloc = alloc_mod.allocator(dev)
    for i in range(soak_cycles(10_000)):
        block = alloc.allocate(1 + (i * 7919) % (3 * MiB))
        del block
    stats = alloc.memory_stats()
    assert stats["allocation.all.current"] == 0
    assert stats["segment.all.allocated"] <= 4  # BO_CREATEs over the whole soak
    alloc.empty_cache()
    assert live_bo_bytes() == baseline


def test_recycled_blocks_under_queued_ops_give_numpy_results(dev: npu.Device) -> None:
    rng = np.random.default_rng(5)
    data = [rng.standard_normal((64, 256)).astype(np.float32) for _ in range(24)]
    acc = npu.tensor(np.zeros((64, 256), np.float32), device=dev)
    want = np.zeros((64, 256), np.float32)
    for x in data:
        # Each upload and intermediate dies at once, so the next iteration
        # recycles blocks that queued ops still read or write.
        acc = npu.relu(acc + npu.tensor(x, device=dev) * 0.5)
        want = np.maximum(want + x * 0.5, 0)
    np.testing.assert_allclose(acc.numpy(), want, rtol=1e-6, atol=1e-6)


def test_tensor_memory_comes_from_cached_segments(dev: npu.Device) -> None:
    alloc = alloc_mod.allocator(dev)
    alloc.empty_cache()
    before = alloc.memory_stats()["segment.all.allocated"]
    tensors = [npu.tensor(np.full(1000, i, np.float32), device=dev) for i in range(100)]
    assert alloc.memory_stats()["segment.all.allocated"] - before <= 1
    for i, t in enumerate(tensors):
        assert t.numpy()[0] == i
