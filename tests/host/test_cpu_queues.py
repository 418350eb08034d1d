"""User-mode queues on the CPU backend: the ring protocol of docs/npu-spec.md
section 6 and the QUEUE_CREATE rules of docs/uapi.md, run by the backend's
firmware thread (npu.hal.cpu_queues). The guest's tests/guest/test_user_queues.py
holds the driver to the same rules."""

from __future__ import annotations

import errno
import faulthandler
import os
import signal
import struct
import time
from collections.abc import Callable, Iterator

import numpy as np
import pytest

import npu
from npu import _abi
from npu.hal import CpuBackend

PAGE = 4096


def cmd(opcode: int, *words: int, flags: int = 0, ctx: int = 0) -> _abi.NpuCmd:
    """A descriptor with ``words`` as its payload's u64s (from offset 16)."""
    c = _abi.NpuCmd(opcode=opcode, flags=flags, ctx=ctx)
    for i, w in enumerate(words):
        c.raw[i] = w
    return c


def wait_until(cond: Callable[[], bool], timeout_s: float = 5.0) -> bool:
    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        if cond():
            return True
        time.sleep(0.001)
    return cond()


@pytest.fixture
def queue(device: npu.Device) -> Iterator[npu.UserQueue]:
    q = device.create_queue(16)
    yield q
    q.close()


def test_the_cpu_backend_lends_seven_user_queues_then_fails_with_ebusy(
    device: npu.Device,
) -> None:
    assert device.info.user_queues == 7
    queues = [device.create_queue(16) for _ in range(7)]
    assert sorted(q.index for q in queues) == list(range(1, 8))
    with pytest.raises(npu.NpuError) as info:
        device.create_queue(16)
    assert info.value.errno == errno.EBUSY
    assert "QUEUE_CREATE" in info.value.context
    queues[3].close()
    assert device.create_queue(16).index == queues[3].index  # given back, lent again


def test_buffers_have_distinct_page_aligned_device_addresses_above_4_gib(
    device: npu.Device,
) -> None:
    bufs = [device.alloc(100) for _ in range(4)]
    vas = [b.va for b in bufs]
    assert len(set(vas)) == 4
    assert all(va % PAGE == 0 and va >= 1 << 32 for va in vas)


def test_fill_then_copy_give_the_pattern_at_the_destination(
    device: npu.Device, queue: npu.UserQueue
) -> None:
    src, dst = device.alloc(PAGE), device.alloc(PAGE)
    queue.fill(src, 0x04030201, PAGE)
    fence = queue.copy(src, dst, PAGE // 2, dst_offset=PAGE // 2)
    queue.wait(fence)
    got = dst.numpy()
    assert not got[: PAGE // 2].any()
    assert bytes(got[PAGE // 2 : PAGE // 2 + 4]) == b"\x01\x02\x03\x04"
    assert (got[PAGE // 2 :].view("<u4") == 0x04030201).all()


def test_nothing_runs_until_the_doorbell_rings(device: npu.Device, queue: npu.UserQueue) -> None:
    buf = device.alloc(PAGE)
    fence = queue.fill(buf, 0xFFFFFFFF, PAGE)
    time.sleep(0.05)
    assert queue.completed() == 0
    assert not buf.numpy().any()
    queue.kick()
    assert wait_until(lambda: queue.completed() >= fence)  # the firmware thread ran it
    assert (buf.numpy() == 0xFF).all()


def test_each_command_gets_a_completion_record_and_the_fence_record_follows(
    queue: npu.UserQueue,
) -> None:
    fences = [queue.nop(), queue.nop(), queue.nop(irq=True)]  # the IRQ: wait adds no NOP
    queue.wait(fences[-1])
    records = [queue.completion(f) for f in fences]
    assert [(r.fence, r.status, r.opcode) for r in records] == [
        (f, _abi.NPU_ST_OK, _abi.NPU_OP_NOP) for f in fences
    ]
    assert all(r.t_start_ns <= r.t_end_ns for r in records)
    value, stamp = struct.unpack("<QQ", bytes(queue.fence_record)[:16])
    assert (value, stamp) == (fences[-1], records[-1].t_end_ns)


def test_the_ring_wraps_around_when_more_commands_than_entries_are_pushed(
    device: npu.Device, queue: npu.UserQueue
) -> None:
    count = 5 * queue.entries + 3
    buf = device.alloc(count * 64)
    patterns = (np.arange(count, dtype=np.uint64) * 2654435761 + 1) & 0xFFFFFFFF
    for i, p in enumerate(patterns):
        queue.fill(buf, int(p), 64, offset=64 * i)
    queue.synchronize()
    want = np.repeat(patterns.astype(np.uint32), 16).reshape(count, 16)
    np.testing.assert_array_equal(buf.numpy(np.uint32).reshape(count, 16), want)


@pytest.mark.parametrize(
    ("descriptor", "status"),
    [
        (cmd(_abi.NPU_OP_NOP, flags=0x8000), _abi.NPU_ST_BAD_FLAGS),
        (cmd(_abi.NPU_OP_NOP, 1), _abi.NPU_ST_BAD_RESERVED),
        (cmd(99), _abi.NPU_ST_BAD_OPCODE),
        (cmd(_abi.NPU_OP_COPY, 1 << 32, 2 << 32, 0), _abi.NPU_ST_BAD_ARGS),
        (cmd(_abi.NPU_OP_FILL, 1 << 32, 6, 0), _abi.NPU_ST_BAD_ARGS),
        (cmd(_abi.NPU_OP_SIGNAL, (1 << 32) + 4, 1), _abi.NPU_ST_BAD_ARGS),
        (cmd(_abi.NPU_OP_ELTWISE, (1 << 32) + 8, 0), _abi.NPU_ST_BAD_ARGS),
    ],
    ids=["flags", "payload", "opcode", "copy-len-0", "fill-len-not-x4", "signal-unaligned",
         "params-unaligned"],
)  # fmt: skip
def test_a_bad_descriptor_fails_alone_with_its_status_and_the_queue_goes_on(
    device: npu.Device, queue: npu.UserQueue, descriptor: _abi.NpuCmd, status: int
) -> None:
    buf = device.alloc(PAGE)
    good = queue.fill(buf, 7, PAGE)
    bad = queue.push(descriptor)
    after = queue.fill(buf, 9, PAGE)
    with pytest.raises(npu.NpuDeviceError) as info:
        queue.wait(after)
    assert (info.value.errno, info.value.status, info.value.fence) == (errno.EIO, status, bad)
    queue.wait(after)  # reported once
    assert queue.status(good) == queue.status(after) == _abi.NPU_ST_OK
    assert (buf.numpy(np.uint32) == 9).all()


def test_an_overlapping_copy_completes_with_bad_args(
    device: npu.Device, queue: npu.UserQueue
) -> None:
    buf = device.alloc(PAGE)
    fence = queue.push(cmd(_abi.NPU_OP_COPY, buf.va, buf.va + 64, 128))
    with pytest.raises(npu.NpuDeviceError) as info:
        queue.wait(fence)
    assert info.value.status == _abi.NPU_ST_BAD_ARGS


def test_gemm_on_a_queue_matches_numpy(device: npu.Device, queue: npu.UserQueue) -> None:
    rng = np.random.default_rng(0)
    m, n, k = 5, 7, 3
    a, b = rng.standard_normal((m, k), np.float32), rng.standard_normal((n, k), np.float32)
    ba, bb, bc = device.alloc(a.nbytes), device.alloc(b.nbytes), device.alloc(m * n * 4)
    ba.numpy(np.float32)[: a.size] = a.ravel()
    bb.numpy(np.float32)[: b.size] = b.ravel()
    words = (
        m | n << 32,
        k | k << 32,
        k | n << 32,
        _abi.NPU_DTYPE_FP32 | _abi.NPU_GEMM_TRANS_B << 32,
    )
    fence = queue.push(cmd(_abi.NPU_OP_GEMM, ba.va, bb.va, bc.va, *words))
    queue.wait(fence)
    got = bc.numpy(np.float32)[: m * n].reshape(m, n)
    np.testing.assert_allclose(got, a @ b.T, rtol=1e-5, atol=1e-6)


def test_a_command_outside_every_buffer_faults_stops_the_queue_and_faults_the_file(
    device: npu.Device, queue: npu.UserQueue
) -> None:
    buf = device.alloc(PAGE)
    fault = queue.push(cmd(_abi.NPU_OP_FILL, buf.va + PAGE, 64, 1))  # just past its end
    later = queue.nop()
    with pytest.raises(npu.NpuDeviceError) as info:
        queue.wait(later)
    assert (info.value.errno, info.value.status, info.value.fence) == (
        errno.EBADFD, _abi.NPU_ST_MMU_FAULT, fault,
    )  # fmt: skip
    assert queue.status(fault) == _abi.NPU_ST_MMU_FAULT
    assert queue.completed() == fault  # the NOP after it never ran
    for call in (lambda: device.create_queue(16), lambda: npu.tensor([1.0], device=device) + 1):
        with pytest.raises(npu.NpuError) as refused:
            call()
            npu.synchronize(device)
        assert refused.value.errno == errno.EBADFD


def test_a_nonzero_ctx_faults_on_a_lent_queue(queue: npu.UserQueue) -> None:
    fence = queue.push(cmd(_abi.NPU_OP_NOP, ctx=1))
    with pytest.raises(npu.NpuDeviceError) as info:
        queue.wait(fence)
    assert (info.value.errno, info.value.status) == (errno.EBADFD, _abi.NPU_ST_MMU_FAULT)


def test_a_tail_beyond_the_ring_stops_the_queue_with_eio(driver: CpuBackend) -> None:
    info = driver.queue_create(16, 0)
    bell = driver.map(info.doorbell_offset, PAGE, 0x2 | 0x1)
    struct.pack_into("<I", bell, 0, 17)  # 17 commands on a ring of 16
    with pytest.raises(OSError) as raised:
        driver.wait(1, 10**9, info.index)
    assert raised.value.errno == errno.EIO
    assert raised.value.status == _abi.NPU_ST_ABORTED  # type: ignore[attr-defined]
    bell.close()


def test_a_wait_command_holds_its_queue_until_another_queue_signals(device: npu.Device) -> None:
    consumer, producer = device.create_queue(16), device.create_queue(16)
    flag, src, dst = device.alloc(PAGE), device.alloc(PAGE), device.alloc(PAGE)
    consumer.push(cmd(_abi.NPU_OP_WAIT, flag.va, 5))
    done = consumer.copy(src, dst, PAGE)
    consumer.kick()
    time.sleep(0.05)
    assert consumer.completed() == 0  # blocked on the WAIT
    producer.fill(src, 0xABCDABCD, PAGE)
    producer.push(cmd(_abi.NPU_OP_SIGNAL, flag.va, 5))
    producer.kick()
    consumer.wait(done)
    assert (dst.numpy(np.uint32) == 0xABCDABCD).all()  # saw the producer's write


def test_a_host_store_releases_a_blocked_wait_command(
    device: npu.Device, queue: npu.UserQueue
) -> None:
    flag = device.alloc(PAGE)
    fence = queue.push(cmd(_abi.NPU_OP_WAIT, flag.va, 1))
    queue.kick()
    time.sleep(0.02)
    assert queue.completed() == 0
    flag.numpy(np.uint64)[0] = 1
    queue.wait(fence)


def test_a_wait_on_a_fence_never_completed_times_out(
    device: npu.Device, queue: npu.UserQueue
) -> None:
    flag = device.alloc(PAGE)
    fence = queue.push(cmd(_abi.NPU_OP_WAIT, flag.va, 1))
    t0 = time.monotonic()
    with pytest.raises(npu.NpuTimeoutError):
        queue.wait(fence, timeout_s=0.05)
    assert time.monotonic() - t0 < 2.0


def test_an_injected_hang_stops_user_queues_too(driver: CpuBackend, queue: npu.UserQueue) -> None:
    driver.hang = True
    fence = queue.nop()
    with pytest.raises(npu.NpuTimeoutError):
        queue.wait(fence, timeout_s=0.02)
    driver.hang = False
    queue.wait(fence)


def test_queue_create_refuses_bad_rings_and_priorities_with_einval(driver: CpuBackend) -> None:
    for entries, priority in [(8, 0), (24, 0), (8192, 0), (16, 4), (16, -1)]:
        with pytest.raises(OSError) as info:
            driver.queue_create(entries, priority)
        assert info.value.errno == errno.EINVAL


@pytest.mark.parametrize(
    ("index", "code"), [(3, errno.ENOENT), (0, errno.EINVAL), (8, errno.EINVAL)]
)
def test_queue_destroy_and_wait_of_a_queue_not_lent_fail_with_enoent_or_einval(
    driver: CpuBackend, index: int, code: int
) -> None:
    for call in (lambda: driver.queue_destroy(index), lambda: driver.wait(1, 0, index)):
        with pytest.raises(OSError) as info:
            call()
        assert info.value.errno == code


def test_mmap_of_a_queue_region_not_lent_fails_with_einval(driver: CpuBackend) -> None:
    for offset in (0, 1 << 24, (1 << 24) + (1 << 20), (1 << 24) + PAGE):
        with pytest.raises(OSError) as info:
            driver.map(offset, PAGE, 0x3)
        assert info.value.errno == errno.EINVAL


def test_a_doorbell_store_after_queue_destroy_gets_sigbus() -> None:
    pid = os.fork()
    if pid == 0:  # the child: its store must kill it with SIGBUS
        try:
            faulthandler.disable()
            backend = CpuBackend()
            info = backend.queue_create(16, 0)
            bell = backend.map(info.doorbell_offset, PAGE, 0x3)
            struct.pack_into("<I", bell, 0, 0)  # mapped: fine
            backend.queue_destroy(info.index)
            struct.pack_into("<I", bell, 0, 1)
        finally:
            os._exit(0)
    _, status = os.waitpid(pid, 0)
    assert os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGBUS


def test_the_queue_memory_stays_readable_after_queue_destroy(driver: CpuBackend) -> None:
    info = driver.queue_create(16, 0)
    mem = driver.map(info.mem_offset, info.mem_size, 0x3)
    bell = driver.map(info.doorbell_offset, PAGE, 0x3)
    struct.pack_into("<HHHHQ", mem, 0, _abi.NPU_OP_NOP, 0, 0, 0, 1)
    struct.pack_into("<I", bell, 0, 1)
    driver.wait(1, 10**9, info.index)
    driver.queue_destroy(info.index)
    assert struct.unpack_from("<Q", mem, info.fence_offset)[0] == 1
    assert struct.unpack_from("<QI", mem, info.cpl_offset) == (1, _abi.NPU_ST_OK)
    mem.close()
    bell.close()


def params_block(device: npu.Device, fill: Callable[[_abi.NpuTensorParams], None]) -> npu.Buffer:
    """A parameter block in a new buffer, as ``fill`` sets it up."""
    block = _abi.NpuTensorParams()
    fill(block)
    buf = device.alloc(PAGE)
    buf.numpy()[: len(bytes(block))] = np.frombuffer(bytes(block), np.uint8)
    return buf


def hw_operand(t: _abi.NpuHwTensor, va: int, n: int) -> None:
    t.va, t.dtype, t.ndim = va, _abi.NPU_DTYPE_FP32, 1
    t.shape[0], t.strides[0] = n, 1


def test_a_tensor_op_reads_its_parameter_block_and_the_operands_at_their_vas(
    device: npu.Device, queue: npu.UserQueue
) -> None:
    a, b, out = device.alloc(PAGE), device.alloc(PAGE), device.alloc(PAGE)
    a.numpy(np.float32)[:8] = np.arange(8)
    b.numpy(np.float32)[:8] = 10

    def add(p: _abi.NpuTensorParams) -> None:
        for i, buf in enumerate((a, b, out)):
            hw_operand(p.t[i], buf.va, 8)

    block = params_block(device, add)
    fence = queue.push(cmd(_abi.NPU_OP_ELTWISE, block.va, _abi.NPU_ELTWISE_ADD))
    queue.wait(fence)
    np.testing.assert_array_equal(out.numpy(np.float32)[:8], np.arange(8) + 10)


def test_an_unused_operand_not_all_zero_fails_the_tensor_op(
    device: npu.Device, queue: npu.UserQueue
) -> None:
    a, out = device.alloc(PAGE), device.alloc(PAGE)

    def relu(p: _abi.NpuTensorParams) -> None:
        hw_operand(p.t[0], a.va, 8)
        hw_operand(p.t[1], out.va, 8)
        p.t[2].shape[0] = 1  # operand 2 of a UNARY is unused

    block = params_block(device, relu)
    fence = queue.push(cmd(_abi.NPU_OP_UNARY, block.va, _abi.NPU_UNARY_RELU))
    with pytest.raises(npu.NpuDeviceError) as info:
        queue.wait(fence)
    assert info.value.status == _abi.NPU_ST_BAD_ARGS


def test_a_tensor_operand_outside_every_buffer_faults(
    device: npu.Device, queue: npu.UserQueue
) -> None:
    a = device.alloc(PAGE)

    def relu(p: _abi.NpuTensorParams) -> None:
        hw_operand(p.t[0], a.va, 8)
        hw_operand(p.t[1], 1 << 40, 8)  # no buffer there

    block = params_block(device, relu)
    fence = queue.push(cmd(_abi.NPU_OP_UNARY, block.va, _abi.NPU_UNARY_RELU))
    with pytest.raises(npu.NpuDeviceError) as info:
        queue.wait(fence)
    assert (info.value.errno, info.value.status) == (errno.EBADFD, _abi.NPU_ST_MMU_FAULT)
