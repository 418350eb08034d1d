"""What the engine's DMA may reach, target by target of QEMU's memory map (docs/npu-spec.md 9).

The engine reads and writes RAM the host can access directly, and nothing
else: ROM and read-only RAM (the BIOS, another device's option-ROM BAR)
are read and never written; MMIO (another device's register BAR, another
NPU's registers, the HPET), PCI configuration space through ECAM and
unassigned space are refused without being touched, with
``NPU_ST_DMA_ERROR``. RAM-backed BARs stay reachable: another NPU's device
memory (BAR2) is RAM, and the multi-card stack relies on it. The same rule
holds for every kind of access: operands, descriptor rings, completion
rings, fence write-backs, page tables, trace rings.

Every other access would make QEMU take the BQL on the engine thread, and a
vCPU that holds it while waiting for the engine (a reset, a move to D3hot)
would wait for good: the last tests queue a write into ROM and fire such an
event at once, and QEMU must still answer.
"""

from __future__ import annotations

import struct
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from qtest import (
    BAR2_BASE,
    DATA,
    ECAM_BASE,
    Npu,
    PciFunction,
    copy,
    fill,
    find_pci,
    hw,
)

# The peers: a second NPU (its BAR0 registers and BAR2 device memory) and a
# PCI test device with an MMIO BAR and an option ROM of ours.
PEER_NPU_SLOT = 0x10
TESTDEV_SLOT = 0x11
PEER_BAR0 = 0xE100_0000
PEER_BAR2 = BAR2_BASE  # the NPU under test leaves its own BAR2 unmapped
TESTDEV_BAR0 = 0xE140_0000
TESTDEV_ROM = 0xE180_0000
ROM_BYTES = 0x1000
PCI_ROM_ADDRESS = 0x30
PCI_CAP_ID_PM = 0x01
PCI_PM_CTRL = 4
D3HOT = 3
BIOS_BASE = 0xFFFC_0000  # q35's pc.bios (SeaBIOS, 256 KiB, read-only RAM) below 4 GiB
BIOS = 0xFFFF_0000  # its last 64 KiB: code up to the reset vector
HPET = 0xFED0_0000
UNASSIGNED = 0x30_0000_0000  # above RAM and every BAR placed here
LEN = 0x1000
SRC = DATA + 0x10_0000  # data a read target is copied over / a write source
PATTERN = 0x5A5AA5A5


@dataclass(frozen=True)
class Target:
    addr: int
    readable: bool  # RAM (read-only or not): the engine may read it
    writable: bool  # writable RAM: the engine may write it


TARGETS = {
    "ram": Target(DATA, True, True),
    "peer-npu-device-memory": Target(PEER_BAR2, True, True),
    "bios-rom": Target(BIOS, True, False),
    "option-rom-bar": Target(TESTDEV_ROM, True, False),
    "other-device-mmio-bar": Target(TESTDEV_BAR0, False, False),
    "peer-npu-registers": Target(PEER_BAR0, False, False),
    "hpet-mmio": Target(HPET, False, False),
    "ecam": Target(ECAM_BASE, False, False),
    "unassigned": Target(UNASSIGNED, False, False),
}
UNREADABLE = [name for name, t in TARGETS.items() if not t.readable]


@pytest.fixture
def npu(tmp_path: Path) -> Iterator[Npu]:
    """The NPU with queue 0 running, a peer NPU and a test device mapped, ECAM open."""
    rom = tmp_path / "option.rom"
    rom.write_bytes((b"\x55\xaa\x08" + bytes(range(256)) * 16)[:ROM_BYTES])
    dev = Npu(
        tmp_path / "qemu.log",
        extra_args=[
            "-device", f"npu,boot-rom=on,addr={PEER_NPU_SLOT:#x}",
            "-device", f"pci-testdev,addr={TESTDEV_SLOT:#x},romfile={rom}",
        ],
    )  # fmt: skip
    try:
        first = find_pci(dev.qt, hw.PCI_VENDOR_ID, hw.PCI_DEVICE_ID)
        assert first.dev != PEER_NPU_SLOT, "the NPU under test must be the first one found"
        peer = PciFunction(dev.qt, 0, PEER_NPU_SLOT, 0)
        peer.map_bar(hw.BAR_REGS, PEER_BAR0)
        assert peer.map_bar(hw.BAR_MEM, PEER_BAR2), "the peer NPU has no device memory"
        peer.enable()
        testdev = PciFunction(dev.qt, 0, TESTDEV_SLOT, 0)
        testdev.map_bar(0, TESTDEV_BAR0)
        testdev.write32(PCI_ROM_ADDRESS, TESTDEV_ROM | 1)
        testdev.enable()
        dev.enable_ecam()
        assert dev.qt.memread(TESTDEV_ROM, 3) == b"\x55\xaa\x08", "option ROM not mapped"
        assert dev.qt.memread(BIOS, LEN) != bytes(LEN), "no BIOS at 0xffff0000"
        dev.start()
        yield dev
    finally:
        dev.close()


def readback(npu: Npu, t: Target) -> bytes | None:
    """The target's bytes as the CPU sees them (None: reading would touch a device)."""
    return npu.qt.memread(t.addr, LEN) if t.readable else None


@pytest.mark.parametrize("name", TARGETS)
def test_the_engine_writes_writable_ram_only(npu: Npu, name: str) -> None:
    t = TARGETS[name]
    before = readback(npu, t)
    cpl = npu.run(fill(t.addr, LEN, PATTERN))
    if t.writable:
        assert cpl.status == hw.ST_OK
        assert npu.qt.memread(t.addr, LEN) == struct.pack("<I", PATTERN) * (LEN // 4)
    else:
        assert cpl.status == hw.ST_DMA_ERROR
        assert readback(npu, t) == before
    npu.assert_alive()


@pytest.mark.parametrize("name", TARGETS)
def test_the_engine_reads_ram_and_rom_only(npu: Npu, name: str) -> None:
    t = TARGETS[name]
    npu.qt.memset(SRC, LEN, 0xEE)
    cpl = npu.run(copy(t.addr, SRC, LEN))
    if t.readable:
        assert cpl.status == hw.ST_OK
        assert npu.qt.memread(SRC, LEN) == npu.qt.memread(t.addr, LEN)
    else:
        assert cpl.status == hw.ST_DMA_ERROR
        assert npu.qt.memread(SRC, LEN) == b"\xee" * LEN
    npu.assert_alive()


RING_USES = {"descriptor-ring": "readable", "completion-ring": "writable", "fence": "writable"}


@pytest.mark.parametrize("use", RING_USES)
@pytest.mark.parametrize("name", TARGETS)
def test_a_queue_enables_only_with_its_rings_where_the_engine_may_reach(
    npu: Npu, name: str, use: str
) -> None:
    t = TARGETS[name]
    npu.wr(hw.REG_CONTROL, 0)
    npu.qwr(hw.Q_CONTROL, 0)
    q = 1
    ring, cpl, fence = DATA + 0x20_0000, DATA + 0x28_0000, DATA + 0x2C_0000
    if use == "descriptor-ring":
        ring = t.addr
    elif use == "completion-ring":
        cpl = t.addr
    else:
        fence = t.addr
    for reg, val in (
        (hw.Q_RING_LO, ring), (hw.Q_RING_HI, ring >> 32), (hw.Q_RING_SIZE, 16),
        (hw.Q_CPL_LO, cpl), (hw.Q_CPL_HI, cpl >> 32),
        (hw.Q_FENCE_LO, fence), (hw.Q_FENCE_HI, fence >> 32),
    ):  # fmt: skip
        npu.qwr(reg, val & 0xFFFF_FFFF, q)
    npu.qwr(hw.Q_CONTROL, hw.QCTL_ENABLE, q)
    if getattr(t, RING_USES[use]):
        assert npu.qrd(hw.Q_CONTROL, q) == hw.QCTL_ENABLE
    else:
        assert npu.qrd(hw.Q_CONTROL, q) == 0
        assert npu.qrd(hw.Q_ERROR, q) == hw.ERR_BAD_RING
    npu.assert_alive()


def table_at(npu: Npu, lo: int, hi: int, count: int, addr: int) -> None:
    """Point a table register triple (address low, high, entries) at ``addr``,
    four entries, with the device disabled as the registers want."""
    npu.wr(hw.REG_CONTROL, 0)
    npu.wr(lo, addr & 0xFFFF_FFFF)
    npu.wr(hi, addr >> 32)
    npu.wr(count, 4)


@pytest.mark.parametrize("name", UNREADABLE)
def test_page_tables_outside_ram_are_a_dma_error(npu: Npu, name: str) -> None:
    table_at(npu, hw.REG_MMU_L1_LO, hw.REG_MMU_L1_HI, hw.REG_MMU_L1_ENTRIES, TARGETS[name].addr)
    npu.wr(hw.REG_MMU_CONTROL, hw.MMU_ENABLE)
    npu.wr(hw.REG_CONTROL, hw.CONTROL_ENABLE)
    npu.qt.memset(DATA, LEN, 0xEE)
    cpl = npu.run(fill(0x1000, LEN, PATTERN))
    assert cpl.status == hw.ST_DMA_ERROR
    assert npu.qt.memread(DATA, LEN) == b"\xee" * LEN
    npu.assert_alive()


@pytest.mark.parametrize("name", UNREADABLE)
def test_a_context_table_outside_ram_is_a_dma_error(npu: Npu, name: str) -> None:
    table_at(npu, hw.REG_MMU_CTX_LO, hw.REG_MMU_CTX_HI, hw.REG_MMU_CTX_COUNT, TARGETS[name].addr)
    npu.wr(hw.REG_CONTROL, hw.CONTROL_ENABLE)
    cpl = npu.run(fill(DATA, LEN, PATTERN, ctx=1))
    assert cpl.status == hw.ST_DMA_ERROR
    npu.assert_alive()


def test_a_completion_ring_whose_memory_went_away_after_enable_is_refused_at_use(
    npu: Npu,
) -> None:
    # Enabled with its completions in the peer's device memory (RAM), then
    # the peer stops decoding memory: the map changed, the use checks again.
    npu.qwr(hw.Q_CONTROL, 0)
    npu.program_queue(size=64, cpl=PEER_BAR2)
    npu.qwr(hw.Q_CONTROL, hw.QCTL_ENABLE)
    assert npu.qrd(hw.Q_CONTROL) == hw.QCTL_ENABLE
    peer = PciFunction(npu.qt, 0, PEER_NPU_SLOT, 0)
    peer.write32(0x04, peer.read32(0x04) & ~0x2 & 0xFFFF)  # memory space off
    npu.push(fill(DATA, LEN, PATTERN))
    npu.doorbell()
    deadline = time.monotonic() + EVENT_ANSWER_S
    while not npu.qrd(hw.Q_STATUS) & hw.QSTAT_STOPPED:
        assert time.monotonic() < deadline, "the queue did not stop"
    assert npu.qrd(hw.Q_ERROR) == hw.ERR_CPL_WRITE
    npu.assert_alive()


# --------------------------------------------------------------------------
# A write into ROM in flight, and an event that waits for the engine
# --------------------------------------------------------------------------

EVENT_ANSWER_S = 5.0  # QEMU answers long before this, or it never would


def d3hot(npu: Npu) -> None:
    cap = npu.pci.find_capability(PCI_CAP_ID_PM)
    npu.pci.write16(cap + PCI_PM_CTRL, (npu.pci.read16(cap + PCI_PM_CTRL) & ~3) | D3HOT)


def system_reset(npu: Npu) -> None:
    npu.qt.command("outb 0xcf9 0x6")  # the q35 reset control register: a hard reset


def soft_reset(npu: Npu) -> None:
    npu.wr(hw.REG_CONTROL, hw.CONTROL_RESET)


def queue_disable(npu: Npu) -> None:
    npu.qwr(hw.Q_CONTROL, 0)


EVENTS = {
    "d3hot": d3hot,
    "system-reset": system_reset,
    "soft-reset": soft_reset,
    "queue-disable": queue_disable,
}
# Writes into ROM, which QEMU would serve as MMIO, one BQL round trip per
# word (the old engine did), and into another device's MMIO, refused before
# any access: many of them, so that the event surely finds one running.
SLOW_WRITES = {
    "fill-bios-rom": [fill(BIOS_BASE, 0x4_0000, PATTERN)] * 48,
    "copy-into-option-rom-bar": [copy(DATA, TESTDEV_ROM, ROM_BYTES)] * 48,
    "fill-other-device-mmio-bar": [fill(TESTDEV_BAR0, 0x1000, PATTERN)] * 48,
}


ROUNDS = 5  # the old engine deadlocked in about one round of three


def back_to_work(npu: Npu, event: str) -> None:
    """After the event: the device powered, its queue 0 running again."""
    if event == "d3hot":
        cap = npu.pci.find_capability(PCI_CAP_ID_PM)
        npu.pci.write16(cap + PCI_PM_CTRL, npu.pci.read16(cap + PCI_PM_CTRL) & ~3)
    if event in ("d3hot", "soft-reset"):
        deadline = time.monotonic() + EVENT_ANSWER_S
        while npu.rd(hw.REG_STATUS) & hw.STATUS_RESETTING:
            assert time.monotonic() < deadline, "the reset did not finish"
    npu.wr(hw.REG_CONTROL, 0)
    npu.qwr(hw.Q_CONTROL, 0)
    npu.start()


@pytest.mark.parametrize("write", SLOW_WRITES)
@pytest.mark.parametrize("event", EVENTS)
def test_an_event_that_waits_for_the_engine_is_answered_during_a_write_into_rom(
    npu: Npu, event: str, write: str
) -> None:
    bios = npu.qt.memread(BIOS, LEN)
    for _ in range(1 if event == "system-reset" else ROUNDS):
        npu.push(fill(DATA, LEN, 0), *SLOW_WRITES[write], fill(DATA, LEN, PATTERN))
        npu.doorbell()
        time.sleep(0.02)  # the old engine: well inside its writes into ROM by now
        t0 = time.monotonic()
        EVENTS[event](npu)  # a deadlock: this or the next command never answers
        npu.qt.memread(DATA, 4)
        assert time.monotonic() - t0 < EVENT_ANSWER_S
        assert npu.qt.alive()
        assert npu.qt.memread(BIOS, LEN) == bios
        if event != "system-reset":  # that one unmaps the BARs and clears COMMAND
            back_to_work(npu, event)
            npu.assert_alive()


def test_a_write_into_rom_fails_the_command_and_the_queue_goes_on(npu: Npu) -> None:
    bios = npu.qt.memread(BIOS, LEN)
    first = npu.submit(fill(BIOS_BASE, 0x4_0000, PATTERN, 1), fill(DATA, LEN, PATTERN, 2))[0]
    npu.wait_head(first + 2)
    statuses = [c.status for c in npu.completions(first, 2)]
    assert statuses == [hw.ST_DMA_ERROR, hw.ST_OK]
    assert npu.qt.memread(BIOS, LEN) == bios
    assert npu.fence_wb()[0] == 2


def test_a_refused_access_is_traced_and_logged_as_a_guest_error(tmp_path: Path) -> None:
    log = tmp_path / "qemu.log"
    npu = Npu(log, extra_args=["-trace", "npu_guest_error", "-d", "guest_errors"])
    try:
        npu.start()
        assert npu.run(fill(BIOS, LEN, PATTERN)).status == hw.ST_DMA_ERROR
        npu.assert_alive()
    finally:
        npu.close()
    lines = log.read_text().splitlines()
    refusal = f"npu: tensor DMA to {BIOS:#x} refused: not RAM the device may write"
    assert f"npu_guest_error {refusal}" in lines  # the trace event
    assert refusal in lines  # the guest-error log


def test_every_wait_for_the_engine_under_the_bql_lets_the_bql_go(tmp_path: Path) -> None:
    # The trace event npu_engine_wait names each wait of a BQL holder for
    # the engine (a reset's hold phase, D3hot, a queue disable, tracing
    # turned off) and whether the BQL was released meanwhile: always.
    log = tmp_path / "qemu.log"
    npu = Npu(log, extra_args=["-trace", "npu_engine_wait"])
    try:
        for event in ("d3hot", "soft-reset", "queue-disable"):
            npu.start()
            npu.push(*[fill(DATA, 16 << 20, 0)] * 8)
            npu.doorbell()
            time.sleep(0.005)
            EVENTS[event](npu)
            back_to_work(npu, event)
        npu.push(*[fill(DATA, 16 << 20, 0)] * 8)
        npu.doorbell()
        time.sleep(0.005)
        system_reset(npu)
        npu.qt.memread(DATA, 4)
    finally:
        npu.close()
    waits = [line for line in log.read_text().splitlines() if "npu_engine_wait" in line]
    assert any(w.startswith("npu_engine_wait reset:") for w in waits), waits
    assert waits and all(w.endswith("BQL released 1") for w in waits), waits
