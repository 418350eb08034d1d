"""The device's hardware queues and its scheduler, driven through qtest (no
guest): every queue runs its own ring in order, a higher-priority queue runs
first, and queues of equal priority take turns command by command."""

from __future__ import annotations

import struct
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from qtest import (
    CMD_SIZE,
    CPL_SIZE,
    DATA,
    U32,
    Completion,
    Npu,
    copy,
    fill,
    hw,
    nop,
    setup_queue,
)
from qtest import QUEUE_ENTRIES as RING_ENTRIES
from qtest import queue_cpl as cpl
from qtest import queue_ring as ring
from test_device_qtest_engine import runaway_pool

FILL_BYTES = 1 << 20  # about 0.1 ms of device work per FILL


@pytest.fixture
def npu(tmp_path: Path) -> Iterator[Npu]:
    dev = Npu(tmp_path / "qtest.log")
    yield dev
    dev.close()


def post(npu: Npu, q: int, descs: list[bytes]) -> None:
    """Write descriptors at slot 0.. of queue q's ring and ring its doorbell."""
    assert all(len(d) == CMD_SIZE for d in descs)
    npu.qt.memwrite(ring(q), b"".join(descs))
    npu.wr(hw.doorbell(q), len(descs))


def wait_all(npu: Npu, counts: dict[int, int]) -> None:
    deadline = time.monotonic() + 30
    while any(npu.qrd(hw.Q_HEAD, q) != n for q, n in counts.items()):
        assert time.monotonic() < deadline, {q: npu.qrd(hw.Q_HEAD, q) for q in counts}
        time.sleep(0.002)


def completions(npu: Npu, q: int, n: int) -> list[Completion]:
    raw = npu.qt.memread(cpl(q), n * CPL_SIZE)
    return [Completion.parse(raw[i : i + CPL_SIZE]) for i in range(0, len(raw), CPL_SIZE)]


def fills(q: int, n: int) -> list[bytes]:
    """n FILLs of queue q's own data area, fences 1..n."""
    base = DATA + q * n * FILL_BYTES
    return [fill(base + i * FILL_BYTES, FILL_BYTES, 0x1000 * q + i, i + 1) for i in range(n)]


def test_the_device_has_eight_queues_each_with_a_priority_register(npu: Npu) -> None:
    assert npu.rd(hw.REG_NUM_QUEUES) == hw.NUM_QUEUES == 8
    for q in range(hw.NUM_QUEUES):
        npu.qwr(hw.Q_PRIORITY, q % (hw.Q_PRIORITY_MAX + 1), q)
        assert npu.qrd(hw.Q_PRIORITY, q) == q % (hw.Q_PRIORITY_MAX + 1)


def test_a_priority_above_the_maximum_is_ignored(npu: Npu) -> None:
    npu.qwr(hw.Q_PRIORITY, 2, 3)
    npu.qwr(hw.Q_PRIORITY, hw.Q_PRIORITY_MAX + 1, 3)
    assert npu.qrd(hw.Q_PRIORITY, 3) == 2
    npu.assert_alive()


def test_every_queue_runs_its_own_ring_in_order(npu: Npu) -> None:
    n = 4
    for q in range(hw.NUM_QUEUES):
        setup_queue(npu, q)
        post(npu, q, fills(q, n))
    npu.wr(hw.REG_CONTROL, hw.CONTROL_ENABLE)
    wait_all(npu, dict.fromkeys(range(hw.NUM_QUEUES), n))
    for q in range(hw.NUM_QUEUES):
        done = completions(npu, q, n)
        assert [c.fence for c in done] == list(range(1, n + 1))
        assert all(c.status == hw.ST_OK for c in done)
        for i in range(n):
            word = npu.qt.readl(DATA + (q * n + i) * FILL_BYTES + FILL_BYTES - 4)
            assert word == 0x1000 * q + i
        assert npu.qrd(hw.Q_DONE_LO, q) == n


TOKEN = DATA + (64 << 20)  # a 4-byte cell the commands write and read
RECORDS = TOKEN + 0x1000  # where COPYs record the token they saw, 4 bytes each


def token_fills(n: int, tag: int) -> list[bytes]:
    """n FILLs setting TOKEN to tag + i (fences 1..n)."""
    return [fill(TOKEN, 4, tag + i, i + 1) for i in range(n)]


def token_reads(n: int, first_record: int) -> list[bytes]:
    """n COPYs of TOKEN into consecutive records (fences 1..n)."""
    return [copy(TOKEN, RECORDS + 4 * (first_record + i), 4, i + 1) for i in range(n)]


def records(npu: Npu, first: int, n: int) -> list[int]:
    raw = npu.qt.memread(RECORDS + 4 * first, 4 * n)
    return [int.from_bytes(raw[i : i + 4], "little") for i in range(0, len(raw), 4)]


def test_a_higher_priority_queue_runs_first(npu: Npu) -> None:
    # Queue 1 comes first in round-robin order, so without priorities its
    # reads would run before queue 6 wrote the token.
    n = 8
    npu.qt.memset(TOKEN, 4, 0)
    setup_queue(npu, 1, priority=0)
    setup_queue(npu, 6, priority=hw.Q_PRIORITY_MAX)
    post(npu, 1, token_reads(n, 0))
    post(npu, 6, token_fills(n, 0x600))
    npu.wr(hw.REG_CONTROL, hw.CONTROL_ENABLE)  # both have work when the device starts
    wait_all(npu, {1: n, 6: n})
    assert records(npu, 0, n) == [0x600 + n - 1] * n


def test_queues_of_equal_priority_take_turns(npu: Npu) -> None:
    n = 6
    npu.qt.memset(TOKEN, 4, 0)
    setup_queue(npu, 2, priority=1)
    setup_queue(npu, 3, priority=1)
    post(npu, 2, token_fills(n, 0x200))
    post(npu, 3, token_reads(n, 0))
    npu.wr(hw.REG_CONTROL, hw.CONTROL_ENABLE)
    wait_all(npu, {2: n, 3: n})
    seen = records(npu, 0, n)
    # Alternating commands: each read sees the fill just before it.
    assert seen in ([0x200 + i for i in range(n)], [0] + [0x200 + i for i in range(n - 1)]), [
        hex(v) for v in seen
    ]


def test_a_reset_clears_the_priorities(npu: Npu) -> None:
    npu.qwr(hw.Q_PRIORITY, 3, 1)
    npu.wr(hw.REG_CONTROL, hw.CONTROL_RESET)
    deadline = time.monotonic() + 10
    while npu.rd(hw.REG_STATUS) & hw.STATUS_RESETTING:
        assert time.monotonic() < deadline
        time.sleep(0.001)
    assert npu.qrd(hw.Q_PRIORITY, 1) == 0


def test_a_nop_on_the_last_queue_completes(npu: Npu) -> None:
    q = hw.NUM_QUEUES - 1
    setup_queue(npu, q)
    post(npu, q, [nop(7)])
    npu.wr(hw.REG_CONTROL, hw.CONTROL_ENABLE)
    wait_all(npu, {q: 1})
    assert completions(npu, q, 1)[0].fence == 7


# -- interrupt moderation -------------------------------------------------------


def irq_nops(n: int) -> list[bytes]:
    return [nop(i + 1, flags=hw.CMD_F_IRQ) for i in range(n)]


def test_without_moderation_every_irq_command_is_signalled(npu: Npu) -> None:
    setup_queue(npu, 0)
    post(npu, 0, irq_nops(10))
    npu.wr(hw.REG_CONTROL, hw.CONTROL_ENABLE)
    wait_all(npu, {0: 10})
    assert npu.qrd(hw.Q_IRQS, 0) == 10


def test_a_count_coalesces_a_burst(npu: Npu) -> None:
    setup_queue(npu, 1)
    npu.qwr(hw.Q_IRQ_COUNT, 8, 1)
    post(npu, 1, irq_nops(RING_ENTRIES))
    npu.wr(hw.REG_CONTROL, hw.CONTROL_ENABLE)
    wait_all(npu, {1: RING_ENTRIES})
    assert npu.qrd(hw.Q_IRQS, 1) == RING_ENTRIES // 8


def test_an_isolated_command_is_signalled_at_once_under_moderation(npu: Npu) -> None:
    setup_queue(npu, 2)
    npu.qwr(hw.Q_IRQ_COUNT, 16, 2)
    npu.qwr(hw.Q_IRQ_DELAY, 1000, 2)
    npu.wr(hw.REG_IRQ_STATUS, U32)
    npu.wr(hw.REG_CONTROL, hw.CONTROL_ENABLE)
    post(npu, 2, irq_nops(1))
    wait_all(npu, {2: 1})
    deadline = time.monotonic() + 5
    while npu.qrd(hw.Q_IRQS, 2) != 1:  # no clock step: the queue went idle
        assert time.monotonic() < deadline
        time.sleep(0.001)
    assert npu.rd(hw.REG_IRQ_STATUS) & (1 << 2)


def test_held_completions_are_signalled_when_the_delay_passes(npu: Npu) -> None:
    setup_queue(npu, 3)
    npu.qwr(hw.Q_IRQ_COUNT, 1000, 3)
    npu.qwr(hw.Q_IRQ_DELAY, 50, 3)
    big = fill(DATA, 256 << 20, 0x5A5A5A5A, 4)  # ~25 ms or more: the queue stays busy
    post(npu, 3, [*irq_nops(3), big])
    npu.wr(hw.REG_CONTROL, hw.CONTROL_ENABLE)
    deadline = time.monotonic() + 5
    while npu.qrd(hw.Q_HEAD, 3) < 3:
        assert time.monotonic() < deadline
        time.sleep(0.0005)
    assert npu.qrd(hw.Q_HEAD, 3) == 3, "the FILL finished too soon to observe"
    assert npu.qrd(hw.Q_IRQS, 3) == 0  # held: more work is queued
    npu.qt.clock_step(50_000)  # the virtual clock is the device's timer clock
    assert npu.qrd(hw.Q_IRQS, 3) == 1
    wait_all(npu, {3: 4})


def test_moderation_values_above_the_limits_are_ignored(npu: Npu) -> None:
    npu.qwr(hw.Q_IRQ_COUNT, 4, 4)
    npu.qwr(hw.Q_IRQ_COUNT, hw.IRQ_COUNT_MAX + 1, 4)
    npu.qwr(hw.Q_IRQ_DELAY, hw.IRQ_DELAY_MAX + 1, 4)
    assert (npu.qrd(hw.Q_IRQ_COUNT, 4), npu.qrd(hw.Q_IRQ_DELAY, 4)) == (4, 0)
    npu.assert_alive()


# -- per-queue address spaces -------------------------------------------------------

AS_TABLES = DATA + (128 << 20)  # page tables of the address-space tests
AS_PAGES = AS_TABLES + 0x10_0000  # the pages they map


def address_space(npu: Npu, q: int, pages: dict[int, int]) -> None:
    """Give queue q (disabled) its own table mapping VA page -> physical page (writable)."""
    l1 = AS_TABLES + q * 0x2000
    l2 = l1 + 0x1000
    npu.qt.memset(l1, 0x2000, 0)
    npu.qt.memwrite(l1, struct.pack("<Q", l2 | hw.PTE_VALID))
    for va, pa in pages.items():
        pte = pa | hw.PTE_VALID | hw.PTE_WRITE
        npu.qt.memwrite(l2 + (va >> hw.PAGE_SHIFT) * 8, struct.pack("<Q", pte))
    npu.qwr(hw.Q_MMU_L1_LO, l1, q)
    npu.qwr(hw.Q_MMU_L1_HI, 0, q)
    npu.qwr(hw.Q_MMU_L1_ENTRIES, 1, q)


def test_each_queue_translates_through_its_own_tables(npu: Npu) -> None:
    page_a, page_b = AS_PAGES, AS_PAGES + 0x1000
    npu.qt.memset(page_a, 0x2000, 0)
    address_space(npu, 1, {0x0: page_a})
    address_space(npu, 2, {0x0: page_b})
    for q in (1, 2):
        setup_queue(npu, q)
        post(npu, q, [fill(0x0, 4096, 0x11111111 * q, 1)])  # the same VA on both
    npu.wr(hw.REG_CONTROL, hw.CONTROL_ENABLE)
    wait_all(npu, {1: 1, 2: 1})
    assert completions(npu, 1, 1)[0].status == completions(npu, 2, 1)[0].status == hw.ST_OK
    assert npu.qt.readl(page_a) == 0x11111111 and npu.qt.readl(page_b) == 0x22222222


def test_a_queue_cannot_reach_pages_only_another_queue_maps(npu: Npu) -> None:
    secret = AS_PAGES + 0x4000
    npu.qt.memset(secret, 4096, 0x5A)
    address_space(npu, 1, {0x0: AS_PAGES, 0x1000: secret})  # queue 1 may reach the page
    address_space(npu, 2, {0x0: AS_PAGES + 0x2000})  # queue 2 maps only its own
    setup_queue(npu, 2)
    post(npu, 2, [copy(0x1000, 0x0, 4096, 1)])  # read VA 0x1000: not in queue 2's tables
    npu.wr(hw.REG_CONTROL, hw.CONTROL_ENABLE)
    wait_all(npu, {2: 1})
    assert completions(npu, 2, 1)[0].status == hw.ST_MMU_FAULT
    assert npu.rd(hw.REG_MMU_FAULT_QUEUE) == 2
    assert npu.qrd(hw.Q_ERROR, 2) == hw.ERR_MMU_FAULT, "a queue with its own tables stops"
    assert npu.rd(hw.REG_MMU_FAULT_LO) == 0x1000
    assert npu.qt.memread(AS_PAGES + 0x2000, 16) != b"\x5a" * 16


def test_queues_without_tables_use_the_device_wide_setting(npu: Npu) -> None:
    address_space(npu, 1, {0x0: AS_PAGES})
    setup_queue(npu, 0)  # MMU_CONTROL is off: queue 0 uses bus addresses
    post(npu, 0, [fill(AS_PAGES + 0x3000, 4096, 0xC0FFEE, 1)])
    npu.wr(hw.REG_CONTROL, hw.CONTROL_ENABLE)
    wait_all(npu, {0: 1})
    assert completions(npu, 0, 1)[0].status == hw.ST_OK
    assert npu.qt.readl(AS_PAGES + 0x3000) == 0xC0FFEE


def test_address_space_registers_are_locked_while_the_queue_is_enabled(npu: Npu) -> None:
    address_space(npu, 3, {0x0: AS_PAGES})
    setup_queue(npu, 3)
    npu.qwr(hw.Q_MMU_L1_ENTRIES, 0, 3)  # ignored: the queue is enabled
    npu.qwr(hw.Q_MMU_L1_LO, 0x5000, 3)
    assert npu.qrd(hw.Q_MMU_L1_ENTRIES, 3) == 1
    assert npu.qrd(hw.Q_MMU_L1_LO, 3) == AS_TABLES + 3 * 0x2000


# -- Q_STATUS.ACTIVE -----------------------------------------------------------------

BIG_FILL = 256 << 20  # tens of ms of device work: long enough to watch
# A higher-priority queue's flood: each FILL several ms, clear of POOL2D's operands.
FLOOD = DATA + (64 << 20)
FLOOD_BYTES = 128 << 20
FLOOD_CMDS = 16


def wait_active(npu: Npu, q: int) -> None:
    deadline = time.monotonic() + 5
    while not npu.qrd(hw.Q_STATUS, q) & hw.QSTAT_ACTIVE:
        assert npu.qrd(hw.Q_HEAD, q) == 0, "the command finished before ACTIVE was seen"
        assert time.monotonic() < deadline
        time.sleep(0.0002)


def wait_inactive(npu: Npu, q: int) -> None:
    deadline = time.monotonic() + 30
    while npu.qrd(hw.Q_STATUS, q) & hw.QSTAT_ACTIVE:
        assert time.monotonic() < deadline
        time.sleep(0.001)


def test_active_is_set_only_while_a_command_of_the_queue_runs(npu: Npu) -> None:
    setup_queue(npu, 1)
    setup_queue(npu, 2)
    assert npu.qrd(hw.Q_STATUS, 1) == hw.QSTAT_IDLE
    post(npu, 1, [fill(DATA, BIG_FILL, 0x5A5A5A5A, 1)])
    npu.wr(hw.REG_CONTROL, hw.CONTROL_ENABLE)
    wait_active(npu, 1)
    assert npu.qrd(hw.Q_STATUS, 2) == hw.QSTAT_IDLE, "another queue's command is not ours"
    wait_all(npu, {1: 1})
    assert npu.qrd(hw.Q_STATUS, 1) == hw.QSTAT_IDLE
    assert completions(npu, 1, 1)[0].status == hw.ST_OK


def test_a_disabled_queues_running_command_stops_at_its_next_control_point(npu: Npu) -> None:
    setup_queue(npu, 1)
    post(npu, 1, [fill(DATA, BIG_FILL, 0x5A5A5A5A, 1), nop(2)])
    npu.wr(hw.REG_CONTROL, hw.CONTROL_ENABLE)
    wait_active(npu, 1)
    npu.qwr(hw.Q_CONTROL, 0, 1)
    wait_inactive(npu, 1)
    # Stopped in its first few 4 MiB pieces, not run to the end of 256 MiB.
    assert npu.qt.memread(DATA + BIG_FILL - 4, 4) == bytes(4), "the FILL ran to its end"
    assert npu.qrd(hw.Q_HEAD, 1) == 0, "the old generation does not advance Q_HEAD"
    time.sleep(0.05)
    assert completions(npu, 1, 2)[0].fence != 1, "a stopped command writes no completion"
    assert completions(npu, 1, 2)[1].fence != 2, "nothing runs on a disabled queue"
    npu.assert_alive()


def test_a_disabled_preempted_command_stops_without_waiting_for_the_queues_in_front(
    tmp_path: Path,
) -> None:
    """A preempted command of a disabled queue is not resumed into more work:
    the command in front of it ends and it stops (a driver's QUEUE_DESTROY
    does not wait for a flood of a higher priority)."""
    dev = Npu(tmp_path / "qtest.log", device="npu,cmd-budget-ms=0")
    try:
        setup_queue(dev, 1, priority=0)
        setup_queue(dev, 2, priority=3)
        post(dev, 1, [runaway_pool(dev, 1)])  # hours of work
        dev.wr(hw.REG_CONTROL, hw.CONTROL_ENABLE)
        wait_active(dev, 1)
        flood = [fill(FLOOD, FLOOD_BYTES, 0x11111111, 0x200 + i) for i in range(FLOOD_CMDS)]
        post(dev, 2, flood)
        deadline = time.monotonic() + 10
        while dev.qrd(hw.Q_HEAD, 2) == 0:  # queue 2 runs: queue 1 is preempted
            assert time.monotonic() < deadline, "the higher priority did not preempt"
            time.sleep(0.0005)
        dev.qwr(hw.Q_CONTROL, 0, 1)
        wait_inactive(dev, 1)
        assert dev.qrd(hw.Q_HEAD, 2) < FLOOD_CMDS, "queue 1 waited for the whole flood"
        wait_all(dev, {2: FLOOD_CMDS})
        assert dev.qrd(hw.Q_HEAD, 1) == 0
        dev.assert_alive()
    finally:
        dev.close()


def test_re_enabling_a_queue_while_its_old_command_stops_starts_the_new_generation_at_slot_0(
    npu: Npu,
) -> None:
    setup_queue(npu, 1)
    post(npu, 1, [fill(DATA, BIG_FILL, 0x5A5A5A5A, 1)])
    npu.wr(hw.REG_CONTROL, hw.CONTROL_ENABLE)
    wait_active(npu, 1)
    npu.qwr(hw.Q_CONTROL, 0, 1)
    npu.qwr(hw.Q_CONTROL, hw.QCTL_ENABLE, 1)
    assert npu.qrd(hw.Q_STATUS, 1) & hw.QSTAT_IDLE
    wait_inactive(npu, 1)
    assert npu.qrd(hw.Q_STATUS, 1) == hw.QSTAT_IDLE
    post(npu, 1, [nop(5)])  # the new generation runs from slot 0
    wait_all(npu, {1: 1})
    assert completions(npu, 1, 1)[0].fence == 5


def test_a_head_written_while_disabled_is_where_the_next_enable_starts(npu: Npu) -> None:
    # A driver restarting a queue after a reset resumes it where it stopped.
    q = 3
    npu.wr(hw.REG_CONTROL, hw.CONTROL_ENABLE)
    setup_queue(npu, q)
    npu.qwr(hw.Q_CONTROL, 0, q)
    npu.qwr(hw.Q_HEAD, 5, q)
    npu.qwr(hw.Q_CONTROL, hw.QCTL_ENABLE, q)
    assert (npu.qrd(hw.Q_HEAD, q), npu.qrd(hw.Q_TAIL, q)) == (5, 5)
    descs = fills(q, 2)
    npu.qt.memwrite(ring(q) + 5 * CMD_SIZE, b"".join(descs))
    npu.wr(hw.doorbell(q), 7)
    wait_all(npu, {q: 7})
    raw = npu.qt.memread(cpl(q) + 5 * CPL_SIZE, 2 * CPL_SIZE)
    done = [Completion.parse(raw[i : i + CPL_SIZE]) for i in (0, CPL_SIZE)]
    assert [(c.fence, c.status) for c in done] == [(1, hw.ST_OK), (2, hw.ST_OK)]


def test_a_head_written_while_enabled_is_ignored(npu: Npu) -> None:
    q = 2
    setup_queue(npu, q)
    npu.qwr(hw.Q_HEAD, 9, q)
    assert npu.qrd(hw.Q_HEAD, q) == 0
    npu.qwr(hw.Q_CONTROL, 0, q)
    npu.qwr(hw.Q_CONTROL, hw.QCTL_ENABLE, q)
    assert npu.qrd(hw.Q_HEAD, q) == 0, "the ignored write left no restart point"
    npu.assert_alive()
