"""Device memory (BAR2, NPU_CAP_LOCAL_MEM), driven through qtest (no guest).

The ``mem-size`` property (default 512 MiB, 0 for none) gives the device
RAM of its own, which the CPU sees through BAR2 (64-bit, prefetchable) and
the engine reaches through PTEs with NPU_PTE_LOCAL: such a PTE holds an
offset into device memory instead of a bus address. Device memory is not
on the engine's bus path: a bus address inside BAR2 is one of the device's
own BARs, refused like BAR0. Soft resets leave its contents alone, like
VRAM.

Every test gets its own QEMU with BAR2 mapped at BAR2_BASE; the ``mmu``
fixture adds a device-wide address space whose pages each test maps (guest
RAM or device memory, per page) and reads back through the CPU's view of
them.
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

import numpy as np
import pytest

from qtest import (
    BAR2_BASE,
    DATA,
    U32,
    Npu,
    QTestError,
    copy,
    fill,
    gemm,
    hw,
    hw_tensor,
    tensor,
    tensor_params,
)
from qtest_tensor_ref import FP32, MM_REL, TINY

MEM_SIZE = 512 << 20  # the mem-size default
PAGE = 0x1000
BAR2_REG = 0x10 + 4 * hw.BAR_MEM  # its PCI config offset (low dword; high dword after it)
BAR_64_PREFETCH = 0b1100  # memory BAR, type 10 (64-bit), prefetchable

# Guest RAM (bus addresses)
BASE = DATA + (32 << 20)
L1 = BASE  # a full-size L1 table (NPU_MMU_MAX_L1 entries)
L2_POOL = BASE + 0x1_0000  # L2 tables, one per L1 entry in use, allocated upwards
HOST = BASE + 0x10_0000  # host pages the tests map
MIXED = BASE + 0x80_0000  # bus addresses the mixed-run tests also use as local offsets

# Device VAs
SRC, DST = 0x10_0000, 0x20_0000  # a host source and a host destination
LOC = 0x100_0000  # local pages, 16 MiB of VA and more
SRC_PA, DST_PA = HOST, HOST + 0x8_0000

# The capabilities that do not depend on device memory
OTHER_CAPS = (hw.CAP_COPY | hw.CAP_FILL | hw.CAP_GEMM_FP32 | hw.CAP_MSIX | hw.CAP_TIMESTAMPS
              | hw.CAP_MMU | hw.CAP_TENSOR | hw.CAP_REDUCE | hw.CAP_MATMUL | hw.CAP_CONV
              | hw.CAP_QUANT)  # fmt: skip


def span(start: int, pages: int) -> list[int]:
    """``pages`` consecutive page addresses (or offsets) from ``start``."""
    return [start + i * PAGE for i in range(pages)]


def random_bytes(seed: int, n: int) -> bytes:
    return np.random.default_rng(seed).integers(0, 256, n, dtype=np.uint8).tobytes()


class Mmu:
    """Device-wide page tables in guest RAM, and the CPU's view of each mapped page.

    ``map()`` points consecutive VA pages at device memory (``local``: BAR2
    offsets) or at guest RAM (bus addresses); ``read()``/``write()`` move
    bytes at VAs through what the CPU sees: guest RAM or the BAR2 window.
    """

    def __init__(self, npu: Npu) -> None:
        self.npu = npu
        self.l2: dict[int, int] = {}  # L1 index -> its L2 table
        self.cpu: dict[int, int] = {}  # VA page -> CPU address of its bytes
        npu.qt.memset(L1, hw.MMU_MAX_L1 * 8, 0)

    def enable(self) -> None:
        """Program and turn on the device-wide MMU (the device must be disabled)."""
        self.npu.wr(hw.REG_MMU_L1_LO, L1 & U32)
        self.npu.wr(hw.REG_MMU_L1_HI, L1 >> 32)
        self.npu.wr(hw.REG_MMU_L1_ENTRIES, hw.MMU_MAX_L1)
        self.npu.wr(hw.REG_MMU_CONTROL, hw.MMU_ENABLE)

    def _l2(self, l1i: int) -> int:
        if l1i not in self.l2:
            table = L2_POOL + len(self.l2) * PAGE
            self.npu.qt.memset(table, PAGE, 0)
            self.npu.qt.memwrite(L1 + l1i * 8, struct.pack("<Q", table | hw.PTE_VALID))
            self.l2[l1i] = table
        return self.l2[l1i]

    def map(self, va: int, targets: Sequence[int], *, local: bool, write: bool = True) -> None:
        """Map VA pages va, va + 4 KiB, ... to targets[0], targets[1], ..."""
        assert va % PAGE == 0 and all(t % PAGE == 0 for t in targets)
        flags = hw.PTE_VALID | (hw.PTE_WRITE if write else 0) | (hw.PTE_LOCAL if local else 0)
        pos = 0
        while pos < len(targets):  # one write per L2 table touched
            v = va + pos * PAGE
            n = min(len(targets) - pos, hw.MMU_L2_ENTRIES - ((v >> hw.PAGE_SHIFT) & 511))
            ptes = [t | flags for t in targets[pos : pos + n]]
            slot = self._l2(v >> hw.MMU_L1_SHIFT) + ((v >> hw.PAGE_SHIFT) & 511) * 8
            self.npu.qt.memwrite(slot, struct.pack(f"<{n}Q", *ptes))
            pos += n
        bar2 = self.npu.bar2
        for i, t in enumerate(targets):
            if not local:
                self.cpu[va + i * PAGE] = t
            elif bar2 is not None:
                self.cpu[va + i * PAGE] = bar2 + t

    def local(self, va: int, offsets: Sequence[int], *, write: bool = True) -> None:
        self.map(va, offsets, local=True, write=write)

    def host(self, va: int, addrs: Sequence[int], *, write: bool = True) -> None:
        self.map(va, addrs, local=False, write=write)

    def _runs(self, va: int, size: int) -> Iterator[tuple[int, int, int]]:
        """(position, CPU address, length) of [va, va + size), CPU-contiguous pieces merged."""
        pos = 0
        while pos < size:
            cpu = self.cpu[(va + pos) & ~(PAGE - 1)] + ((va + pos) & (PAGE - 1))
            n = min(size - pos, PAGE - ((va + pos) & (PAGE - 1)))
            while pos + n < size and self.cpu.get(va + pos + n) == cpu + n:
                n += min(size - pos - n, PAGE)
            yield pos, cpu, n
            pos += n

    def write(self, va: int, data: bytes) -> None:
        for pos, cpu, n in self._runs(va, len(data)):
            self.npu.qt.memwrite(cpu, data[pos : pos + n])

    def read(self, va: int, size: int) -> bytes:
        return b"".join(self.npu.qt.memread(cpu, n) for _, cpu, n in self._runs(va, size))


@pytest.fixture
def npu(tmp_path: Path) -> Iterator[Npu]:
    """The default device (512 MiB of device memory), BAR2 mapped at BAR2_BASE."""
    dev = Npu(tmp_path / "qtest.log")
    try:
        assert dev.map_mem() == MEM_SIZE
        yield dev
    finally:
        dev.close()


@pytest.fixture
def mmu(npu: Npu) -> Iterator[Mmu]:
    """The device-wide MMU on with empty tables, queue 0 running."""
    tables = Mmu(npu)
    tables.enable()
    npu.start()
    yield tables
    npu.assert_alive()


def bar2(npu: Npu, off: int, size: int) -> bytes:
    """What the CPU reads at offset ``off`` of device memory."""
    assert npu.bar2 is not None
    return npu.qt.memread(npu.bar2 + off, size)


def set_bar2(npu: Npu, off: int, data: bytes) -> None:
    assert npu.bar2 is not None
    npu.qt.memwrite(npu.bar2 + off, data)


def mem_size_regs(npu: Npu) -> int:
    return npu.rd(hw.REG_MEM_SIZE_LO) | npu.rd(hw.REG_MEM_SIZE_HI) << 32


def fault(npu: Npu) -> tuple[int, int, int]:
    """(VA, MMU_FAULT_INFO, MMU_FAULTS) of the last fault."""
    va = npu.rd(hw.REG_MMU_FAULT_LO) | npu.rd(hw.REG_MMU_FAULT_HI) << 32
    return va, npu.rd(hw.REG_MMU_FAULT_INFO), npu.rd(hw.REG_MMU_FAULTS)


# --------------------------------------------------------------------------
# Discovery: CAPS, MEM_SIZE, BAR2 and the mem-size property
# --------------------------------------------------------------------------


def test_caps_and_mem_size_report_512_mib_of_device_memory_by_default(npu: Npu) -> None:
    assert hw.CAP_LOCAL_MEM == 1 << 11
    caps = npu.rd(hw.REG_CAPS)
    assert caps & hw.CAP_LOCAL_MEM
    assert caps & OTHER_CAPS == OTHER_CAPS
    assert (npu.rd(hw.REG_MEM_SIZE_LO), npu.rd(hw.REG_MEM_SIZE_HI)) == (MEM_SIZE, 0)
    npu.assert_alive()


def test_mem_size_registers_are_read_only(npu: Npu) -> None:
    npu.wr(hw.REG_MEM_SIZE_LO, 0x1000)
    npu.wr(hw.REG_MEM_SIZE_HI, 7)
    assert mem_size_regs(npu) == MEM_SIZE
    npu.assert_alive()


def test_bar2_is_a_64_bit_prefetchable_memory_bar_of_mem_size(tmp_path: Path) -> None:
    dev = Npu(tmp_path / "qtest.log")
    try:
        assert dev.pci.read32(BAR2_REG) & 0xF == BAR_64_PREFETCH
        assert dev.map_mem() == MEM_SIZE
        assert dev.pci.read32(BAR2_REG) == (BAR2_BASE & U32) | BAR_64_PREFETCH
        assert dev.pci.read32(BAR2_REG + 4) == BAR2_BASE >> 32
        dev.assert_alive()
    finally:
        dev.close()


def test_bar2_is_ram_the_cpu_reads_back_what_it_wrote(npu: Npu) -> None:
    data = random_bytes(1, 3 * PAGE + 5)
    for off in (0, 0x123_4567, MEM_SIZE - len(data)):  # the first and the last byte too
        set_bar2(npu, off, data)
        assert bar2(npu, off, len(data)) == data
    npu.assert_alive()


@pytest.mark.parametrize(("value", "size"), [("1M", 1 << 20), ("4G", 4 << 30)])
def test_mem_size_sets_the_bar2_size_and_the_mem_size_registers(
    tmp_path: Path, value: str, size: int
) -> None:
    dev = Npu(tmp_path / "qtest.log", device=f"npu,mem-size={value}")
    try:
        assert mem_size_regs(dev) == size
        assert dev.rd(hw.REG_CAPS) & hw.CAP_LOCAL_MEM
        assert dev.map_mem() == size
        set_bar2(dev, size - 4, b"\x01\x02\x03\x04")
        assert bar2(dev, size - 4, 4) == b"\x01\x02\x03\x04"
        dev.assert_alive()
    finally:
        dev.close()


def test_mem_size_0_means_no_bar2_no_cap_and_mem_size_reads_0(tmp_path: Path) -> None:
    dev = Npu(tmp_path / "qtest.log", device="npu,mem-size=0")
    try:
        caps = dev.rd(hw.REG_CAPS)
        assert not caps & hw.CAP_LOCAL_MEM
        assert caps & OTHER_CAPS == OTHER_CAPS, "the other capabilities stay"
        assert (dev.rd(hw.REG_MEM_SIZE_LO), dev.rd(hw.REG_MEM_SIZE_HI)) == (0, 0)
        assert dev.pci.read32(BAR2_REG) == 0
        assert dev.pci.read32(BAR2_REG + 4) == 0
        assert dev.map_mem() == 0, "BAR2 is not implemented: it does not size"
        dev.assert_alive()
    finally:
        dev.close()


@pytest.mark.parametrize("value", ["3M", "512K", "128G"])
def test_an_invalid_mem_size_makes_qemu_refuse_to_start(tmp_path: Path, value: str) -> None:
    # Not a power of two, below 1 MiB, above 64 GiB: realize fails, QEMU exits
    # (seen as EOF on its stdout, or as its exit status, whichever comes first).
    refused = r"(?s)(exited with 1|\(EOF\)).*mem-size must be 0 or a power of two"
    with pytest.raises(QTestError, match=refused):
        Npu(tmp_path / "qtest.log", device=f"npu,mem-size={value}")


# --------------------------------------------------------------------------
# The engine in device memory (NPU_PTE_LOCAL)
# --------------------------------------------------------------------------


def test_copy_host_to_local_to_host_round_trips_and_bar2_shows_the_device_writes(
    mmu: Mmu,
) -> None:
    npu = mmu.npu
    data = random_bytes(2, 3 * PAGE)
    offsets = [MEM_SIZE - PAGE, 0, 0x123_4000]  # scattered: the last page, the first, one between
    mmu.host(SRC, span(SRC_PA, 3))
    mmu.local(LOC, offsets)
    mmu.host(DST, span(DST_PA, 3))
    npu.qt.memwrite(SRC_PA, data)
    npu.qt.memset(DST_PA, 3 * PAGE, 0xEE)
    assert npu.run(copy(SRC, LOC, 3 * PAGE, fence=1)).status == hw.ST_OK
    for i, off in enumerate(offsets):
        assert bar2(npu, off, PAGE) == data[i * PAGE : (i + 1) * PAGE], f"local page {i}"
    assert npu.run(copy(LOC, DST, 3 * PAGE, fence=2)).status == hw.ST_OK
    assert npu.qt.memread(DST_PA, 3 * PAGE) == data
    assert fault(npu)[2] == 0


def test_the_device_reads_what_the_cpu_wrote_through_bar2(mmu: Mmu) -> None:
    npu = mmu.npu
    data = random_bytes(3, 2 * PAGE)
    set_bar2(npu, 0x40_0000, data)
    mmu.local(LOC, span(0x40_0000, 2))
    mmu.host(DST, span(DST_PA, 2))
    assert npu.run(copy(LOC + 0x10, DST, 2 * PAGE - 0x20)).status == hw.ST_OK
    assert npu.qt.memread(DST_PA, 2 * PAGE - 0x20) == data[0x10:-0x10]


def test_fill_of_local_pages_is_visible_through_bar2(mmu: Mmu) -> None:
    npu = mmu.npu
    size = 5 << 20  # above 4 MiB: split into tiles for the AI cores
    off = 0x100_0000
    set_bar2(npu, off - PAGE, b"\x5a" * PAGE)
    set_bar2(npu, off + size, b"\x5a" * PAGE)
    mmu.local(LOC, span(off, size // PAGE))
    assert npu.run(fill(LOC, size, 0xA1B2C3D4, fence=1)).status == hw.ST_OK
    assert bar2(npu, off, size) == struct.pack("<I", 0xA1B2C3D4) * (size // 4)
    assert bar2(npu, off - PAGE, PAGE) == b"\x5a" * PAGE, "fill wrote before its range"
    assert bar2(npu, off + size, PAGE) == b"\x5a" * PAGE, "fill wrote past its range"


def test_the_last_page_of_device_memory_is_mappable(mmu: Mmu) -> None:
    npu = mmu.npu
    mmu.local(LOC, [MEM_SIZE - PAGE])
    assert npu.run(fill(LOC, PAGE, 0x600DF00D)).status == hw.ST_OK
    assert bar2(npu, MEM_SIZE - 4, 4) == struct.pack("<I", 0x600DF00D)


LOCAL_OFFSETS_PAST_THE_END = {
    "mem-size": MEM_SIZE,
    "mem-size+4KiB": MEM_SIZE + PAGE,
    "4GiB": 1 << 32,
    "top-of-pte": hw.PTE_ADDR_MASK & ~(1 << 63),
}


@pytest.mark.parametrize("write", [False, True], ids=["read", "write"])
@pytest.mark.parametrize(
    "off", LOCAL_OFFSETS_PAST_THE_END.values(), ids=LOCAL_OFFSETS_PAST_THE_END.keys()
)
def test_a_local_pte_at_or_past_mem_size_faults_with_fault_local(
    mmu: Mmu, off: int, write: bool
) -> None:
    npu = mmu.npu
    va = (5 << 30) + LOC  # above 4 GiB: FAULT_HI holds bits too
    mmu.local(va, [off])
    mmu.host(SRC, [SRC_PA])
    mmu.host(DST, [DST_PA])
    npu.qt.memset(DST_PA, PAGE, 0xEE)
    desc = copy(SRC, va + 0x40, 0x100, fence=7) if write else copy(va + 0x40, DST, 0x100, fence=7)
    cpl = npu.run(desc)
    assert (cpl.status, cpl.fence) == (hw.ST_MMU_FAULT, 7)
    info = hw.FAULT_LOCAL | (hw.FAULT_WRITE if write else 0)
    assert fault(npu) == (va + 0x40, info, 1)
    assert hw.FAULT_LOCAL == 1 << 5
    assert npu.qt.memread(DST_PA, PAGE) == b"\xee" * PAGE


def test_a_transfer_running_past_the_end_of_device_memory_faults_at_the_first_page_beyond(
    mmu: Mmu,
) -> None:
    npu = mmu.npu
    mmu.local(LOC, [MEM_SIZE - PAGE, MEM_SIZE])  # contiguous offsets, the second one too far
    assert npu.run(fill(LOC, 2 * PAGE, 0)).status == hw.ST_MMU_FAULT
    assert fault(npu) == (LOC + PAGE, hw.FAULT_LOCAL | hw.FAULT_WRITE, 1)


def test_without_device_memory_every_local_pte_faults_with_fault_local(tmp_path: Path) -> None:
    dev = Npu(tmp_path / "qtest.log", device="npu,mem-size=0")
    try:
        tables = Mmu(dev)
        tables.local(LOC, [0])
        tables.enable()
        dev.start()
        assert dev.run(fill(LOC, 4, 0)).status == hw.ST_MMU_FAULT
        assert fault(dev) == (LOC, hw.FAULT_LOCAL | hw.FAULT_WRITE, 1)
        dev.assert_alive()
    finally:
        dev.close()


def test_a_write_to_a_read_only_local_page_faults_with_fault_perm(mmu: Mmu) -> None:
    npu = mmu.npu
    before = random_bytes(4, PAGE)
    set_bar2(npu, 0x3000, before)
    mmu.local(LOC, [0x3000], write=False)
    mmu.host(SRC, [SRC_PA])
    mmu.host(DST, [DST_PA])
    cpl = npu.run(copy(SRC, LOC + 0x80, 0x100))
    assert cpl.status == hw.ST_MMU_FAULT
    assert fault(npu) == (LOC + 0x80, hw.FAULT_PERM | hw.FAULT_WRITE, 1)
    assert bar2(npu, 0x3000, PAGE) == before
    assert npu.run(copy(LOC, DST, PAGE)).status == hw.ST_OK, "reads need only VALID"
    assert npu.qt.memread(DST_PA, PAGE) == before


def test_a_write_to_a_read_only_local_pte_past_the_end_reports_perm_not_local(
    mmu: Mmu,
) -> None:
    # The permission check comes first, as for host pages.
    mmu.local(LOC, [MEM_SIZE], write=False)
    assert mmu.npu.run(fill(LOC, 4, 0)).status == hw.ST_MMU_FAULT
    assert fault(mmu.npu) == (LOC, hw.FAULT_PERM | hw.FAULT_WRITE, 1)


# A local page and a host page whose addresses continue each other, so that
# a run merging them would move the wrong bytes: local offset X and bus
# address X + 4 KiB, or bus address X and local offset X + 4 KiB.
MIXED_LAYOUTS = {
    "local-then-host": (True, False),
    "host-then-local": (False, True),
}


@pytest.mark.parametrize("layout", MIXED_LAYOUTS.values(), ids=MIXED_LAYOUTS.keys())
def test_a_copy_spanning_local_and_host_pages_moves_each_page_to_its_own_memory(
    mmu: Mmu, layout: tuple[bool, bool]
) -> None:
    npu = mmu.npu
    for i, local in enumerate(layout):
        mmu.map(LOC + i * PAGE, [MIXED + i * PAGE], local=local)
        # Poison the page's twin in the other memory, which no PTE maps.
        if local:
            npu.qt.memset(MIXED + i * PAGE, PAGE, 0x77)
        else:
            set_bar2(npu, MIXED + i * PAGE, b"\x77" * PAGE)
    mmu.host(SRC, span(SRC_PA, 2))
    mmu.host(DST, span(DST_PA, 2))
    data = random_bytes(5, 2 * PAGE)
    npu.qt.memwrite(SRC_PA, data)
    start, length = 0x10, 2 * PAGE - 0x30  # unaligned: each page partly
    assert npu.run(copy(SRC + start, LOC + start, length)).status == hw.ST_OK
    assert mmu.read(LOC + start, length) == data[start : start + length]
    for i, local in enumerate(layout):
        twin = (
            npu.qt.memread(MIXED + i * PAGE, PAGE) if local else bar2(npu, MIXED + i * PAGE, PAGE)
        )
        assert twin == b"\x77" * PAGE, f"page {i} went to the wrong memory"
    npu.qt.memset(DST_PA, 2 * PAGE, 0)
    assert npu.run(copy(LOC + start, DST + start, length)).status == hw.ST_OK
    assert npu.qt.memread(DST_PA + start, length) == data[start : start + length]


def test_eltwise_add_fp32_in_scattered_local_pages_matches_numpy(mmu: Mmu) -> None:
    npu = mmu.npu
    rng = np.random.default_rng(6)
    shape = (525, 1000)  # 2^19 elements and more: split across the AI cores
    n = shape[0] * shape[1]
    pages = (n * 4 + PAGE - 1) // PAGE
    a = (rng.standard_normal(n) * 8).astype(np.float32)
    b = (rng.standard_normal(n) * 8).astype(np.float32)
    # Each operand in blocks of 8 local pages, the blocks in reverse order:
    # the engine's windows into device memory end mid-row.
    vas = [LOC, LOC + (4 << 20), LOC + (8 << 20)]
    params_va = LOC + (12 << 20)
    for i, va in enumerate(vas):
        base = 0x200_0000 + i * (4 << 20)
        blocks = [span(base + blk * 8 * PAGE, 8) for blk in range((pages + 7) // 8)]
        mmu.local(va, [p for blk in reversed(blocks) for p in blk][:pages])
    mmu.local(params_va, [0x300_0000])
    mmu.write(vas[0], a.tobytes())
    mmu.write(vas[1], b.tobytes())
    mmu.write(vas[2], b"\xaa" * (pages * PAGE))
    ops = [hw_tensor(va, FP32, shape, (shape[1], 1)) for va in vas]
    mmu.write(params_va, tensor_params(ops))
    cpl = npu.run(tensor(hw.OP_ELTWISE, params_va, hw.ELTWISE_ADD, fence=1), timeout=60)
    assert cpl.status == hw.ST_OK
    got = np.frombuffer(mmu.read(vas[2], n * 4), "<f4")
    want = (a.astype(np.float64) + b.astype(np.float64)).astype(np.float32)  # rounded once
    np.testing.assert_array_equal(got, want)
    assert mmu.read(vas[2] + n * 4, pages * PAGE - n * 4) == b"\xaa" * (pages * PAGE - n * 4)


def test_matmul_fp32_with_operands_in_local_memory_matches_numpy(mmu: Mmu) -> None:
    npu = mmu.npu
    rng = np.random.default_rng(7)
    m, k, n = 37, 129, 45
    a = rng.standard_normal((m, k)).astype(np.float32)
    b = rng.standard_normal((k, n)).astype(np.float32)
    va_a, va_b, va_out, params_va = LOC, LOC + 0x4_0000, LOC + 0x8_0000, LOC + 0xC_0000
    mmu.local(va_a, span(0x50_0000, 8)[::-1])
    mmu.local(va_b, span(0x60_0000, 8)[::-1])
    mmu.local(va_out, span(0x70_0000, 8)[::-1])
    mmu.local(params_va, [0x80_0000])
    mmu.write(va_a, a.tobytes())
    mmu.write(va_b, b.tobytes())
    mmu.write(va_out, b"\xaa" * (m * n * 4 + 64))
    ops = [hw_tensor(va_a, FP32, (m, k), (k, 1)), hw_tensor(va_b, FP32, (k, n), (n, 1)),
           hw_tensor(va_out, FP32, (m, n), (n, 1))]  # fmt: skip
    mmu.write(params_va, tensor_params(ops))
    cpl = npu.run(tensor(hw.OP_MATMUL, params_va, hw.ACT_NONE, fence=1))
    assert cpl.status == hw.ST_OK
    got = np.frombuffer(mmu.read(va_out, m * n * 4), "<f4").reshape(m, n).astype(np.float64)
    a64, b64 = a.astype(np.float64), b.astype(np.float64)
    want, mag = a64 @ b64, np.abs(a64) @ np.abs(b64)
    # fp32 accumulation (test_device_qtest_tensor.py's MATMUL tolerance)
    tol = 1e-5 * mag + MM_REL[FP32] * np.abs(want) + TINY[FP32]
    assert (np.abs(got - want) <= tol).all()
    assert mmu.read(va_out + m * n * 4, 64) == b"\xaa" * 64


def test_gemm_reads_and_writes_local_pages(mmu: Mmu) -> None:
    npu = mmu.npu
    m, n, k = 3, 2, 4
    av = [float(i + 1) for i in range(m * k)]
    bv = [float(2 * i - 3) for i in range(k * n)]
    mmu.local(LOC, [0x9000, 0x1000, 0x5000])  # A, B and C each in a local page
    mmu.write(LOC, struct.pack(f"<{m * k}f", *av))
    mmu.write(LOC + PAGE, struct.pack(f"<{k * n}f", *bv))
    assert npu.run(gemm(LOC, LOC + PAGE, LOC + 2 * PAGE, m, n, k, k, n, n)).status == hw.ST_OK
    c = struct.unpack(f"<{m * n}f", bar2(npu, 0x5000, m * n * 4))
    want = [
        sum(av[i * k + x] * bv[x * n + j] for x in range(k)) for i in range(m) for j in range(n)
    ]
    assert list(c) == want


# --------------------------------------------------------------------------
# Reset
# --------------------------------------------------------------------------


def test_device_memory_survives_a_soft_reset(mmu: Mmu) -> None:
    npu = mmu.npu
    by_device, by_cpu = random_bytes(8, 2 * PAGE), random_bytes(9, PAGE)
    mmu.host(SRC, span(SRC_PA, 2))
    mmu.local(LOC, span(0x7_0000, 2))
    mmu.host(DST, span(DST_PA, 2))
    npu.qt.memwrite(SRC_PA, by_device)
    assert npu.run(copy(SRC, LOC, 2 * PAGE)).status == hw.ST_OK
    set_bar2(npu, MEM_SIZE - PAGE, by_cpu)
    npu.soft_reset()
    assert npu.rd(hw.REG_MMU_CONTROL) == 0, "the reset did happen"
    assert bar2(npu, 0x7_0000, 2 * PAGE) == by_device
    assert bar2(npu, MEM_SIZE - PAGE, PAGE) == by_cpu
    assert mem_size_regs(npu) == MEM_SIZE
    assert npu.pci.read32(BAR2_REG + 4) == BAR2_BASE >> 32, "config space is not reset"
    # The engine still finds the bytes after reprogramming (the tables are in guest RAM).
    mmu.enable()
    npu.start()
    assert npu.run(copy(LOC, DST, 2 * PAGE)).status == hw.ST_OK
    assert npu.qt.memread(DST_PA, 2 * PAGE) == by_device


# --------------------------------------------------------------------------
# Device memory is reachable through local PTEs only, never as a bus address
# --------------------------------------------------------------------------

SENTINEL = bytes(range(256)) * 16  # what BAR2 holds at offset 0 and at its end


def eltwise_block(a: int, b: int, out: int, n: int = 256) -> bytes:
    ops = [hw_tensor(va, FP32, (n,), (1,)) for va in (a, b, out)]
    return tensor_params(ops)


# Bus address cases: (descriptor, parameter block to put at PARAMS or b"")
PARAMS = DATA + 0x1_0000
IN = DATA + 0x2_0000  # a guest RAM operand
BAR2_END = BAR2_BASE + MEM_SIZE
OWN_BAR2: dict[str, tuple[bytes, bytes]] = {
    "copy-to-bar2": (copy(IN, BAR2_BASE, 0x100), b""),
    "copy-from-bar2": (copy(BAR2_BASE, IN, 0x100), b""),
    "copy-to-the-last-bar2-bytes": (copy(IN, BAR2_END - 0x10, 0x10), b""),
    "copy-ending-in-bar2": (copy(IN, BAR2_BASE - 0x80, 0x100), b""),
    "fill-bar2": (fill(BAR2_BASE, 0x1000, 0xDEADBEEF), b""),
    "gemm-c-in-bar2": (gemm(IN, IN, BAR2_BASE, 4, 4, 4, 4, 4, 4), b""),
    "gemm-a-in-bar2": (gemm(BAR2_BASE, IN, IN + 0x1000, 4, 4, 4, 4, 4, 4), b""),
    "eltwise-out-in-bar2": (
        tensor(hw.OP_ELTWISE, PARAMS, hw.ELTWISE_ADD),
        eltwise_block(IN, IN, BAR2_BASE),
    ),
    "eltwise-out-running-past-bar2": (
        tensor(hw.OP_ELTWISE, PARAMS, hw.ELTWISE_ADD),
        eltwise_block(IN, IN, BAR2_END - 0x100),
    ),
    "eltwise-input-in-bar2": (
        tensor(hw.OP_ELTWISE, PARAMS, hw.ELTWISE_ADD),
        eltwise_block(IN, BAR2_BASE, IN + 0x1000),
    ),
    "matmul-out-in-bar2": (
        tensor(hw.OP_MATMUL, PARAMS, hw.ACT_NONE),
        tensor_params([hw_tensor(va, FP32, (4, 4), (4, 1)) for va in (IN, IN, BAR2_BASE)]),
    ),
    "params-in-bar2": (
        tensor(hw.OP_ELTWISE, BAR2_BASE, hw.ELTWISE_ADD),
        eltwise_block(IN, IN, IN + 0x1000),
    ),
}


@pytest.mark.parametrize("case", OWN_BAR2.values(), ids=OWN_BAR2.keys())
def test_with_the_mmu_off_a_bar2_bus_address_is_refused_as_the_devices_own_bar(
    npu: Npu, case: tuple[bytes, bytes]
) -> None:
    desc, block = case
    set_bar2(npu, 0, SENTINEL)
    set_bar2(npu, MEM_SIZE - len(SENTINEL), SENTINEL)
    if block:
        set_bar2(npu, 0, block)  # what the op would find there: a valid parameter block
        npu.qt.memwrite(PARAMS, block)
    npu.qt.memwrite(IN, struct.pack("<1024f", *range(1024)))
    npu.start()  # MMU_CONTROL = 0: descriptor addresses are bus addresses
    assert npu.run(desc).status == hw.ST_BAD_ADDR
    if block:
        assert bar2(npu, 0, len(block)) == block
        assert bar2(npu, len(block), len(SENTINEL) - len(block)) == SENTINEL[len(block) :]
    else:
        assert bar2(npu, 0, len(SENTINEL)) == SENTINEL
    assert bar2(npu, MEM_SIZE - len(SENTINEL), len(SENTINEL)) == SENTINEL
    assert npu.rd(hw.REG_MMU_FAULTS) == 0, "refused, not faulted"
    npu.assert_alive()


HOST_PTE_TO_BAR2: dict[str, Callable[[], bytes]] = {
    "copy-to": lambda: copy(SRC, LOC, 0x100),
    "copy-from": lambda: copy(LOC, DST, 0x100),
    "fill": lambda: fill(LOC, PAGE, 0),
    "eltwise-out": lambda: tensor(hw.OP_ELTWISE, DST, hw.ELTWISE_ADD),
}


@pytest.mark.parametrize("make", HOST_PTE_TO_BAR2.values(), ids=HOST_PTE_TO_BAR2.keys())
def test_a_host_pte_holding_the_bar2_bus_address_is_refused_as_own_bar(
    mmu: Mmu, make: Callable[[], bytes]
) -> None:
    npu = mmu.npu
    mmu.host(LOC, [BAR2_BASE])  # no PTE_LOCAL: a bus address, which is our BAR2
    mmu.host(SRC, [SRC_PA])
    mmu.host(DST, [DST_PA])
    npu.qt.memwrite(DST_PA, eltwise_block(SRC, SRC, LOC, 64))
    set_bar2(npu, 0, SENTINEL)
    assert npu.run(make()).status == hw.ST_BAD_ADDR
    assert bar2(npu, 0, len(SENTINEL)) == SENTINEL
    assert fault(npu)[2] == 0


RING_IN_BAR2 = {
    "ring": {"ring": BAR2_BASE},
    "cpl": {"cpl": BAR2_BASE + 0x1000},
    "fence": {"fence": BAR2_END - 16},
}


@pytest.mark.parametrize("where", RING_IN_BAR2.values(), ids=RING_IN_BAR2.keys())
def test_a_queue_with_its_rings_in_bar2_does_not_enable(npu: Npu, where: dict[str, int]) -> None:
    npu.program_queue(**where)
    npu.qwr(hw.Q_CONTROL, hw.QCTL_ENABLE)
    assert npu.qrd(hw.Q_CONTROL) == 0
    assert npu.qrd(hw.Q_ERROR) == hw.ERR_BAD_RING
    npu.assert_alive()


def test_page_tables_in_bar2_are_a_dma_error_not_a_local_table(npu: Npu) -> None:
    tables = Mmu(npu)
    tables.local(LOC, [0x1000])  # a good local page ...
    set_bar2(npu, 0, npu.qt.memread(L1, PAGE))  # ... and a copy of the L1 table in BAR2
    npu.wr(hw.REG_MMU_L1_LO, BAR2_BASE & U32)
    npu.wr(hw.REG_MMU_L1_HI, BAR2_BASE >> 32)
    npu.wr(hw.REG_MMU_L1_ENTRIES, hw.MMU_MAX_L1)
    npu.wr(hw.REG_MMU_CONTROL, hw.MMU_ENABLE)
    npu.start()
    assert npu.run(fill(LOC, 4, 0)).status == hw.ST_DMA_ERROR
    assert npu.rd(hw.REG_MMU_FAULTS) == 0
    assert bar2(npu, 0x1000, 4) == b"\0" * 4
    npu.assert_alive()


def test_a_context_table_in_bar2_is_a_dma_error(npu: Npu) -> None:
    tables = Mmu(npu)
    tables.local(LOC, [0x1000])
    entry = struct.pack("<QII", L1 | hw.PTE_VALID, hw.MMU_MAX_L1, 0)
    set_bar2(npu, 16, entry)  # a valid entry 1, in BAR2
    npu.wr(hw.REG_MMU_CTX_LO, BAR2_BASE & U32)
    npu.wr(hw.REG_MMU_CTX_HI, BAR2_BASE >> 32)
    npu.wr(hw.REG_MMU_CTX_COUNT, 2)
    npu.start()
    assert npu.run(fill(LOC, 4, 0, ctx=1)).status == hw.ST_DMA_ERROR
    assert bar2(npu, 0x1000, 4) == b"\0" * 4
    npu.assert_alive()
