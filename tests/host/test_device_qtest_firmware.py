"""The device firmware: boot, validation, heartbeat, mailbox and log ring, through qtest.

Until a firmware runs (FW_STATUS = RUNNING) the device runs no command. The
driver puts an image (include/npu_fw.h, built by scripts/mkfw.py) in memory,
writes FW_ADDR/FW_SIZE and FW_CONTROL.BOOT; the device reads it once,
validates it and runs it, or reports FAILED with FW_ERROR. The image names
the opcodes the firmware runs (others complete BAD_OPCODE), the heartbeat
period (FW_HEARTBEAT counts periods of device time) and the log level of
the log ring (FW_LOG_*). The mailbox (MBOX_*) answers PING, QUERY,
SET_LOG_LEVEL and RESET_QUEUE, echoing MBOX_SEQ in MBOX_RESP_SEQ and raising
NPU_IRQ_MBOX. INJECT.FW_CRASH stops the firmware at once (CRASHED). A soft
reset keeps a running firmware and clears a crashed one; a system (PCI)
reset turns it off. docs/firmware.md is the prose version.

These tests run the device with ``boot-rom=off`` (the engine tests' rig
default, ``boot-rom=on``, starts a built-in firmware at reset; the ``rom``
fixture covers that). Under qtest the virtual clock moves only on
``clock_step``, so heartbeat counts are exact.
"""

from __future__ import annotations

import importlib.util
import json
import struct
import time
import zlib
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from qtest import BAR0_BASE, DATA, REPO, U32, U64, Npu, copy, fill, hw, nop


def _load_mkfw() -> ModuleType:
    spec = importlib.util.spec_from_file_location("mkfw", REPO / "scripts" / "mkfw.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


mkfw = _load_mkfw()
MANIFEST: dict[str, Any] = json.loads((REPO / "firmware" / "npu_fw.json").read_text())

IMAGE = DATA + (64 << 20)  # where the tests put an image (up to 2 MiB)
LOG = DATA + (80 << 20)  # the log ring: struct npu_fw_log, then the text
LOG_HEAD = 8  # sizeof(struct npu_fw_log)
LOG_SIZE = 4096
BUF = DATA  # data the commands move
MSI_MAILBOX = 0x16_0000  # MSI-X vector v writes its data word at MSI_MAILBOX + 16 * v
PCI_CAP_ID_MSIX = 0x11
BUILD_ID = 32  # offset of npu_fw_header.build_id
SEC_OPCODES, SEC_HEARTBEAT, SEC_LOG_LEVEL = 1, 2, 3
SEC_OPTIONAL = 1 << 31
# How long commands are watched to see that they do not run (real time).
IDLE_WATCH_S = 0.2


# --------------------------------------------------------------------------
# Images
# --------------------------------------------------------------------------


def manifest(**changes: Any) -> dict[str, Any]:
    return {**MANIFEST, **changes}


def image(**kwargs: Any) -> bytes:
    """An image of the project's manifest; ``m`` replaces manifest fields."""
    return bytes(mkfw.build_image(manifest(**kwargs.pop("m", {})), **kwargs))


def section(kind: int, data: bytes) -> bytes:
    """One ``struct npu_fw_section`` and its data, padded to 4 bytes."""
    return struct.pack("<II", kind, len(data)) + data + bytes(-len(data) % 4)


def u32_section(kind: int, value: int) -> bytes:
    return section(kind, struct.pack("<I", value))


def raw_image(payload: bytes, *, version: int = 0x1_0000, flags: int = 0) -> bytes:
    """An image of exactly ``payload`` with a consistent header (CRCs right)."""
    fields = [
        mkfw.MAGIC,
        mkfw.HEADER_SIZE,
        version,
        hw.ABI_VERSION,
        len(payload),
        zlib.crc32(payload),
        0,
        flags,
    ]
    build_id = b"raw".ljust(32, b"\0")
    fields[6] = zlib.crc32(struct.pack("<8I", *fields) + build_id)
    return struct.pack("<8I", *fields) + build_id + payload


def opcode_mask(names: list[str]) -> int:
    return sum(1 << getattr(hw, f"OP_{n}") for n in set(names))


def flipped(img: bytes, offset: int) -> bytes:
    return img[:offset] + bytes([img[offset] ^ 0x01]) + img[offset + 1 :]


def boot_line(m: dict[str, Any]) -> str:
    """The line a booting firmware logs (level 1)."""
    major, minor = (int(x) for x in str(m["version"]).split("."))
    note = f" - {m['note']}" if m.get("note") else ""
    return (
        f"npu-fw {major}.{minor} booted: opcodes {opcode_mask(m['opcodes']):#x}"
        f" heartbeat {m['heartbeat_us']} us{note}\n"
    )


# --------------------------------------------------------------------------
# The device
# --------------------------------------------------------------------------


@pytest.fixture
def npu(tmp_path: Path) -> Iterator[Npu]:
    """An NPU without a boot ROM: no firmware runs until one is booted."""
    dev = Npu(tmp_path / "qtest.log", device="npu,boot-rom=off")
    try:
        yield dev
    finally:
        dev.close()


@pytest.fixture
def booted(npu: Npu) -> Npu:
    """``npu`` running the project's image, queue 0 started."""
    assert boot(npu, image()) == (hw.FW_RUNNING, hw.FWERR_NONE)
    npu.start()
    return npu


@pytest.fixture
def rom(tmp_path: Path) -> Iterator[Npu]:
    """An NPU with its firmware in ROM (the engine tests' default)."""
    dev = Npu(tmp_path / "qtest.log", device="npu,boot-rom=on")
    try:
        yield dev
    finally:
        dev.close()


def load(npu: Npu, img: bytes, addr: int = IMAGE, size: int | None = None) -> None:
    """Put ``img`` at ``addr`` and point FW_ADDR/FW_SIZE at it (no boot)."""
    npu.qt.memwrite(addr, img)
    npu.wr(hw.REG_FW_ADDR_LO, addr & U32)
    npu.wr(hw.REG_FW_ADDR_HI, addr >> 32)
    npu.wr(hw.REG_FW_SIZE, len(img) if size is None else size)


def fw_state(npu: Npu) -> tuple[int, int]:
    """(FW_STATUS, FW_ERROR)."""
    return npu.rd(hw.REG_FW_STATUS), npu.rd(hw.REG_FW_ERROR)


def boot(npu: Npu, img: bytes, addr: int = IMAGE, size: int | None = None) -> tuple[int, int]:
    """Load ``img`` and write FW_CONTROL.BOOT; return (FW_STATUS, FW_ERROR)."""
    load(npu, img, addr, size)
    npu.wr(hw.REG_FW_CONTROL, hw.FW_BOOT)
    return fw_state(npu)


def fw_regs(npu: Npu) -> dict[str, int]:
    names = ("ADDR_LO", "ADDR_HI", "SIZE", "STATUS", "ERROR", "VERSION", "HEARTBEAT")
    return {name: npu.rd(getattr(hw, "REG_FW_" + name)) for name in names}


def program_log(npu: Npu, base: int = LOG, size: int = LOG_SIZE) -> None:
    npu.wr(hw.REG_FW_LOG_LO, base & U32)
    npu.wr(hw.REG_FW_LOG_HI, base >> 32)
    npu.wr(hw.REG_FW_LOG_SIZE, size)


def log_head(npu: Npu, base: int = LOG) -> tuple[int, int]:
    """(write, size) of the ring's struct npu_fw_log."""
    write, size = struct.unpack("<II", npu.qt.memread(base, LOG_HEAD))
    return write, size


def log_text(npu: Npu, base: int = LOG) -> str:
    """The ring's text, oldest byte first (what a reader reconstructs from the head)."""
    write, size = log_head(npu, base)
    ring = npu.qt.memread(base + LOG_HEAD, size)
    n = min(write, size)
    return bytes(ring[(write - n + i) % size] for i in range(n)).decode()


def mbox(npu: Npu, cmd: int, arg0: int = 0, arg1: int = 0, seq: int = 1) -> tuple[int, ...]:
    """Send one request; return (RESP_SEQ, RESP_STATUS, RESP0, RESP1)."""
    npu.wr(hw.REG_MBOX_CMD, cmd)
    npu.wr(hw.REG_MBOX_ARG0, arg0)
    npu.wr(hw.REG_MBOX_ARG1, arg1)
    npu.wr(hw.REG_MBOX_SEQ, seq)
    names = ("RESP_SEQ", "RESP_STATUS", "RESP0", "RESP1")
    return tuple(npu.rd(getattr(hw, "REG_MBOX_" + name)) for name in names)


def submit_and_watch(npu: Npu, *descs: bytes) -> list[int]:
    """Ring the doorbell for ``descs`` and check that none of them runs."""
    idx = npu.submit(*descs)
    time.sleep(IDLE_WATCH_S)
    assert npu.qrd(hw.Q_HEAD) == idx[0], "a command ran without a firmware"
    assert all(untouched(c) for c in npu.completions(idx[0], len(idx)))
    return idx


def untouched(cpl: Any) -> bool:
    """The completion slot still holds the 0xEE bytes Npu.start() put there."""
    return bool(cpl.fence == 0xEEEE_EEEE_EEEE_EEEE)


def system_reset(npu: Npu) -> None:
    """Reset the machine (ICH9 reset control, port 0xcf9), then map the BARs again.

    Every device gets its qdev reset, the NPU's being the PCI reset; its
    config space is cleared, so the BARs are placed again as Npu() did.
    """
    npu.qt.command("outb 0xcf9 0x6")
    deadline = time.monotonic() + 10
    while npu.pci.read32(0x04) & 0x2:  # memory decoding: on until the reset
        assert time.monotonic() < deadline, "the system reset did not happen"
        time.sleep(0.01)
    npu.pci.map_bar(hw.BAR_REGS, npu.bar0)
    npu.pci.map_bar(hw.BAR_MSIX, npu.bar4)
    npu.pci.enable()
    npu.tail = 0


# --------------------------------------------------------------------------
# Boot
# --------------------------------------------------------------------------


def test_without_a_boot_rom_the_firmware_is_off(npu: Npu) -> None:
    assert fw_regs(npu) == {"ADDR_LO": 0, "ADDR_HI": 0, "SIZE": 0, "STATUS": hw.FW_OFF,
                            "ERROR": hw.FWERR_NONE, "VERSION": 0, "HEARTBEAT": 0}  # fmt: skip
    npu.qt.clock_step(100_000_000)
    assert npu.rd(hw.REG_FW_HEARTBEAT) == 0, "no firmware: no heartbeat"
    npu.assert_alive()


def test_queued_commands_wait_until_a_firmware_boots_then_run(npu: Npu) -> None:
    npu.start()
    npu.qt.memset(BUF, 0x1000, 0)
    idx = submit_and_watch(npu, fill(BUF, 0x1000, 0x600DF00D, fence=1), nop(2))
    assert npu.qrd(hw.Q_STATUS) & hw.QSTAT_ACTIVE == 0
    assert npu.qt.readl(BUF) == 0, "nothing was written"
    assert boot(npu, image()) == (hw.FW_RUNNING, hw.FWERR_NONE)
    npu.wait_head(idx[-1] + 1)
    cpls = npu.completions(idx[0], 2)
    assert [(c.status, c.fence) for c in cpls] == [(hw.ST_OK, 1), (hw.ST_OK, 2)]
    assert npu.qt.memread(BUF, 0x1000) == struct.pack("<I", 0x600DF00D) * 0x400
    npu.assert_alive()


def test_fw_version_is_the_booted_images_header_version(npu: Npu) -> None:
    assert boot(npu, image(m={"version": "2.7"})) == (hw.FW_RUNNING, hw.FWERR_NONE)
    assert npu.rd(hw.REG_FW_VERSION) == 2 << 16 | 7
    npu.assert_alive()


def test_the_boot_rom_firmware_runs_from_reset_with_every_opcode(rom: Npu) -> None:
    assert fw_state(rom) == (hw.FW_RUNNING, hw.FWERR_NONE)
    rom.start()
    rom.qt.memset(BUF, 0x2000, 0x5A)
    assert rom.run(copy(BUF, BUF + 0x1000, 0x1000, fence=1)).status == hw.ST_OK
    assert rom.run(fill(BUF, 0x1000, 0x12345678, fence=2)).status == hw.ST_OK
    assert rom.qt.readl(BUF) == 0x12345678
    rom.assert_alive()


# --------------------------------------------------------------------------
# Rejected images
# --------------------------------------------------------------------------


def _bad_size_cases() -> list[Any]:
    img = image()
    return [
        pytest.param(img, 0, id="size-0"),
        pytest.param(img, hw.FW_MAX_SIZE + 1, id="size-over-1MiB"),
        pytest.param(img, len(img) - 4, id="size-below-the-headers"),
        pytest.param(img + bytes(4), len(img) + 4, id="size-above-the-headers"),
        pytest.param(img[:32], 32, id="shorter-than-a-header"),
    ]


@pytest.mark.parametrize(("img", "size"), _bad_size_cases())
def test_an_image_of_the_wrong_size_fails_with_fwerr_size(npu: Npu, img: bytes, size: int) -> None:
    assert boot(npu, img, size=size) == (hw.FW_FAILED, hw.FWERR_SIZE)
    assert npu.rd(hw.REG_FW_VERSION) == 0
    npu.assert_alive()


def test_an_image_with_a_bad_magic_fails_with_fwerr_magic(npu: Npu) -> None:
    assert boot(npu, image(magic=0x12345678)) == (hw.FW_FAILED, hw.FWERR_MAGIC)
    npu.assert_alive()


def test_an_image_built_for_another_abi_fails_with_fwerr_abi(npu: Npu) -> None:
    assert boot(npu, image(abi=hw.ABI_VERSION + 1)) == (hw.FW_FAILED, hw.FWERR_ABI)
    npu.assert_alive()


def test_an_image_with_header_flags_set_fails_with_fwerr_abi(npu: Npu) -> None:
    img = raw_image(u32_section(SEC_OPCODES, 1), flags=1)
    assert boot(npu, img) == (hw.FW_FAILED, hw.FWERR_ABI)
    npu.assert_alive()


def test_a_header_crc_mismatch_fails_with_fwerr_checksum(npu: Npu) -> None:
    img = flipped(image(), BUILD_ID)  # the build id is covered by the header CRC only
    assert boot(npu, img) == (hw.FW_FAILED, hw.FWERR_CHECKSUM)
    npu.assert_alive()


def test_a_payload_crc_mismatch_fails_with_fwerr_checksum(npu: Npu) -> None:
    img = image()
    assert boot(npu, flipped(img, len(img) - 8)) == (hw.FW_FAILED, hw.FWERR_CHECKSUM)
    npu.assert_alive()


MALFORMED = {
    "truncated-section-data": dict(extra_sections=struct.pack("<II", SEC_OPTIONAL | 9, 64) + b"x"),
    "truncated-section-header": dict(extra_sections=struct.pack("<I", SEC_OPTIONAL | 9)),
    "unknown-mandatory-section": dict(extra_sections=u32_section(0x55, 0)),
    "opcodes-without-nop": dict(m={"opcodes": ["COPY", "FILL"]}),
    "opcodes-section-not-4-bytes": dict(extra_sections=section(SEC_OPCODES, bytes(8))),
    "heartbeat-below-100-us": dict(m={"heartbeat_us": 99}),
    "heartbeat-above-1-s": dict(m={"heartbeat_us": 1_000_001}),
    "log-level-above-3": dict(m={"log_level": 4}),
}


@pytest.mark.parametrize("kwargs", MALFORMED.values(), ids=MALFORMED.keys())
def test_a_malformed_section_fails_with_fwerr_format(npu: Npu, kwargs: dict[str, Any]) -> None:
    assert boot(npu, image(**kwargs)) == (hw.FW_FAILED, hw.FWERR_FORMAT)
    npu.assert_alive()


def test_an_image_without_an_opcodes_section_fails_with_fwerr_format(npu: Npu) -> None:
    img = raw_image(u32_section(SEC_HEARTBEAT, 1000) + u32_section(SEC_LOG_LEVEL, 1))
    assert boot(npu, img) == (hw.FW_FAILED, hw.FWERR_FORMAT)
    npu.assert_alive()


def test_an_unknown_optional_section_is_ignored(npu: Npu) -> None:
    extra = section(SEC_OPTIONAL | 0x55, b"from a newer mkfw")
    assert boot(npu, image(extra_sections=extra)) == (hw.FW_RUNNING, hw.FWERR_NONE)
    npu.assert_alive()


@pytest.mark.parametrize(("heartbeat_us", "log_level"), [(100, 0), (1_000_000, 3)])
def test_the_limits_of_the_heartbeat_and_log_level_are_accepted(
    npu: Npu, heartbeat_us: int, log_level: int
) -> None:
    img = image(m={"heartbeat_us": heartbeat_us, "log_level": log_level})
    assert boot(npu, img) == (hw.FW_RUNNING, hw.FWERR_NONE)
    npu.assert_alive()


@pytest.mark.parametrize(
    "addr", [BAR0_BASE, U64 - 0xFF], ids=["in-the-devices-own-bar", "address-overflows"]
)
def test_an_image_the_device_cannot_read_fails_with_fwerr_dma(npu: Npu, addr: int) -> None:
    npu.wr(hw.REG_FW_ADDR_LO, addr & U32)
    npu.wr(hw.REG_FW_ADDR_HI, addr >> 32)
    npu.wr(hw.REG_FW_SIZE, len(image()))
    npu.wr(hw.REG_FW_CONTROL, hw.FW_BOOT)
    assert fw_state(npu) == (hw.FW_FAILED, hw.FWERR_DMA)
    npu.assert_alive()


def test_a_note_ending_the_image_without_a_nul_is_read_within_the_image(npu: Npu) -> None:
    # The last section is a NOTE whose text fills it to the image's last
    # byte: no NUL, no padding. Under ASan an over-read fails the test.
    note = b"built by hand"[:12]
    program_log(npu)
    img = raw_image(u32_section(SEC_OPCODES, 1) + section(SEC_OPTIONAL | 4, note))
    assert boot(npu, img) == (hw.FW_RUNNING, hw.FWERR_NONE)
    assert log_text(npu).splitlines()[0].endswith(" - " + note.decode())
    npu.assert_alive()


def test_after_a_failed_boot_commands_still_wait_and_a_good_image_boots(npu: Npu) -> None:
    npu.start()
    assert boot(npu, image(magic=0)) == (hw.FW_FAILED, hw.FWERR_MAGIC)
    idx = submit_and_watch(npu, nop(1))
    assert boot(npu, image()) == (hw.FW_RUNNING, hw.FWERR_NONE), "FW_ERROR clears on success"
    npu.wait_head(idx[0] + 1)
    assert npu.completion(idx[0]).status == hw.ST_OK
    npu.assert_alive()


def test_a_failed_boot_after_a_crash_leaves_no_version(booted: Npu) -> None:
    booted.wr(hw.REG_INJECT, hw.INJECT_FW_CRASH)
    assert booted.rd(hw.REG_FW_VERSION) == 0x1_0000, "a crashed firmware keeps its version"
    assert boot(booted, image(abi=0)) == (hw.FW_FAILED, hw.FWERR_ABI)
    assert booted.rd(hw.REG_FW_VERSION) == 0
    booted.assert_alive()


def test_an_opcode_missing_from_the_image_completes_bad_opcode(npu: Npu) -> None:
    assert boot(npu, image(m={"opcodes": ["NOP", "COPY"]}))[0] == hw.FW_RUNNING
    npu.start()
    npu.qt.memset(BUF, 0x2000, 0x33)
    cpl = npu.run(fill(BUF, 0x1000, 0x44444444, fence=1))
    assert (cpl.status, cpl.opcode, cpl.fence) == (hw.ST_BAD_OPCODE, hw.OP_FILL, 1)
    assert npu.qt.memread(BUF, 0x1000) == b"\x33" * 0x1000, "the FILL did not run"
    assert npu.qrd(hw.Q_STATUS) & hw.QSTAT_STOPPED == 0, "a bad opcode does not stop the queue"
    assert npu.run(copy(BUF, BUF + 0x1000, 0x1000, fence=2)).status == hw.ST_OK
    assert npu.run(nop(3)).status == hw.ST_OK
    npu.assert_alive()


# --------------------------------------------------------------------------
# The firmware registers while it runs
# --------------------------------------------------------------------------


def test_the_image_registers_are_read_only_while_the_firmware_runs(booted: Npu) -> None:
    before = fw_regs(booted)
    booted.wr(hw.REG_FW_ADDR_LO, 0x1000)
    booted.wr(hw.REG_FW_ADDR_HI, 1)
    booted.wr(hw.REG_FW_SIZE, 0x100)
    assert fw_regs(booted) == before
    assert (before["ADDR_LO"], before["SIZE"]) == (IMAGE, len(image()))
    booted.assert_alive()


def test_boot_while_the_firmware_runs_is_ignored(booted: Npu) -> None:
    booted.qt.clock_step(50_000_000)
    hb = booted.rd(hw.REG_FW_HEARTBEAT)
    booted.qt.memwrite(IMAGE, image(m={"version": "9.9"}))  # same size, other version
    booted.wr(hw.REG_FW_CONTROL, hw.FW_BOOT)
    assert fw_state(booted) == (hw.FW_RUNNING, hw.FWERR_NONE)
    assert booted.rd(hw.REG_FW_VERSION) == 0x1_0000, "the image was not read again"
    assert booted.rd(hw.REG_FW_HEARTBEAT) == hb, "the heartbeat did not restart"
    booted.assert_alive()


def test_fw_stop_turns_the_firmware_off_and_commands_wait_again(booted: Npu) -> None:
    assert booted.run(nop(1)).status == hw.ST_OK
    booted.wr(hw.REG_FW_CONTROL, hw.FW_STOP)
    regs = fw_regs(booted)
    assert (regs["STATUS"], regs["VERSION"], regs["HEARTBEAT"]) == (hw.FW_OFF, 0, 0)
    idx = submit_and_watch(booted, nop(2))
    assert mbox(booted, hw.MBOX_PING, seq=5)[0] != 5, "a stopped firmware does not answer"
    booted.wr(hw.REG_FW_CONTROL, hw.FW_BOOT)  # FW_ADDR/SIZE still name the image
    assert fw_state(booted) == (hw.FW_RUNNING, hw.FWERR_NONE)
    booted.wait_head(idx[0] + 1)
    assert booted.completion(idx[0]).status == hw.ST_OK
    booted.assert_alive()


# --------------------------------------------------------------------------
# Heartbeat and crash
# --------------------------------------------------------------------------


def test_the_heartbeat_counts_periods_of_device_time(npu: Npu) -> None:
    assert boot(npu, image(m={"heartbeat_us": 1000}))[0] == hw.FW_RUNNING
    hb = npu.rd(hw.REG_FW_HEARTBEAT)
    time.sleep(0.05)
    assert npu.rd(hw.REG_FW_HEARTBEAT) == hb, "host time does not move the device clock"
    npu.qt.clock_step(10_000_000)  # 10 ms = 10 periods
    assert npu.rd(hw.REG_FW_HEARTBEAT) == hb + 10
    npu.qt.clock_step(2_500_000)
    assert npu.rd(hw.REG_FW_HEARTBEAT) == hb + 12, "whole periods only"
    npu.assert_alive()


def test_an_injected_crash_freezes_the_heartbeat(booted: Npu) -> None:
    booted.qt.clock_step(100_000_000)
    hb = booted.rd(hw.REG_FW_HEARTBEAT)
    assert hb == 10  # 100 ms of 10 ms periods
    booted.wr(hw.REG_INJECT, hw.INJECT_FW_CRASH)
    assert fw_state(booted) == (hw.FW_CRASHED, hw.FWERR_NONE)
    assert booted.rd(hw.REG_INJECT) == 0, "FW_CRASH fires on the write: nothing stays armed"
    booted.qt.clock_step(100_000_000)
    assert booted.rd(hw.REG_FW_HEARTBEAT) == hb
    booted.assert_alive()


def test_a_crashed_firmware_runs_no_command(booted: Npu) -> None:
    booted.wr(hw.REG_INJECT, hw.INJECT_FW_CRASH)
    submit_and_watch(booted, nop(1), fill(BUF, 0x1000, 0, fence=2))
    booted.assert_alive()


def test_a_crashed_firmware_does_not_answer_the_mailbox(booted: Npu) -> None:
    assert mbox(booted, hw.MBOX_PING, 1, seq=1)[:2] == (1, hw.MBOX_OK)
    booted.wr(hw.REG_IRQ_STATUS, U32)
    booted.wr(hw.REG_INJECT, hw.INJECT_FW_CRASH)
    assert mbox(booted, hw.MBOX_PING, 7, seq=2) == (1, hw.MBOX_OK, 2, 0), "last answer stays"
    assert booted.rd(hw.REG_IRQ_STATUS) & hw.IRQ_MBOX == 0
    booted.assert_alive()


def test_a_crash_injected_without_a_running_firmware_does_nothing(npu: Npu) -> None:
    npu.wr(hw.REG_INJECT, hw.INJECT_FW_CRASH)
    assert fw_state(npu) == (hw.FW_OFF, hw.FWERR_NONE)
    assert npu.rd(hw.REG_INJECT) == 0
    assert boot(npu, image()) == (hw.FW_RUNNING, hw.FWERR_NONE), "not armed for later"
    npu.assert_alive()


def test_fw_stop_turns_a_crashed_firmware_off(booted: Npu) -> None:
    booted.wr(hw.REG_INJECT, hw.INJECT_FW_CRASH)
    booted.wr(hw.REG_FW_CONTROL, hw.FW_STOP)
    assert fw_state(booted) == (hw.FW_OFF, hw.FWERR_NONE)
    assert booted.rd(hw.REG_FW_HEARTBEAT) == 0
    booted.assert_alive()


def test_a_crashed_firmware_can_be_booted_again(booted: Npu) -> None:
    booted.wr(hw.REG_INJECT, hw.INJECT_FW_CRASH)
    idx = submit_and_watch(booted, nop(1))
    booted.wr(hw.REG_FW_CONTROL, hw.FW_BOOT)
    assert fw_state(booted) == (hw.FW_RUNNING, hw.FWERR_NONE)
    assert booted.rd(hw.REG_FW_HEARTBEAT) == 0, "a new boot restarts the heartbeat"
    booted.wait_head(idx[0] + 1)
    assert booted.completion(idx[0]).status == hw.ST_OK
    booted.assert_alive()


# --------------------------------------------------------------------------
# Resets
# --------------------------------------------------------------------------


def test_a_soft_reset_keeps_a_running_firmware(booted: Npu) -> None:
    program_log(booted)  # after the boot: the ring stays empty until a line comes
    booted.qt.clock_step(30_000_000)
    before = fw_regs(booted)
    booted.soft_reset()
    assert fw_regs(booted) == before, "state, version, image registers and heartbeat stay"
    assert booted.rd(hw.REG_FW_LOG_SIZE) == LOG_SIZE, "and so does the log configuration"
    booted.qt.clock_step(10_000_000)
    assert booted.rd(hw.REG_FW_HEARTBEAT) == before["HEARTBEAT"] + 1, "it keeps counting"
    booted.start()
    assert booted.run(nop(1)).status == hw.ST_OK
    booted.assert_alive()


def test_a_soft_reset_turns_a_crashed_firmware_off(booted: Npu) -> None:
    booted.wr(hw.REG_INJECT, hw.INJECT_FW_CRASH)
    booted.soft_reset()
    assert fw_state(booted) == (hw.FW_OFF, hw.FWERR_NONE)
    assert booted.rd(hw.REG_FW_HEARTBEAT) == 0
    booted.start()
    idx = submit_and_watch(booted, nop(1))
    assert boot(booted, image()) == (hw.FW_RUNNING, hw.FWERR_NONE)
    booted.wait_head(idx[0] + 1)
    assert booted.completion(idx[0]).status == hw.ST_OK
    booted.assert_alive()


def test_a_soft_reset_that_turns_a_crashed_firmware_off_clears_its_version(booted: Npu) -> None:
    booted.wr(hw.REG_INJECT, hw.INJECT_FW_CRASH)
    booted.soft_reset()
    assert fw_state(booted) == (hw.FW_OFF, hw.FWERR_NONE)
    assert booted.rd(hw.REG_FW_VERSION) == 0


def test_a_system_reset_turns_the_firmware_off_and_clears_its_registers(booted: Npu) -> None:
    program_log(booted)
    mbox(booted, hw.MBOX_PING, seq=3)
    system_reset(booted)
    assert fw_regs(booted) == {"ADDR_LO": 0, "ADDR_HI": 0, "SIZE": 0, "STATUS": hw.FW_OFF,
                               "ERROR": hw.FWERR_NONE, "VERSION": 0, "HEARTBEAT": 0}  # fmt: skip
    log = [booted.rd(r) for r in (hw.REG_FW_LOG_LO, hw.REG_FW_LOG_HI, hw.REG_FW_LOG_SIZE)]
    assert log == [0, 0, 0]
    mbox_regs = ("CMD", "ARG0", "ARG1", "SEQ", "RESP_SEQ", "RESP_STATUS", "RESP0", "RESP1")
    assert [booted.rd(getattr(hw, "REG_MBOX_" + r)) for r in mbox_regs] == [0] * 8
    booted.start()
    idx = submit_and_watch(booted, nop(1))
    assert boot(booted, image()) == (hw.FW_RUNNING, hw.FWERR_NONE)
    booted.wait_head(idx[0] + 1)
    booted.assert_alive()


def test_a_system_reset_restarts_the_boot_rom_firmware(rom: Npu) -> None:
    rom.wr(hw.REG_INJECT, hw.INJECT_FW_CRASH)
    assert fw_state(rom) == (hw.FW_CRASHED, hw.FWERR_NONE)
    system_reset(rom)
    assert fw_state(rom) == (hw.FW_RUNNING, hw.FWERR_NONE)
    rom.start()
    assert rom.run(nop(1)).status == hw.ST_OK
    rom.assert_alive()


# --------------------------------------------------------------------------
# Mailbox
# --------------------------------------------------------------------------


def test_mailbox_ping_answers_arg0_plus_one_and_the_heartbeat(booted: Npu) -> None:
    booted.qt.clock_step(50_000_000)
    assert mbox(booted, hw.MBOX_PING, 41, seq=1) == (1, hw.MBOX_OK, 42, 5)
    assert mbox(booted, hw.MBOX_PING, U32, seq=2) == (2, hw.MBOX_OK, 0, 5), "arg0 + 1 wraps"
    booted.assert_alive()


@pytest.mark.parametrize("seq", [1, 0x8000_0000, U32, 0])
def test_mailbox_resp_seq_echoes_the_request_seq(booted: Npu, seq: int) -> None:
    resp_seq, status, *_ = mbox(booted, hw.MBOX_PING, seq=seq)
    assert (resp_seq, status) == (seq, hw.MBOX_OK)
    assert booted.rd(hw.REG_MBOX_SEQ) == seq
    booted.assert_alive()


def test_writing_mbox_seq_sends_the_request_and_nothing_else_does(booted: Npu) -> None:
    mbox(booted, hw.MBOX_PING, 1, seq=1)
    booted.wr(hw.REG_MBOX_CMD, hw.MBOX_QUERY)
    booted.wr(hw.REG_MBOX_ARG0, 100)
    booted.wr(hw.REG_MBOX_ARG1, 200)
    assert (booted.rd(hw.REG_MBOX_RESP_SEQ), booted.rd(hw.REG_MBOX_RESP0)) == (1, 2)
    assert [booted.rd(r) for r in (hw.REG_MBOX_CMD, hw.REG_MBOX_ARG0, hw.REG_MBOX_ARG1)] == [
        hw.MBOX_QUERY, 100, 200,
    ]  # fmt: skip
    booted.assert_alive()


def test_a_mailbox_answer_raises_irq_status_bit_30(booted: Npu) -> None:
    booted.wr(hw.REG_IRQ_STATUS, U32)
    mbox(booted, hw.MBOX_PING, seq=1)
    assert booted.rd(hw.REG_IRQ_STATUS) == hw.IRQ_MBOX == 1 << 30
    booted.wr(hw.REG_IRQ_STATUS, hw.IRQ_MBOX)
    assert booted.rd(hw.REG_IRQ_STATUS) == 0
    booted.assert_alive()


def test_a_mailbox_answer_signals_the_device_msix_vector(booted: Npu) -> None:
    cap = booted.pci.find_capability(PCI_CAP_ID_MSIX)
    for v in range(hw.MSIX_VECTORS):
        entry = struct.pack("<QII", MSI_MAILBOX + 16 * v, 0xA0 + v, 0)  # unmasked
        for off in range(0, 16, 4):
            booted.qt.writel(booted.bar4 + 16 * v + off, struct.unpack_from("<I", entry, off)[0])
    booted.pci.write16(cap + 2, 1 << 15)  # MSI-X enable
    booted.qt.memset(MSI_MAILBOX, 16 * hw.MSIX_VECTORS, 0)
    booted.wr(hw.REG_IRQ_MASK, hw.IRQ_MBOX)
    mbox(booted, hw.MBOX_PING, seq=1)
    deadline = time.monotonic() + 5
    while not booted.qt.readl(MSI_MAILBOX + 16 * hw.VEC_DEVICE) and time.monotonic() < deadline:
        time.sleep(0.001)
    assert booted.qt.readl(MSI_MAILBOX + 16 * hw.VEC_DEVICE) == 0xA0 + hw.VEC_DEVICE
    assert all(booted.qt.readl(MSI_MAILBOX + 16 * v) == 0 for v in range(1, hw.MSIX_VECTORS))
    booted.assert_alive()


def test_mailbox_query_answers_commands_completed_and_the_log_level(npu: Npu) -> None:
    assert boot(npu, image(m={"log_level": 2}))[0] == hw.FW_RUNNING
    npu.start()
    _, status, done, level = mbox(npu, hw.MBOX_QUERY, seq=1)
    assert (status, level) == (hw.MBOX_OK, 2)
    npu.submit(nop(1), nop(2), fill(BUF, 16, 0, fence=3))
    npu.wait_head(3)
    assert mbox(npu, hw.MBOX_QUERY, seq=2) == (2, hw.MBOX_OK, (done + 3) & U32, 2)
    npu.assert_alive()


def test_mailbox_set_log_level_changes_the_level_query_reports(booted: Npu) -> None:
    for seq, level in enumerate((3, 0, 1), start=1):
        assert mbox(booted, hw.MBOX_SET_LOG_LEVEL, level, seq=seq)[:2] == (seq, hw.MBOX_OK)
        assert mbox(booted, hw.MBOX_QUERY, seq=100 + seq)[3] == level
    booted.assert_alive()


@pytest.mark.parametrize("level", [4, U32])
def test_mailbox_set_log_level_above_3_is_bad_arg(booted: Npu, level: int) -> None:
    assert mbox(booted, hw.MBOX_SET_LOG_LEVEL, level, seq=1)[:2] == (1, hw.MBOX_BAD_ARG)
    assert mbox(booted, hw.MBOX_QUERY, seq=2)[3] == MANIFEST["log_level"], "level unchanged"
    booted.assert_alive()


def test_mailbox_reset_queue_disables_the_queue_and_clears_its_error(booted: Npu) -> None:
    booted.doorbell(booted.ring_size + 1)  # overrun: the queue stops with an error
    deadline = time.monotonic() + 5
    while not booted.qrd(hw.Q_STATUS) & hw.QSTAT_STOPPED:
        assert time.monotonic() < deadline, "the queue did not stop"
        time.sleep(0.001)
    assert booted.qrd(hw.Q_ERROR) == hw.ERR_RING_OVERRUN
    assert mbox(booted, hw.MBOX_RESET_QUEUE, 0, seq=1)[:2] == (1, hw.MBOX_OK)
    regs = (hw.Q_CONTROL, hw.Q_ERROR, hw.Q_HEAD, hw.Q_TAIL, hw.Q_RING_LO, hw.Q_RING_SIZE)
    assert [booted.qrd(r) for r in regs] == [0] * len(regs)
    assert booted.qrd(hw.Q_STATUS) == hw.QSTAT_IDLE
    assert fw_state(booted) == (hw.FW_RUNNING, hw.FWERR_NONE)
    booted.start()  # the queue works again once programmed
    assert booted.run(nop(1)).status == hw.ST_OK
    booted.assert_alive()


def test_mailbox_reset_queue_leaves_the_other_queues_alone(booted: Npu) -> None:
    booted.qwr(hw.Q_PRIORITY, 2, 1)
    assert mbox(booted, hw.MBOX_RESET_QUEUE, 1, seq=1)[:2] == (1, hw.MBOX_OK)
    assert booted.qrd(hw.Q_PRIORITY, 1) == 0
    assert booted.qrd(hw.Q_CONTROL) == hw.QCTL_ENABLE
    assert booted.run(nop(1)).status == hw.ST_OK
    booted.assert_alive()


def test_a_destroyed_queue_runs_nothing_until_the_firmware_creates_it(booted: Npu) -> None:
    assert mbox(booted, hw.MBOX_DESTROY_QUEUE, 0, seq=1)[:2] == (1, hw.MBOX_OK)
    assert booted.qrd(hw.Q_CONTROL) == 0, "destroying resets the queue"
    booted.start()  # programmed and enabled again, but not in the scheduler
    (index,) = booted.submit(nop(1))
    time.sleep(0.2)
    assert booted.qrd(hw.Q_HEAD) == index, "a queue the firmware did not create ran"
    assert mbox(booted, hw.MBOX_CREATE_QUEUE, 0, 2, seq=2)[:2] == (2, hw.MBOX_OK)
    booted.wait_head(index + 1)
    assert booted.completion(index).status == hw.ST_OK
    assert booted.qrd(hw.Q_PRIORITY) == 2, "CREATE_QUEUE sets the priority"
    booted.assert_alive()


@pytest.mark.parametrize(("queue", "priority"), [(hw.NUM_QUEUES, 0), (U32, 0), (1, 4)])
def test_mailbox_create_queue_with_a_bad_queue_or_priority_is_bad_arg(
    booted: Npu, queue: int, priority: int
) -> None:
    assert mbox(booted, hw.MBOX_CREATE_QUEUE, queue, priority, seq=1)[:2] == (1, hw.MBOX_BAD_ARG)
    booted.assert_alive()


def test_a_soft_reset_leaves_a_booted_firmware_with_queue_0_only(booted: Npu) -> None:
    assert mbox(booted, hw.MBOX_CREATE_QUEUE, 3, 1, seq=1)[:2] == (1, hw.MBOX_OK)
    booted.soft_reset()
    booted.start()
    assert booted.run(nop(1)).status == hw.ST_OK, "queue 0 still runs"
    assert mbox(booted, hw.MBOX_DESTROY_QUEUE, 3, seq=2)[:2] == (2, hw.MBOX_OK)
    booted.assert_alive()


@pytest.mark.parametrize("queue", [hw.NUM_QUEUES, U32])
def test_mailbox_reset_queue_of_no_queue_is_bad_arg(booted: Npu, queue: int) -> None:
    assert mbox(booted, hw.MBOX_RESET_QUEUE, queue, seq=1)[:2] == (1, hw.MBOX_BAD_ARG)
    assert booted.qrd(hw.Q_CONTROL) == hw.QCTL_ENABLE
    booted.assert_alive()


def test_mailbox_reset_queue_of_a_queue_running_a_command_is_busy(booted: Npu) -> None:
    booted.wr(hw.REG_INJECT, hw.INJECT_HANG)  # the command stays ACTIVE until a reset
    booted.submit(nop(1))
    deadline = time.monotonic() + 5
    while not booted.qrd(hw.Q_STATUS) & hw.QSTAT_ACTIVE:
        assert time.monotonic() < deadline, "the command did not start"
        time.sleep(0.001)
    assert mbox(booted, hw.MBOX_RESET_QUEUE, 0, seq=1)[:2] == (1, hw.MBOX_BUSY)
    assert booted.qrd(hw.Q_CONTROL) == hw.QCTL_ENABLE, "the queue was left alone"
    booted.soft_reset()
    booted.assert_alive()


@pytest.mark.parametrize("command", [0, 7, 0xFFFF_FFFF])
def test_an_unknown_mailbox_command_answers_unknown(booted: Npu, command: int) -> None:
    assert mbox(booted, command, 1, 2, seq=9) == (9, hw.MBOX_UNKNOWN, 0, 0)
    booted.assert_alive()


def test_without_a_firmware_the_mailbox_is_not_answered(npu: Npu) -> None:
    assert mbox(npu, hw.MBOX_PING, 1, seq=1) == (0, 0, 0, 0)
    assert npu.rd(hw.REG_IRQ_STATUS) & hw.IRQ_MBOX == 0
    assert boot(npu, image(magic=0))[0] == hw.FW_FAILED
    assert mbox(npu, hw.MBOX_PING, 1, seq=2)[0] == 0, "nor after a failed boot"
    npu.assert_alive()


# --------------------------------------------------------------------------
# Log ring
# --------------------------------------------------------------------------


def test_the_boot_line_is_written_to_the_log_ring(npu: Npu) -> None:
    npu.qt.memset(LOG, LOG_HEAD + LOG_SIZE, 0)
    program_log(npu)
    assert boot(npu, image())[0] == hw.FW_RUNNING
    line = boot_line(MANIFEST)
    assert line.startswith("npu-fw 1.0 booted: opcodes 0x3ffff heartbeat 10000 us - ")
    assert log_head(npu) == (len(line), LOG_SIZE)
    assert npu.qt.memread(LOG + LOG_HEAD, len(line)).decode() == line
    assert npu.qt.memread(LOG + LOG_HEAD + len(line), 16) == bytes(16)
    npu.assert_alive()


def test_the_log_ring_wraps_and_the_head_counts_every_byte(npu: Npu) -> None:
    npu.qt.memset(LOG, LOG_HEAD + 256, 0)
    program_log(npu, size=256)
    assert boot(npu, image(m={"log_level": 3}))[0] == hw.FW_RUNNING
    expect = boot_line(manifest(log_level=3))
    for seq in range(1, 11):
        mbox(npu, hw.MBOX_PING, seq, seq=seq)
        expect += f"mbox seq {seq} cmd {hw.MBOX_PING} arg {seq:#x}: status 0\n"
    write, size = log_head(npu)
    assert (write, size) == (len(expect), 256)
    assert write > 256
    assert log_text(npu) == expect[-256:]
    npu.assert_alive()


def test_the_log_level_filters_the_mailbox_debug_lines(booted: Npu) -> None:
    booted.qt.memset(LOG, LOG_HEAD + LOG_SIZE, 0)
    program_log(booted)  # level 1 from the image: no debug lines
    mbox(booted, hw.MBOX_PING, 1, seq=1)
    assert log_head(booted)[0] == 0
    mbox(booted, hw.MBOX_SET_LOG_LEVEL, 3, seq=2)
    mbox(booted, hw.MBOX_PING, 4, seq=3)
    lines = [
        "mbox seq 2 cmd 3 arg 0x3: status 0",
        "log level 3",
        "mbox seq 3 cmd 1 arg 0x4: status 0",
    ]
    assert log_text(booted).splitlines() == lines
    write = log_head(booted)[0]
    mbox(booted, hw.MBOX_SET_LOG_LEVEL, 0, seq=4)  # even its own "log level 0" is filtered
    mbox(booted, hw.MBOX_PING, 5, seq=5)
    assert log_head(booted)[0] == write
    booted.assert_alive()


BAD_LOGS = {
    "misaligned": (LOG + 4, LOG_SIZE),
    "size-not-a-power-of-two": (LOG, 3000),
    "size-below-256": (LOG, 128),
    "size-above-1MiB": (LOG, 2 << 20),
    "in-the-devices-own-bar": (BAR0_BASE, LOG_SIZE),
}


@pytest.mark.parametrize(("base", "size"), BAD_LOGS.values(), ids=BAD_LOGS.keys())
def test_a_bad_log_configuration_disables_logging(npu: Npu, base: int, size: int) -> None:
    npu.qt.memset(LOG, LOG_HEAD + LOG_SIZE + 16, 0xAA)
    npu.wr(hw.REG_SCRATCH, 0x5CA7C4)
    program_log(npu, base, size)
    assert boot(npu, image(m={"log_level": 3})) == (hw.FW_RUNNING, hw.FWERR_NONE)
    assert mbox(npu, hw.MBOX_PING, 1, seq=1)[:2] == (1, hw.MBOX_OK)
    assert npu.qt.memread(LOG, LOG_HEAD + LOG_SIZE + 16) == b"\xaa" * (LOG_HEAD + LOG_SIZE + 16)
    assert npu.rd(hw.REG_SCRATCH) == 0x5CA7C4
    npu.start()
    assert npu.run(nop(1)).status == hw.ST_OK
    npu.assert_alive()


def test_without_a_log_ring_the_firmware_runs_and_writes_no_log(npu: Npu) -> None:
    npu.qt.memset(0, 0x1000, 0xAA)  # FW_LOG_LO/HI = 0: no ring, not address 0
    assert boot(npu, image(m={"log_level": 3}))[0] == hw.FW_RUNNING
    mbox(npu, hw.MBOX_PING, 1, seq=1)
    assert npu.qt.memread(0, 0x1000) == b"\xaa" * 0x1000
    npu.assert_alive()
