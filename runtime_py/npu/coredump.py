"""Decoder of the NPU device coredump (``include/npu_coredump.h``).

When the driver's watchdog resets the device (a hung command, a lost
firmware, or a recovery that failed) it hands a binary dump to the kernel's
devcoredump: ``/sys/class/devcoredump/devcdN/data``, whose
``failing_device`` is the NPU's PCI device. The kernel keeps one dump per
device until it is dismissed (any write to ``data``) or for 5 minutes.

Command line::

    python3 -m npu.coredump                 # the first pending NPU dump
    python3 -m npu.coredump FILE            # a dump file or a devcd data file
    python3 -m npu.coredump --save d.bin --dismiss

Library: :func:`parse` turns the bytes into a :class:`Coredump` (raising
:class:`ValueError` on a truncated or malformed dump) and :func:`format`
renders it for humans. The ctypes mirrors below follow the C header; the
host test ``tests/host/test_coredump_layout.py`` compiles the header and
checks that they agree. This module imports only the standard library and
:mod:`npu._abi` (the descriptor and parameter block layouts).
"""

from __future__ import annotations

import argparse
import ctypes
import enum
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from npu import _abi

# --------------------------------------------------------------------------
# npu_coredump.h: constants
# --------------------------------------------------------------------------

NPU_DUMP_MAGIC: Final = 0x4455504E  # "NPUD" at offset 0
NPU_DUMP_VERSION: Final = 1
NPU_DUMP_NO_QUEUE: Final = 0xFFFFFFFF

NPU_DUMP_HANG: Final = 1
NPU_DUMP_FW_LOST: Final = 2
NPU_DUMP_FATAL: Final = 3

NPU_DUMP_SEC_REGS: Final = 1
NPU_DUMP_SEC_QUEUE: Final = 2
NPU_DUMP_SEC_CMD: Final = 3
NPU_DUMP_SEC_FW_LOG: Final = 4

NPU_DUMP_BEFORE_RESET: Final = 0
NPU_DUMP_AFTER_RESET: Final = 1

NPU_DUMP_Q_USER: Final = 1 << 0
NPU_DUMP_Q_STOPPED: Final = 1 << 1
NPU_DUMP_Q_HUNG: Final = 1 << 2

NPU_DUMP_CMD_PARAMS: Final = 1 << 0

# npu_hw.h values the decoder names (driver business, not in npu._abi).
NPU_QREG_BASE: Final = 0x1000
NPU_QREG_STRIDE: Final = 0x100
NPU_STATUS_READY: Final = 1 << 0
NPU_STATUS_ENABLED: Final = 1 << 1
NPU_STATUS_RESETTING: Final = 1 << 2
NPU_STATUS_ERROR: Final = 1 << 3
NPU_QSTAT_IDLE: Final = 1 << 0
NPU_QSTAT_STOPPED: Final = 1 << 1
NPU_QSTAT_ACTIVE: Final = 1 << 2
NPU_QSTAT_WAITING: Final = 1 << 3
NPU_FW_OFF: Final = 0
NPU_FW_RUNNING: Final = 1
NPU_FW_FAILED: Final = 2
NPU_FW_CRASHED: Final = 3

DEVCOREDUMP: Final = Path("/sys/class/devcoredump")


class Reason(enum.IntEnum):
    """Why the dump was written (``enum npu_dump_reason``)."""

    HANG = NPU_DUMP_HANG
    FW_LOST = NPU_DUMP_FW_LOST
    FATAL = NPU_DUMP_FATAL


class SectionType(enum.IntEnum):
    """Section types (``enum npu_dump_section_type``)."""

    REGS = NPU_DUMP_SEC_REGS
    QUEUE = NPU_DUMP_SEC_QUEUE
    CMD = NPU_DUMP_SEC_CMD
    FW_LOG = NPU_DUMP_SEC_FW_LOG


_REASON_TEXT: Final[dict[int, str]] = {
    Reason.HANG: "a command ran past hang_timeout_ms",
    Reason.FW_LOST: "the firmware heartbeat stopped",
    Reason.FATAL: "the recovery failed: the device is gone",
}

# --------------------------------------------------------------------------
# npu_coredump.h: structures (little endian)
# --------------------------------------------------------------------------


class NpuDumpHeader(ctypes.LittleEndianStructure):
    """``struct npu_dump_header``: the first 72 bytes of a dump."""

    _fields_ = [
        ("magic", ctypes.c_uint32),
        ("version", ctypes.c_uint32),
        ("size", ctypes.c_uint32),
        ("num_sections", ctypes.c_uint32),
        ("reason", ctypes.c_uint32),
        ("cause", ctypes.c_uint32),
        ("queue", ctypes.c_uint32),
        ("rsvd0", ctypes.c_uint32),
        ("fence", ctypes.c_uint64),
        ("client", ctypes.c_uint64),
        ("timestamp_ns", ctypes.c_uint64),
        ("hw_version", ctypes.c_uint32),
        ("fw_version", ctypes.c_uint32),
        ("driver_version", ctypes.c_uint32),
        ("rsvd1", ctypes.c_uint32),
    ]


class NpuDumpSection(ctypes.LittleEndianStructure):
    """``struct npu_dump_section``: a section's type and payload size."""

    _fields_ = [
        ("type", ctypes.c_uint32),
        ("size", ctypes.c_uint32),
    ]


class NpuDumpRegs(ctypes.LittleEndianStructure):
    """``struct npu_dump_regs``: the head of a REGS payload."""

    _fields_ = [
        ("count", ctypes.c_uint32),
        ("when", ctypes.c_uint32),
    ]


class NpuDumpReg(ctypes.LittleEndianStructure):
    """``struct npu_dump_reg``: one register, by its BAR0 offset."""

    _fields_ = [
        ("offset", ctypes.c_uint32),
        ("value", ctypes.c_uint32),
    ]


class NpuDumpQueue(ctypes.LittleEndianStructure):
    """``struct npu_dump_queue``: a QUEUE payload."""

    _fields_ = [
        ("index", ctypes.c_uint32),
        ("flags", ctypes.c_uint32),
        ("head", ctypes.c_uint32),
        ("tail", ctypes.c_uint32),
        ("status", ctypes.c_uint32),
        ("error", ctypes.c_uint32),
        ("done", ctypes.c_uint64),
        ("next_fence", ctypes.c_uint64),
        ("completed", ctypes.c_uint64),
        ("client", ctypes.c_uint64),
        ("entries", ctypes.c_uint32),
        ("rsvd", ctypes.c_uint32),
    ]


class NpuDumpCmd(ctypes.LittleEndianStructure):
    """``struct npu_dump_cmd``: a CMD payload."""

    _fields_ = [
        ("queue", ctypes.c_uint32),
        ("slot", ctypes.c_uint32),
        ("flags", ctypes.c_uint32),
        ("rsvd", ctypes.c_uint32),
        ("cmd", _abi.NpuCmd),
        ("params", _abi.NpuTensorParams),
    ]


class NpuDumpFwLog(ctypes.LittleEndianStructure):
    """``struct npu_dump_fw_log``: the head of a FW_LOG payload."""

    _fields_ = [
        ("length", ctypes.c_uint32),
        ("written", ctypes.c_uint32),
    ]


#: C struct name -> ctypes mirror, for the layout test.
STRUCTS: Final[dict[str, type[ctypes.Structure]]] = {
    "npu_dump_header": NpuDumpHeader,
    "npu_dump_section": NpuDumpSection,
    "npu_dump_regs": NpuDumpRegs,
    "npu_dump_reg": NpuDumpReg,
    "npu_dump_queue": NpuDumpQueue,
    "npu_dump_cmd": NpuDumpCmd,
    "npu_dump_fw_log": NpuDumpFwLog,
}

# --------------------------------------------------------------------------
# Register names (enum npu_reg and enum npu_qreg of npu_hw.h)
# --------------------------------------------------------------------------

#: Device registers: BAR0 offset -> name without ``NPU_REG_``.
DEVICE_REGISTERS: Final[dict[int, str]] = {
    0x000: "MAGIC", 0x004: "HW_VERSION", 0x008: "ABI_VERSION", 0x00C: "CAPS",
    0x010: "NUM_QUEUES", 0x014: "NUM_CORES", 0x018: "MAX_RING", 0x020: "STATUS",
    0x024: "CONTROL", 0x028: "IRQ_STATUS", 0x02C: "IRQ_MASK", 0x030: "ERROR",
    0x038: "TIMESTAMP_LO", 0x03C: "TIMESTAMP_HI", 0x040: "SCRATCH",
    0x050: "MMU_CONTROL", 0x054: "MMU_L1_LO", 0x058: "MMU_L1_HI", 0x05C: "MMU_L1_ENTRIES",
    0x060: "MMU_FAULT_LO", 0x064: "MMU_FAULT_HI", 0x068: "MMU_FAULT_INFO",
    0x06C: "MMU_FAULTS", 0x070: "MMU_FAULT_QUEUE", 0x074: "MMU_CTX_LO", 0x078: "MMU_CTX_HI",
    0x07C: "MMU_CTX_COUNT", 0x080: "MMU_FAULT_CTX", 0x084: "MEM_SIZE_LO",
    0x088: "MEM_SIZE_HI", 0x090: "INJECT",
    0x0A0: "FW_ADDR_LO", 0x0A4: "FW_ADDR_HI", 0x0A8: "FW_SIZE", 0x0AC: "FW_CONTROL",
    0x0B0: "FW_STATUS", 0x0B4: "FW_ERROR", 0x0B8: "FW_VERSION", 0x0BC: "FW_HEARTBEAT",
    0x0C0: "MBOX_CMD", 0x0C4: "MBOX_ARG0", 0x0C8: "MBOX_ARG1", 0x0CC: "MBOX_SEQ",
    0x0D0: "MBOX_RESP_SEQ", 0x0D4: "MBOX_RESP_STATUS", 0x0D8: "MBOX_RESP0",
    0x0DC: "MBOX_RESP1", 0x0E0: "FW_LOG_LO", 0x0E4: "FW_LOG_HI", 0x0E8: "FW_LOG_SIZE",
    0x0F0: "TIMING",
}  # fmt: skip

#: Per-queue registers: offset in the queue's block -> name without ``NPU_Q_``.
QUEUE_REGISTERS: Final[dict[int, str]] = {
    0x00: "RING_LO", 0x04: "RING_HI", 0x08: "RING_SIZE", 0x0C: "CONTROL", 0x10: "HEAD",
    0x14: "TAIL", 0x18: "CPL_LO", 0x1C: "CPL_HI", 0x20: "FENCE_LO", 0x24: "FENCE_HI",
    0x28: "STATUS", 0x2C: "ERROR", 0x30: "DONE_LO", 0x34: "DONE_HI", 0x38: "PRIORITY",
    0x40: "IRQ_COUNT", 0x44: "IRQ_DELAY", 0x48: "IRQS", 0x4C: "PROGRESS",
    0x50: "MMU_L1_LO", 0x54: "MMU_L1_HI", 0x58: "MMU_L1_ENTRIES",
}  # fmt: skip


def register_name(offset: int) -> str:
    """The name of the BAR0 register at ``offset``: ``"FW_STATUS"``, ``"Q2.HEAD"``.

    An offset the tables do not know is rendered as ``"?0x..."``.
    """
    if offset < NPU_QREG_BASE:
        name = DEVICE_REGISTERS.get(offset)
    else:
        q, reg = divmod(offset - NPU_QREG_BASE, NPU_QREG_STRIDE)
        reg_name = QUEUE_REGISTERS.get(reg) if q < _abi.NPU_MAX_QUEUES else None
        name = f"Q{q}.{reg_name}" if reg_name else None
    return name or f"?{offset:#x}"


# --------------------------------------------------------------------------
# The decoded dump
# --------------------------------------------------------------------------


@dataclass(frozen=True)
class Registers:
    """A REGS section: register values read at one moment."""

    when: int  #: NPU_DUMP_BEFORE_RESET or NPU_DUMP_AFTER_RESET
    values: dict[int, int]  #: BAR0 offset -> value, in the dump's order

    def __getitem__(self, name: str) -> int:
        """The value of the register named ``name`` (as :func:`register_name` names it)."""
        for offset, value in self.values.items():
            if register_name(offset) == name:
                return value
        raise KeyError(name)


@dataclass(frozen=True)
class QueueState:
    """A QUEUE section: a hardware queue in use, as the device and the driver saw it."""

    index: int
    flags: int  #: NPU_DUMP_Q_*
    head: int
    tail: int
    status: int  #: NPU_QSTAT_*
    error: int  #: enum npu_dev_error
    done: int  #: the last fence the device completed
    next_fence: int  #: queue 0: the last fence the driver handed out
    completed: int  #: queue 0: the last fence retired; a user queue: its write-back
    client: int  #: a user queue: the drm client id of its file
    entries: int

    @property
    def is_user(self) -> bool:
        """True for a queue lent to a file (a user queue)."""
        return bool(self.flags & NPU_DUMP_Q_USER)


@dataclass(frozen=True)
class HungCommand:
    """A CMD section: the hung command as it was in its ring."""

    queue: int
    slot: int
    cmd: bytes  #: the 128-byte ``struct npu_cmd``
    params: bytes | None  #: the 256-byte parameter block of a tensor op, if captured

    @property
    def descriptor(self) -> _abi.NpuCmd:
        """The command as its ctypes mirror."""
        return _abi.NpuCmd.from_buffer_copy(self.cmd)

    @property
    def tensor_params(self) -> _abi.NpuTensorParams | None:
        """The tensor op's parameter block as its ctypes mirror, if captured."""
        return None if self.params is None else _abi.NpuTensorParams.from_buffer_copy(self.params)

    @property
    def opcode(self) -> int:
        """``npu_cmd.opcode``."""
        return int(self.descriptor.opcode)

    @property
    def opcode_name(self) -> str:
        """The opcode's name (``"FILL"``), or ``"OP_<n>"`` for an unknown one."""
        return _enum_name(_abi.Opcode, self.opcode, "OP_")

    @property
    def fence(self) -> int:
        """``npu_cmd.fence``."""
        return int(self.descriptor.fence)


@dataclass(frozen=True)
class FirmwareLog:
    """A FW_LOG section: the newest text of the firmware's log ring."""

    text: str
    written: int  #: bytes the firmware wrote since its boot (mod 2**32)


@dataclass(frozen=True)
class UnknownSection:
    """A section of a type this decoder does not know (a newer driver's)."""

    type: int
    payload: bytes


@dataclass(frozen=True)
class Coredump:
    """A decoded dump: the header's fields and the sections."""

    version: int
    size: int
    reason: int  #: enum npu_dump_reason
    cause: int  #: what started the recovery (differs from reason for FATAL)
    queue: int | None  #: the hung hardware queue, None for none
    fence: int  #: the hung command's fence, 0 for none
    client: int  #: drm client id of the file the hung command belongs to, 0 for none
    timestamp_ns: int  #: CLOCK_MONOTONIC of the capture
    hw_version: int
    fw_version: int
    driver_version: int
    registers: tuple[Registers, ...]
    queues: tuple[QueueState, ...]
    command: HungCommand | None
    fw_log: FirmwareLog | None
    unknown: tuple[UnknownSection, ...] = ()

    @property
    def reason_name(self) -> str:
        """``"HANG"``, ``"FW_LOST"`` or ``"FATAL"`` (``"REASON_<n>"`` if unknown)."""
        return _enum_name(Reason, self.reason, "REASON_")

    @property
    def cause_name(self) -> str:
        """The name of :attr:`cause`, as :attr:`reason_name`."""
        return _enum_name(Reason, self.cause, "REASON_")


def _enum_name(kind: type[enum.IntEnum], value: int, prefix: str) -> str:
    try:
        return kind(value).name
    except ValueError:
        return f"{prefix}{value}"


# --------------------------------------------------------------------------
# Parsing
# --------------------------------------------------------------------------


def _section_label(index: int, stype: int) -> str:
    return f"section {index} ({_enum_name(SectionType, stype, 'type ')})"


def _need(payload: bytes, size: int, what: str, label: str) -> None:
    if len(payload) < size:
        raise ValueError(f"{label}: {len(payload)} payload bytes, {what} needs {size}")


def _parse_regs(payload: bytes, label: str) -> Registers:
    _need(payload, ctypes.sizeof(NpuDumpRegs), "struct npu_dump_regs", label)
    head = NpuDumpRegs.from_buffer_copy(payload)
    need = ctypes.sizeof(NpuDumpRegs) + head.count * ctypes.sizeof(NpuDumpReg)
    _need(payload, need, f"count = {head.count} registers", label)
    values: dict[int, int] = {}
    step = ctypes.sizeof(NpuDumpReg)
    for i in range(head.count):
        reg = NpuDumpReg.from_buffer_copy(payload, ctypes.sizeof(NpuDumpRegs) + i * step)
        values[int(reg.offset)] = int(reg.value)
    return Registers(when=int(head.when), values=values)


def _parse_queue(payload: bytes, label: str) -> QueueState:
    _need(payload, ctypes.sizeof(NpuDumpQueue), "struct npu_dump_queue", label)
    q = NpuDumpQueue.from_buffer_copy(payload)
    return QueueState(
        index=q.index, flags=q.flags, head=q.head, tail=q.tail, status=q.status,
        error=q.error, done=q.done, next_fence=q.next_fence, completed=q.completed,
        client=q.client, entries=q.entries,
    )  # fmt: skip


def _parse_cmd(payload: bytes, label: str) -> HungCommand:
    _need(payload, ctypes.sizeof(NpuDumpCmd), "struct npu_dump_cmd", label)
    c = NpuDumpCmd.from_buffer_copy(payload)
    return HungCommand(
        queue=int(c.queue),
        slot=int(c.slot),
        cmd=bytes(c.cmd),
        params=bytes(c.params) if c.flags & NPU_DUMP_CMD_PARAMS else None,
    )


def _parse_fw_log(payload: bytes, label: str) -> FirmwareLog:
    _need(payload, ctypes.sizeof(NpuDumpFwLog), "struct npu_dump_fw_log", label)
    head = NpuDumpFwLog.from_buffer_copy(payload)
    start = ctypes.sizeof(NpuDumpFwLog)
    _need(payload, start + head.length, f"length = {head.length} bytes of text", label)
    text = payload[start : start + head.length].decode("utf-8", errors="replace")
    return FirmwareLog(text=text, written=int(head.written))


def parse(data: bytes) -> Coredump:
    """Decode a dump.

    Raises :class:`ValueError` naming what is wrong: too short for its header
    or for the size it declares, a bad magic or version, a section that runs
    past the end, a payload too short for its structure, bytes after the
    last section, or a second CMD or FW_LOG section.
    """
    hsize = ctypes.sizeof(NpuDumpHeader)
    if len(data) < hsize:
        raise ValueError(f"truncated dump: {len(data)} bytes, shorter than its {hsize}-byte header")
    h = NpuDumpHeader.from_buffer_copy(data)
    if h.magic != NPU_DUMP_MAGIC:
        raise ValueError(
            f"bad magic {h.magic:#010x} (an NPU coredump starts with {NPU_DUMP_MAGIC:#010x})"
        )
    if h.version < 1:
        raise ValueError(f"bad version {h.version}")
    if h.size < hsize:
        raise ValueError(f"bad size {h.size} in the header: smaller than the header")
    if h.size > len(data):
        raise ValueError(f"truncated dump: the header says {h.size} bytes, got {len(data)}")
    registers: list[Registers] = []
    queues: list[QueueState] = []
    command: HungCommand | None = None
    fw_log: FirmwareLog | None = None
    unknown: list[UnknownSection] = []
    off = hsize
    ssize = ctypes.sizeof(NpuDumpSection)
    for i in range(h.num_sections):
        if off + ssize > h.size:
            raise ValueError(
                f"section {i} of {h.num_sections}: its header at offset {off} runs past "
                f"the dump's end ({h.size} bytes)"
            )
        sec = NpuDumpSection.from_buffer_copy(data, off)
        label = _section_label(i, sec.type)
        if sec.size % 8:
            raise ValueError(f"{label}: size {sec.size} is not a multiple of 8")
        start, end = off + ssize, off + ssize + sec.size
        if end > h.size:
            raise ValueError(
                f"{label}: {sec.size} bytes at offset {start} run past the dump's end "
                f"({h.size} bytes)"
            )
        payload = bytes(data[start:end])
        if sec.type == NPU_DUMP_SEC_REGS:
            registers.append(_parse_regs(payload, label))
        elif sec.type == NPU_DUMP_SEC_QUEUE:
            queues.append(_parse_queue(payload, label))
        elif sec.type == NPU_DUMP_SEC_CMD:
            if command is not None:
                raise ValueError(f"{label}: a second hung command")
            command = _parse_cmd(payload, label)
        elif sec.type == NPU_DUMP_SEC_FW_LOG:
            if fw_log is not None:
                raise ValueError(f"{label}: a second firmware log")
            fw_log = _parse_fw_log(payload, label)
        else:
            unknown.append(UnknownSection(type=int(sec.type), payload=payload))
        off = end
    if off != h.size:
        raise ValueError(
            f"{h.size - off} bytes after the last of {h.num_sections} sections (offset {off})"
        )
    return Coredump(
        version=int(h.version),
        size=int(h.size),
        reason=int(h.reason),
        cause=int(h.cause),
        queue=None if h.queue == NPU_DUMP_NO_QUEUE else int(h.queue),
        fence=int(h.fence),
        client=int(h.client),
        timestamp_ns=int(h.timestamp_ns),
        hw_version=int(h.hw_version),
        fw_version=int(h.fw_version),
        driver_version=int(h.driver_version),
        registers=tuple(registers),
        queues=tuple(queues),
        command=command,
        fw_log=fw_log,
        unknown=tuple(unknown),
    )


# --------------------------------------------------------------------------
# Formatting
# --------------------------------------------------------------------------


def _version(v: int) -> str:
    return f"{v >> 16}.{v & 0xFFFF}"


def _flags(value: int, names: Sequence[tuple[int, str]]) -> str:
    """``"A|B"`` for the set bits of ``value`` ("-" for none, unknown bits in hex)."""
    parts = [name for bit, name in names if value & bit]
    rest = value & ~sum(bit for bit, _ in names)
    if rest:
        parts.append(f"{rest:#x}")
    return "|".join(parts) or "-"


_STATUS_NAMES: Final = (
    (NPU_STATUS_READY, "READY"),
    (NPU_STATUS_ENABLED, "ENABLED"),
    (NPU_STATUS_RESETTING, "RESETTING"),
    (NPU_STATUS_ERROR, "ERROR"),
)
_QSTAT_NAMES: Final = (
    (NPU_QSTAT_IDLE, "IDLE"),
    (NPU_QSTAT_STOPPED, "STOPPED"),
    (NPU_QSTAT_ACTIVE, "ACTIVE"),
    (NPU_QSTAT_WAITING, "WAITING"),
)
_QFLAG_NAMES: Final = (
    (NPU_DUMP_Q_USER, "user"),
    (NPU_DUMP_Q_STOPPED, "stopped"),
    (NPU_DUMP_Q_HUNG, "hung"),
)
_FW_STATES: Final = {
    NPU_FW_OFF: "OFF",
    NPU_FW_RUNNING: "RUNNING",
    NPU_FW_FAILED: "FAILED",
    NPU_FW_CRASHED: "CRASHED",
}

#: The kind enum of each tensor opcode that has one (npu_cmd.tensor.kind).
_KINDS: Final[dict[int, type[enum.IntEnum]]] = {
    _abi.NPU_OP_ELTWISE: _abi.EltwiseKind,
    _abi.NPU_OP_UNARY: _abi.UnaryKind,
    _abi.NPU_OP_REDUCE: _abi.ReduceKind,
    _abi.NPU_OP_SOFTMAX: _abi.SoftmaxKind,
    _abi.NPU_OP_MATMUL: _abi.ActKind,
    _abi.NPU_OP_LINEAR: _abi.ActKind,
    _abi.NPU_OP_CONV2D: _abi.ActKind,
    _abi.NPU_OP_POOL2D: _abi.PoolKind,
    _abi.NPU_OP_REQUANT: _abi.ActKind,
}


def _register_note(offset: int, value: int) -> str:
    """A decoded meaning for the registers that have one."""
    name = register_name(offset)
    if name == "STATUS":
        return _flags(value, _STATUS_NAMES)
    if name == "ERROR":
        return _enum_name(_abi.DevError, value, "ERR_")
    if name == "FW_STATUS":
        return _FW_STATES.get(value, "")
    return ""


def _format_registers(regs: Registers) -> list[str]:
    """Device registers one a line; queue registers as a table, a column a queue."""
    when = "before the reset" if regs.when == NPU_DUMP_BEFORE_RESET else "after the reset"
    lines = [f"Registers ({when})"]
    per_queue: dict[int, dict[int, int]] = {}
    for offset, value in regs.values.items():
        q, reg = divmod(offset - NPU_QREG_BASE, NPU_QREG_STRIDE)
        if offset >= NPU_QREG_BASE and q < _abi.NPU_MAX_QUEUES and reg in QUEUE_REGISTERS:
            per_queue.setdefault(q, {})[reg] = value
            continue
        note = _register_note(offset, value)
        lines.append(
            f"  {offset:#07x}  {register_name(offset):20} {value:#010x}"
            + (f"  {note}" if note else "")
        )
    if per_queue:
        queues = sorted(per_queue)
        lines.append(f"  {'queue registers':27}" + "".join(f"{f'Q{q}':>12}" for q in queues))
        for reg, name in QUEUE_REGISTERS.items():
            if not any(reg in per_queue[q] for q in queues):
                continue
            cells = [per_queue[q].get(reg) for q in queues]
            lines.append(
                f"  {reg:#07x}  {name:18}"
                + "".join(f"{'-' if v is None else f'{v:#010x}':>12}" for v in cells)
            )
    return lines


def _format_command(c: HungCommand) -> list[str]:
    d = c.descriptor
    op = c.opcode
    lines = [
        f"Hung command (queue {c.queue}, ring slot {c.slot})",
        f"  {c.opcode_name}  fence {d.fence}  ctx {d.ctx}  flags "
        f"{_flags(d.flags, ((_abi.NPU_CMD_F_IRQ, 'IRQ'),))}",
    ]
    if op == _abi.NPU_OP_COPY:
        lines.append(f"  src {d.copy.src:#x}  dst {d.copy.dst:#x}  len {d.copy.len}")
    elif op == _abi.NPU_OP_FILL:
        lines.append(f"  dst {d.fill.dst:#x}  len {d.fill.len}  pattern {d.fill.pattern:#010x}")
    elif op == _abi.NPU_OP_GEMM:
        g = d.gemm
        trans = ((_abi.NPU_GEMM_TRANS_A, "TRANS_A"), (_abi.NPU_GEMM_TRANS_B, "TRANS_B"))
        lines += [
            f"  a {g.a:#x}  b {g.b:#x}  c {g.c:#x}",
            f"  m {g.m}  n {g.n}  k {g.k}  lda {g.lda}  ldb {g.ldb}  ldc {g.ldc}  "
            f"dtype {_enum_name(_abi.DType, g.dtype, 'DTYPE_')}  flags {_flags(g.flags, trans)}",
        ]
    elif op in (_abi.NPU_OP_SIGNAL, _abi.NPU_OP_WAIT):
        lines.append(f"  va {d.sync.va:#x}  value {d.sync.value}")
    elif op in _abi.TENSOR_OPCODES:
        kind_enum = _KINDS.get(op)
        kind = _enum_name(kind_enum, d.tensor.kind, "") if kind_enum else str(d.tensor.kind)
        lines.append(f"  params {d.tensor.params:#x}  kind {kind}")
        p = c.tensor_params
        if p is None:
            lines.append("  (parameter block not captured)")
        else:
            for i, t in enumerate(p.t):
                if t.ndim == 0 and t.va == 0:
                    continue
                n = min(int(t.ndim), _abi.NPU_MAX_RANK)
                lines.append(
                    f"  t[{i}] va {t.va:#x}  {_enum_name(_abi.DType, t.dtype, 'DTYPE_')}  "
                    f"shape {list(t.shape[:n])}  strides {list(t.strides[:n])}"
                )
            used = [(i, v) for i, v in enumerate(p.params) if v]
            if used:
                lines.append("  params " + "  ".join(f"[{i}] {v:#x}" for i, v in used))
    elif op != _abi.NPU_OP_NOP:
        words = "  ".join(f"{w:#x}" for w in d.raw if w)
        lines.append(f"  payload {words or '0'}")
    return lines


def format(dump: Coredump) -> str:
    """Render a dump for humans: the header, the queues, the hung command,
    the registers (named, with the meaning of status words) and the log."""
    why = _REASON_TEXT.get(dump.reason)
    lines = [
        f"NPU device coredump (version {dump.version}, {dump.size} bytes)",
        f"  reason     {dump.reason_name}" + (f": {why}" if why else ""),
    ]
    if dump.cause != dump.reason:
        lines.append(f"  cause      {dump.cause_name}")
    lines += [
        f"  queue      {'-' if dump.queue is None else dump.queue}",
        f"  fence      {dump.fence or '-'}",
        f"  client     {dump.client or '-'}",
        f"  captured   {dump.timestamp_ns / 1e9:.6f} s (CLOCK_MONOTONIC)",
        f"  versions   hardware {_version(dump.hw_version)}, firmware "
        f"{_version(dump.fw_version)}, driver {_version(dump.driver_version)}",
        "",
        "Queues",
        "  queue  flags             head      tail  status          error         "
        "done  next_fence   completed  client  entries",
    ]
    for q in dump.queues:
        lines.append(
            f"  {q.index:5}  {_flags(q.flags, _QFLAG_NAMES):12}  {q.head:8}  {q.tail:8}  "
            f"{_flags(q.status, _QSTAT_NAMES):14}  "
            f"{_enum_name(_abi.DevError, q.error, 'ERR_'):12}  {q.done:5}  "
            f"{q.next_fence if not q.is_user else '-':>10}  {q.completed:10}  "
            f"{q.client or '-':>6}  {q.entries:7}"
        )
    lines.append("")
    if dump.command is not None:
        lines += [*_format_command(dump.command), ""]
    for regs in dump.registers:
        lines += [*_format_registers(regs), ""]
    for sec in dump.unknown:
        lines += [f"Unknown section type {sec.type} ({len(sec.payload)} bytes)", ""]
    if dump.fw_log is None:
        lines.append("Firmware log: none")
    else:
        log = dump.fw_log
        lines.append(f"Firmware log ({len(log.text.encode())} bytes; {log.written} written)")
        lines += [f"  {line}" for line in log.text.splitlines()]
    return "\n".join(lines) + "\n"


# --------------------------------------------------------------------------
# devcoredump in sysfs
# --------------------------------------------------------------------------


def _read_id(path: Path) -> int | None:
    try:
        return int(path.read_text().strip(), 16)
    except (OSError, ValueError):
        return None


def is_npu(device: Path) -> bool:
    """True if the sysfs device directory ``device`` is an NPU (its PCI IDs)."""
    return (
        _read_id(device / "vendor") == _abi.NPU_PCI_VENDOR_ID
        and _read_id(device / "device") == _abi.NPU_PCI_DEVICE_ID
    )


def find_dumps(root: Path = DEVCOREDUMP) -> list[Path]:
    """The ``data`` files of the pending dumps under ``root`` whose failing
    device is an NPU, oldest (lowest devcdN) first."""

    def number(p: Path) -> int:
        digits = p.name.removeprefix("devcd")
        return int(digits) if digits.isdigit() else -1

    if not root.is_dir():
        return []
    found = []
    for devcd in sorted(root.glob("devcd*"), key=number):
        if (devcd / "data").exists() and is_npu(devcd / "failing_device"):
            found.append(devcd / "data")
    return found


def dismiss(data: Path) -> None:
    """Free a pending dump: any write to its ``data`` file does it."""
    with open(data, "wb") as f:
        f.write(b"1")


def main(argv: Sequence[str] | None = None) -> int:
    """``python3 -m npu.coredump [FILE] [--save OUT] [--dismiss]``: print a dump."""
    ap = argparse.ArgumentParser(
        prog="python3 -m npu.coredump",
        description="Decode an NPU device coredump (include/npu_coredump.h).",
    )
    ap.add_argument(
        "file",
        nargs="?",
        type=Path,
        help="a dump, or a devcoredump data file (default: the first pending NPU dump in "
        f"{DEVCOREDUMP})",
    )
    ap.add_argument("--save", type=Path, metavar="OUT", help="also write the raw dump to OUT")
    ap.add_argument(
        "--dismiss", action="store_true", help="free the devcoredump once printed (writes to data)"
    )
    args = ap.parse_args(argv)
    path: Path | None = args.file
    if path is None:
        found = find_dumps(DEVCOREDUMP)
        if not found:
            print(f"no NPU coredump pending in {DEVCOREDUMP}", file=sys.stderr)
            return 1
        path = found[0]
    is_devcd = (path.resolve().parent / "failing_device").exists()
    if args.dismiss and not is_devcd:
        print(f"--dismiss: {path} is not a devcoredump data file", file=sys.stderr)
        return 2
    try:
        data = path.read_bytes()
    except OSError as e:
        print(f"{path}: {e.strerror}", file=sys.stderr)
        return 1
    if args.save is not None:
        args.save.write_bytes(data)
    try:
        dump = parse(data)
    except ValueError as e:
        print(f"{path}: {e}", file=sys.stderr)
        return 1
    print(f"{path}:")
    print(format(dump), end="")
    if args.dismiss:
        dismiss(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
