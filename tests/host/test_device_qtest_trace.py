"""The device's trace ring (NPU_CAP_TRACE, docs/npu-spec.md 4.8).

Through qtest, against the ASan/UBSan build: the ring is programmed at a
RAM address of the test's choosing, commands run, and the records the
device wrote there are read back and decoded.
"""

from __future__ import annotations

import struct
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest

from qtest import DATA, Npu, copy, gemm, hw, nop
from test_device_qtest_firmware import mbox, system_reset

TRACE_RING = 0x30_0000  # 64 KiB of records, clear of the queue and data areas
REC = struct.Struct("<QHBBIQQ")
KINDS = {
    getattr(hw, name): name[3:].lower()
    for name in (
        "TR_FETCH",
        "TR_DISPATCH",
        "TR_CMD_START",
        "TR_CMD_END",
        "TR_TILE_START",
        "TR_TILE_END",
        "TR_DMA_START",
        "TR_DMA_END",
        "TR_CPL_WRITE",
        "TR_IRQ",
        "TR_MBOX_REQ",
        "TR_MBOX_REPLY",
    )
}


@dataclass(frozen=True)
class Rec:
    ts: int
    kind: str
    queue: int
    core: int
    arg32: int
    fence: int
    arg: int


@pytest.fixture
def npu(tmp_path: Path) -> Iterator[Npu]:
    """A device with queue 0 running."""
    dev = Npu(tmp_path / "qemu.log")
    try:
        dev.start()
        yield dev
    finally:
        dev.close()


def trd(npu: Npu, reg: int) -> int:
    return npu.rd(hw.TRACE_BASE + reg)


def twr(npu: Npu, reg: int, val: int) -> None:
    npu.wr(hw.TRACE_BASE + reg, val)


def program(npu: Npu, records: int = 2048, base: int = TRACE_RING, mask: int | None = None) -> None:
    """Place the ring and turn tracing on."""
    twr(npu, hw.TRACE_RING_LO, base & 0xFFFF_FFFF)
    twr(npu, hw.TRACE_RING_HI, base >> 32)
    twr(npu, hw.TRACE_RING_SIZE, records)
    if mask is not None:
        twr(npu, hw.TRACE_MASK, mask)
    twr(npu, hw.TRACE_CONTROL, hw.TRACE_ENABLE)


def drain(npu: Npu, records: int = 2048, base: int = TRACE_RING) -> list[Rec]:
    """The records between TAIL and HEAD, decoded; TAIL moves up to HEAD."""
    tail, head = trd(npu, hw.TRACE_TAIL), trd(npu, hw.TRACE_HEAD)
    out = []
    for i in range(tail, head):
        raw = npu.qt.memread(base + (i % records) * REC.size, REC.size)
        ts, kind, queue, core, arg32, fence, arg = REC.unpack(raw)
        out.append(Rec(ts, KINDS.get(kind, str(kind)), queue, core, arg32, fence, arg))
    twr(npu, hw.TRACE_TAIL, head)
    return out


def kinds(recs: list[Rec], fence: int | None = None) -> list[str]:
    return [r.kind for r in recs if fence is None or r.fence == fence]


def test_the_device_reports_a_trace_ring_in_caps(npu: Npu) -> None:
    assert npu.rd(hw.REG_CAPS) & hw.CAP_TRACE
    assert REC.size == 32


def test_nothing_is_logged_until_tracing_is_enabled(npu: Npu) -> None:
    npu.run(nop(1))
    assert (trd(npu, hw.TRACE_CONTROL), trd(npu, hw.TRACE_HEAD)) == (0, 0)


def test_a_command_logs_fetch_start_end_completion_and_interrupt_in_order(npu: Npu) -> None:
    program(npu)
    npu.wr(hw.REG_IRQ_MASK, 1 << 0)  # NPU_IRQ_QUEUE(0)
    npu.run(nop(7, flags=hw.CMD_F_IRQ))
    recs = drain(npu)
    assert kinds(recs, 7) == ["fetch", "cmd_start", "cmd_end", "cpl_write", "irq"]
    assert all(r.queue == 0 for r in recs)
    fetch = recs[0]
    assert (fetch.arg32, fetch.arg) == (hw.OP_NOP, 0), "opcode and ring index"
    assert recs[-1].arg32 == hw.TRACE_INTX, "the qtest machine has MSI-X off: INTx"


def test_a_masked_interrupt_is_not_logged(npu: Npu) -> None:
    program(npu)
    npu.run(nop(7, flags=hw.CMD_F_IRQ))
    assert "irq" not in kinds(drain(npu))


def test_records_carry_the_device_clock(npu: Npu) -> None:
    program(npu)
    npu.run(nop(1))
    npu.qt.clock_step(5000)
    npu.run(nop(2))
    recs = drain(npu)
    stamps = [r.ts for r in recs]
    assert stamps == sorted(stamps)
    first = next(r.ts for r in recs if r.fence == 2)
    assert first - recs[0].ts >= 5000


def test_a_copy_logs_its_operand_read_and_result_write_as_transfers(npu: Npu) -> None:
    program(npu)
    npu.run(copy(DATA, DATA + 0x10_0000, 0x3000, fence=3))
    dma = [(r.kind, r.arg32, r.arg) for r in drain(npu) if r.kind.startswith("dma")]
    assert ("dma_start", 0, 0x3000) in dma or ("dma_start", 1, 0x3000) in dma
    assert sum(k == "dma_start" for k, _, _ in dma) == sum(k == "dma_end" for k, _, _ in dma)


def test_a_split_gemm_logs_its_tiles_on_the_ai_cores(npu: Npu) -> None:
    m = n = k = 256
    a, b, c = DATA, DATA + 0x10_0000, DATA + 0x20_0000
    npu.qt.memwrite(a, np.ones(m * k, np.float32).tobytes())
    npu.qt.memwrite(b, np.ones(k * n, np.float32).tobytes())
    program(npu)
    assert npu.run(gemm(a, b, c, m, n, k, k, n, n, fence=9)).status == hw.ST_OK
    recs = [r for r in drain(npu) if r.fence == 9]
    starts = [r for r in recs if r.kind == "tile_start"]
    ends = [r for r in recs if r.kind == "tile_end"]
    assert starts and len(starts) == len(ends)
    assert {r.arg for r in starts} == set(range(len(starts))), "each tile once"
    assert all(r.arg32 == hw.ST_OK for r in ends)
    assert {r.core for r in starts} <= {0, 1, hw.TRACE_CORE_CP}
    cmd = [r for r in recs if r.kind in ("cmd_start", "cmd_end")]
    assert cmd[0].ts <= min(r.ts for r in starts) <= max(r.ts for r in ends) <= cmd[-1].ts


def test_mailbox_requests_and_answers_are_logged(npu: Npu) -> None:
    program(npu)
    seq, status, _, _ = mbox(npu, hw.MBOX_PING, 41, seq=5)
    assert (seq, status) == (5, hw.MBOX_OK)
    recs = [r for r in drain(npu) if r.kind.startswith("mbox")]
    assert [(r.kind, r.arg32, r.arg) for r in recs] == [
        ("mbox_req", hw.MBOX_PING, 5),
        ("mbox_reply", hw.MBOX_OK, 5),
    ]
    assert all(r.queue == hw.TRACE_NO_QUEUE for r in recs)


def test_a_descriptor_read_ahead_for_a_group_is_logged_once_when_taken(npu: Npu) -> None:
    # nop 2 is read ahead while nop 1 is taken, does not join, and is read
    # again at the head: one fetch record each.
    program(npu)
    idx = npu.submit(nop(1), nop(2))
    npu.wait_head(idx[-1] + 1)
    fetches = [r.fence for r in drain(npu) if r.kind == "fetch"]
    assert fetches == [1, 2]


def test_mask_bits_of_no_kind_read_back_as_zero(npu: Npu) -> None:
    twr(npu, hw.TRACE_MASK, 0xFFFF_FFFF)
    assert trd(npu, hw.TRACE_MASK) == (1 << hw.TR_KINDS) - 2


def test_the_mask_keeps_only_the_kinds_asked_for(npu: Npu) -> None:
    program(npu, mask=1 << hw.TR_FETCH)
    npu.run(nop(1))
    npu.run(nop(2))
    assert kinds(drain(npu)) == ["fetch", "fetch"]


def test_a_full_ring_drops_records_and_counts_them(npu: Npu) -> None:
    program(npu, records=hw.TRACE_MIN_RECORDS)
    for f in range(1, 9):
        npu.run(nop(f))
    assert trd(npu, hw.TRACE_HEAD) == hw.TRACE_MIN_RECORDS
    lost = trd(npu, hw.TRACE_DROPPED)
    assert lost == 8 * 4 - hw.TRACE_MIN_RECORDS
    drain(npu, records=hw.TRACE_MIN_RECORDS)
    npu.run(nop(9))
    assert trd(npu, hw.TRACE_HEAD) == hw.TRACE_MIN_RECORDS + 4, "room again after TAIL moved"
    assert trd(npu, hw.TRACE_DROPPED) == lost


@pytest.mark.parametrize(
    ("records", "base"),
    [
        (hw.TRACE_MIN_RECORDS // 2, TRACE_RING),
        (hw.TRACE_MAX_RECORDS * 2, TRACE_RING),
        (100, TRACE_RING),
        (64, TRACE_RING + 8),
    ],
    ids=["too-small", "too-large", "not-a-power-of-two", "misaligned"],
)
def test_a_bad_ring_is_refused_and_tracing_stays_off(npu: Npu, records: int, base: int) -> None:
    program(npu, records=records, base=base)
    assert trd(npu, hw.TRACE_CONTROL) == 0
    npu.run(nop(1))
    assert trd(npu, hw.TRACE_HEAD) == 0


def test_a_ring_over_the_devices_own_registers_is_refused(npu: Npu) -> None:
    program(npu, records=64, base=npu.bar0)
    assert trd(npu, hw.TRACE_CONTROL) == 0


def test_the_ring_cannot_move_while_tracing(npu: Npu) -> None:
    program(npu)
    twr(npu, hw.TRACE_RING_LO, DATA)
    twr(npu, hw.TRACE_RING_SIZE, 64)
    assert (trd(npu, hw.TRACE_RING_LO), trd(npu, hw.TRACE_RING_SIZE)) == (TRACE_RING, 2048)


def test_a_tail_beyond_the_head_is_refused(npu: Npu) -> None:
    program(npu)
    npu.run(nop(1))
    head = trd(npu, hw.TRACE_HEAD)
    twr(npu, hw.TRACE_TAIL, head + 1)
    assert trd(npu, hw.TRACE_TAIL) == 0
    twr(npu, hw.TRACE_TAIL, head)
    assert trd(npu, hw.TRACE_TAIL) == head


def test_unknown_control_bits_are_refused(npu: Npu) -> None:
    program(npu)
    twr(npu, hw.TRACE_CONTROL, hw.TRACE_ENABLE | 0x10)
    assert trd(npu, hw.TRACE_CONTROL) == hw.TRACE_ENABLE, "the write is ignored"


def test_a_soft_reset_keeps_the_ring_and_what_it_holds(npu: Npu) -> None:
    program(npu)
    npu.run(nop(1))
    head = trd(npu, hw.TRACE_HEAD)
    npu.soft_reset()
    assert (trd(npu, hw.TRACE_CONTROL), trd(npu, hw.TRACE_HEAD)) == (hw.TRACE_ENABLE, head)
    assert kinds(drain(npu), 1)[0] == "fetch"


def test_a_system_reset_turns_tracing_off_and_forgets_the_ring(npu: Npu) -> None:
    program(npu)
    npu.run(nop(1))
    system_reset(npu)
    regs = (hw.TRACE_CONTROL, hw.TRACE_RING_LO, hw.TRACE_RING_SIZE, hw.TRACE_HEAD, hw.TRACE_TAIL)
    assert [trd(npu, r) for r in regs] == [0] * len(regs)


def test_no_record_lands_in_the_ring_after_tracing_is_turned_off(npu: Npu) -> None:
    # A race harness: every core logs tiles and transfers of multi-tile
    # copies while tracing is turned off; once that write returns, the
    # ring's memory is the guest's again (it may free it), so nothing may
    # land there. The writes in flight are waited for, not left to land.
    records = 2048
    for _ in range(20):
        program(npu, records=records)
        first = npu.push(*[copy(DATA, DATA + 0x100_0000, 16 << 20)] * 8)[0]
        npu.doorbell()
        time.sleep(0.002)
        twr(npu, hw.TRACE_CONTROL, 0)
        npu.qt.memset(TRACE_RING, records * REC.size, 0xAB)
        npu.wait_head(first + 8)
        assert npu.qt.memread(TRACE_RING, records * REC.size) == b"\xab" * (records * REC.size)
