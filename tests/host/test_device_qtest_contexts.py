"""The device MMU's context table, driven through qtest (no guest).

A descriptor names its address space in ``npu_cmd.ctx``: 0 is the queue's own
(its Q_MMU table if it has one, else the device-wide MMU), any other value
the entry of that index in the context table (NPU_REG_MMU_CTX_*). A queue
with a table of its own is *confined*: it may not name a context, and the
first command of it that faults stops it (NPU_ERR_MMU_FAULT) until it is
re-enabled. Other queues go on after a fault.
"""

from __future__ import annotations

import struct
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from qtest import BAR0_BASE, DATA, U32, Completion, Npu, cmd, copy, fill, hw, nop
from test_device_qtest_concurrent import concurrent

BASE = DATA + (32 << 20)
CTX_TABLE = BASE  # the context table: up to NPU_MMU_MAX_CTX entries of 16 bytes
TABLES = BASE + 0x10_0000  # address space i: L1 at TABLES + i * 0x2000, its L2 after it
PAGES = BASE + 0x20_0000  # the pages the address spaces map
ENTRY_SIZE = 16  # struct npu_mmu_ctx_entry
CTX_COUNT = 8  # entries of the table the fixture programs

# Every address space maps VA SRC and DST, each to a page of its own.
SRC, DST = 0x0, 0x1000
SECRET_VA = 0x2000  # mapped by context 2 only
DEVICE_WIDE = 0  # address-space index of the device-wide tables (MMU_L1_*)
CONFINED = 3  # address-space index of queue 0's own tables (Q_MMU_L1_*)
OTHER_Q = 1  # a second queue, for the tests that need two


def backing(space: int, va: int) -> int:
    """The page that address space ``space`` maps at ``va``."""
    return PAGES + space * 0x4000 + va


SECRET = backing(2, SECRET_VA)


@pytest.fixture
def npu(tmp_path: Path) -> Iterator[Npu]:
    dev = Npu(tmp_path / "qtest.log")
    try:
        yield dev
    finally:
        dev.close()


def l1_of(space: int) -> int:
    return TABLES + space * 0x2000


def address_space(npu: Npu, space: int, vas: tuple[int, ...] = (SRC, DST)) -> int:
    """Build address space ``space``'s tables (one L1 entry: 2 MiB); return its L1 address."""
    l1 = l1_of(space)
    l2 = l1 + 0x1000
    npu.qt.memset(l1, 0x2000, 0)
    npu.qt.memwrite(l1, struct.pack("<Q", l2 | hw.PTE_VALID))
    for va in vas:
        pte = backing(space, va) | hw.PTE_VALID | hw.PTE_WRITE
        npu.qt.memwrite(l2 + (va >> hw.PAGE_SHIFT) * 8, struct.pack("<Q", pte))
        npu.qt.memset(backing(space, va), 0x1000, 0x10 * space + (va >> hw.PAGE_SHIFT))
    return l1


def entry(l1: int, l1_entries: int = 1, *, valid: bool = True, rsvd: int = 0) -> bytes:
    """A ``struct npu_mmu_ctx_entry``."""
    return struct.pack("<QII", l1 | (hw.PTE_VALID if valid else 0), l1_entries, rsvd)


def set_entry(npu: Npu, ctx: int, raw: bytes) -> None:
    npu.qt.memwrite(CTX_TABLE + ctx * ENTRY_SIZE, raw)


def context_table(npu: Npu, count: int, base: int = CTX_TABLE) -> None:
    """Program the context table registers (the device must be disabled)."""
    npu.wr(hw.REG_MMU_CTX_LO, base & U32)
    npu.wr(hw.REG_MMU_CTX_HI, base >> 32)
    npu.wr(hw.REG_MMU_CTX_COUNT, count)


def ctx_regs(npu: Npu) -> tuple[int, int, int]:
    return npu.rd(hw.REG_MMU_CTX_LO), npu.rd(hw.REG_MMU_CTX_HI), npu.rd(hw.REG_MMU_CTX_COUNT)


def device_wide_mmu(npu: Npu) -> None:
    """Turn the device-wide MMU on, translating through address space DEVICE_WIDE."""
    npu.wr(hw.REG_MMU_L1_LO, address_space(npu, DEVICE_WIDE))
    npu.wr(hw.REG_MMU_L1_HI, 0)
    npu.wr(hw.REG_MMU_L1_ENTRIES, 1)
    npu.wr(hw.REG_MMU_CONTROL, hw.MMU_ENABLE)


def confine(npu: Npu, q: int = 0) -> None:
    """Give queue q (disabled) its own tables: address space CONFINED."""
    npu.qwr(hw.Q_MMU_L1_LO, address_space(npu, CONFINED), q)
    npu.qwr(hw.Q_MMU_L1_HI, 0, q)
    npu.qwr(hw.Q_MMU_L1_ENTRIES, 1, q)


def contexts_setup(npu: Npu) -> None:
    """A table of CTX_COUNT entries: 1 and 2 valid, each its own space; the rest zero."""
    npu.qt.memset(CTX_TABLE, CTX_COUNT * ENTRY_SIZE, 0)
    set_entry(npu, 1, entry(address_space(npu, 1)))
    set_entry(npu, 2, entry(address_space(npu, 2, (SRC, DST, SECRET_VA))))
    context_table(npu, CTX_COUNT)


@pytest.fixture
def contexts(npu: Npu) -> Npu:
    """Contexts 1 and 2, the device-wide MMU on, queue 0 (no tables of its own) running."""
    contexts_setup(npu)
    device_wide_mmu(npu)
    npu.start()
    return npu


@pytest.fixture
def confined(npu: Npu) -> Npu:
    """The ``contexts`` setup, but queue 0 has its own tables (it is confined)."""
    contexts_setup(npu)
    device_wide_mmu(npu)
    confine(npu)
    npu.start()
    return npu


def page(npu: Npu, space: int, va: int) -> bytes:
    return npu.qt.memread(backing(space, va), 0x1000)


def filled(space: int, va: int) -> bytes:
    """What address_space() put in the page: 0x1000 times its tag byte."""
    return bytes([0x10 * space + (va >> hw.PAGE_SHIFT)]) * 0x1000


def fault_regs(npu: Npu) -> dict[str, int]:
    names = ("FAULT_LO", "FAULT_HI", "FAULT_INFO", "FAULT_QUEUE", "FAULT_CTX", "FAULTS")
    return {name: npu.rd(getattr(hw, "REG_MMU_" + name)) for name in names}


def ctx_fault(ctx: int, faults: int = 1, queue: int = 0) -> dict[str, int]:
    """The fault registers after a descriptor named a ``ctx`` that is no address space."""
    return {"FAULT_LO": 0, "FAULT_HI": 0, "FAULT_INFO": hw.FAULT_CTX, "FAULT_QUEUE": queue,
            "FAULT_CTX": ctx, "FAULTS": faults}  # fmt: skip


def wait_stopped(npu: Npu, q: int = 0, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not npu.qrd(hw.Q_STATUS, q) & hw.QSTAT_STOPPED:
        assert time.monotonic() < deadline, f"queue {q} did not stop\n{npu.qt.log_tail()}"
        time.sleep(0.001)


def untouched(cpl: Completion) -> bool:
    """The completion slot still holds the 0xEE bytes Npu.start() put there."""
    return cpl.fence == 0xEEEE_EEEE_EEEE_EEEE


# --------------------------------------------------------------------------
# Selecting an address space
# --------------------------------------------------------------------------


def test_a_command_translates_through_the_context_entry_it_names(contexts: Npu) -> None:
    for ctx in (1, 2):
        cpl = contexts.run(copy(SRC, DST, 0x1000, fence=ctx, ctx=ctx))
        assert (cpl.status, cpl.fence) == (hw.ST_OK, ctx)
    # The same VAs, two address spaces: each copy stayed within its own pages.
    assert page(contexts, 1, DST) == filled(1, SRC)
    assert page(contexts, 2, DST) == filled(2, SRC)
    assert page(contexts, DEVICE_WIDE, DST) == filled(DEVICE_WIDE, DST)
    assert fault_regs(contexts)["FAULTS"] == 0
    contexts.assert_alive()


def test_ctx_0_translates_through_the_device_wide_table(contexts: Npu) -> None:
    assert contexts.run(copy(SRC, DST, 0x1000)).status == hw.ST_OK
    assert page(contexts, DEVICE_WIDE, DST) == filled(DEVICE_WIDE, SRC)
    for ctx in (1, 2):
        assert page(contexts, ctx, DST) == filled(ctx, DST)
    contexts.assert_alive()


def test_a_context_translates_even_with_the_device_wide_mmu_off(npu: Npu) -> None:
    contexts_setup(npu)
    npu.start()  # MMU_CONTROL is 0: ctx 0 uses bus addresses
    assert npu.run(copy(SRC, DST, 0x1000, ctx=1)).status == hw.ST_OK
    assert page(npu, 1, DST) == filled(1, SRC)
    dst = backing(1, DST)
    assert npu.run(fill(dst, 0x1000, 0x0BADCAFE)).status == hw.ST_OK  # a bus address
    assert npu.qt.readl(dst) == 0x0BADCAFE
    npu.assert_alive()


def test_a_fault_in_a_context_records_the_va_and_the_ctx(contexts: Npu) -> None:
    unmapped = 0x5000
    assert contexts.run(copy(SRC, unmapped, 0x10, ctx=2)).status == hw.ST_MMU_FAULT
    want = {"FAULT_LO": unmapped, "FAULT_HI": 0, "FAULT_INFO": hw.FAULT_WRITE,
            "FAULT_QUEUE": 0, "FAULT_CTX": 2, "FAULTS": 1}  # fmt: skip
    assert fault_regs(contexts) == want
    beyond = 1 << hw.MMU_L1_SHIFT  # past the entry's single L1 entry
    assert contexts.run(copy(beyond, DST, 0x10, ctx=1)).status == hw.ST_MMU_FAULT
    want |= {"FAULT_LO": beyond, "FAULT_INFO": hw.FAULT_RANGE, "FAULT_CTX": 1, "FAULTS": 2}
    assert fault_regs(contexts) == want
    contexts.assert_alive()


def test_a_va_mapped_only_in_another_context_faults_and_writes_nothing(contexts: Npu) -> None:
    # Context 2 maps SECRET_VA; context 1 maps nothing there.
    cpl = contexts.run(copy(SRC, SECRET_VA, 0x1000, ctx=1))
    assert cpl.status == hw.ST_MMU_FAULT
    assert fault_regs(contexts) == {
        "FAULT_LO": SECRET_VA, "FAULT_HI": 0, "FAULT_INFO": hw.FAULT_WRITE,
        "FAULT_QUEUE": 0, "FAULT_CTX": 1, "FAULTS": 1,
    }  # fmt: skip
    assert contexts.run(copy(SECRET_VA, DST, 0x1000, ctx=1)).status == hw.ST_MMU_FAULT
    assert contexts.rd(hw.REG_MMU_FAULT_INFO) == 0  # a read of an absent PTE
    assert contexts.qt.memread(SECRET, 0x1000) == filled(2, SECRET_VA)
    assert page(contexts, 1, DST) == filled(1, DST), "nothing leaked into context 1"
    contexts.assert_alive()


def test_context_entries_are_read_when_the_command_starts(contexts: Npu) -> None:
    # The device is running: the driver fills entry 5 and clears entry 1.
    set_entry(contexts, 5, entry(l1_of(2)))
    assert contexts.run(fill(DST, 0x1000, 0x55555555, ctx=5)).status == hw.ST_OK
    assert contexts.qt.readl(backing(2, DST)) == 0x55555555
    set_entry(contexts, 1, bytes(ENTRY_SIZE))
    assert contexts.run(fill(DST, 0x1000, 0x11111111, ctx=1)).status == hw.ST_MMU_FAULT
    assert fault_regs(contexts) == ctx_fault(1)
    assert page(contexts, 1, DST) == filled(1, DST)
    contexts.assert_alive()


# --------------------------------------------------------------------------
# A ctx that names no address space
# --------------------------------------------------------------------------


@pytest.mark.parametrize("ctx", [CTX_COUNT, CTX_COUNT + 1, hw.MMU_MAX_CTX, 0xFFFF])
def test_a_ctx_at_or_beyond_ctx_count_faults_with_fault_ctx(contexts: Npu, ctx: int) -> None:
    set_entry(contexts, CTX_COUNT, entry(l1_of(1)))  # valid, but past CTX_COUNT
    cpl = contexts.run(copy(SRC, DST, 0x1000, fence=0xC7, ctx=ctx))
    assert (cpl.status, cpl.fence) == (hw.ST_MMU_FAULT, 0xC7)
    assert fault_regs(contexts) == ctx_fault(ctx)
    assert page(contexts, 1, DST) == filled(1, DST)
    assert page(contexts, DEVICE_WIDE, DST) == filled(DEVICE_WIDE, DST)
    contexts.assert_alive()


def test_any_ctx_faults_without_a_context_table(npu: Npu) -> None:
    npu.start()  # CTX_COUNT is 0
    assert npu.run(nop(1, ctx=1)).status == hw.ST_MMU_FAULT
    assert fault_regs(npu) == ctx_fault(1)
    npu.assert_alive()


BAD_ENTRIES = {
    "without-valid": entry(l1_of(1), valid=False),
    "l1-entries-0": entry(l1_of(1), 0),
    "l1-entries-4097": entry(l1_of(1), hw.MMU_MAX_L1 + 1),
    "l1-entries-2^32-1": entry(l1_of(1), U32),
    "rsvd-1": entry(l1_of(1), rsvd=1),
    "rsvd-top-bit": entry(l1_of(1), rsvd=1 << 31),
    "all-zero": bytes(ENTRY_SIZE),
}


@pytest.mark.parametrize("raw", BAD_ENTRIES.values(), ids=BAD_ENTRIES.keys())
def test_an_invalid_context_entry_faults_with_fault_ctx(contexts: Npu, raw: bytes) -> None:
    set_entry(contexts, 1, raw)
    cpl = contexts.run(copy(SRC, DST, 0x1000, fence=9, ctx=1))
    assert (cpl.status, cpl.fence) == (hw.ST_MMU_FAULT, 9)
    assert fault_regs(contexts) == ctx_fault(1)
    assert page(contexts, 1, DST) == filled(1, DST)
    assert not contexts.rd(hw.REG_STATUS) & hw.STATUS_ERROR
    contexts.assert_alive()


def test_a_context_table_inside_the_device_bars_is_dma_error(npu: Npu) -> None:
    context_table(npu, CTX_COUNT, BAR0_BASE)
    npu.start()
    assert npu.run(nop(1, ctx=1)).status == hw.ST_DMA_ERROR
    assert npu.rd(hw.REG_MMU_FAULTS) == 0, "a table read failure is not a fault"
    npu.assert_alive()


def test_the_largest_l1_size_is_a_valid_context_entry(contexts: Npu) -> None:
    l1 = l1_of(4)
    contexts.qt.memset(l1, hw.MMU_MAX_L1 * 8, 0)  # a full-size L1 table
    contexts.qt.memwrite(l1, struct.pack("<Q", (l1_of(1) + 0x1000) | hw.PTE_VALID))
    set_entry(contexts, 4, entry(l1, hw.MMU_MAX_L1))
    assert contexts.run(copy(SRC, DST, 0x1000, ctx=4)).status == hw.ST_OK
    assert page(contexts, 1, DST) == filled(1, SRC)  # context 1's L2 table
    top = (hw.MMU_MAX_L1 << hw.MMU_L1_SHIFT) - 0x1000  # in range, no L1 entry
    assert contexts.run(fill(top, 4, 0, ctx=4)).status == hw.ST_MMU_FAULT
    assert contexts.rd(hw.REG_MMU_FAULT_INFO) == hw.FAULT_L1 | hw.FAULT_WRITE
    contexts.assert_alive()


def test_flags_and_rsvd0_are_checked_before_the_ctx(contexts: Npu) -> None:
    assert contexts.run(cmd(hw.OP_NOP, ctx=0xFFFF, rsvd0=1)).status == hw.ST_BAD_RESERVED
    assert contexts.run(cmd(hw.OP_NOP, ctx=0xFFFF, flags=0x8000)).status == hw.ST_BAD_FLAGS
    assert fault_regs(contexts)["FAULTS"] == 0
    contexts.assert_alive()


# --------------------------------------------------------------------------
# The context table registers
# --------------------------------------------------------------------------


def test_context_table_registers_read_back_what_was_written(npu: Npu) -> None:
    context_table(npu, 17, 0x1_2345_6000)
    assert ctx_regs(npu) == (0x2345_6000, 1, 17)
    npu.assert_alive()


def test_ctx_lo_drops_the_bits_below_4_kib(npu: Npu) -> None:
    npu.wr(hw.REG_MMU_CTX_LO, CTX_TABLE | 0xFFF)
    assert npu.rd(hw.REG_MMU_CTX_LO) == CTX_TABLE
    npu.assert_alive()


@pytest.mark.parametrize("count", [hw.MMU_MAX_CTX + 1, 0xFFFF, U32])
def test_ctx_count_above_the_maximum_is_clamped_to_4096(npu: Npu, count: int) -> None:
    npu.wr(hw.REG_MMU_CTX_COUNT, count)
    assert npu.rd(hw.REG_MMU_CTX_COUNT) == hw.MMU_MAX_CTX == 4096
    npu.assert_alive()


def test_the_last_of_4096_contexts_is_usable(npu: Npu) -> None:
    last = hw.MMU_MAX_CTX - 1
    npu.qt.memset(CTX_TABLE, hw.MMU_MAX_CTX * ENTRY_SIZE, 0)
    set_entry(npu, last, entry(address_space(npu, 1)))
    context_table(npu, U32)
    npu.start()
    assert npu.run(copy(SRC, DST, 0x1000, ctx=last)).status == hw.ST_OK
    assert page(npu, 1, DST) == filled(1, SRC)
    assert npu.run(nop(ctx=last + 1)).status == hw.ST_MMU_FAULT
    assert npu.rd(hw.REG_MMU_FAULT_CTX) == last + 1
    npu.assert_alive()


def test_context_table_registers_are_ignored_while_the_device_is_enabled(contexts: Npu) -> None:
    before = ctx_regs(contexts)
    assert before == (CTX_TABLE, 0, CTX_COUNT)
    contexts.wr(hw.REG_MMU_CTX_LO, 0x7000)
    contexts.wr(hw.REG_MMU_CTX_HI, 1)
    contexts.wr(hw.REG_MMU_CTX_COUNT, 1)
    assert ctx_regs(contexts) == before
    assert contexts.run(copy(SRC, DST, 0x1000, ctx=2)).status == hw.ST_OK  # still in use
    contexts.wr(hw.REG_CONTROL, 0)
    contexts.wr(hw.REG_MMU_CTX_COUNT, 1)  # disabled: takes effect
    assert contexts.rd(hw.REG_MMU_CTX_COUNT) == 1
    contexts.assert_alive()


def test_fault_ctx_is_read_only(contexts: Npu) -> None:
    assert contexts.run(nop(ctx=CTX_COUNT + 3)).status == hw.ST_MMU_FAULT
    contexts.wr(hw.REG_MMU_FAULT_CTX, 0)
    assert contexts.rd(hw.REG_MMU_FAULT_CTX) == CTX_COUNT + 3
    contexts.assert_alive()


def test_a_soft_reset_clears_the_context_table_registers_and_fault_ctx(contexts: Npu) -> None:
    assert contexts.run(nop(ctx=CTX_COUNT)).status == hw.ST_MMU_FAULT
    assert contexts.rd(hw.REG_MMU_FAULT_CTX) == CTX_COUNT
    contexts.soft_reset()
    assert ctx_regs(contexts) == (0, 0, 0)
    assert fault_regs(contexts) == dict.fromkeys(fault_regs(contexts), 0)
    contexts.start()
    assert contexts.run(nop(ctx=1)).status == hw.ST_MMU_FAULT  # no table any more
    contexts.assert_alive()


# --------------------------------------------------------------------------
# Confined queues (an address space of their own)
# --------------------------------------------------------------------------


def assert_stopped_on_mmu_fault(npu: Npu, q: int = 0) -> None:
    assert npu.qrd(hw.Q_STATUS, q) & hw.QSTAT_STOPPED
    assert npu.qrd(hw.Q_ERROR, q) == hw.ERR_MMU_FAULT == 5
    assert npu.rd(hw.REG_ERROR) == hw.ERR_MMU_FAULT
    assert npu.rd(hw.REG_STATUS) & hw.STATUS_ERROR
    assert npu.rd(hw.REG_IRQ_STATUS) & hw.IRQ_ERROR


def test_a_confined_queue_translates_ctx_0_through_its_own_table(confined: Npu) -> None:
    assert confined.run(copy(SRC, DST, 0x1000)).status == hw.ST_OK
    assert page(confined, CONFINED, DST) == filled(CONFINED, SRC)
    assert page(confined, DEVICE_WIDE, DST) == filled(DEVICE_WIDE, DST)
    assert confined.qrd(hw.Q_ERROR) == hw.ERR_NONE
    confined.assert_alive()


@pytest.mark.parametrize("ctx", [1, 2, CTX_COUNT, 0xFFFF])
def test_a_confined_queue_rejects_a_ctx_with_a_fault_and_stops(confined: Npu, ctx: int) -> None:
    # Context 1 and 2 are valid entries: the queue may still name none of them.
    first, second = confined.submit(copy(SRC, DST, 0x1000, fence=1, ctx=ctx), nop(2))
    confined.wait_head(second)
    wait_stopped(confined)
    cpl = confined.completion(first)
    assert (cpl.status, cpl.fence) == (hw.ST_MMU_FAULT, 1)
    assert fault_regs(confined) == ctx_fault(ctx)
    assert_stopped_on_mmu_fault(confined)
    assert confined.rd(hw.REG_IRQ_STATUS) & 1, "the faulting completion is signalled too"
    time.sleep(0.1)
    assert confined.qrd(hw.Q_HEAD) == second, "the next descriptor must not run"
    assert untouched(confined.completion(second))
    assert confined.fence_wb()[0] == 1
    for space in (1, 2, CONFINED):
        assert page(confined, space, DST) == filled(space, DST)
    confined.assert_alive()


def test_a_confined_group_stops_after_its_faulting_member(confined: Npu) -> None:
    # A group of the faulting copy and a flagged NOP: the NOP ran beside it,
    # but the queue stops before the NOP completes, as if it never ran.
    first, second = confined.submit(copy(SRC, 0x5000, 0x10, fence=1), concurrent(nop(2)))
    confined.wait_head(second)
    wait_stopped(confined)
    assert confined.completion(first).status == hw.ST_MMU_FAULT
    assert_stopped_on_mmu_fault(confined)
    time.sleep(0.1)
    assert confined.qrd(hw.Q_HEAD) == second
    assert untouched(confined.completion(second))
    assert confined.fence_wb()[0] == 1
    confined.assert_alive()


FAULTING: dict[str, Callable[[], bytes]] = {
    "write-without-pte": lambda: copy(SRC, 0x5000, 0x10, fence=1),
    "read-without-pte": lambda: copy(0x5000, DST, 0x10, fence=1),
    "beyond-the-l1-table": lambda: fill(1 << hw.MMU_L1_SHIFT, 4, 0, fence=1),
    "fault-in-a-later-page": lambda: fill(DST, 0x2000, 0, fence=1),
    "split-into-tiles-on-the-cores": lambda: fill(SRC, 8 << 20, 0, fence=1),
}


@pytest.mark.parametrize("make", FAULTING.values(), ids=FAULTING.keys())
def test_a_confined_queue_stops_after_a_translation_fault(
    confined: Npu, make: Callable[[], bytes]
) -> None:
    first, second = confined.submit(make(), nop(2))
    confined.wait_head(second)
    wait_stopped(confined)
    assert confined.completion(first).status == hw.ST_MMU_FAULT
    assert confined.rd(hw.REG_MMU_FAULT_CTX) == 0
    assert_stopped_on_mmu_fault(confined)
    time.sleep(0.1)
    assert confined.qrd(hw.Q_HEAD) == second
    assert untouched(confined.completion(second))
    confined.assert_alive()


def test_a_confined_queue_is_not_stopped_by_other_errors(confined: Npu) -> None:
    bad = [nop(1, flags=4), copy(SRC, SRC + 8, 0x10, fence=2), copy(SRC, DST, 0x10, fence=3)]
    first = confined.submit(*bad)[0]
    confined.wait_head(first + len(bad))
    statuses = [c.status for c in confined.completions(first, len(bad))]
    assert statuses == [hw.ST_BAD_FLAGS, hw.ST_BAD_ARGS, hw.ST_OK]
    assert confined.qrd(hw.Q_STATUS) == hw.QSTAT_IDLE
    assert confined.qrd(hw.Q_ERROR) == hw.ERR_NONE
    confined.assert_alive()


def test_doorbells_do_not_restart_a_stopped_confined_queue(confined: Npu) -> None:
    confined.run(nop(1, ctx=1))
    wait_stopped(confined)
    confined.submit(nop(2), nop(3))
    time.sleep(0.1)
    assert confined.qrd(hw.Q_HEAD) == 1
    assert confined.qrd(hw.Q_STATUS) & hw.QSTAT_STOPPED
    confined.assert_alive()


def test_re_enabling_a_stopped_confined_queue_clears_q_error_and_runs_again(
    confined: Npu,
) -> None:
    confined.run(nop(1, ctx=1))
    wait_stopped(confined)
    confined.qwr(hw.Q_CONTROL, 0)
    assert confined.qrd(hw.Q_ERROR) == hw.ERR_MMU_FAULT, "disabling keeps the reason"
    confined.start()  # re-enable: HEAD and TAIL restart at 0
    assert confined.qrd(hw.Q_ERROR) == hw.ERR_NONE
    assert confined.qrd(hw.Q_STATUS) == hw.QSTAT_IDLE
    assert not confined.rd(hw.REG_STATUS) & hw.STATUS_ERROR
    assert confined.rd(hw.REG_ERROR) == hw.ERR_MMU_FAULT, "REG_ERROR is sticky until reset"
    cpl = confined.run(copy(SRC, DST, 0x1000, fence=7))
    assert (cpl.status, cpl.fence) == (hw.ST_OK, 7)
    assert page(confined, CONFINED, DST) == filled(CONFINED, SRC)
    assert confined.qrd(hw.Q_MMU_L1_ENTRIES) == 1, "the queue is still confined"
    confined.run(nop(8, ctx=2))
    wait_stopped(confined)  # and stops again on the next fault
    confined.assert_alive()


def test_a_stopped_confined_queue_does_not_hold_up_the_others(npu: Npu) -> None:
    contexts_setup(npu)
    confine(npu, OTHER_Q)
    ring = 0x20_0000
    for reg, val in ((hw.Q_RING_LO, ring), (hw.Q_RING_SIZE, 4), (hw.Q_CPL_LO, ring + 0x1000),
                     (hw.Q_FENCE_LO, 0)):  # fmt: skip
        npu.qwr(reg, val, OTHER_Q)
    npu.qwr(hw.Q_CONTROL, hw.QCTL_ENABLE, OTHER_Q)
    npu.start()
    npu.qt.memwrite(ring, nop(1, ctx=1) + nop(2))
    npu.wr(hw.doorbell(OTHER_Q), 2)
    wait_stopped(npu, OTHER_Q)
    assert npu.qrd(hw.Q_ERROR, OTHER_Q) == hw.ERR_MMU_FAULT
    assert fault_regs(npu) == ctx_fault(1, queue=OTHER_Q)
    assert npu.run(copy(SRC, DST, 0x1000, fence=3, ctx=1)).status == hw.ST_OK  # queue 0
    assert page(npu, 1, DST) == filled(1, SRC)
    assert npu.qrd(hw.Q_ERROR) == hw.ERR_NONE
    assert npu.qrd(hw.Q_HEAD, OTHER_Q) == 1
    npu.assert_alive()


def test_an_unconfined_queue_keeps_running_after_faults(contexts: Npu) -> None:
    descs = [
        nop(1, ctx=CTX_COUNT),  # names no context
        copy(SRC, SECRET_VA, 0x10, fence=2, ctx=1),  # a translation fault in a context
        copy(SRC, 0x5000, 0x10, fence=3),  # one in the device-wide table
        copy(SRC, DST, 0x1000, fence=4, ctx=1),
    ]
    first = contexts.submit(*descs)[0]
    contexts.wait_head(first + len(descs))
    done = contexts.completions(first, len(descs))
    assert [c.status for c in done] == [hw.ST_MMU_FAULT] * 3 + [hw.ST_OK]
    assert contexts.rd(hw.REG_MMU_FAULTS) == 3
    assert contexts.qrd(hw.Q_STATUS) == hw.QSTAT_IDLE
    assert contexts.qrd(hw.Q_ERROR) == hw.ERR_NONE
    assert not contexts.rd(hw.REG_STATUS) & hw.STATUS_ERROR
    assert contexts.rd(hw.REG_ERROR) == hw.ERR_NONE
    assert not contexts.rd(hw.REG_IRQ_STATUS) & hw.IRQ_ERROR
    assert page(contexts, 1, DST) == filled(1, SRC)
    contexts.assert_alive()


def test_the_completion_of_the_faulting_command_is_written_before_the_stop(
    confined: Npu,
) -> None:
    (idx,) = confined.submit(copy(SRC, 0x5000, 0x10, fence=0xFA))
    confined.wait_head(idx + 1)
    assert confined.qrd(hw.Q_STATUS) & hw.QSTAT_STOPPED  # HEAD and STOPPED move together
    cpl = confined.completion(idx)
    assert (cpl.status, cpl.fence, cpl.opcode) == (hw.ST_MMU_FAULT, 0xFA, hw.OP_COPY)
    assert confined.fence_wb()[0] == 0xFA
    assert confined.qrd(hw.Q_DONE_LO) == 0xFA
    confined.assert_alive()
