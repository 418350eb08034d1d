"""The NPU device model, driven without a guest through QEMU's qtest protocol.

Each test starts its own QEMU (``-accel qtest``, q35, 512 MiB), finds the NPU
on PCI bus 0, maps BAR0 and the MSI-X BAR and enables memory space and bus
mastering; then it programs registers with MMIO, places rings, descriptors,
page tables and data in guest RAM and reads back what the device's worker
thread wrote. Expected values come from include/npu_hw.h and
docs/npu-spec.md. Every test ends by checking that QEMU still runs and the
device still answers.

Set NPU_QTEST_GUEST_ERRORS=1 to get the device's LOG_GUEST_ERROR messages in
the per-test qemu.log (it slows failing DMAs down a lot).
"""

from __future__ import annotations

import contextlib
import random
import struct
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from qtest import (
    BAR0_BASE,
    BAR4_BASE,
    CMD_SIZE,
    CPL_SIZE,
    DATA,
    FENCE,
    RAM_SIZE,
    RING,
    U32,
    U64,
    Npu,
    QTestRefused,
    cmd,
    copy,
    fill,
    gemm,
    hw,
    nop,
)

# Registers whose values a command must never change (snapshot checks).
GLOBAL_CONFIG = ["REG_CONTROL", "REG_IRQ_MASK", "REG_SCRATCH", "REG_MMU_CONTROL",
                 "REG_MMU_L1_LO", "REG_MMU_L1_HI", "REG_MMU_L1_ENTRIES",
                 "REG_MMU_CTX_LO", "REG_MMU_CTX_HI", "REG_MMU_CTX_COUNT"]  # fmt: skip
QUEUE_CONFIG = ["Q_RING_LO", "Q_RING_HI", "Q_RING_SIZE", "Q_CONTROL",
                "Q_CPL_LO", "Q_CPL_HI", "Q_FENCE_LO", "Q_FENCE_HI"]  # fmt: skip
IRQ_QUEUE0 = 1 << 0  # NPU_IRQ_QUEUE(0)
MSIX_BYTES = hw.MSIX_VECTORS * 16  # NPU_MSIX_VECTORS entries of 16 bytes
PBA_OFFSET = 0x800


@pytest.fixture
def npu(tmp_path: Path) -> Iterator[Npu]:
    """A fresh QEMU with the NPU mapped; queue 0 not programmed."""
    dev = Npu(tmp_path / "qemu.log")
    try:
        yield dev
    finally:
        dev.close()


@pytest.fixture
def ready(npu: Npu) -> Npu:
    """The NPU with queue 0 (64 entries, fence write-back) and the device enabled."""
    npu.start()
    return npu


def snapshot(npu: Npu) -> dict[str, int]:
    """The configuration registers and the MSI-X table/PBA, by name."""
    snap = {name: npu.rd(getattr(hw, name)) for name in GLOBAL_CONFIG}
    snap |= {name: npu.qrd(getattr(hw, name)) for name in QUEUE_CONFIG}
    for off in range(0, MSIX_BYTES, 4):
        snap[f"msix+{off:#x}"] = npu.qt.readl(npu.bar4 + off)
    snap["pba"] = npu.qt.readl(npu.bar4 + PBA_OFFSET)
    return snap


def expect_ok_fill(npu: Npu, fence: int = 0xF111) -> None:
    """The device still works: a FILL completes OK and writes the pattern."""
    dst, length = DATA + 0x80000, 0x1000
    npu.qt.memset(dst, length, 0)
    cpl = npu.run(fill(dst, length, 0xC0FFEE11, fence))
    assert (cpl.status, cpl.fence) == (hw.ST_OK, fence)
    assert npu.qt.memread(dst, length) == struct.pack("<I", 0xC0FFEE11) * (length // 4)


# --------------------------------------------------------------------------
# Identity and register access
# --------------------------------------------------------------------------


def test_pci_identity_and_bar_sizes_match_the_header(npu: Npu) -> None:
    assert npu.pci.read32(0x00) == hw.PCI_DEVICE_ID << 16 | hw.PCI_VENDOR_ID
    assert npu.pci.read8(0x08) == hw.PCI_REVISION
    assert npu.pci.read16(0x0A) == hw.PCI_CLASS
    assert npu.pci.read8(0x3D) == 1  # INTA
    assert npu.bar0_size == hw.BAR0_SIZE
    assert npu.bar4_size == 4096
    npu.assert_alive()


def test_identity_registers_match_the_header(npu: Npu) -> None:
    all_caps = (hw.CAP_COPY | hw.CAP_FILL | hw.CAP_GEMM_FP32 | hw.CAP_MSIX
                | hw.CAP_TIMESTAMPS | hw.CAP_MMU | hw.CAP_TENSOR
                | hw.CAP_REDUCE | hw.CAP_MATMUL | hw.CAP_CONV | hw.CAP_QUANT
                | hw.CAP_LOCAL_MEM | hw.CAP_POOL_GEOMETRY | hw.CAP_SELECT
                | hw.CAP_STRIDED_OUT | hw.CAP_CONV_ACCUMULATE
                | hw.CAP_ACT_RELU6 | hw.CAP_CONCURRENT | hw.CAP_PERF
                | hw.CAP_TRACE)  # fmt: skip
    assert npu.rd(hw.REG_MAGIC) == hw.MAGIC == 0x4E505530
    assert npu.rd(hw.REG_HW_VERSION) == hw.HW_VERSION
    assert npu.rd(hw.REG_ABI_VERSION) == hw.ABI_VERSION
    assert npu.rd(hw.REG_CAPS) == all_caps
    assert npu.rd(hw.REG_NUM_QUEUES) == hw.NUM_QUEUES
    assert 1 <= npu.rd(hw.REG_NUM_CORES) <= 64  # the `cores` property, tested below
    assert npu.rd(hw.REG_MAX_RING) == hw.RING_MAX_ENTRIES
    assert npu.rd(hw.REG_STATUS) == hw.STATUS_READY
    assert npu.rd(hw.REG_ERROR) == hw.ERR_NONE
    npu.assert_alive()


def test_num_cores_reports_the_cores_property(tmp_path: Path) -> None:
    dev = Npu(tmp_path / "qemu.log", device="npu,cores=4")
    try:
        assert dev.rd(hw.REG_NUM_CORES) == 4
        dev.assert_alive()
    finally:
        dev.close()


def test_scratch_reads_back_what_was_written(npu: Npu) -> None:
    for val in (0, 1, 0xFFFFFFFF, 0xA5A5A5A5, 0x5A5A5A5A, 0x12345678):
        npu.wr(hw.REG_SCRATCH, val)
        assert npu.rd(hw.REG_SCRATCH) == val
    npu.assert_alive()


def test_read_only_registers_ignore_writes(ready: Npu) -> None:
    ready.run(nop(0x1234_5678_9ABC))  # give HEAD and DONE non-zero values
    ro = [getattr(hw, n) for n in (
        "REG_MAGIC", "REG_HW_VERSION", "REG_ABI_VERSION", "REG_CAPS", "REG_NUM_QUEUES",
        "REG_NUM_CORES", "REG_MAX_RING", "REG_STATUS", "REG_ERROR", "REG_TIMESTAMP_HI",
        "REG_MMU_FAULT_LO", "REG_MMU_FAULT_HI", "REG_MMU_FAULT_INFO", "REG_MMU_FAULTS",
        "REG_MMU_FAULT_QUEUE", "REG_MMU_FAULT_CTX",
    )] + [hw.qreg(0, getattr(hw, n)) for n in (
        "Q_HEAD", "Q_STATUS", "Q_ERROR", "Q_DONE_LO", "Q_DONE_HI",
    )]  # fmt: skip
    before = {off: ready.rd(off) for off in ro}
    for off in ro:
        for val in (0xFFFFFFFF, 0, before[off] ^ 0x5A5A5A5A):
            ready.wr(off, val)
    assert {off: ready.rd(off) for off in ro} == before
    assert ready.rd(hw.REG_STATUS) == hw.STATUS_READY | hw.STATUS_ENABLED
    ready.assert_alive()


def known_offsets() -> set[int]:
    regs = {v for k, v in hw.all.items() if k.startswith("NPU_REG_")}
    qregs = {v for k, v in hw.all.items() if k.startswith("NPU_Q_")}
    return regs | {hw.qreg(q, r) for q in range(hw.NUM_QUEUES) for r in qregs}


def test_every_bar0_offset_reads_at_4_and_8_bytes_and_unassigned_ones_read_0(npu: Npu) -> None:
    qt, base = npu.qt, npu.bar0
    known = known_offsets()
    doorbells = range(hw.DOORBELL_BASE, hw.doorbell(hw.NUM_QUEUES) + 0x1000, 4)
    for off in [*range(0, 0x2000, 4), *doorbells, hw.BAR0_SIZE - 8, hw.BAR0_SIZE - 4]:
        lo = qt.readl(base + off)
        if off not in known:
            assert lo == 0, f"unassigned offset {off:#x} reads {lo:#x}"
        if off % 8 == 0:
            # The memory core splits it into two 4-byte accesses, low first.
            assert qt.readq(base + off) == lo | qt.readl(base + off + 4) << 32, hex(off)
        else:
            with contextlib.suppress(QTestRefused):
                qt.readq(base + off)  # unaligned: rejected by the memory core
    assert npu.rd(hw.REG_STATUS) == hw.STATUS_READY
    npu.assert_alive()


def test_byte_and_halfword_accesses_are_rejected(npu: Npu) -> None:
    qt, base = npu.qt, npu.bar0
    npu.wr(hw.REG_SCRATCH, 0x12345678)
    npu.wr(hw.REG_IRQ_MASK, 0x0000FFFF)
    targets = [hw.REG_CONTROL, hw.REG_IRQ_MASK, hw.REG_SCRATCH, hw.qreg(0, hw.Q_RING_SIZE),
               hw.qreg(0, hw.Q_CONTROL), hw.qreg(0, hw.Q_TAIL), hw.doorbell(0)]  # fmt: skip
    narrow = [(qt.writeb, 1), (qt.writew, 2)]
    for reg in targets:
        for write, size in narrow:
            for off in range(reg, reg + 4, size):
                with contextlib.suppress(QTestRefused):
                    write(base + off, 0xFFFF)  # e.g. would set CONTROL.RESET and ENABLE
    for off in [*range(0, 0x100), *range(hw.QREG_BASE, hw.QREG_BASE + 0x40)]:
        for read in (qt.readb, qt.readw):
            with contextlib.suppress(QTestRefused):
                read(base + off)
    assert npu.rd(hw.REG_SCRATCH) == 0x12345678
    assert npu.rd(hw.REG_IRQ_MASK) == 0x0000FFFF
    assert npu.rd(hw.REG_STATUS) == hw.STATUS_READY  # neither RESETTING nor ENABLED
    assert npu.rd(hw.REG_CONTROL) == 0
    assert npu.qrd(hw.Q_RING_SIZE) == 0
    assert npu.qrd(hw.Q_CONTROL) == 0
    assert npu.qrd(hw.Q_TAIL) == 0
    npu.assert_alive()


def test_a_64bit_register_pair_takes_one_8_byte_access(npu: Npu) -> None:
    npu.qt.writeq(npu.bar0 + hw.qreg(0, hw.Q_RING_LO), 0x0000_0001_2345_6780)
    assert npu.qrd(hw.Q_RING_LO) == 0x2345_6780
    assert npu.qrd(hw.Q_RING_HI) == 0x1
    assert npu.qt.readq(npu.bar0 + hw.qreg(0, hw.Q_RING_LO)) == 0x0000_0001_2345_6780
    npu.assert_alive()


def test_timestamp_hi_is_latched_by_a_timestamp_lo_read(npu: Npu) -> None:
    assert npu.rd(hw.REG_TIMESTAMP_HI) == 0
    now = npu.qt.clock_step(5_000_000_000)  # the device clock is QEMU_CLOCK_VIRTUAL
    assert now > 1 << 32
    assert npu.rd(hw.REG_TIMESTAMP_HI) == 0, "HI changes only on a TIMESTAMP_LO read"
    lo = npu.rd(hw.REG_TIMESTAMP_LO)
    assert npu.rd(hw.REG_TIMESTAMP_HI) << 32 | lo == now
    npu.qt.clock_step(1 << 32)
    assert npu.rd(hw.REG_TIMESTAMP_HI) == now >> 32
    npu.assert_alive()


# --------------------------------------------------------------------------
# Queue setup
# --------------------------------------------------------------------------


def test_doorbell_before_any_queue_is_configured_does_nothing(npu: Npu) -> None:
    npu.wr(hw.REG_CONTROL, hw.CONTROL_ENABLE)
    npu.wr(hw.doorbell(0), 5)
    npu.qwr(hw.Q_TAIL, 3)
    time.sleep(0.1)
    assert npu.qrd(hw.Q_TAIL) == 3
    assert npu.qrd(hw.Q_HEAD) == 0
    assert npu.rd(hw.REG_STATUS) == hw.STATUS_READY | hw.STATUS_ENABLED
    assert npu.rd(hw.REG_ERROR) == hw.ERR_NONE
    assert npu.rd(hw.REG_IRQ_STATUS) == 0
    # Enabling the queue discards the early tail; the queue then works.
    npu.start()
    assert npu.qrd(hw.Q_TAIL) == 0
    expect_ok_fill(npu)
    npu.assert_alive()


RING_BYTES_64 = 64 * CMD_SIZE
BAD_RING_CONFIGS: dict[str, dict[str, int]] = {
    "size-0": {"size": 0},
    "size-1": {"size": 1},
    "size-3": {"size": 3},
    "size-131072": {"size": 131072},
    "size-0x80000000": {"size": 0x8000_0000},
    "ring-0": {"ring": 0},
    "ring-unaligned": {"ring": RING + 32},
    "ring-inside-bar0": {"ring": BAR0_BASE},
    "ring-overlapping-bar0-start": {"ring": BAR0_BASE - RING_BYTES_64 + 64},
    "ring-inside-msix-bar": {"ring": BAR4_BASE},
    "ring-wrapping-2^64": {"ring": (1 << 64) - RING_BYTES_64 // 2},
    "cpl-0": {"cpl": 0},
    "cpl-unaligned": {"cpl": 0x14_0010},
    "cpl-inside-bar0": {"cpl": BAR0_BASE + 0x1000},
    "fence-unaligned": {"fence": FENCE + 8},
    "fence-inside-bar0": {"fence": BAR0_BASE + 0x40},
    "fence-inside-msix-bar": {"fence": BAR4_BASE},
}


@pytest.mark.parametrize("config", BAD_RING_CONFIGS.values(), ids=BAD_RING_CONFIGS.keys())
def test_enabling_a_queue_with_a_bad_ring_config_is_bad_ring(
    npu: Npu, config: dict[str, int]
) -> None:
    npu.wr(hw.REG_CONTROL, hw.CONTROL_ENABLE)
    npu.program_queue(**config)
    npu.qwr(hw.Q_CONTROL, hw.QCTL_ENABLE)
    assert npu.qrd(hw.Q_CONTROL) == 0, "the queue must stay disabled"
    assert npu.qrd(hw.Q_STATUS) & hw.QSTAT_STOPPED
    assert npu.qrd(hw.Q_ERROR) == hw.ERR_BAD_RING
    assert npu.rd(hw.REG_STATUS) & hw.STATUS_ERROR
    assert npu.rd(hw.REG_ERROR) == hw.ERR_BAD_RING
    assert npu.rd(hw.REG_IRQ_STATUS) & hw.IRQ_ERROR
    npu.doorbell(1)  # nothing may run
    time.sleep(0.05)
    assert npu.qrd(hw.Q_HEAD) == 0
    assert npu.qrd(hw.Q_CONTROL) == 0
    npu.assert_alive()


def test_a_queue_with_a_good_config_enables_and_clears_the_error(npu: Npu) -> None:
    npu.program_queue(size=3)
    npu.qwr(hw.Q_CONTROL, hw.QCTL_ENABLE)
    assert npu.rd(hw.REG_ERROR) == hw.ERR_BAD_RING
    assert npu.qrd(hw.Q_ERROR) == hw.ERR_BAD_RING
    npu.start(size=4)
    assert npu.qrd(hw.Q_STATUS) == hw.QSTAT_IDLE
    assert npu.qrd(hw.Q_ERROR) == hw.ERR_NONE
    assert not npu.rd(hw.REG_STATUS) & hw.STATUS_ERROR
    assert npu.rd(hw.REG_ERROR) == hw.ERR_BAD_RING, "ERROR is sticky until reset"
    expect_ok_fill(npu)
    npu.assert_alive()


def test_config_registers_drop_invalid_bits(npu: Npu) -> None:
    npu.wr(hw.REG_MMU_L1_LO, 0x20_0123)
    assert npu.rd(hw.REG_MMU_L1_LO) == 0x20_0000
    npu.wr(hw.REG_MMU_L1_ENTRIES, hw.MMU_MAX_L1 + 1)
    assert npu.rd(hw.REG_MMU_L1_ENTRIES) == hw.MMU_MAX_L1
    npu.wr(hw.REG_MMU_CONTROL, U32)
    assert npu.rd(hw.REG_MMU_CONTROL) == hw.MMU_ENABLE
    npu.wr(hw.REG_CONTROL, U32 & ~hw.CONTROL_RESET)
    assert npu.rd(hw.REG_CONTROL) == hw.CONTROL_ENABLE
    npu.wr(hw.REG_CONTROL, 0)
    npu.start(size=4)
    npu.qwr(hw.Q_CONTROL, U32)
    assert npu.qrd(hw.Q_CONTROL) == hw.QCTL_ENABLE
    npu.assert_alive()


# --------------------------------------------------------------------------
# Commands with the MMU disabled (bus addresses)
# --------------------------------------------------------------------------


def test_nop_completes_ok_with_fence_writeback_and_timestamps(ready: Npu) -> None:
    t0 = ready.qt.clock_step(1_000_000)
    fence = 0x0123_4567_89AB_CDEF
    cpl = ready.run(nop(fence))
    t1 = ready.qt.clock_step(1_000)
    assert (cpl.status, cpl.fence, cpl.opcode, cpl.rsvd) == (hw.ST_OK, fence, hw.OP_NOP, 0)
    assert t0 <= cpl.t_start <= cpl.t_end <= t1
    assert ready.fence_wb() == (fence, cpl.t_end)
    assert ready.qrd(hw.Q_DONE_LO) | ready.qrd(hw.Q_DONE_HI) << 32 == fence
    assert ready.qrd(hw.Q_STATUS) == hw.QSTAT_IDLE
    assert ready.rd(hw.REG_IRQ_STATUS) == 0  # OK and no NPU_CMD_F_IRQ: no interrupt
    ready.assert_alive()


def test_nop_with_irq_flag_raises_the_queue_interrupt(ready: Npu) -> None:
    cpl = ready.run(nop(5, flags=hw.CMD_F_IRQ))
    assert cpl.status == hw.ST_OK
    assert ready.rd(hw.REG_IRQ_STATUS) == IRQ_QUEUE0
    ready.wr(hw.REG_IRQ_STATUS, IRQ_QUEUE0)
    assert ready.rd(hw.REG_IRQ_STATUS) == 0
    ready.assert_alive()


def test_fill_writes_the_pattern_and_nothing_around_it(ready: Npu) -> None:
    ready.qt.memset(DATA, 0x3000, 0xAA)
    cpl = ready.run(fill(DATA + 0x1000, 0x1000 + 12, 0x11223344, fence=2))
    assert (cpl.status, cpl.fence, cpl.opcode) == (hw.ST_OK, 2, hw.OP_FILL)
    mem = ready.qt.memread(DATA, 0x3000)
    assert mem[:0x1000] == b"\xaa" * 0x1000
    assert mem[0x1000:0x200C] == bytes.fromhex("44332211") * (0x100C // 4)
    assert mem[0x200C:] == b"\xaa" * (0x3000 - 0x200C)
    assert ready.fence_wb()[0] == 2
    ready.assert_alive()


def test_fill_of_several_tiles_is_split_correctly(ready: Npu) -> None:
    length = (9 << 20) + 12  # 1 MiB engine chunks, 4 MiB core tiles, a short tail
    ready.qt.memset(DATA, length + 0x1000, 0xAA)
    cpl = ready.run(fill(DATA, length, 0xDEADBEEF, fence=3))
    assert cpl.status == hw.ST_OK
    mem = ready.qt.memread(DATA, length + 0x1000)
    assert mem[:length] == struct.pack("<I", 0xDEADBEEF) * (length // 4)
    assert mem[length:] == b"\xaa" * 0x1000
    ready.assert_alive()


def test_copy_of_several_tiles_is_split_correctly(ready: Npu) -> None:
    length = (10 << 20) + 0x123
    data = random.Random(2).randbytes(length)
    src, dst = DATA, DATA + (16 << 20) + 0x40
    ready.qt.memwrite(src, data)
    ready.qt.memset(dst + length, 0x100, 0xAA)
    assert ready.run(copy(src, dst, length, fence=4)).status == hw.ST_OK
    assert ready.qt.memread(dst, length) == data
    assert ready.qt.memread(dst + length, 0x100) == b"\xaa" * 0x100
    ready.assert_alive()


def test_copy_failing_in_a_later_tile_is_dma_error_and_earlier_tiles_are_written(
    ready: Npu,
) -> None:
    dst = RAM_SIZE - (6 << 20)  # tile 1 runs off the end of RAM
    ready.qt.memset(DATA, 12 << 20, 0x31)
    ready.qt.memset(dst, 4 << 20, 0)
    assert ready.run(copy(DATA, dst, 12 << 20)).status == hw.ST_DMA_ERROR
    assert ready.qt.memread(dst, 4 << 20) == b"\x31" * (4 << 20)
    assert not ready.rd(hw.REG_STATUS) & hw.STATUS_ERROR
    expect_ok_fill(ready)
    ready.assert_alive()


def test_copy_moves_the_bytes_and_nothing_around_them(ready: Npu) -> None:
    data = random.Random(1).randbytes(0x2345)
    src, dst = DATA, DATA + 0x10000
    ready.qt.memwrite(src, data)
    ready.qt.memset(dst - 0x100, 0x2600, 0x55)
    cpl = ready.run(copy(src, dst, len(data), fence=3))
    assert (cpl.status, cpl.fence, cpl.opcode) == (hw.ST_OK, 3, hw.OP_COPY)
    assert cpl.t_end >= cpl.t_start
    mem = ready.qt.memread(dst - 0x100, 0x2600)
    assert mem[:0x100] == b"\x55" * 0x100
    assert mem[0x100 : 0x100 + len(data)] == data
    assert mem[0x100 + len(data) :] == b"\x55" * (0x2600 - 0x100 - len(data))
    assert ready.fence_wb()[0] == 3
    ready.assert_alive()


def test_gemm_computes_c_equals_a_times_b(ready: Npu) -> None:
    m, n, k = 3, 2, 4
    a = [float(i + 1) for i in range(m * k)]
    b = [float(2 * i - 3) for i in range(k * n)]
    ldc = n + 1  # one gap column that must survive
    ready.qt.memwrite(DATA, struct.pack(f"<{m * k}f", *a))
    ready.qt.memwrite(DATA + 0x1000, struct.pack(f"<{k * n}f", *b))
    ready.qt.memwrite(DATA + 0x2000, struct.pack(f"<{m * ldc}f", *[-7.0] * (m * ldc)))
    cpl = ready.run(gemm(DATA, DATA + 0x1000, DATA + 0x2000, m, n, k, k, n, ldc, fence=4))
    assert cpl.status == hw.ST_OK
    c = struct.unpack(
        f"<{(m - 1) * ldc + n}f", ready.qt.memread(DATA + 0x2000, ((m - 1) * ldc + n) * 4)
    )
    for i in range(m):
        for j in range(n):
            assert c[i * ldc + j] == sum(a[i * k + x] * b[x * n + j] for x in range(k))
        if i < m - 1:
            assert c[i * ldc + n] == -7.0
    ready.assert_alive()


def test_queue_ring_registers_are_read_only_while_the_queue_is_enabled(ready: Npu) -> None:
    before = {name: ready.qrd(getattr(hw, name)) for name in QUEUE_CONFIG}
    for name in QUEUE_CONFIG:
        if name != "Q_CONTROL":
            ready.qwr(getattr(hw, name), 0x40)
    assert {name: ready.qrd(getattr(hw, name)) for name in QUEUE_CONFIG} == before
    expect_ok_fill(ready)
    ready.assert_alive()


def test_fence_address_0_disables_the_fence_writeback(npu: Npu) -> None:
    npu.qt.memset(FENCE, 16, 0x99)
    npu.start(fence=0)
    assert npu.run(nop(42)).status == hw.ST_OK
    assert npu.qt.memread(FENCE, 16) == b"\x99" * 16
    assert npu.qrd(hw.Q_DONE_LO) == 42
    npu.assert_alive()


def test_clearing_control_enable_stops_fetching_until_set_again(ready: Npu) -> None:
    ready.wr(hw.REG_CONTROL, 0)
    ready.submit(nop(1), nop(2))
    time.sleep(0.1)
    assert ready.qrd(hw.Q_HEAD) == 0
    assert ready.qrd(hw.Q_STATUS) == 0  # neither IDLE nor STOPPED
    ready.wr(hw.REG_CONTROL, hw.CONTROL_ENABLE)
    ready.wait_head(2)
    assert [c.fence for c in ready.completions(0, 2)] == [1, 2]
    ready.assert_alive()


def test_disabling_a_queue_mid_command_drops_the_old_generation(npu: Npu) -> None:
    size = 64 << 20
    src, dst = 0x0800_0000, 0x1000_0000
    npu.start(size=4)
    npu.qt.memset(src, size, 0x66)
    npu.qt.memset(dst, size, 0)
    npu.submit(copy(src, dst, size, fence=1), copy(src, dst, size, fence=2))
    deadline = time.monotonic() + 10
    while npu.qt.memread(dst, 1) != b"\x66":  # the first copy is under way
        assert time.monotonic() < deadline, "the copy did not start"
    npu.qwr(hw.Q_CONTROL, 0)
    # A new generation on other rings, with its own fence write-back.
    new_fence = FENCE + 0x100
    npu.program_queue(size=4, ring=RING + 0x8000, cpl=0x14_8000, fence=new_fence)
    npu.qt.memset(0x14_8000, 4 * CPL_SIZE, 0xEE)
    npu.qwr(hw.Q_CONTROL, hw.QCTL_ENABLE)
    npu.tail = 0
    (idx,) = npu.submit(nop(100))
    npu.wait_head(idx + 1)
    assert npu.completion(idx).fence == 100
    time.sleep(0.3)  # let the old copy finish
    assert npu.qrd(hw.Q_HEAD) == 1, "the old generation must not advance Q_HEAD"
    assert npu.qrd(hw.Q_DONE_LO) == 100
    assert struct.unpack("<Q", npu.qt.memread(new_fence, 8))[0] == 100
    assert not npu.rd(hw.REG_STATUS) & hw.STATUS_ERROR
    npu.assert_alive()


@pytest.mark.parametrize("cores", [1, 2, 4])
@pytest.mark.parametrize("gflags", [0, 1, 2, 3], ids=["NN", "TA", "TB", "TATB"])
def test_large_gemm_split_across_cores_is_exact(tmp_path: Path, cores: int, gflags: int) -> None:
    import numpy as np

    m, n, k = 200, 96, 240  # 4.6M multiply-adds: several row tiles
    ta, tb = bool(gflags & hw.GEMM_TRANS_A), bool(gflags & hw.GEMM_TRANS_B)
    rng = np.random.default_rng(gflags)
    # Small integers: every partial sum is exact in fp32, whatever the order.
    a = rng.integers(-4, 5, size=(k, m) if ta else (m, k)).astype(np.float32)
    b = rng.integers(-4, 5, size=(n, k) if tb else (k, n)).astype(np.float32)
    lda, ldb, ldc = a.shape[1] + 3, b.shape[1] + 1, n + 2
    a_mem = np.zeros((a.shape[0], lda), np.float32)
    a_mem[:, : a.shape[1]] = a
    b_mem = np.zeros((b.shape[0], ldb), np.float32)
    b_mem[:, : b.shape[1]] = b
    c_mem = np.full((m, ldc), -1.0, np.float32)
    abuf, bbuf, cbuf = DATA, DATA + 0x10_0000, DATA + 0x20_0000
    dev = Npu(tmp_path / "qemu.log", device=f"npu,cores={cores}")
    try:
        dev.start()
        dev.qt.memwrite(abuf, a_mem.tobytes())
        dev.qt.memwrite(bbuf, b_mem.tobytes())
        dev.qt.memwrite(cbuf, c_mem.tobytes())
        cpl = dev.run(gemm(abuf, bbuf, cbuf, m, n, k, lda, ldb, ldc, gflags=gflags, fence=9))
        assert cpl.status == hw.ST_OK
        c = np.frombuffer(dev.qt.memread(cbuf, c_mem.nbytes), np.float32).reshape(m, ldc)
        want = (a.T if ta else a) @ (b.T if tb else b)
        assert np.array_equal(c[:, :n], want)
        assert np.all(c[:, n:] == -1.0), "the gap columns of C must survive"
        dev.assert_alive()
    finally:
        dev.close()


def test_a_full_ring_is_not_an_overrun(ready: Npu) -> None:
    idx = ready.submit(*(nop(100 + i) for i in range(64)))
    ready.wait_head(idx[-1] + 1)
    assert [c.fence for c in ready.completions(0, 64)] == [100 + i for i in range(64)]
    assert not ready.rd(hw.REG_STATUS) & hw.STATUS_ERROR
    ready.assert_alive()


# --------------------------------------------------------------------------
# Bad descriptors: an error status, and the queue keeps going
# --------------------------------------------------------------------------

TOP = 1 << 64


def with_byte(desc: bytes, offset: int, value: int = 1) -> bytes:
    raw = bytearray(desc)
    raw[offset] = value
    return bytes(raw)


def gemm_abc(m: int, n: int, k: int, lda: int, ldb: int, ldc: int, **kw: int) -> bytes:
    return gemm(DATA, DATA + 0x1000, DATA + 0x2000, m, n, k, lda, ldb, ldc, **kw)


COPY16 = copy(DATA, DATA + 0x1000, 16)
BAD_DESCRIPTORS: dict[str, tuple[bytes, str]] = {
    "opcode-count": (cmd(hw.OP_COUNT), "BAD_OPCODE"),
    "opcode-count+1": (cmd(hw.OP_COUNT + 1, b"\1" * 112), "BAD_OPCODE"),
    "opcode-0xffff": (cmd(0xFFFF), "BAD_OPCODE"),
    "flags-bit2": (nop(flags=4), "BAD_FLAGS"),
    "copy-flags-bit15": (with_byte(COPY16, 3, 0x80), "BAD_FLAGS"),
    "rsvd0": (cmd(hw.OP_NOP, rsvd0=1), "BAD_RESERVED"),
    "copy-rsvd0-top-bit": (with_byte(COPY16, 7, 0x80), "BAD_RESERVED"),
    "rsvd0-checked-before-ctx": (cmd(hw.OP_NOP, ctx=1, rsvd0=1), "BAD_RESERVED"),
    "flags-checked-before-ctx": (cmd(hw.OP_NOP, ctx=1, flags=4), "BAD_FLAGS"),
    # No context table: every ctx but 0 names no address space.
    "nop-ctx-1": (cmd(hw.OP_NOP, ctx=1), "MMU_FAULT"),
    "copy-ctx-top-bit": (with_byte(COPY16, 5, 0x80), "MMU_FAULT"),
    "ctx-checked-before-the-payload": (with_byte(cmd(hw.OP_NOP, ctx=1), 16), "MMU_FAULT"),
    "ctx-checked-before-the-opcode": (cmd(hw.OP_COUNT, ctx=1), "MMU_FAULT"),
    "nop-payload-byte-16": (with_byte(nop(), 16), "BAD_RESERVED"),
    "nop-payload-byte-127": (with_byte(nop(), 127), "BAD_RESERVED"),
    "copy-unused-byte-40": (with_byte(COPY16, 40), "BAD_RESERVED"),
    "copy-unused-byte-127": (with_byte(COPY16, 127), "BAD_RESERVED"),
    "fill-unused-byte-40": (with_byte(fill(DATA, 16, 7), 40), "BAD_RESERVED"),
    "fill-rsvd": (fill(DATA, 16, 7, rsvd=1), "BAD_RESERVED"),
    "gemm-unused-byte-72": (with_byte(gemm_abc(1, 1, 1, 1, 1, 1), 72), "BAD_RESERVED"),
    "copy-len-0": (copy(DATA, DATA + 0x1000, 0), "BAD_ARGS"),
    "copy-overlapping": (copy(DATA, DATA + 0x800, 0x1000), "BAD_ARGS"),
    "copy-overlapping-backwards": (copy(DATA + 0x800, DATA, 0x1000), "BAD_ARGS"),
    "copy-src-equals-dst": (copy(DATA, DATA, 16), "BAD_ARGS"),
    "copy-len-4GiB+1": (copy(DATA, DATA + (8 << 30), (1 << 32) + 1), "BAD_ARGS"),
    "copy-len-2^64-1": (copy(DATA, DATA + 0x1000, U64), "BAD_ARGS"),
    "copy-src-wraps-2^64": (copy(TOP - 0x100, DATA, 0x200), "BAD_ADDR"),
    "copy-dst-wraps-2^64": (copy(DATA, TOP - 0x100, 0x200), "BAD_ADDR"),
    "copy-src-ends-at-2^64": (copy(TOP - 0x1000, DATA, 0x1000), "BAD_ADDR"),
    "fill-len-0": (fill(DATA, 0, 7), "BAD_ARGS"),
    "fill-len-not-multiple-of-4": (fill(DATA, 6, 7), "BAD_ARGS"),
    "fill-len-4GiB+4": (fill(DATA, (1 << 32) + 4, 7), "BAD_ARGS"),
    "fill-dst-wraps-2^64": (fill(TOP - 8, 16, 7), "BAD_ADDR"),
    "gemm-m-0": (gemm_abc(0, 1, 1, 1, 1, 1), "BAD_ARGS"),
    "gemm-n-0": (gemm_abc(1, 0, 1, 1, 1, 1), "BAD_ARGS"),
    "gemm-k-0": (gemm_abc(1, 1, 0, 1, 1, 1), "BAD_ARGS"),
    "gemm-m-65537": (gemm_abc(65537, 1, 1, 1, 1, 1), "BAD_ARGS"),
    "gemm-lda-below-k": (gemm_abc(2, 2, 4, 3, 2, 2), "BAD_ARGS"),
    "gemm-ldb-below-n": (gemm_abc(2, 4, 2, 2, 3, 4), "BAD_ARGS"),
    "gemm-ldc-below-n": (gemm_abc(2, 4, 2, 2, 4, 3), "BAD_ARGS"),
    "gemm-trans-a-lda-below-m": (gemm_abc(4, 1, 2, 3, 1, 1, gflags=1), "BAD_ARGS"),
    "gemm-lda-above-2^24": (gemm_abc(1, 1, 1, hw.MAX_LD + 1, 1, 1), "BAD_ARGS"),
    "gemm-ldc-2^32-1": (gemm_abc(1, 1, 1, 1, 1, U32), "BAD_ARGS"),
    "gemm-dtype-1": (gemm_abc(1, 1, 1, 1, 1, 1, dtype=1), "BAD_ARGS"),
    "gemm-span-above-4GiB": (gemm_abc(65536, 1, 65536, 65536, 1, 1), "BAD_ARGS"),
    "gemm-flags-bit2": (gemm_abc(1, 1, 1, 1, 1, 1, gflags=4), "BAD_FLAGS"),
    "gemm-c-wraps-2^64": (gemm(DATA, DATA, TOP - 4, 1, 2, 1, 1, 2, 2), "BAD_ADDR"),
}


@pytest.mark.parametrize(("desc", "status"), BAD_DESCRIPTORS.values(), ids=BAD_DESCRIPTORS.keys())
def test_bad_descriptor_completes_with_its_status_and_the_queue_goes_on(
    ready: Npu, desc: bytes, status: str
) -> None:
    ready.qt.memset(DATA, 0x3000, 0xAA)
    desc = desc[:8] + struct.pack("<Q", 0xBAD0_0000_0001) + desc[16:]  # set the fence
    cpl = ready.run(desc)
    assert cpl.status == getattr(hw, "ST_" + status), f"got status {cpl.status}"
    assert (cpl.fence, cpl.opcode) == (0xBAD0_0000_0001, struct.unpack_from("<H", desc)[0])
    assert ready.fence_wb()[0] == 0xBAD0_0000_0001
    assert ready.rd(hw.REG_IRQ_STATUS) == IRQ_QUEUE0  # a non-OK status raises the queue bit
    assert ready.qt.memread(DATA, 0x3000) == b"\xaa" * 0x3000, "a rejected command wrote memory"
    assert not ready.rd(hw.REG_STATUS) & hw.STATUS_ERROR, "a bad command must not stop the queue"
    expect_ok_fill(ready)
    ready.assert_alive()


BAR_TARGETS: dict[str, Callable[[], bytes]] = {
    "fill-bar0-scratch": lambda: fill(BAR0_BASE + hw.REG_SCRATCH, 4, 0xDEADBEEF),
    "fill-whole-register-block": lambda: fill(BAR0_BASE, 0x2000, 0),
    "fill-bar0-last-word": lambda: fill(BAR0_BASE + hw.BAR0_SIZE - 4, 4, 0),
    "fill-ending-in-bar0": lambda: fill(BAR0_BASE - 0x1000, 0x1004, 0),
    "copy-to-bar0-control": lambda: copy(DATA + 0x8000, BAR0_BASE + hw.REG_CONTROL, 4),
    "copy-to-bar0-queue-block": lambda: copy(DATA + 0x8000, BAR0_BASE + hw.QREG_BASE, 0x100),
    "copy-to-bar0-doorbell": lambda: copy(DATA + 0x8000, BAR0_BASE + hw.doorbell(0), 4),
    "copy-from-bar0": lambda: copy(BAR0_BASE, DATA, 0x100),
    "copy-to-msix-table": lambda: copy(DATA + 0x8000, BAR4_BASE, MSIX_BYTES),
    "fill-msix-table": lambda: fill(BAR4_BASE, 16, 0xFEE00000),
    "fill-msix-pba": lambda: fill(BAR4_BASE + PBA_OFFSET, 8, U32),
    "copy-from-msix-table": lambda: copy(BAR4_BASE, DATA, 16),
}


@pytest.mark.parametrize("make", BAR_TARGETS.values(), ids=BAR_TARGETS.keys())
def test_dma_touching_the_device_bars_is_bad_addr_and_changes_no_register(
    npu: Npu, make: Callable[[], bytes]
) -> None:
    # Non-default values everywhere a stray DMA could land.
    npu.wr(hw.REG_MMU_L1_LO, 0x20_0000)
    npu.wr(hw.REG_MMU_L1_ENTRIES, 7)
    npu.start()
    npu.wr(hw.REG_SCRATCH, 0x5EED1234)
    npu.wr(hw.REG_IRQ_MASK, hw.IRQ_ERROR | IRQ_QUEUE0)
    # Source data that would reset the device / rewrite registers if it landed.
    npu.qt.memwrite(DATA + 0x8000, struct.pack("<I", hw.CONTROL_RESET) * 64)
    npu.qt.memset(DATA, 0x1000, 0xAA)
    before = snapshot(npu)
    cpl = npu.run(make())
    assert cpl.status == hw.ST_BAD_ADDR
    assert snapshot(npu) == before
    assert npu.rd(hw.REG_STATUS) == hw.STATUS_READY | hw.STATUS_ENABLED
    assert npu.qt.memread(DATA, 0x1000) == b"\xaa" * 0x1000
    expect_ok_fill(npu)
    npu.assert_alive()


# --------------------------------------------------------------------------
# Device MMU
# --------------------------------------------------------------------------

L1 = 0x20_0000  # L1 table (4 entries used)
L2 = 0x20_1000  # L2 table of L1[0]; L1[1] is invalid; L1[2], L1[3] -> empty L2 tables
PAGES = DATA  # backing pages
MMU_L1_ENTRIES = 4
# va page -> (backing page offset, writable); deliberately not contiguous.
MAPPING = {0x1000: (0x5000, True), 0x2000: (0x3000, True), 0x3000: (0x1000, True),
           0x4000: (0x7000, True), 0x5000: (0x8000, False)}  # fmt: skip
UNMAPPED_VA = 0x6000


def enable_mmu(npu: Npu) -> None:
    """Turn the MMU on, translating through MAPPING (the device must be disabled)."""
    qt = npu.qt
    qt.memset(L1, 0x4000, 0)
    l1 = [L2 | hw.PTE_VALID, 0, (L2 + 0x1000) | hw.PTE_VALID, (L2 + 0x2000) | hw.PTE_VALID]
    qt.memwrite(L1, struct.pack("<4Q", *l1))
    for va, (off, writable) in MAPPING.items():
        pte = (PAGES + off) | hw.PTE_VALID | (hw.PTE_WRITE if writable else 0)
        qt.memwrite(L2 + (va >> 12) * 8, struct.pack("<Q", pte))
    npu.wr(hw.REG_MMU_L1_LO, L1)
    npu.wr(hw.REG_MMU_L1_HI, 0)
    npu.wr(hw.REG_MMU_L1_ENTRIES, MMU_L1_ENTRIES)
    npu.wr(hw.REG_MMU_CONTROL, hw.MMU_ENABLE)
    assert npu.rd(hw.REG_MMU_CONTROL) == hw.MMU_ENABLE


@pytest.fixture
def mmu(npu: Npu) -> Npu:
    """The NPU with the MMU on, translating through MAPPING; queue 0 running."""
    qt = npu.qt
    enable_mmu(npu)
    npu.start()
    for i in range(9):  # every backing page holds its own recognisable bytes
        qt.memset(PAGES + i * 0x1000, 0x1000, 0x10 + i)
    return npu


def page(npu: Npu, va: int) -> bytes:
    return npu.qt.memread(PAGES + MAPPING[va][0], 0x1000)


def fault(npu: Npu) -> tuple[int, int, int]:
    """(MMU_FAULT address, MMU_FAULT_INFO, MMU_FAULTS)."""
    addr = npu.rd(hw.REG_MMU_FAULT_LO) | npu.rd(hw.REG_MMU_FAULT_HI) << 32
    return addr, npu.rd(hw.REG_MMU_FAULT_INFO), npu.rd(hw.REG_MMU_FAULTS)


def test_mmu_copy_between_mapped_vas_goes_through_the_tables(mmu: Npu) -> None:
    src_pages = page(mmu, 0x1000) + page(mmu, 0x2000)
    cpl = mmu.run(copy(0x1000, 0x3000, 0x2000, fence=1))
    assert cpl.status == hw.ST_OK
    assert page(mmu, 0x3000) + page(mmu, 0x4000) == src_pages
    # Unaligned, crossing page boundaries on both sides.
    expect = (page(mmu, 0x1000) + page(mmu, 0x2000))[0x123 : 0x123 + 0x1800]
    cpl = mmu.run(copy(0x1123, 0x3456, 0x1800, fence=2))
    assert cpl.status == hw.ST_OK
    assert (page(mmu, 0x3000) + page(mmu, 0x4000))[0x456 : 0x456 + 0x1800] == expect
    assert fault(mmu) == (0, 0, 0)
    mmu.assert_alive()


def test_mmu_copy_of_several_tiles_through_scattered_pages(npu: Npu) -> None:
    pages = 3 * 1024 + 5  # 12 MiB + 5 pages of VA from 0x200000 (L1[1..7])
    va0, backing = 1 << hw.MMU_L1_SHIFT, 0x0800_0000
    order = list(range(2 * pages))
    random.Random(3).shuffle(order)  # VA page i -> backing page order[i]
    l1 = bytearray(8 * 16)
    for l1i in range(1, 1 + (2 * pages + 511) // 512 + 1):
        struct.pack_into("<Q", l1, 8 * l1i, (0x30_0000 + l1i * 0x1000) | hw.PTE_VALID)
    npu.qt.memwrite(L1, bytes(l1))
    ptes = b"".join(struct.pack("<Q", (backing + p * 0x1000) | 3) for p in order)
    npu.qt.memwrite(0x30_1000, ptes)  # the L2 tables of L1[1..] are consecutive pages
    npu.wr(hw.REG_MMU_L1_LO, L1)
    npu.wr(hw.REG_MMU_L1_ENTRIES, 16)
    npu.wr(hw.REG_MMU_CONTROL, hw.MMU_ENABLE)
    npu.start()
    length = pages * 0x1000 - 0x321
    data = random.Random(4).randbytes(length)
    src, dst = va0 + 0x321, va0 + pages * 0x1000
    i = 0
    while i < length:  # scatter the source bytes page by page
        va = src + i
        run = min(0x1000 - va % 0x1000, length - i)
        pa = backing + order[(va - va0) // 0x1000] * 0x1000 + va % 0x1000
        npu.qt.memwrite(pa, data[i : i + run])
        i += run
    assert npu.run(copy(src, dst, length, fence=5)).status == hw.ST_OK
    got = b"".join(
        npu.qt.memread(backing + order[pages + i] * 0x1000, 0x1000) for i in range(pages)
    )
    assert got[:length] == data
    npu.assert_alive()


def test_mmu_fault_in_a_later_tile_is_reported_with_its_va(npu: Npu) -> None:
    pages = 4 * 1024  # 16 MiB mapped 1:1 at VA 0x200000, one hole at 13 MiB
    hole = 13 * 256
    npu.qt.memwrite(
        L1,
        struct.pack("<Q", 0)
        + b"".join(struct.pack("<Q", (0x30_0000 + i * 0x1000) | hw.PTE_VALID) for i in range(8)),
    )
    ptes = [(0x0800_0000 + p * 0x1000) | 3 for p in range(pages)]
    ptes[hole] = 0
    npu.qt.memwrite(0x30_0000, struct.pack(f"<{pages}Q", *ptes))
    npu.wr(hw.REG_MMU_L1_LO, L1)
    npu.wr(hw.REG_MMU_L1_ENTRIES, 9)
    npu.wr(hw.REG_MMU_CONTROL, hw.MMU_ENABLE)
    npu.start()
    va0 = 1 << hw.MMU_L1_SHIFT
    assert npu.run(fill(va0, pages * 0x1000, 0)).status == hw.ST_MMU_FAULT
    assert fault(npu) == (va0 + hole * 0x1000, hw.FAULT_WRITE, 1)
    assert not npu.rd(hw.REG_STATUS) & hw.STATUS_ERROR
    assert npu.run(fill(va0, 0x1000, 0)).status == hw.ST_OK
    npu.assert_alive()


def test_mmu_read_only_page_can_be_read(mmu: Npu) -> None:
    cpl = mmu.run(copy(0x5000, 0x1000, 0x1000))
    assert cpl.status == hw.ST_OK
    assert page(mmu, 0x1000) == page(mmu, 0x5000)
    mmu.assert_alive()


def test_mmu_copy_to_an_unmapped_va_faults_and_records_it(mmu: Npu) -> None:
    cpl = mmu.run(copy(0x1000, UNMAPPED_VA + 0x10, 0x100, fence=7))
    assert (cpl.status, cpl.fence) == (hw.ST_MMU_FAULT, 7)
    assert fault(mmu) == (UNMAPPED_VA + 0x10, hw.FAULT_WRITE, 1)
    cpl = mmu.run(copy(UNMAPPED_VA + 0x20, 0x1000, 0x100))  # and reading from it
    assert cpl.status == hw.ST_MMU_FAULT
    assert fault(mmu) == (UNMAPPED_VA + 0x20, 0, 2)
    assert not mmu.rd(hw.REG_STATUS) & hw.STATUS_ERROR, "a fault must not stop the queue"
    assert mmu.run(copy(0x1000, 0x3000, 0x100)).status == hw.ST_OK
    mmu.assert_alive()


def test_mmu_va_without_l1_entry_faults_with_fault_l1(mmu: Npu) -> None:
    va = (1 << hw.MMU_L1_SHIFT) + 0x40  # L1[1] is not valid
    cpl = mmu.run(copy(va, 0x1000, 0x10))
    assert cpl.status == hw.ST_MMU_FAULT
    assert fault(mmu) == (va, hw.FAULT_L1, 1)
    va = (2 << hw.MMU_L1_SHIFT) + 0x3000  # L1[2] valid, its L2 empty: a missing PTE
    cpl = mmu.run(fill(va, 0x10, 0))
    assert cpl.status == hw.ST_MMU_FAULT
    assert fault(mmu) == (va, hw.FAULT_WRITE, 2)
    mmu.assert_alive()


def test_mmu_write_to_a_page_without_pte_write_faults_with_fault_perm(mmu: Npu) -> None:
    before = page(mmu, 0x5000)
    cpl = mmu.run(copy(0x1000, 0x5000, 0x10))
    assert cpl.status == hw.ST_MMU_FAULT
    assert fault(mmu) == (0x5000, hw.FAULT_PERM | hw.FAULT_WRITE, 1)
    assert mmu.run(fill(0x5800, 4, 0)).status == hw.ST_MMU_FAULT
    assert fault(mmu) == (0x5800, hw.FAULT_PERM | hw.FAULT_WRITE, 2)
    assert page(mmu, 0x5000) == before
    mmu.assert_alive()


def test_mmu_va_beyond_the_l1_table_faults_with_fault_range(mmu: Npu) -> None:
    va = MMU_L1_ENTRIES << hw.MMU_L1_SHIFT
    cpl = mmu.run(copy(0x1000, va, 0x10))
    assert cpl.status == hw.ST_MMU_FAULT
    assert fault(mmu) == (va, hw.FAULT_RANGE | hw.FAULT_WRITE, 1)
    va = 0x1_0000_2000  # the high half of the address is recorded too
    assert mmu.run(copy(va, 0x1000, 0x10)).status == hw.ST_MMU_FAULT
    assert fault(mmu) == (va, hw.FAULT_RANGE, 2)
    assert mmu.run(copy(0x1000, 0x3000, 0x10)).status == hw.ST_OK
    mmu.assert_alive()


def test_mmu_mapping_onto_the_device_bars_is_bad_addr(mmu: Npu) -> None:
    # Map VA 0x7000 -> BAR0 page 0 and VA 0x8000 -> the MSI-X BAR, both writable.
    for va, pa in ((0x7000, BAR0_BASE), (0x8000, BAR4_BASE)):
        mmu.qt.memwrite(L2 + (va >> 12) * 8, struct.pack("<Q", pa | hw.PTE_VALID | hw.PTE_WRITE))
    mmu.wr(hw.REG_SCRATCH, 0x5EED)
    before = snapshot(mmu)
    assert mmu.run(fill(0x7000 + hw.REG_SCRATCH, 4, 0xDEAD)).status == hw.ST_BAD_ADDR
    assert mmu.run(copy(0x1000, 0x7000, 0x100)).status == hw.ST_BAD_ADDR
    assert mmu.run(copy(0x1000, 0x8000, 0x20)).status == hw.ST_BAD_ADDR
    assert mmu.run(copy(0x7000, 0x1000, 0x20)).status == hw.ST_BAD_ADDR
    # A run of two contiguous pages whose second page is BAR0.
    mmu.qt.memwrite(L2 + 6 * 8, struct.pack("<Q", (BAR0_BASE - 0x1000) | 3))
    assert mmu.run(fill(0x6000, 0x2000, 0)).status in (hw.ST_BAD_ADDR, hw.ST_DMA_ERROR)
    assert snapshot(mmu) == before
    assert mmu.run(copy(0x1000, 0x3000, 0x10)).status == hw.ST_OK
    mmu.assert_alive()


def test_mmu_page_table_inside_the_device_bars_is_dma_error(mmu: Npu) -> None:
    l1 = struct.pack("<Q", BAR0_BASE | hw.PTE_VALID)
    mmu.qt.memwrite(L1 + 3 * 8, l1)  # L1[3] -> an "L2 table" in BAR0
    va = 3 << hw.MMU_L1_SHIFT
    assert mmu.run(fill(va, 4, 0)).status == hw.ST_DMA_ERROR
    assert mmu.rd(hw.REG_MMU_FAULTS) == 0, "a table read failure is not a fault"
    assert mmu.run(copy(0x1000, 0x3000, 0x10)).status == hw.ST_OK
    mmu.assert_alive()


def test_mmu_registers_are_read_only_while_the_device_is_enabled(mmu: Npu) -> None:
    mmu.wr(hw.REG_MMU_CONTROL, 0)
    mmu.wr(hw.REG_MMU_L1_ENTRIES, 1)
    assert mmu.rd(hw.REG_MMU_CONTROL) == hw.MMU_ENABLE
    assert mmu.rd(hw.REG_MMU_L1_ENTRIES) == MMU_L1_ENTRIES
    assert mmu.run(copy(0x1000, 0x3000, 0x10)).status == hw.ST_OK
    mmu.assert_alive()


# --------------------------------------------------------------------------
# Device errors and soft reset
# --------------------------------------------------------------------------


@pytest.mark.parametrize("tail", [5, 0xFFFF_FFFF], ids=["tail-ahead", "tail-behind-head"])
def test_ring_overrun_stops_the_queue_with_ring_overrun(npu: Npu, tail: int) -> None:
    npu.start(size=4)
    npu.doorbell(tail)
    deadline = time.monotonic() + 5
    while not npu.rd(hw.REG_STATUS) & hw.STATUS_ERROR:
        assert time.monotonic() < deadline, "the overrun was not detected"
        time.sleep(0.001)
    assert npu.rd(hw.REG_ERROR) == hw.ERR_RING_OVERRUN
    assert npu.rd(hw.REG_IRQ_STATUS) & hw.IRQ_ERROR
    assert npu.qrd(hw.Q_STATUS) & hw.QSTAT_STOPPED
    assert npu.qrd(hw.Q_ERROR) == hw.ERR_RING_OVERRUN
    assert npu.qrd(hw.Q_HEAD) == 0
    assert npu.qt.memread(npu.cpl, 4 * CPL_SIZE) == b"\xee" * 4 * CPL_SIZE, "nothing may run"
    npu.assert_alive()


def test_soft_reset_clears_a_stopped_queue_which_then_works_again(npu: Npu) -> None:
    npu.start(size=4)
    npu.wr(hw.REG_SCRATCH, 0x1234)
    npu.wr(hw.REG_IRQ_MASK, U32)
    npu.doorbell(5)
    deadline = time.monotonic() + 5
    while npu.rd(hw.REG_ERROR) != hw.ERR_RING_OVERRUN:
        assert time.monotonic() < deadline, "the overrun was not detected"
        time.sleep(0.001)
    seen = npu.soft_reset()
    assert seen[-1] == hw.STATUS_READY
    assert all(s & ~(hw.STATUS_RESETTING | hw.STATUS_ERROR | hw.STATUS_ENABLED)
               == hw.STATUS_READY for s in seen)  # fmt: skip
    for name in ("REG_CONTROL", "REG_IRQ_STATUS", "REG_IRQ_MASK", "REG_ERROR", "REG_SCRATCH"):
        assert npu.rd(getattr(hw, name)) == 0, name
    qregs = {k[4:]: v for k, v in hw.all.items() if k.startswith("NPU_Q_")}
    values = {name: npu.qrd(off) for name, off in qregs.items()}
    assert values == {name: hw.QSTAT_IDLE if name == "Q_STATUS" else 0 for name in qregs}
    npu.start(size=4)
    expect_ok_fill(npu)
    assert [npu.run(nop(i)).status for i in range(6)] == [hw.ST_OK] * 6  # wraps the ring
    npu.assert_alive()


def test_soft_reset_while_a_large_copy_executes_stops_it_between_two_pieces(npu: Npu) -> None:
    size = 64 << 20
    src, dst = 0x0800_0000, 0x1000_0000
    npu.start(size=8)
    npu.qt.memset(src, size, 0x77)
    npu.qt.memset(dst, size, 0)
    npu.submit(*(copy(src, dst, size, fence=i + 1) for i in range(8)))
    deadline = time.monotonic() + 10
    while npu.qt.memread(dst, 1) != b"\x77":  # the first copy is under way
        assert time.monotonic() < deadline, "the copy did not start"
    seen = npu.soft_reset(timeout=30)
    assert seen[0] & hw.STATUS_RESETTING, "RESETTING must read 1 while the copy runs"
    assert seen[-1] == hw.STATUS_READY
    # Copies done before the reset completed (record + fence); the one in
    # progress stopped at a control point, between two pieces of at most
    # 4 MiB, and wrote no completion; queued ones were dropped.
    cpls = npu.completions(0, 8)
    done = [c for c in cpls if c.fence != 0xEEEE_EEEE_EEEE_EEEE]
    assert len(done) < 8
    assert [c.fence for c in done] == list(range(1, len(done) + 1))
    assert all(c.status == hw.ST_OK for c in done)
    assert npu.fence_wb()[0] == len(done)
    assert npu.qrd(hw.Q_HEAD) == 0
    assert npu.qrd(hw.Q_CONTROL) == 0
    npu.start(size=8)
    expect_ok_fill(npu)
    npu.assert_alive()


# --------------------------------------------------------------------------
# MSI-X: messages are DMA writes, so a vector aimed at RAM can be observed
# --------------------------------------------------------------------------

MSI_MAILBOX = 0x16_0000  # vector v writes its data word at MSI_MAILBOX + 16 * v
PCI_CAP_ID_MSIX = 0x11


@pytest.fixture
def msix(npu: Npu) -> Npu:
    """The NPU with MSI-X on, both vectors aimed at MSI_MAILBOX, queue 0 running."""
    cap = npu.pci.find_capability(PCI_CAP_ID_MSIX)
    assert npu.pci.read32(cap + 4) == hw.BAR_MSIX  # table in the MSI-X BAR at offset 0
    for v in range(hw.MSIX_VECTORS):
        entry = struct.pack("<QII", MSI_MAILBOX + 16 * v, 0xA0 + v, 0)  # unmasked
        for off in range(0, 16, 4):
            npu.qt.writel(npu.bar4 + 16 * v + off, struct.unpack_from("<I", entry, off)[0])
    npu.pci.write16(cap + 2, 1 << 15)  # MSI-X enable
    npu.start(size=4)
    npu.qt.memset(MSI_MAILBOX, 16 * hw.MSIX_VECTORS, 0)
    return npu


def mailbox(npu: Npu, vector: int) -> int:
    return int(struct.unpack("<I", npu.qt.memread(MSI_MAILBOX + 16 * vector, 4))[0])


def wait_mailbox(npu: Npu, vector: int, timeout: float = 5.0) -> int:
    deadline = time.monotonic() + timeout
    while not mailbox(npu, vector) and time.monotonic() < deadline:
        time.sleep(0.001)
    return mailbox(npu, vector)


def test_msix_queue_vector_fires_for_a_command_with_the_irq_flag(msix: Npu) -> None:
    msix.wr(hw.REG_IRQ_MASK, IRQ_QUEUE0 | hw.IRQ_ERROR)
    assert msix.run(nop(1)).status == hw.ST_OK
    time.sleep(0.05)
    assert mailbox(msix, hw.VEC_DEVICE) == mailbox(msix, 1) == 0, "no IRQ flag: no message"
    assert msix.run(nop(2, flags=hw.CMD_F_IRQ)).status == hw.ST_OK
    assert wait_mailbox(msix, 1) == 0xA1
    assert mailbox(msix, hw.VEC_DEVICE) == 0
    msix.assert_alive()


def test_msix_device_vector_fires_for_a_queue_error(msix: Npu) -> None:
    msix.wr(hw.REG_IRQ_MASK, IRQ_QUEUE0 | hw.IRQ_ERROR)
    msix.doorbell(7)  # overrun of a 4-entry ring
    assert wait_mailbox(msix, hw.VEC_DEVICE) == 0xA0
    assert msix.rd(hw.REG_ERROR) == hw.ERR_RING_OVERRUN
    msix.assert_alive()


def test_msix_masked_cause_is_signalled_when_unmasked(msix: Npu) -> None:
    assert msix.run(nop(1, flags=hw.CMD_F_IRQ)).status == hw.ST_OK
    time.sleep(0.05)
    assert mailbox(msix, 1) == 0, "masked in IRQ_MASK: no message yet"
    assert msix.rd(hw.REG_IRQ_STATUS) == IRQ_QUEUE0
    msix.wr(hw.REG_IRQ_MASK, IRQ_QUEUE0)
    assert wait_mailbox(msix, 1) == 0xA1
    msix.assert_alive()


def test_msix_cause_cleared_before_unmasking_is_not_signalled(msix: Npu) -> None:
    assert msix.run(nop(1, flags=hw.CMD_F_IRQ)).status == hw.ST_OK
    msix.wr(hw.REG_IRQ_STATUS, IRQ_QUEUE0)
    msix.wr(hw.REG_IRQ_MASK, IRQ_QUEUE0)
    time.sleep(0.05)
    assert mailbox(msix, 1) == 0
    msix.assert_alive()


def test_dma_cannot_reprogram_the_device_through_the_ecam_window(ready: Npu) -> None:
    mch = type(ready.pci)(ready.qt, 0, 0, 0)  # q35 host bridge: enable MMCONFIG at 0xb0000000
    mch.write32(0x64, 0)
    mch.write32(0x60, 0xB000_0001)
    ecam = 0xB000_0000 | ready.pci.bus << 20 | ready.pci.dev << 15 | ready.pci.fn << 12
    assert ready.qt.readl(ecam) == hw.PCI_DEVICE_ID << 16 | hw.PCI_VENDOR_ID
    bar0_cfg = ready.pci.read32(0x10)
    ready.submit(fill(ecam + 0x10, 4, 0x0010_0000, fence=0xECA))  # move BAR0 onto RAM
    deadline = time.monotonic() + 5
    while ready.fence_wb()[0] != 0xECA:  # RAM, still readable with BAR0 moved
        assert time.monotonic() < deadline, "the FILL did not complete"
        time.sleep(0.001)
    moved = ready.pci.read32(0x10)
    ready.pci.write32(0x10, bar0_cfg)  # put it back so the device can be checked
    assert moved == bar0_cfg, f"a DMA moved BAR0 to {moved:#x}"
    ready.assert_alive()


# --------------------------------------------------------------------------
# Random descriptors
# --------------------------------------------------------------------------

SCRATCH = 0x1000_0000  # random DMA may land anywhere in [SCRATCH, RAM_SIZE)
FUZZ_COUNT = 1000
FUZZ_RING = 256
PAYLOAD_USED = {
    hw.OP_NOP: 0,
    hw.OP_COPY: 24,
    hw.OP_FILL: 24,
    hw.OP_GEMM: 56,
    hw.OP_ELTWISE: 16,
    hw.OP_UNARY: 16,
    hw.OP_CONVERT: 16,
    hw.OP_REDUCE: 16,
    hw.OP_SOFTMAX: 16,
    hw.OP_LAYERNORM: 16,
    hw.OP_MATMUL: 16,
    hw.OP_LINEAR: 16,
    hw.OP_CONV2D: 16,
    hw.OP_POOL2D: 16,
}


def fuzz_address(rng: random.Random) -> int:
    kind = rng.choices(["any", "bar0", "bar4", "top", "ram"], [3, 3, 2, 2, 10])[0]
    if kind == "any":
        return rng.getrandbits(64)
    if kind == "bar0":
        return BAR0_BASE + rng.randrange(-0x10000, hw.BAR0_SIZE + 0x10000)
    if kind == "bar4":
        return BAR4_BASE + rng.randrange(-0x10000, 0x11000)
    if kind == "top":
        return TOP - rng.randrange(1, 1 << 21)
    return SCRATCH + rng.randrange(RAM_SIZE - SCRATCH)


def fuzz_length(rng: random.Random) -> int:
    return rng.choice([
        0, rng.randrange(1, 64), rng.randrange(1, 1 << 20), rng.randrange(1, 1 << 32),
        1 << 32, (1 << 32) + rng.choice([1, 4]), rng.getrandbits(64),
        rng.randrange(1, 64) * 4, rng.randrange(1, 1 << 16) * 4,
    ])  # fmt: skip


def fuzz_gemm_shape(rng: random.Random) -> list[int]:
    """m, n, k, lda, ldb, ldc: mostly a small valid shape, with one field often broken."""
    m, n, k = (rng.randrange(1, 9) for _ in range(3))
    ta, tb = rng.random() < 0.5, rng.random() < 0.5
    shape = [m, n, k, (m if ta else k) + rng.randrange(3), (k if tb else n) + rng.randrange(3),
             n + rng.randrange(3), ta | tb << 1]  # fmt: skip
    if rng.random() < 0.5:
        # Never a huge *valid* shape or stride: a legitimate GEMM could run for hours.
        shape[rng.randrange(6)] = rng.choice(
            [0, 65537, hw.MAX_LD + 1, rng.randrange(hw.MAX_LD + 1, 1 << 32), rng.randrange(8)]
        )
    return shape


def fuzz_descriptor(rng: random.Random, fence: int) -> bytes:
    """A seeded random descriptor with opcode 0..5, mostly near-valid fields."""
    opcode = rng.randrange(hw.OP_COUNT + 1)
    if rng.random() < 0.2:  # random bytes everywhere
        return (
            struct.pack("<H", opcode)
            + rng.randbytes(6)
            + struct.pack("<Q", fence)
            + rng.randbytes(112)
        )
    if opcode == hw.OP_COPY:
        payload = struct.pack("<QQQ", fuzz_address(rng), fuzz_address(rng), fuzz_length(rng))
    elif opcode == hw.OP_FILL:
        rsvd = 0 if rng.random() < 0.9 else rng.getrandbits(32)
        payload = struct.pack(
            "<QQII", fuzz_address(rng), fuzz_length(rng), rng.getrandbits(32), rsvd
        )
    elif opcode == hw.OP_GEMM:
        m, n, k, lda, ldb, ldc, gflags = fuzz_gemm_shape(rng)
        dtype = 0 if rng.random() < 0.9 else rng.getrandbits(32)
        gflags = gflags if rng.random() < 0.9 else rng.getrandbits(32)
        addrs = (fuzz_address(rng) for _ in range(3))
        payload = struct.pack("<QQQ8I", *addrs, m, n, k, lda, ldb, ldc, dtype, gflags)
    elif opcode == hw.OP_NOP or rng.random() < 0.5:
        payload = b""
    else:
        payload = rng.randbytes(112)
    flags = rng.choice([0, 0, 0, hw.CMD_F_IRQ, 1 << rng.randrange(16)])
    ctx = 0 if rng.random() < 0.9 else rng.getrandbits(16)
    rsvd0 = 0 if rng.random() < 0.9 else rng.getrandbits(16)
    desc = bytearray(cmd(opcode, payload, flags=flags, ctx=ctx, rsvd0=rsvd0, fence=fence))
    if rng.random() < 0.1:
        desc[rng.randrange(16 + len(payload), CMD_SIZE) if len(payload) < 112 else 127] |= 1
    return bytes(desc)


def expected_header_status(desc: bytes) -> int | None:
    """The status decided by the generic checks of spec 6.3 step 4, if any.

    The fuzz programs no context table, so a ctx other than 0 names no address
    space: an MMU fault, decided after flags and rsvd0, before the opcode's checks.
    """
    opcode, flags, ctx, rsvd0 = struct.unpack_from("<HHHH", desc)
    if flags & ~hw.CMD_F_MASK:
        return hw.ST_BAD_FLAGS
    if rsvd0:
        return hw.ST_BAD_RESERVED
    if ctx:
        return hw.ST_MMU_FAULT
    if opcode in PAYLOAD_USED and any(desc[16 + PAYLOAD_USED[opcode] :]):
        return hw.ST_BAD_RESERVED
    if opcode >= hw.OP_COUNT:
        return hw.ST_BAD_OPCODE
    return None


def test_random_descriptors_all_complete_and_the_device_survives(npu: Npu) -> None:
    rng = random.Random(0x4E5055)
    npu.start(size=FUZZ_RING)
    npu.wr(hw.REG_SCRATCH, 0x5EED5EED)
    npu.wr(hw.REG_IRQ_MASK, hw.IRQ_ERROR | IRQ_QUEUE0)
    before = snapshot(npu)
    statuses: dict[int, int] = {}
    done = 0
    while done < FUZZ_COUNT:
        batch = [fuzz_descriptor(rng, done + i) for i in range(min(FUZZ_RING, FUZZ_COUNT - done))]
        first = npu.submit(*batch)[0]
        npu.wait_head(first + len(batch), timeout=60)
        for desc, cpl in zip(batch, npu.completions(first, len(batch)), strict=True):
            seen = f"descriptor {desc.hex()} -> {cpl}"
            assert cpl.status < hw.ST_COUNT, seen
            assert cpl.status not in (hw.ST_ABORTED,), seen  # never produced by the device
            assert cpl.fence == struct.unpack_from("<Q", desc, 8)[0], seen
            assert cpl.opcode == struct.unpack_from("<H", desc)[0], seen
            want = expected_header_status(desc)
            assert want is None or cpl.status == want, seen
            statuses[cpl.status] = statuses.get(cpl.status, 0) + 1
        assert not npu.rd(hw.REG_STATUS) & hw.STATUS_ERROR, "no descriptor may stop the queue"
        done += len(batch)
    assert npu.qrd(hw.Q_HEAD) == FUZZ_COUNT
    assert snapshot(npu) == before, "a random DMA reached the device's registers"
    assert len(statuses) >= 6, f"the generator covers too few outcomes: {statuses}"
    expect_ok_fill(npu)
    npu.assert_alive()
