"""npu.Stream on the CPU backend's user queues: the stream layer (arenas,
counters, events across streams, the allocator's per-stream reuse, threads)
runs on the host as it does on the driver (tests/guest/test_streams.py and
test_stream_tensors.py hold the driver to the same behaviour)."""

from __future__ import annotations

import threading
from collections.abc import Iterator

import numpy as np
import pytest

import npu
from npu import _abi
from npu.hal import CpuBackend
from test_threads import OPS, run_threads


class Gate:
    """A WAIT on ``word >= 1`` at the head of a stream; :meth:`open` releases it."""

    def __init__(self, dev: npu.Device) -> None:
        self.buffer = dev.alloc(4096)
        self.buffer.numpy(np.uint64)[0] = 0

    def close_on(self, stream: npu.Stream) -> None:
        q = stream.queue
        assert q is not None
        q.emit(int(_abi.Opcode.WAIT), False, self.buffer.va, 1, 0, self.buffer, None, None)
        q.kick()

    def open(self) -> None:
        self.buffer.numpy(np.uint64)[0] = 1


@pytest.fixture
def gate(device: npu.Device) -> Iterator[Gate]:
    g = Gate(device)
    try:
        yield g
    finally:
        g.open()  # never leave a stream held for its fixture's close()


@pytest.fixture
def stream(device: npu.Device) -> Iterator[npu.Stream]:
    s = npu.Stream(device)
    try:
        yield s
    finally:
        s.close()


def chain(dev: npu.Device, k: int) -> None:
    x = npu.tensor(np.full(64, 1000.0 * k, np.float32), device=dev)
    for i in range(OPS):
        x = x + 1
        if i % 100 == 99:
            np.testing.assert_array_equal(x.numpy(), np.full(64, 1000.0 * k + i + 1))


def test_a_stream_runs_on_a_lent_queue_of_the_cpu_backend(
    device: npu.Device, stream: npu.Stream
) -> None:
    assert stream.queue is not None and 1 <= stream.queue.index <= 7
    assert not stream.is_default


def test_copies_and_fills_on_a_stream_run_in_launch_order(
    device: npu.Device, stream: npu.Stream
) -> None:
    src, first, second = device.alloc(1 << 16), device.alloc(4096), device.alloc(4096)
    stream.fill(src, 0x11111111, 1 << 16)
    stream.copy(first, src, 4096, src_offset=(1 << 16) - 4096)
    stream.fill(src, 0x22222222, 1 << 16)
    stream.copy(second, src, 4096, src_offset=(1 << 16) - 4096)
    stream.synchronize()
    assert (first.numpy(np.uint32) == 0x11111111).all()
    assert (second.numpy(np.uint32) == 0x22222222).all()


def test_a_chain_of_tensor_ops_on_a_stream_gives_the_numpy_result(
    device: npu.Device, stream: npu.Stream
) -> None:
    rng = np.random.default_rng(1)
    x_np = rng.standard_normal((16, 32)).astype(np.float32)
    w_np = rng.standard_normal((32, 8)).astype(np.float32)
    x, w = npu.tensor(x_np, device=device), npu.tensor(w_np, device=device)
    with stream:
        y = npu.softmax(npu.relu(x @ w) * 0.5 + 1.0, axis=-1).sum(axis=0)
    z = np.maximum(x_np @ w_np, 0) * 0.5 + 1.0
    e = np.exp(z - z.max(axis=-1, keepdims=True))
    np.testing.assert_allclose(y.numpy(), (e / e.sum(-1, keepdims=True)).sum(0), rtol=1e-5)


def test_a_stream_of_sixteen_entries_wraps_its_ring_many_times(device: npu.Device) -> None:
    s = npu.Stream(device, entries=16)
    try:
        with s:
            x = npu.tensor(np.zeros(64, np.float32), device=device)
            for _ in range(10 * 16):
                x += 1
        assert s.last_fence >= 10 * 16
        np.testing.assert_array_equal(x.numpy(), np.full(64, 160.0, np.float32))
    finally:
        s.close()


def test_a_consumer_waiting_on_the_producers_event_sees_the_producers_data(
    device: npu.Device, gate: Gate
) -> None:
    big, out = device.alloc(1 << 16), device.alloc(4096)
    producer, consumer = npu.Stream(device), npu.Stream(device, priority=1)
    try:
        gate.close_on(producer)  # the producer is held: only the WAIT can order them
        producer.fill(big, 0xC0DE0001, 1 << 16)
        ev = npu.Event(device)
        ev.record(producer)
        consumer.wait_event(ev)
        consumer.copy(out, big, 4096, src_offset=(1 << 16) - 4096)
        assert not consumer.query() and not ev.query()
        gate.open()
        consumer.synchronize()
        assert ev.query()
        assert (out.numpy(np.uint32) == 0xC0DE0001).all()
    finally:
        consumer.close()
        producer.close()


def test_empty_cache_never_destroys_memory_a_queued_stream_op_still_writes(
    device: npu.Device, driver: CpuBackend, stream: npu.Stream, gate: Gate
) -> None:
    a = npu.tensor(np.ones((1024, 64), np.float32), device=device)
    gate.close_on(stream)
    with stream:
        y = a @ a.T  # 4 MiB: a segment of its own, written once the gate opens
    del y
    timer = threading.Timer(0.05, gate.open)
    timer.start()
    assert npu.empty_cache(device) > 0  # waits for the matmul, then destroys the segment
    timer.join()
    stream.synchronize()  # no MMU fault: the file is not faulted
    np.testing.assert_array_equal((a + 1).numpy(), np.full((1024, 64), 2, np.float32))


def test_four_threads_sharing_one_stream_get_exact_results_in_order(device: npu.Device) -> None:
    s = npu.Stream(device)

    def work(k: int) -> None:
        with s:  # the current stream is per thread
            chain(device, k)

    try:
        assert run_threads(work) == []
    finally:
        s.close()


def test_four_threads_with_a_stream_each_get_exact_results_in_order(device: npu.Device) -> None:
    def work(k: int) -> None:
        s = npu.Stream(device)
        try:
            with s:
                chain(device, k)
        finally:
            s.close()

    assert run_threads(work) == []
