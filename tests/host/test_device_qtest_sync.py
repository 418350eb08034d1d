"""SIGNAL/WAIT and fault injection (NPU_REG_INJECT), driven through qtest (no guest).

SIGNAL stores its 64-bit ``sync.value`` at the 8-byte aligned device
address ``sync.va``. WAIT leaves its queue's head on it until the u64 at
``sync.va`` is at least ``sync.value`` (unsigned): the queue is *blocked*
(neither ACTIVE nor IDLE), the device runs other queues meanwhile and looks
again after each completion and every 1 ms. That 1 ms re-check is a host-time
condition wait, so under qtest, where the virtual clock only moves on
``clock_step``, a WAIT satisfied by a CPU store is still picked up without a
doorbell or a clock step.

NPU_REG_INJECT arms faults for the next command the device starts (HANG,
HW_ERROR, DMA_FAULT) or the next completion interrupt (DROP_IRQ); a bit
clears when its fault fires, reads show what is armed, unknown bits are
ignored and a soft reset disarms everything.
"""

from __future__ import annotations

import struct
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from qtest import (
    CMD_SIZE,
    CPL_SIZE,
    DATA,
    U32,
    U64,
    Completion,
    Npu,
    cmd,
    copy,
    fill,
    hw,
    nop,
    setup_queue,
)
from qtest import (
    QUEUE_ENTRIES as RING_ENTRIES,
)
from qtest import (
    queue_cpl as cpl,
)
from qtest import (
    queue_fence as fence_wb,
)
from qtest import (
    queue_ring as ring,
)

# Queue q's ring, completions and fence write-back: qtest.queue_ring() and after.
SYNC = DATA  # a page of 8-byte sync cells
BUF = DATA + 0x10_0000  # data the commands move
BIG = DATA + (16 << 20)  # room for the large FILLs that keep a producer busy
BIG_FILL = 64 << 20  # several ms of device work
TABLES = DATA + (96 << 20)  # MMU tests: L1, then L2
PAGES = TABLES + 0x10_0000  # MMU tests: backing pages
MSI_MAILBOX = 0x16_0000  # MSI-X vector v writes its data word at MSI_MAILBOX + 16 * v
PCI_CAP_ID_MSIX = 0x11
# The faults armed for a command or a completion interrupt (not the rest of
# NPU_INJECT_MASK, which may hold faults that fire at once).
COMMAND_FAULTS = hw.INJECT_HANG | hw.INJECT_HW_ERROR | hw.INJECT_DROP_IRQ | hw.INJECT_DMA_FAULT
# How long a blocked queue is watched to see that it stays blocked (real time).
BLOCKED_WATCH_S = 0.1


@pytest.fixture
def npu(tmp_path: Path) -> Iterator[Npu]:
    dev = Npu(tmp_path / "qtest.log")
    try:
        yield dev
    finally:
        dev.close()


# -- descriptors and queues ----------------------------------------------------


def signal(va: int, value: int, fence: int = 0, *, flags: int = 0) -> bytes:
    return cmd(hw.OP_SIGNAL, struct.pack("<QQ", va, value & U64), fence=fence, flags=flags)


def wait(va: int, value: int, fence: int = 0, *, flags: int = 0) -> bytes:
    return cmd(hw.OP_WAIT, struct.pack("<QQ", va, value & U64), fence=fence, flags=flags)


def with_byte(desc: bytes, offset: int, value: int = 1) -> bytes:
    raw = bytearray(desc)
    raw[offset] = value
    return bytes(raw)


def post(npu: Npu, q: int, descs: list[bytes], first: int = 0) -> int:
    """Write descriptors at slots first.. of queue q's ring, ring its doorbell; the new tail."""
    assert all(len(d) == CMD_SIZE for d in descs)
    assert first + len(descs) <= RING_ENTRIES
    npu.qt.memwrite(ring(q) + first * CMD_SIZE, b"".join(descs))
    tail = first + len(descs)
    npu.wr(hw.doorbell(q), tail)
    return tail


def start(npu: Npu, *queues: int) -> None:
    """Set up the queues and enable the device."""
    for q in queues:
        setup_queue(npu, q)
    npu.wr(hw.REG_IRQ_STATUS, U32)
    npu.wr(hw.REG_CONTROL, hw.CONTROL_ENABLE)


def head(npu: Npu, q: int) -> int:
    return npu.qrd(hw.Q_HEAD, q)


def wait_heads(npu: Npu, counts: dict[int, int], timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while any(head(npu, q) != n for q, n in counts.items()):
        assert time.monotonic() < deadline, (
            {q: head(npu, q) for q in counts},
            f"STATUS={npu.rd(hw.REG_STATUS):#x}",
        )
        time.sleep(0.001)


def completions(npu: Npu, q: int, n: int, first: int = 0) -> list[Completion]:
    raw = npu.qt.memread(cpl(q) + first * CPL_SIZE, n * CPL_SIZE)
    return [Completion.parse(raw[i : i + CPL_SIZE]) for i in range(0, len(raw), CPL_SIZE)]


def statuses(npu: Npu, q: int, n: int, first: int = 0) -> list[int]:
    return [c.status for c in completions(npu, q, n, first)]


def stays(pred: Callable[[], bool], seconds: float = BLOCKED_WATCH_S) -> bool:
    """pred() holds every time it is looked at for ``seconds`` of real time."""
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        if not pred():
            return False
        time.sleep(0.002)
    return pred()


def within(pred: Callable[[], bool], seconds: float = 5.0) -> float | None:
    """Seconds until pred() held, or None if it did not within ``seconds``."""
    t0 = time.monotonic()
    while not pred():
        if time.monotonic() - t0 > seconds:
            return None
        time.sleep(0.0005)
    return time.monotonic() - t0


def u64_at(npu: Npu, addr: int) -> int:
    return int(struct.unpack("<Q", npu.qt.memread(addr, 8))[0])


def put_u64(npu: Npu, addr: int, value: int) -> None:
    npu.qt.memwrite(addr, struct.pack("<Q", value & U64))


def timestamp(npu: Npu) -> int:
    lo = npu.rd(hw.REG_TIMESTAMP_LO)
    return lo | npu.rd(hw.REG_TIMESTAMP_HI) << 32


# --------------------------------------------------------------------------
# SIGNAL
# --------------------------------------------------------------------------


def test_signal_stores_the_64_bit_value_and_nothing_around_it(npu: Npu) -> None:
    npu.qt.memset(SYNC, 64, 0xAA)
    npu.start()
    c = npu.run(signal(SYNC + 16, 0x1122_3344_5566_7788, fence=5))
    assert (c.status, c.fence, c.opcode) == (hw.ST_OK, 5, hw.OP_SIGNAL)
    assert u64_at(npu, SYNC + 16) == 0x1122_3344_5566_7788
    assert npu.qt.memread(SYNC, 16) == b"\xaa" * 16
    assert npu.qt.memread(SYNC + 24, 40) == b"\xaa" * 40
    assert npu.fence_wb()[0] == 5


def test_signal_overwrites_even_with_a_smaller_value(npu: Npu) -> None:
    put_u64(npu, SYNC, 100)
    npu.start()
    assert npu.run(signal(SYNC, 7)).status == hw.ST_OK
    assert u64_at(npu, SYNC) == 7, "SIGNAL is a store, not a max"


def test_signals_of_one_queue_land_in_order(npu: Npu) -> None:
    put_u64(npu, SYNC, 0)
    npu.start()
    npu.submit(*[signal(SYNC, v, fence=v) for v in range(1, 11)])
    npu.wait_head(10)
    assert u64_at(npu, SYNC) == 10
    assert [c.status for c in npu.completions(0, 10)] == [hw.ST_OK] * 10


@pytest.mark.parametrize("opcode", [hw.OP_SIGNAL, hw.OP_WAIT], ids=["signal", "wait"])
@pytest.mark.parametrize("misalign", [1, 4, 7])
def test_a_misaligned_address_is_bad_args(npu: Npu, opcode: int, misalign: int) -> None:
    npu.qt.memset(SYNC, 32, 0)
    npu.start()
    desc = cmd(opcode, struct.pack("<QQ", SYNC + 8 + misalign, 0), fence=3)
    c = npu.run(desc)
    assert (c.status, c.fence) == (hw.ST_BAD_ARGS, 3)
    assert npu.qt.memread(SYNC, 32) == bytes(32), "nothing was stored"
    assert npu.run(nop(4)).status == hw.ST_OK, "the queue goes on"


@pytest.mark.parametrize("opcode", [hw.OP_SIGNAL, hw.OP_WAIT], ids=["signal", "wait"])
@pytest.mark.parametrize("offset", [16 + 16, 16 + 20, CMD_SIZE - 1], ids=["raw2", "raw2+4", "last"])
def test_a_nonzero_unused_payload_byte_is_bad_reserved(npu: Npu, opcode: int, offset: int) -> None:
    # A WAIT that would block completes at once: the descriptor is refused first.
    put_u64(npu, SYNC, 0)
    npu.start()
    desc = with_byte(cmd(opcode, struct.pack("<QQ", SYNC, 9), fence=2), offset)
    c = npu.run(desc, timeout=5)
    assert (c.status, c.fence) == (hw.ST_BAD_RESERVED, 2)
    assert u64_at(npu, SYNC) == 0, "a refused SIGNAL stores nothing"


def test_signal_into_the_devices_own_registers_is_bad_addr(npu: Npu) -> None:
    npu.start()
    npu.wr(hw.REG_SCRATCH, 0x5A5A)
    c = npu.run(signal(npu.bar0 + hw.REG_SCRATCH, 0xDEAD))
    assert c.status == hw.ST_BAD_ADDR
    assert npu.rd(hw.REG_SCRATCH) == 0x5A5A


def test_signal_and_wait_are_opcodes_15_and_16(npu: Npu) -> None:
    # The opcode numbers are part of the contract (docs/npu-spec.md).
    assert (hw.OP_SIGNAL, hw.OP_WAIT) == (15, 16)
    assert hw.OP_COUNT > hw.OP_WAIT
    npu.start()
    assert npu.run(cmd(hw.OP_COUNT)).status == hw.ST_BAD_OPCODE


# --------------------------------------------------------------------------
# WAIT
# --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("stored", "target"),
    [(5, 5), (6, 5), (0, 0), (1 << 63, 1), (U64, U64), (1 << 32, (1 << 32) - 1)],
    ids=["equal", "above", "zero", "top-bit-is-not-a-sign", "max", "high-word"],
)
def test_a_wait_already_satisfied_completes_at_once(npu: Npu, stored: int, target: int) -> None:
    put_u64(npu, SYNC, stored)
    npu.start()
    c = npu.run(wait(SYNC, target, fence=1), timeout=5)
    assert (c.status, c.fence, c.opcode) == (hw.ST_OK, 1, hw.OP_WAIT)
    assert u64_at(npu, SYNC) == stored, "WAIT only reads"


@pytest.mark.parametrize(
    ("stored", "target"),
    [(4, 5), (0xFFFF_FFFF, 1 << 32), (U64 - 1, U64)],
    ids=["below", "low-word-only", "one-below-max"],
)
def test_a_wait_below_its_value_blocks_the_queue(npu: Npu, stored: int, target: int) -> None:
    put_u64(npu, SYNC, stored)
    start(npu, 1)
    post(npu, 1, [wait(SYNC, target, 1), nop(2)])
    assert stays(lambda: head(npu, 1) == 0)
    # Blocked: neither idle nor stopped, and ACTIVE only during a re-check.
    seen = [npu.qrd(hw.Q_STATUS, 1) for _ in range(50)]
    assert all(s & (hw.QSTAT_IDLE | hw.QSTAT_STOPPED) == 0 for s in seen), seen
    assert sum(bool(s & hw.QSTAT_ACTIVE) for s in seen) < 25, seen
    assert statuses(npu, 1, 2) == [0xEEEE_EEEE] * 2
    assert npu.rd(hw.REG_STATUS) & hw.STATUS_ERROR == 0


def test_a_blocked_queue_reports_waiting_in_every_status_read(npu: Npu) -> None:
    put_u64(npu, SYNC, 0)
    start(npu, 1)
    post(npu, 1, [wait(SYNC, 1, 1), nop(2)])
    assert within(lambda: bool(npu.qrd(hw.Q_STATUS, 1) & hw.QSTAT_WAITING), 1.0) is not None
    # Between the device's 1 ms re-checks, which show ACTIVE instead: never neither.
    seen = [npu.qrd(hw.Q_STATUS, 1) for _ in range(50)]
    assert all(s & (hw.QSTAT_WAITING | hw.QSTAT_ACTIVE) for s in seen), seen
    assert not any(s & hw.QSTAT_WAITING and s & hw.QSTAT_ACTIVE for s in seen), seen
    assert sum(bool(s & hw.QSTAT_WAITING) for s in seen) > 25, seen


def test_waiting_clears_once_the_wait_completes(npu: Npu) -> None:
    put_u64(npu, SYNC, 0)
    start(npu, 1)
    post(npu, 1, [wait(SYNC, 1, 1)])
    assert within(lambda: bool(npu.qrd(hw.Q_STATUS, 1) & hw.QSTAT_WAITING), 1.0) is not None
    put_u64(npu, SYNC, 1)
    wait_heads(npu, {1: 1}, timeout=5)
    assert npu.qrd(hw.Q_STATUS, 1) == hw.QSTAT_IDLE


def test_a_running_queue_and_a_satisfied_wait_never_report_waiting(npu: Npu) -> None:
    put_u64(npu, SYNC, 5)
    start(npu, 1)
    post(npu, 1, [wait(SYNC, 5, 1), fill(BIG, BIG_FILL, 0, fence=2)])
    seen = []
    while head(npu, 1) != 2:
        seen.append(npu.qrd(hw.Q_STATUS, 1))
    assert not any(s & hw.QSTAT_WAITING for s in seen), seen


def test_a_wait_on_its_own_queues_earlier_signal_passes(npu: Npu) -> None:
    put_u64(npu, SYNC, 0)
    npu.start()
    npu.submit(signal(SYNC, 3, 1), wait(SYNC, 3, 2))
    npu.wait_head(2, timeout=5)
    assert [c.status for c in npu.completions(0, 2)] == [hw.ST_OK] * 2


def test_wait_holds_the_consumer_until_the_producer_signals(npu: Npu) -> None:
    # The consumer has the higher priority and is posted first: without the
    # WAIT its COPY would run before the producer's FILL.
    src, dst, flag = BIG, BUF, SYNC
    npu.qt.memset(src + BIG_FILL - 64, 64, 0)
    npu.qt.memset(dst, 64, 0)
    put_u64(npu, flag, 0)
    setup_queue(npu, 1, priority=hw.Q_PRIORITY_MAX)
    setup_queue(npu, 2, priority=0)
    npu.wr(hw.REG_CONTROL, hw.CONTROL_ENABLE)
    post(npu, 1, [wait(flag, 1, 1), copy(src + BIG_FILL - 64, dst, 64, 2)])
    assert stays(lambda: head(npu, 1) == 0)
    post(npu, 2, [fill(src, BIG_FILL, 0xC0DE_0001, 1), signal(flag, 1, 2)])
    wait_heads(npu, {1: 2, 2: 2})
    assert statuses(npu, 1, 2) == statuses(npu, 2, 2) == [hw.ST_OK] * 2
    assert npu.qt.memread(dst, 64) == struct.pack("<I", 0xC0DE_0001) * 16


def test_a_ping_pong_between_two_queues_sees_every_value_in_order(npu: Npu) -> None:
    # Producer (queue 3): for k = 1..n, wait for the consumer's ack k - 1,
    # write k into the cell, signal seq = k. Consumer (queue 5): wait for
    # seq k, copy the cell into record k, signal ack = k. Either side running
    # ahead of the other would record a wrong or a repeated value.
    n = 16
    cell, seq, ack, records = BUF, SYNC, SYNC + 8, BUF + 0x1000
    npu.qt.memset(records, 4 * n, 0xFF)
    put_u64(npu, seq, 0)
    put_u64(npu, ack, 0)
    npu.qt.memset(cell, 4, 0)
    producer, consumer = [], []
    for k in range(1, n + 1):
        producer += [wait(ack, k - 1), fill(cell, 4, k), signal(seq, k)]
        consumer += [wait(seq, k), copy(cell, records + 4 * (k - 1), 4), signal(ack, k)]
    start(npu, 3, 5)
    post(npu, 5, consumer)
    post(npu, 3, producer)
    wait_heads(npu, {3: 3 * n, 5: 3 * n})
    assert statuses(npu, 3, 3 * n) == statuses(npu, 5, 3 * n) == [hw.ST_OK] * (3 * n)
    got = struct.unpack(f"<{n}I", npu.qt.memread(records, 4 * n))
    assert list(got) == list(range(1, n + 1))
    assert (u64_at(npu, seq), u64_at(npu, ack)) == (n, n)


def test_a_cpu_store_releases_a_wait_without_a_doorbell_or_clock_step(npu: Npu) -> None:
    # qtest freezes QEMU_CLOCK_VIRTUAL: only the device's host-time 1 ms
    # re-check can notice the store.
    put_u64(npu, SYNC, 0)
    npu.qt.memset(BUF, 4, 0)
    start(npu, 2)
    post(npu, 2, [wait(SYNC, 5, 1), fill(BUF, 4, 0xF00D, 2)])
    t0 = timestamp(npu)
    assert stays(lambda: head(npu, 2) == 0)
    put_u64(npu, SYNC, 4)  # below the value: still blocked
    assert stays(lambda: head(npu, 2) == 0)
    put_u64(npu, SYNC, 5)
    took = within(lambda: head(npu, 2) == 2, 2.0)
    assert took is not None, f"the store was not picked up; Q_STATUS={npu.qrd(hw.Q_STATUS, 2):#x}"
    assert took < 0.1, f"picked up after {took * 1e3:.0f} ms (re-check every 1 ms)"
    assert timestamp(npu) == t0, "the virtual clock moved: not a host-time re-check"
    assert statuses(npu, 2, 2) == [hw.ST_OK] * 2
    assert npu.qt.readl(BUF) == 0xF00D


def test_a_blocked_queue_does_not_hold_up_the_other_queues(npu: Npu) -> None:
    # Even at a higher priority: a blocked queue is not runnable.
    put_u64(npu, SYNC, 0)
    setup_queue(npu, 1, priority=hw.Q_PRIORITY_MAX)
    setup_queue(npu, 4, priority=0)
    npu.wr(hw.REG_CONTROL, hw.CONTROL_ENABLE)
    post(npu, 1, [wait(SYNC, 1, 1), nop(2)])
    n = 20
    post(npu, 4, [fill(BUF + 4 * i, 4, 0x400 + i, i + 1) for i in range(n)])
    wait_heads(npu, {4: n}, timeout=10)
    assert statuses(npu, 4, n) == [hw.ST_OK] * n
    assert list(struct.unpack(f"<{n}I", npu.qt.memread(BUF, 4 * n))) == [
        0x400 + i for i in range(n)
    ]
    assert head(npu, 1) == 0, "re-checked after each completion, but still not satisfied"
    put_u64(npu, SYNC, 1)
    wait_heads(npu, {1: 2}, timeout=5)


def test_several_queues_waiting_on_one_cell_are_all_released(npu: Npu) -> None:
    put_u64(npu, SYNC, 0)
    waiters = [1, 2, 3, 6]
    start(npu, *waiters, 7)
    for q in waiters:
        post(npu, q, [wait(SYNC, 2, 1), fill(BUF + 4 * q, 4, 0x100 + q, 2)])
    assert stays(lambda: all(head(npu, q) == 0 for q in waiters))
    post(npu, 7, [signal(SYNC, 1, 1), signal(SYNC, 2, 2)])
    wait_heads(npu, {**dict.fromkeys(waiters, 2), 7: 2}, timeout=5)
    for q in waiters:
        assert npu.qt.readl(BUF + 4 * q) == 0x100 + q


def test_disabling_a_blocked_queue_drops_the_wait(npu: Npu) -> None:
    put_u64(npu, SYNC, 0)
    start(npu, 1)
    post(npu, 1, [wait(SYNC, 1, 1)])
    assert stays(lambda: head(npu, 1) == 0)
    npu.qwr(hw.Q_CONTROL, 0, 1)
    npu.qwr(hw.Q_CONTROL, hw.QCTL_ENABLE, 1)  # a new generation from slot 0
    assert within(lambda: npu.qrd(hw.Q_STATUS, 1) == hw.QSTAT_IDLE, 1.0) is not None
    post(npu, 1, [nop(9)])
    wait_heads(npu, {1: 1}, timeout=5)
    assert completions(npu, 1, 1)[0].fence == 9


def test_a_soft_reset_while_a_queue_is_blocked_leaves_a_working_device(npu: Npu) -> None:
    put_u64(npu, SYNC, 0)
    start(npu, 1)
    post(npu, 1, [wait(SYNC, 1, 1)])
    assert stays(lambda: head(npu, 1) == 0)
    npu.soft_reset()
    assert npu.qrd(hw.Q_STATUS, 1) == hw.QSTAT_IDLE and npu.qrd(hw.Q_CONTROL, 1) == 0
    put_u64(npu, SYNC, 1)  # the old WAIT is gone: nothing may run now
    assert stays(lambda: completions(npu, 1, 1)[0].status == 0xEEEE_EEEE)
    npu.start()
    assert npu.run(fill(BUF, 16, 0x77, 1)).status == hw.ST_OK


# -- through the device MMU ----------------------------------------------------

# VA -> (backing page offset from PAGES, writable); VA UNMAPPED has no PTE.
MAPPED_RW, MAPPED_RO, UNMAPPED = 0x1000, 0x2000, 0x3000


@pytest.fixture
def mmu(npu: Npu) -> Npu:
    """The device-wide MMU on: VA 0x1000 writable, 0x2000 read-only, 0x3000 unmapped."""
    l1, l2 = TABLES, TABLES + 0x1000
    npu.qt.memset(l1, 0x2000, 0)
    npu.qt.memwrite(l1, struct.pack("<Q", l2 | hw.PTE_VALID))
    for va, writable in ((MAPPED_RW, True), (MAPPED_RO, False)):
        pte = (PAGES + va) | hw.PTE_VALID | (hw.PTE_WRITE if writable else 0)
        npu.qt.memwrite(l2 + (va >> hw.PAGE_SHIFT) * 8, struct.pack("<Q", pte))
        npu.qt.memset(PAGES + va, 0x1000, 0)
    npu.wr(hw.REG_MMU_L1_LO, l1)
    npu.wr(hw.REG_MMU_L1_HI, 0)
    npu.wr(hw.REG_MMU_L1_ENTRIES, 1)
    npu.wr(hw.REG_MMU_CONTROL, hw.MMU_ENABLE)
    npu.start()
    return npu


def fault(npu: Npu) -> tuple[int, int, int]:
    """(MMU_FAULT address, MMU_FAULT_INFO, MMU_FAULTS)."""
    addr = npu.rd(hw.REG_MMU_FAULT_LO) | npu.rd(hw.REG_MMU_FAULT_HI) << 32
    return addr, npu.rd(hw.REG_MMU_FAULT_INFO), npu.rd(hw.REG_MMU_FAULTS)


def test_signal_and_wait_translate_through_the_mmu(mmu: Npu) -> None:
    c = mmu.run(signal(MAPPED_RW + 8, 42, 1))
    assert c.status == hw.ST_OK
    assert u64_at(mmu, PAGES + MAPPED_RW + 8) == 42
    put_u64(mmu, PAGES + MAPPED_RO, 7)
    assert mmu.run(wait(MAPPED_RO, 7, 2), timeout=5).status == hw.ST_OK, "WAIT only reads"
    assert fault(mmu)[2] == 0


def test_a_wait_on_an_unmapped_va_is_an_mmu_fault_not_a_block(mmu: Npu) -> None:
    c = mmu.run(wait(UNMAPPED + 16, 1, 1), timeout=5)
    assert c.status == hw.ST_MMU_FAULT
    addr, info, count = fault(mmu)
    assert (addr, info & hw.FAULT_WRITE, count) == (UNMAPPED + 16, 0, 1)


def test_a_signal_to_an_unmapped_va_is_an_mmu_write_fault(mmu: Npu) -> None:
    assert mmu.run(signal(UNMAPPED, 1, 1)).status == hw.ST_MMU_FAULT
    addr, info, _ = fault(mmu)
    assert addr == UNMAPPED and info & hw.FAULT_WRITE


def test_a_signal_to_a_read_only_page_is_a_permission_fault(mmu: Npu) -> None:
    assert mmu.run(signal(MAPPED_RO, 1, 1)).status == hw.ST_MMU_FAULT
    addr, info, _ = fault(mmu)
    assert addr == MAPPED_RO and info & hw.FAULT_PERM and info & hw.FAULT_WRITE
    assert u64_at(mmu, PAGES + MAPPED_RO) == 0


# --------------------------------------------------------------------------
# Fault injection: the register
# --------------------------------------------------------------------------


def test_inject_reads_zero_after_reset(npu: Npu) -> None:
    assert npu.rd(hw.REG_INJECT) == 0


def test_inject_arms_bits_cumulatively_and_ignores_unknown_ones(npu: Npu) -> None:
    npu.wr(hw.REG_INJECT, hw.INJECT_DROP_IRQ | (U32 & ~hw.INJECT_MASK))
    assert npu.rd(hw.REG_INJECT) == hw.INJECT_DROP_IRQ
    npu.wr(hw.REG_INJECT, hw.INJECT_HANG)
    assert npu.rd(hw.REG_INJECT) == hw.INJECT_DROP_IRQ | hw.INJECT_HANG
    npu.wr(hw.REG_INJECT, 0)  # writing 0 disarms nothing: only firing or a reset do
    assert npu.rd(hw.REG_INJECT) == hw.INJECT_DROP_IRQ | hw.INJECT_HANG
    npu.wr(hw.REG_INJECT, COMMAND_FAULTS)
    assert npu.rd(hw.REG_INJECT) == COMMAND_FAULTS
    npu.assert_alive()


def test_armed_faults_wait_for_a_command(npu: Npu) -> None:
    npu.wr(hw.REG_INJECT, hw.INJECT_HANG | hw.INJECT_HW_ERROR)
    npu.start()  # enabled, but no command
    assert stays(lambda: npu.rd(hw.REG_INJECT) == hw.INJECT_HANG | hw.INJECT_HW_ERROR)


def test_a_soft_reset_disarms_every_fault(npu: Npu) -> None:
    npu.wr(hw.REG_INJECT, COMMAND_FAULTS)
    npu.soft_reset()
    assert npu.rd(hw.REG_INJECT) == 0
    npu.start()
    npu.wr(hw.REG_IRQ_MASK, U32)
    assert npu.run(nop(1, flags=hw.CMD_F_IRQ)).status == hw.ST_OK
    assert npu.qrd(hw.Q_IRQS) == 1, "DROP_IRQ was disarmed too"


# -- HW_ERROR and DMA_FAULT ------------------------------------------------------


@pytest.mark.parametrize(
    ("bit", "status"),
    [(hw.INJECT_HW_ERROR, hw.ST_HW_ERROR), (hw.INJECT_DMA_FAULT, hw.ST_DMA_ERROR)],
    ids=["hw_error", "dma_fault"],
)
def test_an_injected_error_fails_the_next_command_without_running_it(
    npu: Npu, bit: int, status: int
) -> None:
    dst = BUF
    npu.qt.memset(dst, 0x2000, 0xAA)
    npu.start()
    npu.wr(hw.REG_INJECT, bit)
    c = npu.run(fill(dst, 0x1000, 0x1234_5678, 7))
    assert (c.status, c.fence, c.opcode) == (status, 7, hw.OP_FILL)
    assert npu.qt.memread(dst, 0x2000) == b"\xaa" * 0x2000, "the FILL did not run"
    assert npu.fence_wb()[0] == 7, "the fence is written back as for any completion"
    assert npu.rd(hw.REG_INJECT) == 0, "self-clearing"
    assert npu.rd(hw.REG_IRQ_STATUS) & 1, "an error completion raises the queue interrupt"
    assert npu.qrd(hw.Q_STATUS) == hw.QSTAT_IDLE, "the queue does not stop"
    assert npu.rd(hw.REG_ERROR) == hw.ERR_NONE
    c = npu.run(fill(dst, 0x1000, 0x1234_5678, 8))
    assert c.status == hw.ST_OK, "only one command fails"
    assert npu.qt.memread(dst, 0x1000) == struct.pack("<I", 0x1234_5678) * 0x400


def test_hw_error_and_dma_fault_armed_together_fail_two_commands_in_turn(npu: Npu) -> None:
    npu.start()
    npu.wr(hw.REG_INJECT, hw.INJECT_HW_ERROR | hw.INJECT_DMA_FAULT)
    assert npu.run(nop(1)).status == hw.ST_HW_ERROR
    assert npu.rd(hw.REG_INJECT) == hw.INJECT_DMA_FAULT, "DMA_FAULT stays armed"
    assert npu.run(nop(2)).status == hw.ST_DMA_ERROR
    assert npu.run(nop(3)).status == hw.ST_OK


def test_a_malformed_descriptor_leaves_an_injected_error_armed(npu: Npu) -> None:
    npu.start()
    npu.wr(hw.REG_INJECT, hw.INJECT_HW_ERROR)
    assert npu.run(nop(1, flags=0x8000)).status == hw.ST_BAD_FLAGS
    assert npu.rd(hw.REG_INJECT) == hw.INJECT_HW_ERROR
    assert npu.run(nop(2)).status == hw.ST_HW_ERROR


def test_an_injected_hw_error_fails_a_signal_without_storing(npu: Npu) -> None:
    put_u64(npu, SYNC, 0)
    npu.start()
    npu.wr(hw.REG_INJECT, hw.INJECT_HW_ERROR)
    assert npu.run(signal(SYNC, 5, 1)).status == hw.ST_HW_ERROR
    assert u64_at(npu, SYNC) == 0


def test_an_injected_dma_fault_fails_a_blocked_wait(npu: Npu) -> None:
    # A WAIT that cannot pass completes with the injected status instead.
    put_u64(npu, SYNC, 0)
    npu.start()
    npu.wr(hw.REG_INJECT, hw.INJECT_DMA_FAULT)
    assert npu.run(wait(SYNC, 1, 1), timeout=5).status == hw.ST_DMA_ERROR


def test_an_injected_error_hits_the_first_command_of_any_queue(npu: Npu) -> None:
    start(npu, 5)
    npu.wr(hw.REG_INJECT, hw.INJECT_HW_ERROR)
    post(npu, 5, [nop(1), nop(2)])
    wait_heads(npu, {5: 2})
    assert statuses(npu, 5, 2) == [hw.ST_HW_ERROR, hw.ST_OK]


# -- DROP_IRQ -------------------------------------------------------------------


@pytest.fixture
def msix(npu: Npu) -> Npu:
    """MSI-X on, every vector aimed at MSI_MAILBOX, queue 0 running, all causes unmasked."""
    cap = npu.pci.find_capability(PCI_CAP_ID_MSIX)
    for v in range(hw.MSIX_VECTORS):
        entry = struct.pack("<QII", MSI_MAILBOX + 16 * v, 0xA0 + v, 0)
        for off in range(0, 16, 4):
            npu.qt.writel(npu.bar4 + 16 * v + off, struct.unpack_from("<I", entry, off)[0])
    npu.pci.write16(cap + 2, 1 << 15)  # MSI-X enable
    npu.start()
    npu.qt.memset(MSI_MAILBOX, 16 * hw.MSIX_VECTORS, 0)
    npu.wr(hw.REG_IRQ_MASK, U32)
    return npu


def mailbox(npu: Npu, vector: int) -> int:
    return int(struct.unpack("<I", npu.qt.memread(MSI_MAILBOX + 16 * vector, 4))[0])


def test_drop_irq_swallows_one_completion_interrupt_but_not_the_completion(msix: Npu) -> None:
    vec = 1  # NPU_VEC_QUEUE(0)
    msix.wr(hw.REG_INJECT, hw.INJECT_DROP_IRQ)
    c = msix.run(nop(1, flags=hw.CMD_F_IRQ))
    assert (c.status, c.fence) == (hw.ST_OK, 1)
    assert msix.fence_wb()[0] == 1, "the fence write-back still happens"
    assert msix.rd(hw.REG_INJECT) == 0, "fired"
    assert stays(lambda: mailbox(msix, vec) == 0, 0.05), "no MSI-X message"
    assert msix.rd(hw.REG_IRQ_STATUS) & 1 == 0, "no IRQ_STATUS bit either"
    assert msix.qrd(hw.Q_IRQS) == 0
    # The next interrupt is signalled as usual.
    assert msix.run(nop(2, flags=hw.CMD_F_IRQ)).status == hw.ST_OK
    assert within(lambda: mailbox(msix, vec) == 0xA0 + vec, 5) is not None
    assert msix.rd(hw.REG_IRQ_STATUS) & 1
    assert msix.qrd(hw.Q_IRQS) == 1


def test_drop_irq_waits_for_a_command_that_interrupts(npu: Npu) -> None:
    npu.start()
    npu.wr(hw.REG_INJECT, hw.INJECT_DROP_IRQ)
    assert npu.run(nop(1)).status == hw.ST_OK  # no NPU_CMD_F_IRQ: no interrupt to drop
    assert npu.rd(hw.REG_INJECT) == hw.INJECT_DROP_IRQ
    assert npu.run(nop(2, flags=hw.CMD_F_IRQ)).status == hw.ST_OK
    assert npu.rd(hw.REG_INJECT) == 0
    assert npu.qrd(hw.Q_IRQS) == 0
    assert npu.rd(hw.REG_IRQ_STATUS) & 1 == 0


def test_drop_irq_also_swallows_an_error_completions_interrupt(npu: Npu) -> None:
    npu.start()
    npu.wr(hw.REG_INJECT, hw.INJECT_DROP_IRQ)
    assert npu.run(cmd(hw.OP_COUNT, fence=1)).status == hw.ST_BAD_OPCODE
    assert npu.rd(hw.REG_INJECT) == 0
    assert npu.rd(hw.REG_IRQ_STATUS) & 1 == 0


# -- HANG --------------------------------------------------------------------------


def test_an_injected_hang_stops_the_command_processor_until_a_soft_reset(npu: Npu) -> None:
    dst = BUF
    npu.qt.memset(dst, 0x1000, 0xAA)
    start(npu, 0, 3)
    npu.wr(hw.REG_INJECT, hw.INJECT_HANG)
    post(npu, 0, [fill(dst, 0x1000, 0x5555_5555, 1), nop(2)])
    assert within(lambda: npu.rd(hw.REG_INJECT) == 0) is not None, "the hang did not fire"
    assert npu.qrd(hw.Q_STATUS, 0) == hw.QSTAT_ACTIVE, "running, forever"
    post(npu, 3, [nop(1)])  # another queue's work does not run either
    npu.qt.clock_step(2_000_000_000)  # nor does the device clock help
    assert stays(lambda: head(npu, 0) == 0 and head(npu, 3) == 0, 0.2)
    assert npu.qrd(hw.Q_STATUS, 0) == hw.QSTAT_ACTIVE
    assert statuses(npu, 0, 2) == [0xEEEE_EEEE] * 2 and statuses(npu, 3, 1) == [0xEEEE_EEEE]
    assert u64_at(npu, fence_wb(0)) == 0
    assert npu.qt.memread(dst, 0x1000) == b"\xaa" * 0x1000, "the hung FILL wrote nothing"
    assert npu.rd(hw.REG_STATUS) & hw.STATUS_ERROR == 0, "a hang is silent"
    # Disabling the queue or the device does not revive it.
    npu.qwr(hw.Q_CONTROL, 0, 0)
    npu.wr(hw.REG_CONTROL, 0)
    npu.wr(hw.REG_CONTROL, hw.CONTROL_ENABLE)
    assert stays(lambda: head(npu, 3) == 0, 0.05)
    assert npu.qrd(hw.Q_STATUS, 0) & hw.QSTAT_ACTIVE

    seen = npu.soft_reset()
    assert seen[-1] & hw.STATUS_RESETTING == 0
    for q in (0, 3):
        assert npu.qrd(hw.Q_STATUS, q) == hw.QSTAT_IDLE and npu.qrd(hw.Q_CONTROL, q) == 0
    assert statuses(npu, 0, 2) == [0xEEEE_EEEE] * 2, "the hung command never completes"
    npu.start()
    c = npu.run(fill(dst, 0x1000, 0x5555_5555, 1))
    assert c.status == hw.ST_OK
    assert npu.qt.memread(dst, 0x1000) == b"\x55" * 0x1000
    npu.assert_alive()


def test_a_hang_fires_once(npu: Npu) -> None:
    npu.start()
    npu.wr(hw.REG_INJECT, hw.INJECT_HANG)
    npu.submit(nop(1))
    assert within(lambda: npu.qrd(hw.Q_STATUS) & hw.QSTAT_ACTIVE != 0) is not None
    npu.soft_reset()
    npu.start()
    npu.submit(*[nop(i) for i in range(1, 9)])
    npu.wait_head(8, timeout=5)
    assert [c.status for c in npu.completions(0, 8)] == [hw.ST_OK] * 8


def test_a_hang_leaves_other_armed_faults_for_after_the_reset(npu: Npu) -> None:
    # HANG fires first; HW_ERROR stays armed, and the reset disarms it.
    npu.start()
    npu.wr(hw.REG_INJECT, hw.INJECT_HANG | hw.INJECT_HW_ERROR)
    npu.submit(nop(1))
    assert within(lambda: npu.rd(hw.REG_INJECT) == hw.INJECT_HW_ERROR) is not None
    npu.soft_reset()
    assert npu.rd(hw.REG_INJECT) == 0
    npu.start()
    assert npu.run(nop(1)).status == hw.ST_OK


def test_a_hang_armed_while_a_queue_is_blocked_hangs_that_wait(npu: Npu) -> None:
    # Every look at a blocked WAIT starts it again, so the armed hang fires
    # on the WAIT's next re-check (1 ms) rather than on the next command
    # submitted: a driver's watchdog then sees the waiting queue ACTIVE.
    put_u64(npu, SYNC, 0)
    start(npu, 1, 2)
    post(npu, 1, [wait(SYNC, 1, 1)])
    assert stays(lambda: head(npu, 1) == 0, 0.02)
    npu.wr(hw.REG_INJECT, hw.INJECT_HANG)
    assert within(lambda: npu.rd(hw.REG_INJECT) == 0, 2.0) is not None
    assert npu.qrd(hw.Q_STATUS, 1) == hw.QSTAT_ACTIVE
    put_u64(npu, SYNC, 1)  # too late: the command processor has stopped
    post(npu, 2, [nop(1)])
    assert stays(lambda: head(npu, 1) == 0 and head(npu, 2) == 0, 0.1)
    npu.soft_reset()
    npu.start()
    assert npu.run(nop(1)).status == hw.ST_OK
