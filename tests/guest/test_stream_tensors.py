"""npu.Tensor ops on streams: inside ``with stream:`` tensor ops, graph
replays and in-place copies run on that user stream, ordered after inputs
still being produced elsewhere, with memory reuse ordered by the streams.

A *gate* holds a stream in the device: a WAIT on a word of a buffer that the
host sets to 1 to open it. Work queued behind a closed gate has not run, so
a consumer that did not wait for its producer would compute from stale data
and finish early; the tests check both the finish and the data.
"""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Iterator

import numpy as np
import pytest

import npu
from npu import DType, EltwiseKind, _abi, ops

N = 4096  # elements of the test vectors
X = np.arange(N, dtype=np.float32)
HOLD_S = 0.05  # how long a test lets a gated stream sit before checking it is held


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

    def open_later(self, delay_s: float = HOLD_S) -> threading.Timer:
        timer = threading.Timer(delay_s, self.open)
        timer.start()
        return timer


@pytest.fixture
def gate(dev: npu.Device) -> Iterator[Gate]:
    g = Gate(dev)
    try:
        yield g
    finally:
        g.open()  # never leave a stream held for its fixture's close()


def make_stream(dev: npu.Device) -> Iterator[npu.Stream]:
    s = npu.Stream(dev)
    try:
        yield s
    finally:
        s.close()


s1 = pytest.fixture(make_stream)
s2 = pytest.fixture(make_stream)


def upload(dev: npu.Device, values: np.ndarray = X) -> npu.Tensor:
    return npu.tensor(values, device=dev)


# --------------------------------------------------------------------------
# Which stream runs a tensor op
# --------------------------------------------------------------------------


def test_tensor_ops_inside_with_stream_run_on_that_streams_queue(
    dev: npu.Device, s1: npu.Stream
) -> None:
    x = upload(dev)
    dev.flush_deferred()  # eager ops held back count as submitted
    kernel_before = dev.submitted_fences().get(0, 0)
    launched_before = s1.last_fence
    with s1:
        y = (x * 2 + 1).sum()
    assert s1.last_fence > launched_before
    dev.flush_deferred()  # eager ops held back count as submitted
    assert dev.submitted_fences().get(0, 0) == kernel_before
    assert y.item() == pytest.approx(float((X * 2 + 1).sum()), rel=1e-6)


def test_tensor_ops_outside_any_with_block_go_to_the_default_stream(
    dev: npu.Device, s1: npu.Stream
) -> None:
    x = upload(dev)
    dev.flush_deferred()  # eager ops held back count as submitted
    kernel_before = dev.submitted_fences().get(0, 0)
    launched_before = s1.last_fence
    y = x - 1
    dev.flush_deferred()  # eager ops held back count as submitted
    assert dev.submitted_fences()[0] > kernel_before
    assert s1.last_fence == launched_before
    np.testing.assert_array_equal(y.numpy(), X - 1)


def test_with_default_stream_inside_a_user_stream_goes_back_to_the_kernel_path(
    dev: npu.Device, s1: npu.Stream
) -> None:
    x = upload(dev)
    launched_before = s1.last_fence
    with s1, npu.default_stream(dev):
        y = x + 5
    assert s1.last_fence == launched_before
    np.testing.assert_array_equal(y.numpy(), X + 5)


def test_a_chain_of_tensor_ops_on_a_stream_matches_numpy(dev: npu.Device, s1: npu.Stream) -> None:
    rng = np.random.default_rng(3)
    a_np = rng.standard_normal((16, 32)).astype(np.float32)
    w_np = rng.standard_normal((32, 8)).astype(np.float32)
    a, w = upload(dev, a_np), upload(dev, w_np)
    with s1:
        y = npu.softmax(npu.relu(a @ w) * 0.5, axis=-1).astype(np.float16)
    z = np.maximum(a_np @ w_np, 0) * 0.5
    want = np.exp(z - z.max(-1, keepdims=True))
    want /= want.sum(-1, keepdims=True)
    np.testing.assert_allclose(y.numpy(), want, rtol=2e-3, atol=2e-3)


# --------------------------------------------------------------------------
# Ordering across streams
# --------------------------------------------------------------------------


def produced_behind_gate(dev: npu.Device, stream: npu.Stream, gate: Gate, k: float) -> npu.Tensor:
    """``X * k`` launched on ``stream`` behind the closed gate: not made yet."""
    x = upload(dev)
    gate.close_on(stream)
    with stream:
        return x * k


def test_a_consumer_on_another_stream_is_held_in_the_device_until_its_input_is_made(
    dev: npu.Device, s1: npu.Stream, s2: npu.Stream, gate: Gate
) -> None:
    y = produced_behind_gate(dev, s1, gate, 2)
    with s2:
        z = y + 1
    time.sleep(HOLD_S)
    assert not s2.query(), "the consumer ran before its producer"
    gate.open()
    np.testing.assert_array_equal(z.numpy(), X * 2 + 1)


def test_a_second_consumer_of_the_same_producer_adds_no_second_wait(
    dev: npu.Device, s1: npu.Stream, s2: npu.Stream, gate: Gate
) -> None:
    y = produced_behind_gate(dev, s1, gate, 3)
    with s2:
        before = s2.last_fence
        a = y + 1
        after_first = s2.last_fence
        b = y - 1
    assert after_first - before == 2  # the WAIT and the op
    assert s2.last_fence - after_first == 1  # only the op
    gate.open()
    np.testing.assert_array_equal(a.numpy(), X * 3 + 1)
    np.testing.assert_array_equal(b.numpy(), X * 3 - 1)


def test_a_tensor_of_the_default_stream_is_complete_before_a_user_stream_reads_it(
    dev: npu.Device, s1: npu.Stream
) -> None:
    x = upload(dev)
    y = x * 4  # kernel path, not waited for
    with s1:
        z = y + 1
    np.testing.assert_array_equal(z.numpy(), X * 4 + 1)


def test_the_default_stream_waits_for_a_tensor_still_made_on_a_user_stream(
    dev: npu.Device, s1: npu.Stream, gate: Gate
) -> None:
    y = produced_behind_gate(dev, s1, gate, 2)
    timer = gate.open_later()
    z = y - 1  # the host waits for y first
    assert s1.query()
    timer.join()
    np.testing.assert_array_equal(z.numpy(), X * 2 - 1)


def test_copy_into_a_tensor_of_another_stream_follows_its_producer(
    dev: npu.Device, s1: npu.Stream, s2: npu.Stream, gate: Gate
) -> None:
    x = upload(dev)
    gate.close_on(s1)
    with s1:
        y = x + 1
    src = upload(dev, np.full(N, 7, np.float32))
    with s2:
        y.copy_(src)  # must land after y's producer, not be overwritten by it
    gate.open()
    np.testing.assert_array_equal(y.numpy(), np.full(N, 7, np.float32))


def test_copy_into_a_tensor_another_stream_still_reads_waits_for_the_reader(
    dev: npu.Device, s1: npu.Stream, s2: npu.Stream, gate: Gate
) -> None:
    y = upload(dev)
    gate.close_on(s1)
    with s1:
        z = y + 1  # reads y behind the gate
    src = upload(dev, np.full(N, 7, np.float32))
    with s2:
        y.copy_(src)  # must not overwrite y before the read
    time.sleep(HOLD_S)
    assert not s2.query(), "the write ran before the read it would spoil"
    gate.open()
    np.testing.assert_array_equal(z.numpy(), X + 1)
    np.testing.assert_array_equal(y.numpy(), np.full(N, 7, np.float32))


# --------------------------------------------------------------------------
# Memory reuse across streams
# --------------------------------------------------------------------------


def freed_behind_gate(
    dev: npu.Device, stream: npu.Stream, gate: Gate
) -> tuple[npu.Tensor, tuple[int, int]]:
    """``x``, and where ``x + 1`` computed on ``stream`` lay: freed while its op
    still waits behind the closed gate."""
    x = upload(dev)
    gate.close_on(stream)
    with stream:
        t = x + 1
    assert t.buffer is not None
    where = (t.buffer.handle, t.offset)
    del t
    return x, where


def test_memory_freed_while_a_stream_still_uses_it_is_not_given_to_another_stream(
    dev: npu.Device, s1: npu.Stream, s2: npu.Stream, gate: Gate
) -> None:
    x, where = freed_behind_gate(dev, s1, gate)
    with s2:
        u = x + 2
    assert (u.buffer.handle, u.offset) != where
    gate.open()
    np.testing.assert_array_equal(u.numpy(), X + 2)


def test_memory_freed_on_a_stream_is_reused_at_once_by_that_stream(
    dev: npu.Device, s1: npu.Stream, gate: Gate
) -> None:
    x, where = freed_behind_gate(dev, s1, gate)
    with s1:
        v = x + 3  # runs after t's op on the same queue: safe to reuse
    assert (v.buffer.handle, v.offset) == where
    gate.open()
    np.testing.assert_array_equal(v.numpy(), X + 3)


def test_an_upload_never_takes_memory_a_stream_still_uses(
    dev: npu.Device, s1: npu.Stream, gate: Gate
) -> None:
    _, where = freed_behind_gate(dev, s1, gate)
    u = upload(dev, np.full(N, 9, np.float32))
    assert (u.buffer.handle, u.offset) != where
    gate.open()
    s1.synchronize()
    np.testing.assert_array_equal(u.numpy(), np.full(N, 9, np.float32))


def test_a_host_write_into_a_tensor_waits_for_the_streams_that_read_it(
    dev: npu.Device, s1: npu.Stream, gate: Gate
) -> None:
    x = upload(dev)
    gate.close_on(s1)
    with s1:
        y = x * 1  # reads x behind the gate
    timer = gate.open_later()
    x.copy_(np.zeros(N, np.float32))
    assert s1.query()
    timer.join()
    np.testing.assert_array_equal(y.numpy(), X)


def big_result_behind_gate(dev: npu.Device, stream: npu.Stream, gate: Gate) -> npu.Tensor:
    """``a``, whose 4 MiB product ``a @ a.T`` (its own segment) was launched on
    ``stream`` behind the closed gate and freed at once."""
    a = upload(dev, np.ones((1024, 64), np.float32))
    gate.close_on(stream)
    with stream:
        y = a @ a.T
    del y
    return a


def test_empty_cache_never_destroys_memory_a_queued_stream_op_still_writes(
    dev: npu.Device, s1: npu.Stream, gate: Gate
) -> None:
    a = big_result_behind_gate(dev, s1, gate)
    timer = gate.open_later()
    assert npu.empty_cache(dev) > 0  # waits for the matmul, then destroys its segment
    timer.join()
    s1.synchronize()  # no MMU fault: the file is not marked faulted
    np.testing.assert_array_equal((a + 1).numpy(), np.full((1024, 64), 2, np.float32))


def test_without_caching_a_freed_result_outlives_its_queued_stream_op(
    dev: npu.Device, s1: npu.Stream, gate: Gate, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(npu.allocator.allocator(dev), "caching", False)
    a = big_result_behind_gate(dev, s1, gate)
    npu.memory_stats(dev)  # processes the free: the segment must stay
    gate.open()
    s1.synchronize()
    np.testing.assert_array_equal((a * 3).numpy(), np.full((1024, 64), 3, np.float32))


# --------------------------------------------------------------------------
# Synchronisation and errors
# --------------------------------------------------------------------------


def test_npu_synchronize_waits_for_the_tensor_work_of_every_stream(
    dev: npu.Device, s1: npu.Stream, gate: Gate
) -> None:
    x = upload(dev)
    gate.close_on(s1)
    with s1:
        x * 2
    timer = gate.open_later()
    npu.synchronize(dev)
    assert s1.query()
    timer.join()


def failing_op_into(out: npu.Tensor, dev: npu.Device) -> ops.TensorOp:
    """An int32 ELTWISE.DIV: the device refuses it (BAD_ARGS)."""
    a = dev.alloc(N * 4)
    ra = ops.tensor_ref(a, DType.INT32, (N,))
    return ops.TensorOp(npu.Opcode.ELTWISE, int(EltwiseKind.DIV), (ra, ra, out.tensor_ref()), (a,))


def failed_on(dev: npu.Device, stream: npu.Stream) -> tuple[npu.Tensor, ops.TensorOp]:
    """A tensor whose producing op, launched on ``stream``, fails on the device; the op."""
    out = upload(dev, np.zeros(N, np.int32))
    op = failing_op_into(out, dev)
    with stream:
        sys.modules["npu.tensors.tensor"].launch([op], out)
    return out, op


def test_a_failed_tensor_op_on_a_stream_raises_at_numpy_with_the_op(
    dev: npu.Device, s1: npu.Stream
) -> None:
    out, op = failed_on(dev, s1)
    with pytest.raises(npu.NpuDeviceError) as info:
        out.numpy()
    assert (info.value.status, info.value.op) == (npu.Status.BAD_ARGS, op)
    assert f"queue={s1.queue.index}" in str(info.value)


def test_a_tensor_computed_on_another_stream_from_a_failed_op_raises_it_too(
    dev: npu.Device, s1: npu.Stream, s2: npu.Stream
) -> None:
    out, op = failed_on(dev, s1)
    with s2:
        derived = out + 1
    with pytest.raises(npu.NpuDeviceError) as info:
        derived.numpy()
    assert info.value.op == op
    with pytest.raises(npu.NpuDeviceError):
        out.wait()  # first reported through `derived`, still raised for `out`


def test_launch_blocking_raises_a_failed_stream_op_at_its_call(
    dev: npu.Device, s1: npu.Stream, monkeypatch: pytest.MonkeyPatch
) -> None:
    tensor_module = sys.modules["npu.tensors.tensor"]
    # NPU_LAUNCH_BLOCKING=1 is read at import (as CUDA_LAUNCH_BLOCKING); set what it sets.
    monkeypatch.setattr(tensor_module, "_launch_blocking", True)
    x = upload(dev)
    out = upload(dev, np.zeros(N, np.int32))
    with s1:
        y = x * 3
        assert y.fence is None  # already waited for
        op = failing_op_into(out, dev)
        with pytest.raises(npu.NpuDeviceError) as info:
            tensor_module.launch([op], out)
    assert info.value.op == op
    np.testing.assert_array_equal(y.numpy(), X * 3)


# --------------------------------------------------------------------------
# Graphs
# --------------------------------------------------------------------------


def test_a_graph_replays_on_the_current_user_stream_without_the_kernel_path(
    dev: npu.Device, s1: npu.Stream
) -> None:
    x = upload(dev)
    g = npu.Graph(dev)
    with g.capture():
        w = x * 3 + 1
    dev.flush_deferred()  # eager ops held back count as submitted
    kernel_before = dev.submitted_fences().get(0, 0)
    for value in (1.0, 2.0):
        x.copy_(X * value)
        with s1:
            before = s1.last_fence
            g.replay()
        assert s1.last_fence - before == g.num_ops
        np.testing.assert_array_equal(w.numpy(), X * value * 3 + 1)
    dev.flush_deferred()  # eager ops held back count as submitted
    assert dev.submitted_fences().get(0, 0) == kernel_before


def test_a_graph_replayed_on_a_closed_stream_raises_ebadf(dev: npu.Device) -> None:
    x = upload(dev)
    g = npu.Graph(dev)
    with g.capture():
        x + 1
    s = npu.Stream(dev)
    s.close()
    with pytest.raises(npu.NpuError) as info:
        g.replay(s)
    assert info.value.errno == 9  # EBADF


def test_a_graph_longer_than_a_small_ring_replays_in_order_across_wraps(dev: npu.Device) -> None:
    x = upload(dev)
    acc = upload(dev, np.zeros(N, np.float32))
    g = npu.Graph(dev)
    with g.capture():
        for _ in range(12):  # 12 x (ELTWISE + COPY): mixed tensor and DMA ops
            acc.copy_(acc + x)
    assert g.num_ops == 24
    s = npu.Stream(dev, entries=16)  # runs of 8: a replay wraps the ring
    try:
        with s:
            s.nop()  # start the replays off a slot boundary
            for _ in range(5):
                g.replay()
        g.synchronize()
    finally:
        s.close()
    np.testing.assert_array_equal(acc.numpy(), X * 60)


def test_a_failed_op_of_a_graph_replayed_on_a_stream_is_named_at_synchronize(
    dev: npu.Device, s1: npu.Stream
) -> None:
    launch = sys.modules["npu.tensors.tensor"].launch
    x = upload(dev)
    out = upload(dev, np.zeros(N, np.int32))
    g = npu.Graph(dev)
    with g.capture():
        y = x + 1
        op = failing_op_into(out, dev)
        launch([op], out)
    with s1:
        g.replay()
    with pytest.raises(npu.NpuDeviceError) as info:
        g.synchronize()
    assert (info.value.status, info.value.op) == (npu.Status.BAD_ARGS, op)
    np.testing.assert_array_equal(y.numpy(), X + 1)


def test_a_graph_whose_buffer_was_freed_is_refused_before_launch_on_a_stream(
    dev: npu.Device, s1: npu.Stream
) -> None:
    x = upload(dev)
    g = npu.Graph(dev)
    with g.capture():
        x + 1
    with s1:
        g.replay()  # builds the program
    g.synchronize()
    launched = s1.last_fence
    assert x.buffer is not None
    x.buffer.free()  # the segment under x, behind the allocator's back
    with pytest.raises(npu.NpuError, match="freed") as info:
        g.replay(s1)
    assert info.value.errno == 9  # EBADF, as SUBMIT gives for a freed buffer
    assert s1.last_fence == launched


def graph_of_y_plus_1(dev: npu.Device) -> tuple[npu.Graph, npu.Tensor, npu.Tensor]:
    """A graph computing ``w = y + 1`` from an input ``y`` (zeros): (graph, y, w)."""
    y = upload(dev, np.zeros(N, np.float32))
    g = npu.Graph(dev)
    with g.capture():
        w = y + 1
    return g, y, w


def test_a_graph_replayed_on_one_stream_waits_in_the_device_for_an_input_of_another(
    dev: npu.Device, s1: npu.Stream, s2: npu.Stream, gate: Gate
) -> None:
    g, y, w = graph_of_y_plus_1(dev)
    x = upload(dev)
    gate.close_on(s1)
    with s1:
        y.copy_(x * 2)  # the graph's input, rewritten behind the gate
    with s2:
        g.replay()
    time.sleep(HOLD_S)
    assert not s2.query(), "the replay ran before its input was made"
    gate.open()
    np.testing.assert_array_equal(w.numpy(), X * 2 + 1)


def test_a_graph_replayed_on_the_default_stream_waits_for_an_input_of_a_user_stream(
    dev: npu.Device, s1: npu.Stream, gate: Gate
) -> None:
    g, y, w = graph_of_y_plus_1(dev)
    x = upload(dev)
    gate.close_on(s1)
    with s1:
        y.copy_(x * 2)
    timer = gate.open_later()
    g.replay()  # the host waits for y first
    assert s1.query()
    timer.join()
    np.testing.assert_array_equal(w.numpy(), X * 2 + 1)


def test_a_graph_replayed_on_a_second_stream_waits_for_its_replay_on_the_first(
    dev: npu.Device, s1: npu.Stream, s2: npu.Stream, gate: Gate
) -> None:
    x = upload(dev)
    g = npu.Graph(dev)
    with g.capture():
        w = x * 2 + 1  # an intermediate in the graph's memory, then w
    gate.close_on(s1)
    with s1:
        g.replay()  # held behind the gate
    with s2:
        g.replay()  # would race the first over the same memory
    time.sleep(HOLD_S)
    assert not s2.query(), "the second replay ran before the first"
    gate.open()
    np.testing.assert_array_equal(w.numpy(), X * 2 + 1)


def test_a_graph_replay_waits_for_a_reader_of_its_output_on_another_stream(
    dev: npu.Device, s1: npu.Stream, s2: npu.Stream, gate: Gate
) -> None:
    x = upload(dev)
    g = npu.Graph(dev)
    with g.capture():
        w = x * 2
    with s1:
        g.replay()  # w = 2X
    gate.close_on(s2)
    with s2:
        r = w + 1  # reads w behind the gate
    new_x = upload(dev, X * 10)
    with s1:
        x.copy_(new_x)
        g.replay()  # must not overwrite w before the read
    time.sleep(HOLD_S)
    assert not s1.query(), "the replay overwrote its output before another stream read it"
    gate.open()
    np.testing.assert_array_equal(r.numpy(), X * 2 + 1)
    np.testing.assert_array_equal(w.numpy(), X * 20)
