#!/usr/bin/env python3
"""Write the seed corpus of the device fuzzer (tests/fuzz/corpus/, docs/fuzzing.md).

    python3 tests/fuzz/make_corpus.py [-o tests/fuzz/corpus]

Each seed is an input of QEMU's generic-fuzz target
(tests/qtest/fuzz/generic_fuzz.c): operations separated by ``FUZZ``, each
an opcode byte and its operands. MMIO operations name a fuzzable memory
region by index (``BAR0`` below: the npu's registers, the first region
matched, at the lowest address) and an offset in it; guest RAM is filled
only through DMA patterns: the device's n-th read of guest memory after
the patterns are set gets pattern n (cyclically). So a seed programs a
queue, queues the patterns its descriptor will read (the descriptor,
then the parameter block, page tables and operands, in the order the
device reads them), rings the doorbell and reads the status back.

The seeds cover every opcode with a valid descriptor, the device MMU (a
device-wide table, context table entries, a confined queue, device
memory), firmware boot, the mailbox and the log ring, fault injection,
soft reset, several queues with priorities, SIGNAL/WAIT across queues,
interrupt moderation and MSI-X, and the DMA targets of docs/npu-spec.md 13:
engine DMA, rings, fences, trace and log rings and page tables aimed at
q35's ROM, other devices' MMIO, the device's own BARs, ECAM and unassigned
space, each followed by a D3hot, a soft reset, a queue disable or just the
system reset that ends every input (the liveness oracle times that reset
and watches the engine threads for the BQL, docs/fuzzing.md).
The constants come from include/npu_hw.h
(through tests/host/qtest.py) and the firmware image from scripts/mkfw.py,
so the seeds follow the headers.
"""

from __future__ import annotations

import argparse
import struct
import subprocess
import sys
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "tests" / "host"))

import qtest  # noqa: E402
from qtest import hw  # noqa: E402

SEPARATOR = b"FUZZ"
# generic_fuzz.c's opcodes (enum cmds) and access sizes.
OP_READ, OP_WRITE, OP_PCI_READ, OP_PCI_WRITE = 2, 3, 4, 5
OP_ADD_DMA_PATTERN, OP_CLEAR_DMA_PATTERNS, OP_CLOCK_STEP = 7, 8, 9
SIZE_LONG, SIZE_QUAD = 2, 3
# Fuzzable MMIO regions in address order (libqos maps BAR0, BAR2, BAR4 in
# turn; BAR2 is RAM, which generic-fuzz does not write).
BAR0, MSIX_TABLE = 0, 1

# Guest-physical layout of the seeds (512 MiB of RAM at 0).
RING, CPL, FENCE = 0x10_0000, 0x14_0000, 0x15_0000
L1, L2, CTX_TABLE = 0x20_0000, 0x20_1000, 0x21_0000
PARAMS = 0x30_0000
DATA, OUT = 0x40_0000, 0x50_0000
FIRMWARE, FW_LOG = 0x60_0000, 0x70_0000
Q_RINGS = 0x80_0000  # queue q: ring at Q_RINGS + q * 0x1_0000, cpl +0x8000

ONE_F32 = struct.pack("<f", 1.0)

Op = bytes


def write(off: int, val: int, *, size: int = SIZE_LONG, base: int = BAR0) -> Op:
    return bytes([OP_WRITE]) + struct.pack("<BBxxIQ", size, base, off, val)


def read(off: int, *, size: int = SIZE_LONG, base: int = BAR0) -> Op:
    return bytes([OP_READ]) + struct.pack("<BBxxI", size, base, off)


def pci_write(off: int, val: int, *, size: int = SIZE_LONG) -> Op:
    return bytes([OP_PCI_WRITE]) + struct.pack("<BBBxI", size, 0, off, val)


def pci_read(off: int, *, size: int = SIZE_LONG) -> Op:
    return bytes([OP_PCI_READ]) + struct.pack("<BBB", size, 0, off)


def dma(data: bytes, *, index: int = 0, stride: int = 0) -> Op:
    """A DMA pattern: data repeated, byte ``index`` of each copy += stride."""
    return bytes([OP_ADD_DMA_PATTERN]) + struct.pack("<BB", index, stride) + data


def clear_dma() -> Op:
    return bytes([OP_CLEAR_DMA_PATTERNS])


def clock_step() -> Op:
    return bytes([OP_CLOCK_STEP])


def seed(*ops: Op) -> bytes:
    for op in ops:
        assert SEPARATOR not in op, op
    return SEPARATOR.join(ops)


# -- device programming ------------------------------------------------------


def qwrite(q: int, reg: int, val: int) -> Op:
    return write(hw.qreg(q, reg), val)


def queue(q: int = 0, *, size: int = 64, priority: int = 0, enable: bool = True) -> list[Op]:
    ring = RING if q == 0 else Q_RINGS + q * 0x1_0000
    cpl = CPL if q == 0 else ring + 0x8000
    fence = FENCE if q == 0 else ring + 0xC000
    ops = [
        qwrite(q, hw.Q_RING_LO, ring),
        qwrite(q, hw.Q_RING_HI, 0),
        qwrite(q, hw.Q_RING_SIZE, size),
        qwrite(q, hw.Q_CPL_LO, cpl),
        qwrite(q, hw.Q_CPL_HI, 0),
        qwrite(q, hw.Q_FENCE_LO, fence),
        qwrite(q, hw.Q_FENCE_HI, 0),
    ]
    if priority:
        ops.append(qwrite(q, hw.Q_PRIORITY, priority))
    if enable:
        ops.append(qwrite(q, hw.Q_CONTROL, hw.QCTL_ENABLE))
    return ops


def enable_device() -> list[Op]:
    return [write(hw.REG_IRQ_MASK, 0xFFFF_FFFF), write(hw.REG_CONTROL, hw.CONTROL_ENABLE)]


def doorbell(tail: int, q: int = 0) -> Op:
    return write(hw.doorbell(q), tail)


def status(q: int = 0) -> list[Op]:
    """Read back what the command did (IRQ_STATUS has bit q on an error)."""
    return [
        read(hw.qreg(q, hw.Q_HEAD)),
        read(hw.qreg(q, hw.Q_STATUS)),
        read(hw.REG_IRQ_STATUS),
        read(hw.REG_ERROR),
        read(hw.REG_STATUS),
    ]


def run(descs: Sequence[bytes], extra: Sequence[bytes] = (), *, setup: Sequence[Op] = ()) -> bytes:
    """Queue 0 runs ``descs``; the device's further reads get ``extra`` in turn."""
    return seed(
        *setup,
        *queue(0),
        *enable_device(),
        *(dma(d) for d in descs),
        *(dma(e) for e in extra),
        doorbell(len(descs)),
        *status(0),
    )


# -- descriptors ---------------------------------------------------------------

IRQ = hw.CMD_F_IRQ
FP32, FP16, INT8, INT32 = hw.DTYPE_FP32, hw.DTYPE_FP16, hw.DTYPE_INT8, hw.DTYPE_INT32


def t(va: int, dtype: int, shape: Sequence[int]) -> bytes:
    """A contiguous (row-major) tensor operand."""
    strides = [1] * len(shape)
    for i in range(len(shape) - 2, -1, -1):
        strides[i] = strides[i + 1] * shape[i + 1]
    return qtest.hw_tensor(va, dtype, shape, strides)


def tensor_seed(
    opcode: int, operands: Sequence[bytes], params: Sequence[int] = (), kind: int = 0
) -> bytes:
    desc = qtest.tensor(opcode, PARAMS, kind, fence=1)
    block = qtest.tensor_params(operands, params)
    # The operands are read after the parameter block: all of them 1.0f.
    return run([desc], [block, ONE_F32, ONE_F32, ONE_F32, ONE_F32])


def opcode_seeds() -> dict[str, bytes]:
    f32_eps = struct.unpack("<I", struct.pack("<f", 1e-5))[0]
    seeds = {
        "op-nop": run([qtest.nop(1, flags=IRQ)]),
        "op-copy": run([qtest.copy(DATA, OUT, 0x1000, 1)], [bytes(range(1, 65))]),
        "op-fill": run([qtest.fill(OUT, 0x1000, 0xA5A5_5A5A, 1)]),
        "op-gemm": run(
            [qtest.gemm(DATA, DATA + 0x1000, OUT, 4, 4, 4, 4, 4, 4, fence=1)],
            [ONE_F32, ONE_F32, ONE_F32],
        ),
        "op-eltwise": tensor_seed(
            hw.OP_ELTWISE,
            [t(DATA, FP32, [4, 4]), t(DATA + 0x1000, FP32, [1, 4]), t(OUT, FP32, [4, 4])],
            kind=hw.ELTWISE_ADD,
        ),
        "op-unary": tensor_seed(
            hw.OP_UNARY, [t(DATA, FP32, [16]), t(OUT, FP32, [16])], kind=hw.UNARY_GELU
        ),
        "op-convert": tensor_seed(hw.OP_CONVERT, [t(DATA, FP32, [2, 8]), t(OUT, FP16, [2, 8])]),
        "op-reduce": tensor_seed(
            hw.OP_REDUCE,
            [t(DATA, FP32, [2, 4]), t(OUT, FP32, [2, 1])],
            [0b10],
            kind=hw.REDUCE_SUM,
        ),
        "op-softmax": tensor_seed(
            hw.OP_SOFTMAX, [t(DATA, FP32, [2, 4]), t(OUT, FP32, [2, 4])], [1]
        ),
        "op-layernorm": tensor_seed(
            hw.OP_LAYERNORM,
            [
                t(DATA, FP32, [2, 4]),
                t(DATA + 0x1000, FP32, [1, 4]),
                t(DATA + 0x2000, FP32, [1, 4]),
                t(OUT, FP32, [2, 4]),
            ],
            [1, f32_eps],
        ),
        "op-matmul": tensor_seed(
            hw.OP_MATMUL,
            [t(DATA, FP32, [2, 3]), t(DATA + 0x1000, FP32, [3, 2]), t(OUT, FP32, [2, 2])],
            kind=hw.ACT_RELU,
        ),
        "op-linear": tensor_seed(
            hw.OP_LINEAR,
            [
                t(DATA, FP32, [2, 3]),
                t(DATA + 0x1000, FP32, [3, 2]),
                t(DATA + 0x2000, FP32, [1, 2]),
                t(OUT, FP32, [2, 2]),
            ],
        ),
        "op-conv2d": tensor_seed(
            hw.OP_CONV2D,
            [
                t(DATA, FP32, [1, 1, 4, 4]),
                t(DATA + 0x1000, FP32, [1, 1, 3, 3]),
                t(DATA + 0x2000, FP32, [1, 1, 1, 1]),
                t(OUT, FP32, [1, 1, 2, 2]),
            ],
            [1, 1, 0, 0, 1, 1, 1],
        ),
        "op-conv2d-int8": tensor_seed(
            hw.OP_CONV2D,
            [
                t(DATA, INT8, [1, 2, 4, 4]),
                t(DATA + 0x1000, INT8, [2, 1, 3, 3]),
                t(DATA + 0x2000, INT32, [1, 2, 1, 1]),
                t(OUT, INT32, [1, 2, 2, 2]),
            ],
            [1, 1, 0, 0, 1, 1, 2, 3],
        ),
        "op-pool2d": tensor_seed(
            hw.OP_POOL2D,
            [t(DATA, FP32, [1, 1, 4, 4]), t(OUT, FP32, [1, 1, 2, 2])],
            [2, 2, 2, 2, 0, 0, 0],
            kind=hw.POOL_AVG,
        ),
        "op-requant": tensor_seed(
            hw.OP_REQUANT,
            [t(DATA, INT32, [4]), t(DATA + 0x1000, FP32, [1]), t(OUT, INT8, [4])],
            [0],
        ),
        "op-select": tensor_seed(
            hw.OP_SELECT,
            [
                t(DATA, hw.DTYPE_BOOL, [2, 4]),
                t(DATA + 0x1000, FP32, [2, 4]),
                t(DATA + 0x2000, FP32, [1, 4]),
                t(OUT, FP32, [2, 4]),
            ],
        ),
        "op-convert-strided": tensor_seed(
            hw.OP_CONVERT,
            [t(DATA, FP32, [2, 3]), qtest.hw_tensor(OUT, FP32, [2, 3], [8, 2])],
        ),
        "op-signal": run([qtest.cmd(hw.OP_SIGNAL, struct.pack("<QQ", OUT, 7), fence=1)]),
        "op-wait": run([qtest.cmd(hw.OP_WAIT, struct.pack("<QQ", DATA, 1), fence=1)], [ONE_F32]),
    }
    return seeds


# -- the MMU ---------------------------------------------------------------


def pte(addr: int, *, write_ok: bool = True, local: bool = False) -> bytes:
    v = addr | hw.PTE_VALID | (hw.PTE_WRITE if write_ok else 0) | (hw.PTE_LOCAL if local else 0)
    return struct.pack("<Q", v)


def l2_pattern(first: int, *, local: bool = False) -> Op:
    """An L2 table whose PTE i maps VA page i to ``first`` + i pages (16 of them)."""
    return dma(pte(first, local=local), index=1, stride=0x10)


def mmu_setup(entries: int = 4) -> list[Op]:
    return [
        write(hw.REG_MMU_L1_LO, L1),
        write(hw.REG_MMU_L1_HI, 0),
        write(hw.REG_MMU_L1_ENTRIES, entries),
        write(hw.REG_MMU_CONTROL, hw.MMU_ENABLE),
    ]


def mmu_seeds() -> dict[str, bytes]:
    l1e = pte(L2)
    copy_va = qtest.copy(0x1000, 0x2000, 0x800, 1)
    ctx_entry = struct.pack("<QII", L1 | hw.PTE_VALID, 1, 0)
    return {
        # descriptor, L1 entry, L2 table, source data
        "mmu-copy": seed(
            *mmu_setup(),
            *queue(0),
            *enable_device(),
            dma(copy_va),
            dma(l1e),
            l2_pattern(DATA),
            dma(bytes(range(64))),
            doorbell(1),
            *status(0),
            read(hw.REG_MMU_FAULT_LO),
            read(hw.REG_MMU_FAULT_INFO),
            read(hw.REG_MMU_FAULTS),
        ),
        # the same through context table entry 1
        "mmu-ctx": seed(
            write(hw.REG_MMU_CTX_LO, CTX_TABLE),
            write(hw.REG_MMU_CTX_HI, 0),
            write(hw.REG_MMU_CTX_COUNT, 4),
            *queue(0),
            *enable_device(),
            dma(qtest.copy(0x1000, 0x2000, 0x800, 1, ctx=1)),
            dma(ctx_entry),
            dma(l1e),
            l2_pattern(DATA),
            dma(bytes(range(64))),
            doorbell(1),
            *status(0),
            read(hw.REG_MMU_FAULT_CTX),
        ),
        # queue 1 with an address space of its own (confined)
        "mmu-confined-queue": seed(
            qwrite(1, hw.Q_MMU_L1_LO, L1),
            qwrite(1, hw.Q_MMU_L1_HI, 0),
            qwrite(1, hw.Q_MMU_L1_ENTRIES, 2),
            *queue(1),
            *enable_device(),
            dma(qtest.fill(0x3000, 0x100, 0x1234_5678, 1)),
            dma(l1e),
            l2_pattern(OUT),
            doorbell(1, 1),
            *status(1),
            read(hw.REG_MMU_FAULT_QUEUE),
        ),
        # device memory: FILL a local page, COPY it to another, GEMM in place
        "mmu-local-memory": seed(
            *mmu_setup(1),
            *queue(0),
            *enable_device(),
            # the first command walks the tables; the others find them
            # filled (one fill per region and operation)
            dma(qtest.fill(0x0, 0x2000, 0x3F80_0000, 1)),
            dma(l1e),
            l2_pattern(0, local=True),
            dma(qtest.copy(0x0, 0x4000, 0x1000, 2)),
            dma(qtest.gemm(0x0, 0x1000, 0x8000, 8, 8, 8, 8, 8, 8, fence=3)),
            doorbell(3),
            *status(0),
        ),
    }


# -- firmware, mailbox, injection, reset, queues, interrupts -----------------


def mbox(cmd: int, arg0: int = 0, arg1: int = 0, seq: int = 1) -> list[Op]:
    return [
        write(hw.REG_MBOX_CMD, cmd),
        write(hw.REG_MBOX_ARG0, arg0),
        write(hw.REG_MBOX_ARG1, arg1),
        write(hw.REG_MBOX_SEQ, seq),
        read(hw.REG_MBOX_RESP_SEQ),
        read(hw.REG_MBOX_RESP_STATUS),
        read(hw.REG_MBOX_RESP0),
        read(hw.REG_MBOX_RESP1),
    ]


def firmware_seeds() -> dict[str, bytes]:
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "npu_fw.bin"
        subprocess.run(
            [
                sys.executable,
                str(REPO / "scripts" / "mkfw.py"),
                str(REPO / "firmware" / "npu_fw.json"),
                "-o",
                str(out),
            ],
            check=True,
            capture_output=True,
        )
        image = out.read_bytes()
    boot = [
        write(hw.REG_FW_CONTROL, hw.FW_STOP),
        write(hw.REG_FW_ADDR_LO, FIRMWARE),
        write(hw.REG_FW_ADDR_HI, 0),
        write(hw.REG_FW_SIZE, len(image)),
        dma(image),
        write(hw.REG_FW_CONTROL, hw.FW_BOOT),
        clear_dma(),
        read(hw.REG_FW_STATUS),
        read(hw.REG_FW_ERROR),
        read(hw.REG_FW_VERSION),
    ]
    log = [
        write(hw.REG_FW_LOG_LO, FW_LOG),
        write(hw.REG_FW_LOG_HI, 0),
        write(hw.REG_FW_LOG_SIZE, 0x1000),
    ]
    return {
        "fw-boot": seed(*boot, clock_step(), read(hw.REG_FW_HEARTBEAT), *mbox(hw.MBOX_PING, 41)),
        "fw-boot-run": seed(
            *boot,
            *queue(0),
            *enable_device(),
            dma(qtest.nop(1, flags=IRQ)),
            doorbell(1),
            *status(0),
        ),
        "fw-mailbox": seed(
            *log,
            *mbox(hw.MBOX_SET_LOG_LEVEL, 3, seq=1),
            *mbox(hw.MBOX_QUERY, seq=2),
            *mbox(hw.MBOX_CREATE_QUEUE, 2, 1, seq=3),
            *mbox(hw.MBOX_RESET_QUEUE, 2, seq=4),
            *mbox(hw.MBOX_DESTROY_QUEUE, 2, seq=5),
            *mbox(hw.MBOX_PING, 1, seq=6),
        ),
        "fw-crash": seed(
            *queue(0),
            *enable_device(),
            write(hw.REG_INJECT, hw.INJECT_FW_CRASH),
            dma(qtest.nop(1)),
            doorbell(1),
            *status(0),
            read(hw.REG_FW_STATUS),
            write(hw.REG_FW_CONTROL, hw.FW_STOP),
            *mbox(hw.MBOX_PING),
        ),
    }


# -- DMA targets other than RAM, then an event that waits for the engine -------

# q35 under the fuzzer (no firmware has run: ECAM is closed, the PAM
# registers at their reset value) and the BARs libqos maps for the npu.
# Every unmapped address is the fuzzer's sparse-mem (MMIO) there.
DMA_TARGETS = {
    "pc-bios": 0xFFFC_0000,  # pc.bios: SeaBIOS, 256 KiB of read-only RAM
    "isa-bios": 0x000E_0000,  # its alias below 1 MiB (PAM: reads go to ROM)
    "pc-rom": 0x000C_0000,  # the option ROM space, ROM
    "hpet": 0xFED0_0000,
    "ioapic": 0xFEC0_0000,
    "lapic": 0xFEE0_0000,  # the APIC/MSI window
    "own-bar0": 0xE000_0000,  # the npu's registers
    "own-bar2": 0xE400_0000,  # its device memory (RAM, refused as its own BAR)
    "own-bar4": 0xE800_0000,  # its MSI-X table
    "ecam": 0xB000_0000,  # q35's MMCONFIG window (closed without firmware)
    "unassigned": 0x30_0000_0000,
}
PM_CAP = 0x4C  # the PCI PM capability (after MSI-X at 0x40)
BIG_FILL = 64 << 20  # a RAM FILL of 16 pieces: still running after the settle
QUEUE_DISABLE = hw.qreg(0, hw.Q_CONTROL)


def lo_hi(addr: int) -> tuple[int, int]:
    return addr & 0xFFFF_FFFF, addr >> 32


def ending(event: str) -> list[Op]:
    """An event that waits for the engine; every input ends with a system reset."""
    return {
        "d3hot": [pci_write(PM_CAP + 4, 3), pci_read(PM_CAP + 4)],
        "soft-reset": [write(hw.REG_CONTROL, hw.CONTROL_RESET), read(hw.REG_STATUS)],
        "queue-disable": [write(QUEUE_DISABLE, 0), read(QUEUE_DISABLE)],
        "system-reset": [],
    }[event]


EVENTS = ("system-reset", "d3hot", "soft-reset", "queue-disable")


def target_dma(addr: int, event: str) -> bytes:
    """Engine DMA from and to the target, a long RAM FILL, then the event."""
    descs = [
        qtest.fill(addr, 0x1000, 0x5A5A_A5A5, 1),
        qtest.copy(addr, OUT, 0x1000, 2),
        qtest.cmd(hw.OP_WAIT, struct.pack("<QQ", addr, 1), fence=3),
        qtest.cmd(hw.OP_SIGNAL, struct.pack("<QQ", addr, 7), fence=4),
        qtest.gemm(addr, addr + 0x1000, OUT, 4, 4, 4, 4, 4, 4, fence=5),
        qtest.fill(DATA, BIG_FILL, 0, 6),
    ]
    # Reads of the target are refused or read ROM: only the fetches read RAM.
    return seed(
        *queue(0),
        *enable_device(),
        *(dma(d) for d in descs),
        doorbell(len(descs)),
        *ending(event),
        *status(0),
    )


def target_rings(addr: int, event: str) -> bytes:
    """Queue rings, fences, the trace ring and the firmware log at the target."""
    lo, hi = lo_hi(addr)
    tr = hw.TRACE_BASE
    ops = [*queue(0), *queue(1, enable=False), *queue(2, enable=False), *queue(3, enable=False)]
    for q, (reg_lo, reg_hi) in (
        (1, (hw.Q_RING_LO, hw.Q_RING_HI)),
        (2, (hw.Q_CPL_LO, hw.Q_CPL_HI)),
        (3, (hw.Q_FENCE_LO, hw.Q_FENCE_HI)),
    ):
        ops += [qwrite(q, reg_lo, lo), qwrite(q, reg_hi, hi)]
        ops += [qwrite(q, hw.Q_CONTROL, hw.QCTL_ENABLE)]
        ops += [read(hw.qreg(q, hw.Q_CONTROL)), read(hw.qreg(q, hw.Q_ERROR))]
    ops += [
        write(tr + hw.TRACE_RING_LO, lo),
        write(tr + hw.TRACE_RING_HI, hi),
        write(tr + hw.TRACE_RING_SIZE, 64),
        write(tr + hw.TRACE_MASK, 0xFFFF_FFFF),
        write(tr + hw.TRACE_CONTROL, hw.TRACE_ENABLE),
        read(tr + hw.TRACE_CONTROL),
        write(hw.REG_FW_LOG_LO, lo),
        write(hw.REG_FW_LOG_HI, hi),
        write(hw.REG_FW_LOG_SIZE, 0x1000),
        *mbox(hw.MBOX_SET_LOG_LEVEL, 3),
        *enable_device(),
        # every queue whose ring is RAM fetches this (a ring in ROM: BIOS bytes)
        dma(qtest.fill(DATA, BIG_FILL // 4, 0, 1)),
        *(doorbell(2, q) for q in range(4)),
        *ending(event),
        *status(0),
        read(tr + hw.TRACE_HEAD),
    ]
    return seed(*ops)


def target_mmu(addr: int, event: str) -> bytes:
    """Page tables, a PTE's page and a context table at the target."""
    lo, hi = lo_hi(addr)
    return seed(
        *mmu_setup(),
        write(hw.REG_MMU_CTX_LO, lo),
        write(hw.REG_MMU_CTX_HI, hi),
        write(hw.REG_MMU_CTX_COUNT, 4),
        qwrite(1, hw.Q_MMU_L1_LO, lo),
        qwrite(1, hw.Q_MMU_L1_HI, hi),
        qwrite(1, hw.Q_MMU_L1_ENTRIES, 2),
        *queue(0),
        *queue(1),
        *enable_device(),
        # queue 0: a FILL through L1 (RAM) -> L2 (RAM) -> PTEs to the target,
        # then one in context 1, whose table entry is at the target
        dma(qtest.fill(0x1000, 0x1000, 1, 1)),
        dma(pte(L2)),
        dma(pte(addr), index=1, stride=0x10),
        dma(qtest.fill(0x1000, 0x1000, 1, 2, ctx=1)),
        doorbell(2),
        # queue 1 (confined): its L1 table is the target
        dma(qtest.fill(0x1000, 0x1000, 1, 1)),
        doorbell(1, 1),
        *ending(event),
        *status(0),
        *status(1),
        read(hw.REG_MMU_FAULT_INFO),
    )


def dma_target_seeds() -> dict[str, bytes]:
    seeds = {}
    kinds = (("dma", target_dma), ("rings", target_rings), ("mmu", target_mmu))
    for i, (name, addr) in enumerate(DMA_TARGETS.items()):
        for k, (kind, make) in enumerate(kinds):
            seeds[f"target-{name}-{kind}"] = make(addr, EVENTS[(i + k) % len(EVENTS)])
    return seeds


def misc_seeds() -> dict[str, bytes]:
    nops = [qtest.nop(i + 1, flags=IRQ) for i in range(4)]
    signal_q1 = qtest.cmd(hw.OP_SIGNAL, struct.pack("<QQ", OUT, 5), fence=1)
    wait_q0 = qtest.cmd(hw.OP_WAIT, struct.pack("<QQ", OUT, 5), fence=1)
    seeds = {
        "inject-hang-reset": seed(
            *queue(0),
            *enable_device(),
            write(hw.REG_INJECT, hw.INJECT_HANG),
            dma(qtest.nop(1)),
            doorbell(1),
            *status(0),
            write(hw.REG_CONTROL, hw.CONTROL_RESET),
            read(hw.REG_STATUS),
            *status(0),
        ),
        "soft-reset-during-gemm": seed(
            *queue(0),
            *enable_device(),
            dma(qtest.gemm(DATA, DATA + 0x10000, OUT, 64, 64, 64, 64, 64, 64, fence=1)),
            dma(ONE_F32),
            dma(ONE_F32),
            doorbell(1),
            write(hw.REG_CONTROL, hw.CONTROL_RESET),
            *status(0),
        ),
        "two-queues-priority": seed(
            *queue(0),
            *queue(1, priority=3),
            *enable_device(),
            dma(qtest.fill(OUT, 0x10000, 1, 1)),
            dma(qtest.nop(1, flags=IRQ)),
            doorbell(1, 0),
            doorbell(1, 1),
            *status(0),
            *status(1),
        ),
        "signal-wait-queues": seed(
            *queue(0),
            *queue(1),
            *enable_device(),
            dma(wait_q0),
            dma(b"\0" * 8),
            doorbell(1, 0),
            clear_dma(),
            dma(signal_q1),
            doorbell(1, 1),
            *status(0),
            *status(1),
        ),
        "irq-moderation": seed(
            *queue(0),
            qwrite(0, hw.Q_IRQ_COUNT, 3),
            qwrite(0, hw.Q_IRQ_DELAY, 100),
            *enable_device(),
            *(dma(d) for d in nops),
            doorbell(4),
            clock_step(),
            read(hw.qreg(0, hw.Q_IRQS)),
            *status(0),
        ),
        "ring-wrap-restart": seed(
            *queue(0, size=2),
            *enable_device(),
            *(dma(d) for d in nops[:2]),
            doorbell(2),
            clear_dma(),
            *(dma(d) for d in nops[2:]),
            doorbell(4),
            *status(0),
            qwrite(0, hw.Q_CONTROL, 0),
            qwrite(0, hw.Q_HEAD, 6),
            qwrite(0, hw.Q_CONTROL, hw.QCTL_ENABLE),
            dma(nops[0]),
            doorbell(7),
            *status(0),
        ),
        "bad-descriptor": run(
            [qtest.cmd(hw.OP_COPY, struct.pack("<QQQ", DATA, OUT, 0), flags=0x80, rsvd0=1)]
        ),
    }
    # MSI-X: enable it in config space (the capability is the device's
    # only one), program vector 1 and complete a command with an IRQ.
    msix = [pci_read(0x34, size=0)]
    # MSI-X enable: bit 15 of the message control word at 0x42 (generic-fuzz
    # accesses config space through 0xcfc only: a long write at the cap)
    msix += [pci_write(0x40, 0x8000_0000), pci_read(0x40)]
    msix += [
        write(16 + 0, 0xFEE0_0000, base=MSIX_TABLE),
        write(16 + 8, 0x41, base=MSIX_TABLE),
        write(16 + 12, 0, base=MSIX_TABLE),
    ]
    seeds["msix-completion"] = seed(
        *msix,
        *queue(0),
        *enable_device(),
        dma(qtest.nop(1, flags=IRQ)),
        doorbell(1),
        *status(0),
    )
    return seeds


SEEDS: tuple[Callable[[], dict[str, bytes]], ...] = (
    opcode_seeds,
    mmu_seeds,
    firmware_seeds,
    misc_seeds,
    dma_target_seeds,
)


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-o", "--out", type=Path, default=Path(__file__).parent / "corpus")
    args = ap.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    names: set[str] = set()
    for make in SEEDS:
        for name, data in make().items():
            (args.out / name).write_bytes(data)
            names.add(name)
    for stale in args.out.iterdir():
        if stale.name not in names:
            stale.unlink()
    print(f"{len(names)} seeds in {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
