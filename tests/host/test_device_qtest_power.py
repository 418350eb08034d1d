"""PCI power management of the device (docs/npu-spec.md, "Power management"), through qtest.

The device has a PCI PM capability with D0 and D3hot. In D3hot QEMU's PCI
core unmaps the BARs; the move into D3hot powers the device down: the running
command is dropped and every register, queue and the firmware return to their
power-on state, so a driver must program the device and boot its firmware
again after D0. Device memory (BAR2) keeps its contents.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from qtest import Npu, fill, hw

PCI_CAP_ID_PM = 0x01
PCI_PM_PMC = 2
PCI_PM_CTRL = 4
PCI_PM_CAP_VER_MASK = 0x0007
PCI_PM_CAP_D1 = 0x0200
PCI_PM_CAP_D2 = 0x0400
PCI_PM_CTRL_NO_SOFT_RESET = 0x0008
D0, D3HOT = 0, 3
BUF = 0x100_0000


@pytest.fixture
def npu(tmp_path: Path) -> Iterator[Npu]:
    dev = Npu(tmp_path / "qtest.log", "npu,boot-rom=off")
    try:
        yield dev
    finally:
        dev.close()


def pm(npu: Npu) -> int:
    return npu.pci.find_capability(PCI_CAP_ID_PM)


def set_state(npu: Npu, state: int) -> None:
    cap = pm(npu)
    npu.pci.write16(cap + PCI_PM_CTRL, (npu.pci.read16(cap + PCI_PM_CTRL) & ~3) | state)


def state(npu: Npu) -> int:
    return npu.pci.read16(pm(npu) + PCI_PM_CTRL) & 3


def test_the_pm_capability_is_version_1_2_with_d0_and_d3hot_only(npu: Npu) -> None:
    pmc = npu.pci.read16(pm(npu) + PCI_PM_PMC)
    assert pmc & PCI_PM_CAP_VER_MASK == 3  # PCI PM 1.2
    assert not pmc & (PCI_PM_CAP_D1 | PCI_PM_CAP_D2)


def test_the_device_starts_in_d0_and_loses_its_state_in_d3hot(npu: Npu) -> None:
    ctrl = npu.pci.read16(pm(npu) + PCI_PM_CTRL)
    assert ctrl & 3 == D0
    assert not ctrl & PCI_PM_CTRL_NO_SOFT_RESET


def test_d3hot_is_entered_and_left_on_request(npu: Npu) -> None:
    set_state(npu, D3HOT)
    assert state(npu) == D3HOT
    set_state(npu, D0)
    assert state(npu) == D0


def test_d1_and_d2_are_refused(npu: Npu) -> None:
    for s in (1, 2):
        set_state(npu, s)
        assert state(npu) == D0


def test_registers_are_back_at_power_on_after_d3hot(npu: Npu) -> None:
    npu.wr(hw.REG_SCRATCH, 0x1234_5678)
    npu.wr(hw.REG_IRQ_MASK, 0xF)
    npu.start()
    set_state(npu, D3HOT)
    set_state(npu, D0)
    assert npu.rd(hw.REG_MAGIC) == hw.MAGIC
    assert npu.rd(hw.REG_SCRATCH) == 0
    assert npu.rd(hw.REG_IRQ_MASK) == 0
    assert npu.rd(hw.REG_CONTROL) == 0
    assert npu.qrd(hw.Q_CONTROL) == 0
    assert npu.rd(hw.REG_FW_STATUS) == hw.FW_OFF


def test_the_bars_do_not_answer_in_d3hot(npu: Npu) -> None:
    npu.wr(hw.REG_SCRATCH, 0xA5A5_A5A5)
    set_state(npu, D3HOT)
    assert npu.rd(hw.REG_MAGIC) != hw.MAGIC
    set_state(npu, D0)
    assert npu.rd(hw.REG_MAGIC) == hw.MAGIC


def test_device_memory_keeps_its_contents_across_d3hot(npu: Npu) -> None:
    assert npu.map_mem(), "the device has no BAR2 memory"
    assert npu.bar2 is not None
    npu.qt.memwrite(npu.bar2 + 0x1000, b"kept in self-refresh")
    set_state(npu, D3HOT)
    set_state(npu, D0)
    assert npu.qt.memread(npu.bar2 + 0x1000, 20) == b"kept in self-refresh"


def test_the_device_works_again_after_d3hot_dropped_a_running_command(tmp_path: Path) -> None:
    dev = Npu(tmp_path / "qtest.log")  # firmware in ROM: queues run from reset
    try:
        dev.start()
        dev.submit(fill(BUF, 64 << 20, 0x11111111, 1))
        set_state(dev, D3HOT)
        set_state(dev, D0)
        dev.assert_alive()
        assert dev.qrd(hw.Q_CONTROL) == 0  # power-on state: queue 0 disabled
        dev.start()
        dev.submit(fill(BUF, 4096, 0x22222222, 2))
        dev.wait_head(1, timeout=10)
        assert dev.qt.memread(BUF, 4096) == b"\x22" * 4096
    finally:
        dev.close()
