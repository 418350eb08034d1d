"""npu.Stream: CUDA-like streams on user-mode queues, ordered across streams
by npu.Event (a SIGNAL of the producer's counter, a device-side WAIT on the
consumer), with tensor ops whose parameter blocks the stream writes itself.

Results are checked against numpy; ordering across streams and priorities
through the device timestamps of the completion records.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import numpy as np
import pytest

import npu
from npu import DType, EltwiseKind, UnaryKind, ops

SYSFS = "/sys/class/accel/accel0/device/npu"
MiB = 1 << 20
N = 4096  # elements of the small fp32 vectors
BIG = 16 * MiB  # a FILL or COPY of this takes milliseconds of device time


def sysfs_int(name: str) -> int:
    with open(f"{SYSFS}/{name}") as f:
        return int(f.read())


def f32_bits(x: float) -> int:
    return int(np.float32(x).view(np.uint32))


def vec(dev: npu.Device, values: np.ndarray | None = None, n: int = N) -> npu.Buffer:
    buf = dev.alloc(n * 4)
    if values is not None:
        buf.numpy(np.float32)[:] = values
    return buf


def ref(buf: npu.Buffer, shape: tuple[int, ...] = (N,)) -> ops.TensorRef:
    return ops.tensor_ref(buf, DType.FP32, shape)


def add(a: npu.Buffer, b: npu.Buffer, out: npu.Buffer) -> ops.TensorOp:
    return ops.eltwise(EltwiseKind.ADD, ref(a), ref(b), ref(out), (a, b, out))


@pytest.fixture
def stream(dev: npu.Device) -> Iterator[npu.Stream]:
    s = npu.Stream(dev)
    try:
        yield s
    finally:
        s.close()


def busy(s: npu.Stream, big: npu.Buffer, count: int, last_pattern: int) -> None:
    """Queue ``count`` large FILLs of ``big`` on ``s``; the last writes ``last_pattern``."""
    for i in range(count):
        s.fill(big, last_pattern if i == count - 1 else 0xDEAD0000 + i, BIG)


# --------------------------------------------------------------------------
# Current and default streams
# --------------------------------------------------------------------------


def test_outside_any_with_block_the_current_stream_is_the_default_kernel_path(
    dev: npu.Device,
) -> None:
    s = npu.current_stream(dev)
    assert s is npu.default_stream(dev)
    assert s.is_default and s.queue is None


def test_with_stream_makes_it_current_in_that_thread_only(
    dev: npu.Device, stream: npu.Stream
) -> None:
    seen: list[npu.Stream] = []
    with stream:
        assert npu.current_stream() is stream
        t = threading.Thread(target=lambda: seen.append(npu.current_stream(dev)))
        t.start()
        t.join()
    assert seen == [npu.default_stream(dev)]
    assert npu.current_stream(dev) is npu.default_stream(dev)


def test_event_record_inside_with_stream_records_on_that_stream(
    dev: npu.Device, stream: npu.Stream
) -> None:
    ev = npu.Event(dev)
    with stream:
        ev.record()
    assert ev.stream is stream
    ev.synchronize()
    assert ev.query()


# --------------------------------------------------------------------------
# Order within a stream
# --------------------------------------------------------------------------


def test_copies_and_fills_on_a_stream_run_in_launch_order(
    dev: npu.Device, stream: npu.Stream
) -> None:
    src, first, second = dev.alloc(BIG), dev.alloc(4096), dev.alloc(4096)
    stream.fill(src, 0x11111111, BIG)
    stream.copy(first, src, 4096, src_offset=BIG - 4096)
    stream.fill(src, 0x22222222, BIG)
    stream.copy(second, src, 4096, src_offset=BIG - 4096)
    stream.synchronize()
    assert (first.numpy(np.uint32) == 0x11111111).all()
    assert (second.numpy(np.uint32) == 0x22222222).all()


def test_a_chain_of_dependent_tensor_ops_gives_the_numpy_result(
    dev: npu.Device, stream: npu.Stream
) -> None:
    rng = np.random.default_rng(1)
    x_np = rng.standard_normal(N).astype(np.float32)
    y_np = rng.standard_normal(N).astype(np.float32)
    x, y, t1, t2, t3 = vec(dev, x_np), vec(dev, y_np), vec(dev), vec(dev), vec(dev)
    out = dev.alloc(N * 2)
    stream.launch(add(x, y, t1))  # t1 = x + y
    stream.launch(ops.eltwise(EltwiseKind.MUL, ref(t1), ref(x), ref(t2), (t1, x, t2)))
    stream.launch(ops.unary(UnaryKind.TANH, ref(t2), ref(t3), (t2, t3)))
    stream.launch(ops.convert(ref(t3), ops.tensor_ref(out, DType.FP16, (N,)), (t3, out)))
    stream.synchronize()
    want = np.tanh((x_np + y_np) * x_np).astype(np.float16)
    np.testing.assert_allclose(out.numpy(np.float16), want, rtol=1e-3, atol=1e-3)


def test_matmul_and_linear_on_a_stream_match_numpy(dev: npu.Device, stream: npu.Stream) -> None:
    rng = np.random.default_rng(2)
    m, k, n = 32, 48, 24
    a_np = rng.standard_normal((m, k)).astype(np.float32)
    b_np = rng.standard_normal((k, n)).astype(np.float32)
    bias_np = rng.standard_normal((1, n)).astype(np.float32)
    a, b, bias = vec(dev, a_np.ravel(), m * k), vec(dev, b_np.ravel(), k * n), vec(dev, bias_np, n)
    mm, lin = vec(dev, n=m * n), vec(dev, n=m * n)
    ra, rb = ops.tensor_ref(a, DType.FP32, (m, k)), ops.tensor_ref(b, DType.FP32, (k, n))
    rmm, rlin = ops.tensor_ref(mm, DType.FP32, (m, n)), ops.tensor_ref(lin, DType.FP32, (m, n))
    rbias = ops.tensor_ref(bias, DType.FP32, (1, n))
    stream.launch(ops.matmul_op(ra, rb, rmm, buffers=(a, b, mm)))
    stream.launch(ops.linear_op(ra, rb, rbias, rlin, npu.ActKind.RELU, buffers=(a, b, bias, lin)))
    stream.synchronize()
    np.testing.assert_allclose(mm.numpy(np.float32).reshape(m, n), a_np @ b_np, rtol=1e-4)
    want = np.maximum(a_np @ b_np + bias_np, 0)
    np.testing.assert_allclose(lin.numpy(np.float32).reshape(m, n), want, rtol=1e-4, atol=1e-5)


def test_a_burst_of_ten_times_the_ring_wraps_and_waits_for_room(dev: npu.Device) -> None:
    entries = 16
    one = vec(dev, np.ones(N, np.float32))
    acc = [vec(dev, np.zeros(N, np.float32)), vec(dev)]
    steps = [add(acc[i % 2], one, acc[(i + 1) % 2]) for i in range(2)]
    s = npu.Stream(dev, entries=entries)
    try:
        for i in range(10 * entries):  # each add reads the previous one's output
            s.launch(steps[i % 2])
        assert s.last_fence >= 10 * entries
        s.synchronize()
    finally:
        s.close()
    assert (acc[0].numpy(np.float32) == 10 * entries).all()


# --------------------------------------------------------------------------
# Events across streams
# --------------------------------------------------------------------------


def test_a_consumer_waiting_on_the_producers_event_never_sees_stale_data(
    dev: npu.Device,
) -> None:
    """The consumer has the higher priority: without its wait_event, its
    COPY would run at the producer's next command boundary, before the last
    FILL, and copy a stale pattern (not asserted: that race is the point of
    the WAIT)."""
    big, out = dev.alloc(BIG), dev.alloc(4096)
    producer, consumer = npu.Stream(dev, priority=0), npu.Stream(dev, priority=1)
    try:
        for round_ in range(4):
            tag = 0xC0DE0000 + round_
            ev = npu.Event(dev)
            busy(producer, big, 8, tag)
            ev.record(producer)
            consumer.wait_event(ev)
            copied = consumer.copy(out, big, 4096, src_offset=BIG - 4096)
            consumer.synchronize(timeout_s=60)
            assert (out.numpy(np.uint32) == tag).all(), f"round {round_}: stale data"
            producer.synchronize(timeout_s=60)
            signal_end = producer.completion(ev.fence).t_end_ns
            assert consumer.completion(copied).t_start_ns >= signal_end
    finally:
        consumer.close()
        producer.close()


def test_wait_event_returns_at_once_and_the_device_holds_the_consumer(dev: npu.Device) -> None:
    big, out = dev.alloc(BIG), dev.alloc(4096)
    producer, consumer = npu.Stream(dev), npu.Stream(dev, priority=1)
    try:
        busy(producer, big, 16, 7)
        ev = npu.Event(dev)
        ev.record(producer)
        consumer.wait_event(ev)
        consumer.copy(out, big, 4096)
        assert not producer.query(), "the producer finished before the check: make it longer"
        assert not consumer.query() and not ev.query()
        consumer.synchronize(timeout_s=60)
        assert ev.query()
        assert (out.numpy(np.uint32) == 7).all()
    finally:
        consumer.close()
        producer.close()


def test_a_stream_can_wait_on_an_event_of_the_default_stream(
    dev: npu.Device, stream: npu.Stream
) -> None:
    big, out = dev.alloc(BIG), dev.alloc(4096)
    dev.submit([ops.fill(big, 0x5A5A5A5A, BIG)])
    ev = npu.Event(dev)
    ev.record(npu.default_stream(dev))
    stream.wait_event(ev)
    stream.copy(out, big, 4096, src_offset=BIG - 4096)
    stream.synchronize()
    assert (out.numpy(np.uint32) == 0x5A5A5A5A).all()


def test_elapsed_time_between_stream_events_is_positive_and_additive(
    dev: npu.Device, stream: npu.Stream
) -> None:
    big = dev.alloc(BIG)
    events = [npu.Event(dev) for _ in range(3)]
    t0 = time.perf_counter()
    events[0].record(stream)
    busy(stream, big, 2, 1)
    events[1].record(stream)
    busy(stream, big, 2, 2)
    events[2].record(stream)
    events[2].synchronize()
    wall_ms = (time.perf_counter() - t0) * 1e3
    first, second = events[0].elapsed_time(events[1]), events[1].elapsed_time(events[2])
    total = events[0].elapsed_time(events[2])
    assert first > 0 and second > 0
    assert total == pytest.approx(first + second, abs=1e-6)
    assert total <= wall_ms
    assert events[2].elapsed_time(events[0]) == -total


def test_elapsed_time_compares_events_of_two_streams_on_the_device_clock(
    dev: npu.Device,
) -> None:
    big = dev.alloc(BIG)
    a, b = npu.Stream(dev), npu.Stream(dev)
    try:
        start, end = npu.Event(dev), npu.Event(dev)
        start.record(a)
        b.wait_event(start)
        busy(b, big, 2, 3)
        end.record(b)
        end.synchronize()
        assert start.elapsed_time(end) > 0
    finally:
        a.close()
        b.close()


# --------------------------------------------------------------------------
# Priorities
# --------------------------------------------------------------------------


def test_a_higher_priority_streams_short_op_completes_before_a_lower_ones_backlog(
    dev: npu.Device,
) -> None:
    src, dst, small = dev.alloc(BIG), dev.alloc(BIG), dev.alloc(4096)
    low, high = npu.Stream(dev, priority=0), npu.Stream(dev, priority=1)
    try:
        backlog = [low.copy(dst, src, BIG) for _ in range(8)]
        short = high.fill(small, 9, 4096)
        high.synchronize(timeout_s=60)
        low.synchronize(timeout_s=60)
        assert high.completion(short).t_end_ns < low.completion(backlog[-1]).t_start_ns
    finally:
        high.close()
        low.close()


# --------------------------------------------------------------------------
# Errors
# --------------------------------------------------------------------------


def bad_int_division(dev: npu.Device) -> ops.TensorOp:
    """An ELTWISE.DIV of int32 operands: the device refuses it (BAD_ARGS)."""
    a, out = dev.alloc(N * 4), dev.alloc(N * 4)
    ra, rout = ops.tensor_ref(a, DType.INT32, (N,)), ops.tensor_ref(out, DType.INT32, (N,))
    return ops.TensorOp(npu.Opcode.ELTWISE, int(EltwiseKind.DIV), (ra, ra, rout), (a, out))


def test_a_failed_op_raises_at_synchronize_with_its_status_op_and_stream(
    dev: npu.Device, stream: npu.Stream
) -> None:
    op = bad_int_division(dev)
    fence = stream.launch(op, validate=False)
    stream.nop()
    with pytest.raises(npu.NpuDeviceError) as info:
        stream.synchronize()
    err = info.value
    assert (err.status, err.fence, err.op) == (npu.Status.BAD_ARGS, fence, op)
    assert "ELTWISE.DIV" in str(err)
    assert f"queue={stream.queue.index}" in str(err)
    stream.synchronize()  # reported once


def test_the_runtime_validator_refuses_a_bad_op_before_launch(
    dev: npu.Device, stream: npu.Stream
) -> None:
    with pytest.raises(ValueError):
        stream.launch(bad_int_division(dev))
    assert stream.last_fence == 0


def test_a_failed_op_leaves_its_stream_and_other_streams_working(
    dev: npu.Device, stream: npu.Stream
) -> None:
    buf, other_buf = dev.alloc(4096), dev.alloc(4096)
    other = npu.Stream(dev)
    try:
        stream.launch(bad_int_division(dev), validate=False)
        stream.fill(buf, 1, 4096)
        other.fill(other_buf, 2, 4096)
        other.synchronize()
        with pytest.raises(npu.NpuDeviceError):
            stream.synchronize()
        stream.fill(buf, 3, 4096)
        stream.synchronize()
    finally:
        other.close()
    assert (buf.numpy(np.uint32) == 3).all() and (other_buf.numpy(np.uint32) == 2).all()


def test_an_event_after_a_failed_op_reports_it_at_event_synchronize(
    dev: npu.Device, stream: npu.Stream
) -> None:
    stream.launch(bad_int_division(dev), validate=False)
    ev = npu.Event(dev)
    ev.record(stream)
    with pytest.raises(npu.NpuDeviceError) as info:
        ev.synchronize()
    assert info.value.status == npu.Status.BAD_ARGS
    assert ev.query()


# --------------------------------------------------------------------------
# Lifetime
# --------------------------------------------------------------------------


def test_closing_a_stream_with_work_in_flight_waits_for_it_and_leaks_no_buffer(
    dev: npu.Device,
) -> None:
    big, dst = dev.alloc(BIG), dev.alloc(BIG)
    x, out = vec(dev, np.full(N, 2, np.float32)), vec(dev)
    baseline = sysfs_int("bo_count")
    for _ in range(3):
        s = npu.Stream(dev)
        ev = npu.Event(dev)
        s.launch(add(x, x, out))  # allocates the parameter arena
        ev.record(s)  # and the counter page
        for _ in range(4):
            s.copy(dst, big, BIG)
        s.fill(dst, 0xABCD, 4096)
        s.close()
        assert s.closed and ev.query()
        assert (dst.numpy(np.uint32)[:1024] == 0xABCD).all()
        assert sysfs_int("bo_count") == baseline
    assert (out.numpy(np.float32) == 4).all()
    with pytest.raises(npu.NpuError):
        s.nop()


def test_a_stream_outlives_an_event_timing_after_close(dev: npu.Device) -> None:
    big = dev.alloc(BIG)
    s = npu.Stream(dev)
    start, end = npu.Event(dev), npu.Event(dev)
    start.record(s)
    busy(s, big, 2, 1)
    end.record(s)
    s.close()
    assert start.elapsed_time(end) > 0
