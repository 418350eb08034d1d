"""npu.Graph on the device: a captured chain replays with new inputs and gives
numpy's results every time; the graph's buffers are reused, not reallocated."""

from __future__ import annotations

import numpy as np

import npu


def test_a_captured_mlp_replays_with_new_inputs(dev: npu.Device) -> None:
    rng = np.random.default_rng(3)
    w1 = rng.standard_normal((64, 32)).astype(np.float32)
    b1 = rng.standard_normal(64).astype(np.float32)
    w2 = rng.standard_normal((10, 64)).astype(np.float32)
    x = npu.tensor(np.zeros((16, 32), np.float32), device=dev)
    tw1, tb1, tw2 = (npu.tensor(a, device=dev) for a in (w1, b1, w2))
    g = npu.Graph(dev)
    with g.capture():
        h = npu.linear(x, tw1, tb1, activation="relu")
        y = npu.softmax(h @ tw2.T, axis=-1)
    assert g.num_ops >= 3
    for seed in range(3):
        xs = np.random.default_rng(seed).standard_normal((16, 32)).astype(np.float32)
        x.copy_(xs)
        g.replay()
        g.synchronize()
        logits = np.maximum(xs @ w1.T + b1, 0) @ w2.T
        e = np.exp(logits - logits.max(axis=-1, keepdims=True))
        np.testing.assert_allclose(y.numpy(), e / e.sum(axis=-1, keepdims=True), atol=1e-5)


def test_replays_allocate_nothing(dev: npu.Device) -> None:
    x = npu.tensor(np.ones((256, 256), np.float32), device=dev)
    g = npu.Graph(dev)
    with g.capture():
        y = npu.exp(x * 0.5) + x
    g.replay()
    g.synchronize()
    before = npu.memory_stats(dev)["allocation.all.allocated"]
    for _ in range(10):
        g.replay()
    g.synchronize()
    assert npu.memory_stats(dev)["allocation.all.allocated"] == before
    np.testing.assert_allclose(y.numpy(), np.exp(np.float32(0.5)) + 1, rtol=1e-6)
