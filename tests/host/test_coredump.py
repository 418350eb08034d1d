"""The device coredump decoder (npu.coredump): parse, format, the command line.

Dumps are built here through the module's ctypes mirrors of
include/npu_coredump.h (test_coredump_layout.py checks those against the
header), so each test states the dump it decodes.
"""

from __future__ import annotations

import ctypes
import struct
from pathlib import Path

import pytest

from npu import _abi, coredump
from npu.coredump import (
    NPU_DUMP_AFTER_RESET,
    NPU_DUMP_BEFORE_RESET,
    NPU_DUMP_CMD_PARAMS,
    NPU_DUMP_FATAL,
    NPU_DUMP_FW_LOST,
    NPU_DUMP_HANG,
    NPU_DUMP_NO_QUEUE,
    NPU_DUMP_Q_HUNG,
    NPU_DUMP_Q_STOPPED,
    NPU_DUMP_Q_USER,
    NPU_DUMP_SEC_CMD,
    NPU_DUMP_SEC_FW_LOG,
    NPU_DUMP_SEC_QUEUE,
    NPU_DUMP_SEC_REGS,
)

HEADER_SIZE = ctypes.sizeof(coredump.NpuDumpHeader)
FW_LOG = "npu-fw 1.0: boot\nqueue 0: created\nqueue 0: cmd 17 started\n"


# --------------------------------------------------------------------------
# Building dumps
# --------------------------------------------------------------------------


def section(stype: int, payload: bytes) -> bytes:
    padded = payload + bytes(-len(payload) % 8)
    return bytes(coredump.NpuDumpSection(type=stype, size=len(padded))) + padded


def regs_section(values: dict[int, int], when: int = NPU_DUMP_BEFORE_RESET) -> bytes:
    body = bytes(coredump.NpuDumpRegs(count=len(values), when=when))
    body += b"".join(bytes(coredump.NpuDumpReg(offset=o, value=v)) for o, v in values.items())
    return section(NPU_DUMP_SEC_REGS, body)


def queue_section(**fields: int) -> bytes:
    return section(NPU_DUMP_SEC_QUEUE, bytes(coredump.NpuDumpQueue(**fields)))


def fill_cmd(fence: int = 17) -> _abi.NpuCmd:
    cmd = _abi.NpuCmd(opcode=_abi.NPU_OP_FILL, flags=_abi.NPU_CMD_F_IRQ, ctx=3, fence=fence)
    cmd.fill.dst = 0x10000
    cmd.fill.len = 4096
    cmd.fill.pattern = 0xABCD1234
    return cmd


def cmd_section(
    cmd: _abi.NpuCmd, params: _abi.NpuTensorParams | None = None, queue: int = 0, slot: int = 16
) -> bytes:
    dc = coredump.NpuDumpCmd(queue=queue, slot=slot, cmd=cmd)
    if params is not None:
        dc.params = params
        dc.flags = NPU_DUMP_CMD_PARAMS
    return section(NPU_DUMP_SEC_CMD, bytes(dc))


def fw_log_section(text: str = FW_LOG, written: int = 5000) -> bytes:
    raw = text.encode()
    return section(
        NPU_DUMP_SEC_FW_LOG, bytes(coredump.NpuDumpFwLog(length=len(raw), written=written)) + raw
    )


def dump_bytes(
    *sections: bytes,
    reason: int = NPU_DUMP_HANG,
    cause: int | None = None,
    queue: int = 0,
    fence: int = 17,
    client: int = 5,
) -> bytes:
    """A header for ``sections`` (its size and count filled in), then the sections."""
    body = b"".join(sections)
    header = coredump.NpuDumpHeader(
        magic=coredump.NPU_DUMP_MAGIC, version=coredump.NPU_DUMP_VERSION,
        size=HEADER_SIZE + len(body), num_sections=len(sections), reason=reason,
        cause=reason if cause is None else cause, queue=queue, fence=fence, client=client,
        timestamp_ns=1_234_567_890_123, hw_version=0x00010000, fw_version=0x00010002,
        driver_version=0x00010001,
    )  # fmt: skip
    return bytes(header) + body


def hang_dump() -> bytes:
    """A queue-0 hang of a FILL, with a user queue 3 in use."""
    return dump_bytes(
        regs_section({0x0B0: 1, 0x1028: 0x4, 0x1010: 16}),
        queue_section(
            index=0,
            head=16,
            tail=18,
            status=0x4,
            done=16,
            next_fence=18,
            completed=16,
            entries=4096,
        ),
        queue_section(
            index=3,
            flags=NPU_DUMP_Q_USER,
            head=2,
            tail=2,
            status=0x1,
            completed=9,
            client=8,
            entries=64,
        ),
        cmd_section(fill_cmd()),
        fw_log_section(),
    )


# --------------------------------------------------------------------------
# parse
# --------------------------------------------------------------------------


def test_a_hang_dump_parses_to_its_header_fields() -> None:
    d = coredump.parse(hang_dump())
    assert (d.reason_name, d.cause_name, d.queue, d.fence, d.client) == ("HANG", "HANG", 0, 17, 5)
    assert (d.timestamp_ns, d.hw_version, d.fw_version, d.driver_version) == (
        1_234_567_890_123, 0x00010000, 0x00010002, 0x00010001,
    )  # fmt: skip
    assert d.size == len(hang_dump())


def test_a_hang_dump_parses_to_its_registers() -> None:
    (regs,) = coredump.parse(hang_dump()).registers
    assert regs.when == NPU_DUMP_BEFORE_RESET
    assert regs.values == {0x0B0: 1, 0x1028: 0x4, 0x1010: 16}
    assert regs["Q0.STATUS"] == 0x4


def test_a_hang_dump_parses_to_its_queues() -> None:
    q0, q3 = coredump.parse(hang_dump()).queues
    assert q0 == coredump.QueueState(
        index=0, flags=0, head=16, tail=18, status=0x4, error=0, done=16, next_fence=18,
        completed=16, client=0, entries=4096,
    )  # fmt: skip
    assert (q3.index, q3.is_user, q3.client, q3.completed) == (3, True, 8, 9)


def test_a_hang_dump_parses_to_its_hung_command() -> None:
    c = coredump.parse(hang_dump()).command
    assert c is not None
    assert (c.queue, c.slot, c.opcode_name, c.fence) == (0, 16, "FILL", 17)
    assert bytes(c.descriptor) == bytes(fill_cmd())
    assert c.params is None


def test_a_hang_dump_parses_to_its_firmware_log() -> None:
    assert coredump.parse(hang_dump()).fw_log == coredump.FirmwareLog(text=FW_LOG, written=5000)


def test_a_tensor_ops_parameter_block_is_kept() -> None:
    params = _abi.NpuTensorParams()
    params.t[0].va = 0x2000
    params.params[0] = 0b10
    cmd = _abi.NpuCmd(opcode=_abi.NPU_OP_REDUCE, fence=17)
    c = coredump.parse(dump_bytes(cmd_section(cmd, params))).command
    assert c is not None and c.tensor_params is not None
    assert c.params == bytes(params)
    assert c.tensor_params.t[0].va == 0x2000


def test_a_firmware_lost_dump_has_no_queue() -> None:
    d = coredump.parse(dump_bytes(reason=NPU_DUMP_FW_LOST, queue=NPU_DUMP_NO_QUEUE, fence=0))
    assert (d.reason_name, d.queue, d.command) == ("FW_LOST", None, None)


def test_a_fatal_dump_keeps_its_cause_and_both_register_sets() -> None:
    d = coredump.parse(
        dump_bytes(
            regs_section({0x0B0: 3}),
            regs_section({0x0B0: 2}, when=NPU_DUMP_AFTER_RESET),
            reason=NPU_DUMP_FATAL,
            cause=NPU_DUMP_HANG,
        )
    )
    assert (d.reason_name, d.cause_name) == ("FATAL", "HANG")
    assert [(r.when, r["FW_STATUS"]) for r in d.registers] == [
        (NPU_DUMP_BEFORE_RESET, 3), (NPU_DUMP_AFTER_RESET, 2),
    ]  # fmt: skip


def test_a_section_of_an_unknown_type_is_kept_aside() -> None:
    d = coredump.parse(dump_bytes(section(99, b"newer!"), fw_log_section()))
    assert d.unknown == (coredump.UnknownSection(type=99, payload=b"newer!\0\0"),)
    assert d.fw_log is not None


def test_bytes_after_the_declared_size_are_ignored() -> None:
    assert coredump.parse(hang_dump() + bytes(64)) == coredump.parse(hang_dump())


# --------------------------------------------------------------------------
# parse: bad dumps
# --------------------------------------------------------------------------


def patch(data: bytes, offset: int, fmt: str, value: int) -> bytes:
    out = bytearray(data)
    struct.pack_into(fmt, out, offset, value)
    return bytes(out)


def header_offset(field: str) -> int:
    return int(getattr(coredump.NpuDumpHeader, field).offset)


def test_a_dump_shorter_than_its_header_is_truncated() -> None:
    with pytest.raises(ValueError, match=r"truncated dump: 40 bytes, shorter than its 72-byte"):
        coredump.parse(hang_dump()[:40])


def test_an_empty_input_is_truncated() -> None:
    with pytest.raises(ValueError, match="truncated dump: 0 bytes"):
        coredump.parse(b"")


def test_a_bad_magic_is_named() -> None:
    with pytest.raises(ValueError, match=r"bad magic 0x7f454c46 \(an NPU coredump starts with"):
        coredump.parse(patch(hang_dump(), 0, "<I", 0x7F454C46))


def test_version_0_is_refused() -> None:
    with pytest.raises(ValueError, match="bad version 0"):
        coredump.parse(patch(hang_dump(), header_offset("version"), "<I", 0))


def test_a_dump_cut_short_of_its_declared_size_is_truncated() -> None:
    data = hang_dump()
    with pytest.raises(ValueError, match=rf"the header says {len(data)} bytes, got 100"):
        coredump.parse(data[:100])


def test_a_declared_size_below_the_header_is_refused() -> None:
    with pytest.raises(ValueError, match="bad size 8 in the header"):
        coredump.parse(patch(hang_dump(), header_offset("size"), "<I", 8))


def test_more_sections_than_the_size_holds_is_refused() -> None:
    data = patch(dump_bytes(fw_log_section()), header_offset("num_sections"), "<I", 2)
    with pytest.raises(ValueError, match=r"section 1 of 2: its header at offset \d+ runs past"):
        coredump.parse(data)


def test_a_section_running_past_the_end_is_named() -> None:
    data = dump_bytes(fw_log_section())
    data = patch(data, HEADER_SIZE + 4, "<I", 4096)
    with pytest.raises(ValueError, match=r"section 0 \(FW_LOG\): 4096 bytes at offset 80 run past"):
        coredump.parse(data)


def test_a_section_size_not_a_multiple_of_8_is_refused() -> None:
    data = patch(dump_bytes(fw_log_section()), HEADER_SIZE + 4, "<I", 12)
    with pytest.raises(ValueError, match=r"section 0 \(FW_LOG\): size 12 is not a multiple of 8"):
        coredump.parse(data)


def test_a_register_count_beyond_the_section_is_refused() -> None:
    data = patch(dump_bytes(regs_section({0: 1})), HEADER_SIZE + 8, "<I", 5)
    with pytest.raises(ValueError, match=r"section 0 \(REGS\): 16 payload bytes, count = 5"):
        coredump.parse(data)


def test_a_firmware_log_longer_than_its_section_is_refused() -> None:
    data = patch(dump_bytes(fw_log_section("abc")), HEADER_SIZE + 8, "<I", 100)
    with pytest.raises(ValueError, match=r"section 0 \(FW_LOG\): .*length = 100 bytes of text"):
        coredump.parse(data)


def test_a_queue_section_too_short_for_its_struct_is_refused() -> None:
    data = dump_bytes(section(NPU_DUMP_SEC_QUEUE, bytes(8)))
    with pytest.raises(ValueError, match=r"section 0 \(QUEUE\): 8 payload bytes, struct npu_dump"):
        coredump.parse(data)


def test_bytes_between_the_last_section_and_the_size_are_refused() -> None:
    data = dump_bytes(fw_log_section())
    data = patch(data + bytes(8), header_offset("size"), "<I", len(data) + 8)
    with pytest.raises(ValueError, match="8 bytes after the last of 1 sections"):
        coredump.parse(data)


def test_a_second_hung_command_is_refused() -> None:
    data = dump_bytes(cmd_section(fill_cmd()), cmd_section(fill_cmd()))
    with pytest.raises(ValueError, match=r"section 1 \(CMD\): a second hung command"):
        coredump.parse(data)


# --------------------------------------------------------------------------
# format
# --------------------------------------------------------------------------


def test_format_names_the_reason_queue_fence_and_client() -> None:
    text = coredump.format(coredump.parse(hang_dump()))
    assert "reason     HANG: a command ran past hang_timeout_ms" in text
    assert "queue      0\n" in text
    assert "fence      17\n" in text
    assert "client     5\n" in text
    assert "versions   hardware 1.0, firmware 1.2, driver 1.1" in text


def test_format_names_device_registers_and_decodes_their_states() -> None:
    d = coredump.parse(dump_bytes(regs_section({0x020: 0x3, 0x030: 5, 0x0B0: 1, 0x0B4: 0})))
    text = coredump.format(d)
    assert "Registers (before the reset)" in text
    assert "0x00020  STATUS               0x00000003  READY|ENABLED\n" in text
    assert "0x00030  ERROR                0x00000005  MMU_FAULT\n" in text
    assert "0x000b0  FW_STATUS            0x00000001  RUNNING\n" in text
    assert "0x000b4  FW_ERROR             0x00000000\n" in text


def test_format_tabulates_queue_registers_a_column_a_queue() -> None:
    d = coredump.parse(dump_bytes(regs_section({0x1010: 16, 0x1310: 2, 0x1028: 4})))
    lines = coredump.format(d).splitlines()
    assert "  queue registers" + " " * 22 + "Q0" + " " * 10 + "Q3" in lines
    assert "  0x00010  HEAD                0x00000010  0x00000002" in lines
    assert "  0x00028  STATUS              0x00000004           -" in lines
    assert not any("RING_LO" in line for line in lines), "registers absent from the dump"


def test_format_lists_the_queues_with_their_flags() -> None:
    flags = NPU_DUMP_Q_USER | NPU_DUMP_Q_STOPPED | NPU_DUMP_Q_HUNG
    d = coredump.parse(
        dump_bytes(queue_section(index=2, flags=flags, status=0x6, error=5, client=9))
    )
    (row,) = [line for line in coredump.format(d).splitlines() if line.startswith("      2")]
    assert "user|stopped|hung" in row and "STOPPED|ACTIVE" in row and "MMU_FAULT" in row


def test_format_decodes_the_hung_fill() -> None:
    text = coredump.format(coredump.parse(hang_dump()))
    assert "Hung command (queue 0, ring slot 16)" in text
    assert "FILL  fence 17  ctx 3  flags IRQ" in text
    assert "dst 0x10000  len 4096  pattern 0xabcd1234" in text


def cmd(opcode: int) -> _abi.NpuCmd:
    return _abi.NpuCmd(opcode=opcode, fence=17)


def copy_cmd() -> _abi.NpuCmd:
    c = cmd(_abi.NPU_OP_COPY)
    c.copy.src, c.copy.dst, c.copy.len = 0x1000, 0x2000, 64
    return c


def gemm_cmd() -> _abi.NpuCmd:
    c = cmd(_abi.NPU_OP_GEMM)
    c.gemm.m, c.gemm.n, c.gemm.k, c.gemm.flags = 8, 4, 2, _abi.NPU_GEMM_TRANS_B
    return c


def wait_cmd() -> _abi.NpuCmd:
    c = cmd(_abi.NPU_OP_WAIT)
    c.sync.va, c.sync.value = 0x3000, 99
    return c


@pytest.mark.parametrize(
    ("command", "expected"),
    [
        (copy_cmd(), "src 0x1000  dst 0x2000  len 64"),
        (gemm_cmd(), "m 8  n 4  k 2  lda 0  ldb 0  ldc 0  dtype FP32  flags TRANS_B"),
        (wait_cmd(), "WAIT  fence 17"),
        (wait_cmd(), "va 0x3000  value 99"),
        (cmd(_abi.NPU_OP_NOP), "NOP  fence 17  ctx 0  flags -"),
        (cmd(200), "OP_200  fence 17"),
    ],
    ids=["copy", "gemm", "wait-opcode", "wait-fields", "nop", "unknown-opcode"],
)
def test_format_decodes_each_command_kind(command: _abi.NpuCmd, expected: str) -> None:
    assert expected in coredump.format(coredump.parse(dump_bytes(cmd_section(command))))


def test_format_decodes_a_tensor_op_and_its_parameter_block() -> None:
    c = cmd(_abi.NPU_OP_ELTWISE)
    c.tensor.params, c.tensor.kind = 0x7000, _abi.EltwiseKind.MUL
    params = _abi.NpuTensorParams()
    for i in range(3):
        t = params.t[i]
        t.va, t.dtype, t.ndim = 0x1000 * (i + 1), _abi.NPU_DTYPE_FP16, 2
        t.shape[0], t.shape[1], t.strides[0], t.strides[1] = 4, 8, 8, 1
    text = coredump.format(coredump.parse(dump_bytes(cmd_section(c, params))))
    assert "ELTWISE  fence 17" in text
    assert "params 0x7000  kind MUL" in text
    assert "t[2] va 0x3000  FP16  shape [4, 8]  strides [8, 1]" in text
    assert "t[3]" not in text


def test_format_says_when_a_tensor_ops_block_was_not_captured() -> None:
    text = coredump.format(coredump.parse(dump_bytes(cmd_section(cmd(_abi.NPU_OP_SOFTMAX)))))
    assert "(parameter block not captured)" in text


def test_format_prints_the_firmware_log() -> None:
    text = coredump.format(coredump.parse(hang_dump()))
    assert f"Firmware log ({len(FW_LOG)} bytes; 5000 written)" in text
    assert "  queue 0: cmd 17 started\n" in text


def test_format_of_a_fatal_dump_shows_the_cause_and_the_registers_after_the_reset() -> None:
    d = coredump.parse(
        dump_bytes(
            regs_section({0x0B0: 2}, when=NPU_DUMP_AFTER_RESET),
            reason=NPU_DUMP_FATAL,
            cause=NPU_DUMP_FW_LOST,
            queue=NPU_DUMP_NO_QUEUE,
        )
    )
    text = coredump.format(d)
    assert "reason     FATAL: the recovery failed" in text
    assert "cause      FW_LOST" in text
    assert "queue      -" in text
    assert "Registers (after the reset)" in text
    assert "FW_STATUS            0x00000002  FAILED" in text


# --------------------------------------------------------------------------
# The command line and /sys/class/devcoredump
# --------------------------------------------------------------------------


def fake_devcd(root: Path, n: int, vendor: int, device: int, data: bytes) -> Path:
    """devcdN under ``root`` with data and failing_device -> a PCI device dir."""
    pci = root.parent / f"pci{n}"
    pci.mkdir()
    (pci / "vendor").write_text(f"{vendor:#06x}\n")
    (pci / "device").write_text(f"{device:#06x}\n")
    devcd = root / f"devcd{n}"
    devcd.mkdir(parents=True)
    (devcd / "failing_device").symlink_to(pci)
    (devcd / "data").write_bytes(data)
    return devcd / "data"


NPU_IDS = (_abi.NPU_PCI_VENDOR_ID, _abi.NPU_PCI_DEVICE_ID)


def test_find_dumps_lists_npu_dumps_only_oldest_first(tmp_path: Path) -> None:
    root = tmp_path / "devcoredump"
    d10 = fake_devcd(root, 10, *NPU_IDS, hang_dump())
    fake_devcd(root, 3, 0x8086, 0x1234, b"wifi firmware")
    d2 = fake_devcd(root, 2, *NPU_IDS, hang_dump())
    assert coredump.find_dumps(root) == [d2, d10]


def test_find_dumps_without_devcoredump_is_empty(tmp_path: Path) -> None:
    assert coredump.find_dumps(tmp_path / "absent") == []


def test_main_prints_a_dump_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    f = tmp_path / "dump.bin"
    f.write_bytes(hang_dump())
    assert coredump.main([str(f)]) == 0
    assert "reason     HANG" in capsys.readouterr().out


def test_main_defaults_to_the_first_pending_npu_dump(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    root = tmp_path / "devcoredump"
    data = fake_devcd(root, 1, *NPU_IDS, hang_dump())
    monkeypatch.setattr(coredump, "DEVCOREDUMP", root)
    assert coredump.main([]) == 0
    assert capsys.readouterr().out.startswith(f"{data}:\nNPU device coredump")


def test_main_without_a_pending_dump_fails(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(coredump, "DEVCOREDUMP", tmp_path)
    assert coredump.main([]) == 1
    assert "no NPU coredump pending" in capsys.readouterr().err


def test_main_dismiss_writes_to_the_data_file(tmp_path: Path) -> None:
    data = fake_devcd(tmp_path / "devcoredump", 1, *NPU_IDS, hang_dump())
    assert coredump.main([str(data), "--dismiss"]) == 0
    assert data.read_bytes() == b"1"


def test_main_save_keeps_the_raw_dump(tmp_path: Path) -> None:
    data = fake_devcd(tmp_path / "devcoredump", 1, *NPU_IDS, hang_dump())
    out = tmp_path / "saved.bin"
    assert coredump.main([str(data), "--save", str(out), "--dismiss"]) == 0
    assert out.read_bytes() == hang_dump()


def test_main_refuses_to_dismiss_a_plain_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    f = tmp_path / "dump.bin"
    f.write_bytes(hang_dump())
    assert coredump.main([str(f), "--dismiss"]) == 2
    assert "is not a devcoredump data file" in capsys.readouterr().err
    assert f.read_bytes() == hang_dump()


def test_main_reports_a_bad_dump(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    f = tmp_path / "dump.bin"
    f.write_bytes(b"\x7fELF" + bytes(100))
    assert coredump.main([str(f)]) == 1
    assert "bad magic" in capsys.readouterr().err
