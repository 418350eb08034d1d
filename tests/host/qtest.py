"""Drive the NPU device model through QEMU's qtest protocol, without a guest.

QEMU runs with ``-accel qtest``: no vCPU executes, and the test process reads
and writes guest memory, I/O ports and MMIO through a line protocol on the
QEMU's stdin/stdout (``softmmu/qtest.c``; ``docs/devel/qtest.rst``). The
device's command-processor thread runs as usual, so descriptors placed in
guest RAM are executed for real.

This module has three layers:

- ``QTest``: the wire protocol (``readl``/``writel``/``b64read``/...);
- PCI configuration through ports 0xcf8/0xcfc, to find the NPU and map its
  BARs (there is no firmware to do it);
- ``Npu``: register access, one queue, descriptors and completions, with
  every constant taken from ``include/npu_hw.h`` (``hw``).
"""

from __future__ import annotations

import base64
import contextlib
import os
import re
import select
import struct
import subprocess
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO

REPO = Path(__file__).resolve().parents[2]
HW_HEADER = REPO / "include" / "npu_hw.h"

NPU_CACHE = Path(os.environ.get("NPU_CACHE") or Path.home() / ".cache" / "npu-stack")
# The qtests run QEMU built with AddressSanitizer and UBSan (make qemu-asan);
# NPU_QTEST_QEMU picks another binary.
QEMU = Path(os.environ.get("NPU_QTEST_QEMU") or NPU_CACHE / "bin" / "qemu-system-x86_64-asan")
# A sanitizer report on QEMU's stderr fails the test (QTest.close()). Leak
# checking is off: QEMU does not free everything at exit by design.
SANITIZER_ENV = {
    "ASAN_OPTIONS": "detect_leaks=0:halt_on_error=1:abort_on_error=0:exitcode=86",
    "UBSAN_OPTIONS": "halt_on_error=1:print_stacktrace=1:exitcode=87",
}
SANITIZER_RE = re.compile(
    rb"ERROR: AddressSanitizer|ERROR: LeakSanitizer|runtime error:|UndefinedBehaviorSanitizer"
)
FIRMWARE_DIRS = ("/usr/share/qemu", "/usr/share/seabios")

U32 = (1 << 32) - 1
U64 = (1 << 64) - 1


# --------------------------------------------------------------------------
# Constants of include/npu_hw.h
# --------------------------------------------------------------------------


def _c_eval(expr: str, known: dict[str, int]) -> int:
    """Evaluate a C integer constant expression made of literals and known names."""
    expr = re.sub(r"\b(0[xX][0-9a-fA-F]+|\d+)[uUlL]*\b", r"\1", expr)
    expr = re.sub(r"\b[A-Za-z_]\w*\b", lambda m: str(known[m.group(0)]), expr)
    if not re.fullmatch(r"[0-9a-fA-FxX()<>|&~+\-* \t]*", expr):
        raise ValueError(expr)
    return int(eval(expr, {"__builtins__": {}})) & U64


def load_hw_constants(path: Path = HW_HEADER) -> dict[str, int]:
    """Every object-like ``#define NPU_*`` and every enumerator of the header."""
    text = re.sub(r"/\*.*?\*/", " ", path.read_text(), flags=re.S)
    consts: dict[str, int] = {}
    for m in re.finditer(r"^#define[ \t]+(NPU_\w+)[ \t]+(.+?)[ \t]*$", text, re.M):
        with contextlib.suppress(KeyError, ValueError, SyntaxError):  # not an integer
            consts[m.group(1)] = _c_eval(m.group(2), consts)
    for body in re.findall(r"\benum\s+\w+\s*\{(.*?)\}", text, re.S):
        value = 0
        for item in filter(None, (i.strip() for i in body.split(","))):
            name, _, expr = (s.strip() for s in item.partition("="))
            value = _c_eval(expr, consts) if expr else value
            consts[name] = value
            value += 1
    return consts


class HwConstants:
    """``hw.REG_MAGIC`` is ``NPU_REG_MAGIC`` of ``include/npu_hw.h``."""

    def __init__(self, consts: dict[str, int]) -> None:
        self.all = consts

    def __getattr__(self, name: str) -> int:
        try:
            return self.all["NPU_" + name]
        except KeyError:
            raise AttributeError(f"NPU_{name} is not defined in {HW_HEADER}") from None

    def qreg(self, q: int, reg: int) -> int:
        """``NPU_QREG(q, reg)``."""
        return self.QREG_BASE + q * self.QREG_STRIDE + reg

    def doorbell(self, q: int) -> int:
        """``NPU_DOORBELL(q)``."""
        return self.DOORBELL_BASE + q * self.DOORBELL_STRIDE


hw = HwConstants(load_hw_constants())


# --------------------------------------------------------------------------
# The qtest wire protocol
# --------------------------------------------------------------------------


class QTestError(RuntimeError):
    """QEMU refused a command, stopped answering or exited."""


class QTestRefused(QTestError):
    """QEMU answered a command with something other than ``OK``."""


class SanitizerReport(QTestError):
    """QEMU's AddressSanitizer or UBSan reported an error."""


class QTest:
    """One QEMU process under ``-accel qtest``, driven over its stdin/stdout."""

    def __init__(self, args: Sequence[str], log_path: Path, timeout: float = 20.0) -> None:
        self.log_path = log_path
        self.timeout = timeout
        self.irq_events: list[str] = []
        argv = [
            str(QEMU), "-accel", "qtest", "-qtest", "stdio", "-qtest-log", "none",
            "-display", "none", "-nodefaults", "-D", str(log_path),
            # The device's LOG_GUEST_ERROR messages; off by default because a
            # failed DMA logs every 4-byte access and slows QEMU down 10x.
            *(["-d", "guest_errors"] if os.environ.get("NPU_QTEST_GUEST_ERRORS") else []),
            *(a for d in FIRMWARE_DIRS if Path(d).is_dir() for a in ("-L", d)),
            *args,
        ]  # fmt: skip
        if not (QEMU.is_file() and os.access(QEMU, os.X_OK)):
            raise QTestError(f"no QEMU at {QEMU} (build: make qemu-asan, or set NPU_QTEST_QEMU)")
        self._log: IO[bytes] = open(log_path.with_suffix(".stderr"), "wb")  # noqa: SIM115
        self._proc = subprocess.Popen(
            argv,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self._log,
            env={**os.environ, **SANITIZER_ENV},
        )
        self._buf = b""

    # -- process ----------------------------------------------------------

    def alive(self) -> bool:
        return self._proc.poll() is None

    def close(self) -> None:
        if self.alive():
            self._proc.terminate()
            try:
                self._proc.wait(10)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait()
        for pipe in (self._proc.stdin, self._proc.stdout):
            if pipe is not None:
                pipe.close()
        if self._log.closed:
            return
        self._log.close()
        self.check_sanitizers()

    def check_sanitizers(self) -> None:
        """Raise SanitizerReport if QEMU's stderr holds an ASan or UBSan report."""
        err = self.log_path.with_suffix(".stderr").read_bytes()
        m = SANITIZER_RE.search(err)
        if m:
            start = max(0, m.start() - 200)
            raise SanitizerReport(
                "QEMU sanitizer report:\n" + err[start : start + 6000].decode(errors="replace")
            )

    def log_tail(self, lines: int = 20) -> str:
        """The end of QEMU's stderr and guest-error log, for failure messages."""
        out = []
        for path in (self.log_path.with_suffix(".stderr"), self.log_path):
            if path.exists():
                text = path.read_text(errors="replace").splitlines()[-lines:]
                out.append(f"--- {path.name} ---\n" + "\n".join(text))
        return "\n".join(out)

    def _died(self, what: str) -> QTestError:
        rc = self._proc.poll()
        state = f"exited with {rc}" if rc is not None else "did not answer"
        return QTestError(f"QEMU {state} ({what})\n{self.log_tail()}")

    # -- lines ------------------------------------------------------------

    def _readline(self, deadline: float) -> str:
        assert self._proc.stdout is not None
        fd = self._proc.stdout.fileno()
        while b"\n" not in self._buf:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([fd], [], [], left)[0]:
                raise self._died("timeout")
            chunk = os.read(fd, 1 << 16)
            if not chunk:
                raise self._died("EOF")
            self._buf += chunk
        line, self._buf = self._buf.split(b"\n", 1)
        return line.decode()

    def command(self, line: str) -> str:
        """Send one command; return what follows ``OK`` in the answer."""
        assert self._proc.stdin is not None
        try:
            self._proc.stdin.write(line.encode() + b"\n")
            self._proc.stdin.flush()
        except BrokenPipeError:
            raise self._died(line) from None
        deadline = time.monotonic() + self.timeout
        while True:
            answer = self._readline(deadline)
            if answer.startswith("IRQ"):
                self.irq_events.append(answer)
                continue
            if answer == "OK" or answer.startswith("OK "):
                return answer[3:]
            raise QTestRefused(f"{line[:80]!r} -> {answer!r}")

    # -- commands ---------------------------------------------------------

    def _read(self, width: str, addr: int) -> int:
        return int(self.command(f"read{width} {addr:#x}"), 16)

    def readb(self, addr: int) -> int:
        return self._read("b", addr)

    def readw(self, addr: int) -> int:
        return self._read("w", addr)

    def readl(self, addr: int) -> int:
        return self._read("l", addr)

    def readq(self, addr: int) -> int:
        return self._read("q", addr)

    def writeb(self, addr: int, val: int) -> None:
        self.command(f"writeb {addr:#x} {val & 0xFF:#x}")

    def writew(self, addr: int, val: int) -> None:
        self.command(f"writew {addr:#x} {val & 0xFFFF:#x}")

    def writel(self, addr: int, val: int) -> None:
        self.command(f"writel {addr:#x} {val & U32:#x}")

    def writeq(self, addr: int, val: int) -> None:
        self.command(f"writeq {addr:#x} {val & U64:#x}")

    def inl(self, port: int) -> int:
        return int(self.command(f"inl {port:#x}"), 16)

    def outl(self, port: int, val: int) -> None:
        self.command(f"outl {port:#x} {val & U32:#x}")

    def memread(self, addr: int, size: int) -> bytes:
        if size == 0:
            return b""
        data = base64.b64decode(self.command(f"b64read {addr:#x} {size:#x}"))
        assert len(data) == size
        return data

    def memwrite(self, addr: int, data: bytes) -> None:
        if data:
            enc = base64.b64encode(data).decode()
            self.command(f"b64write {addr:#x} {len(data):#x} {enc}")

    def memset(self, addr: int, size: int, byte: int) -> None:
        self.command(f"memset {addr:#x} {size:#x} {byte & 0xFF:#x}")

    def clock_step(self, ns: int) -> int:
        """Advance QEMU_CLOCK_VIRTUAL (the device clock) by ns; return its new value."""
        return int(self.command(f"clock_step {ns}"))


# --------------------------------------------------------------------------
# PCI configuration space (mechanism #1: ports 0xcf8/0xcfc)
# --------------------------------------------------------------------------

PCI_COMMAND_MEMORY = 1 << 1
PCI_COMMAND_MASTER = 1 << 2


@dataclass(frozen=True)
class PciFunction:
    qt: QTest
    bus: int
    dev: int
    fn: int

    def _select(self, reg: int) -> None:
        addr = 0x8000_0000 | self.bus << 16 | self.dev << 11 | self.fn << 8 | (reg & 0xFC)
        self.qt.outl(0xCF8, addr)

    def read32(self, reg: int) -> int:
        self._select(reg)
        return self.qt.inl(0xCFC)

    def write32(self, reg: int, val: int) -> None:
        self._select(reg)
        self.qt.outl(0xCFC, val)

    def read16(self, reg: int) -> int:
        return (self.read32(reg) >> (8 * (reg & 2))) & 0xFFFF

    def read8(self, reg: int) -> int:
        return (self.read32(reg) >> (8 * (reg & 3))) & 0xFF

    def write16(self, reg: int, val: int) -> None:
        shift = 8 * (reg & 2)
        old = self.read32(reg)
        self.write32(reg, (old & ~(0xFFFF << shift)) | (val & 0xFFFF) << shift)

    def find_capability(self, cap_id: int) -> int:
        """Config-space offset of the first capability with ID ``cap_id``."""
        ptr = self.read8(0x34) & 0xFC
        while ptr:
            if self.read8(ptr) == cap_id:
                return ptr
            ptr = self.read8(ptr + 1) & 0xFC
        raise QTestError(f"no PCI capability {cap_id:#x}")

    def map_bar(self, bar: int, base: int) -> int:
        """Size memory BAR ``bar``, place it at ``base``; return its size (0: no BAR)."""
        reg = 0x10 + 4 * bar
        orig = self.read32(reg)
        assert not orig & 1, f"BAR{bar} is an I/O BAR"
        is64 = (orig >> 1) & 3 == 2
        self.write32(reg, U32)
        mask = self.read32(reg) & ~0xF
        if is64:
            self.write32(reg + 4, U32)
            mask |= self.read32(reg + 4) << 32
        if not mask:
            return 0  # not implemented
        self.write32(reg, base)
        if is64:
            self.write32(reg + 4, base >> 32)
        return ((~mask) & (U64 if is64 else U32)) + 1

    def enable(self, bits: int = PCI_COMMAND_MEMORY | PCI_COMMAND_MASTER) -> None:
        cmd = self.read32(0x04) & 0xFFFF
        self.write32(0x04, cmd | bits)


def find_pci(qt: QTest, vendor: int, device: int, bus: int = 0) -> PciFunction:
    for dev in range(32):
        for fn in range(8):
            f = PciFunction(qt, bus, dev, fn)
            ids = f.read32(0)
            if ids & 0xFFFF == 0xFFFF:
                if fn == 0:
                    break
                continue
            if ids == device << 16 | vendor:
                return f
            if fn == 0 and not f.read8(0x0E) & 0x80:
                break  # single-function device
    raise QTestError(f"PCI device {vendor:04x}:{device:04x} not found on bus {bus}")


# --------------------------------------------------------------------------
# Descriptors and completions
# --------------------------------------------------------------------------

CMD_SIZE = 128
CPL_SIZE = 32
PAYLOAD_SIZE = CMD_SIZE - 16


def cmd(
    opcode: int, payload: bytes = b"", *, flags: int = 0, ctx: int = 0, rsvd0: int = 0,
    fence: int = 0,
) -> bytes:  # fmt: skip
    """A ``struct npu_cmd``: header, then the payload zero-padded to 112 bytes.

    ``ctx`` selects the address space (0: the queue's, else a context table
    entry); ``rsvd0`` is the reserved u16 after it.
    """
    assert len(payload) <= PAYLOAD_SIZE
    header = struct.pack("<HHHHQ", opcode, flags, ctx, rsvd0, fence)
    return header + payload.ljust(PAYLOAD_SIZE, b"\0")


def nop(fence: int = 0, *, flags: int = 0, ctx: int = 0) -> bytes:
    return cmd(hw.OP_NOP, fence=fence, flags=flags, ctx=ctx)


def copy(src: int, dst: int, length: int, fence: int = 0, *, ctx: int = 0) -> bytes:
    return cmd(hw.OP_COPY, struct.pack("<QQQ", src, dst, length), fence=fence, ctx=ctx)


def fill(
    dst: int, length: int, pattern: int, fence: int = 0, *, rsvd: int = 0, ctx: int = 0
) -> bytes:
    payload = struct.pack("<QQII", dst, length, pattern, rsvd)
    return cmd(hw.OP_FILL, payload, fence=fence, ctx=ctx)


def gemm(
    a: int, b: int, c: int, m: int, n: int, k: int, lda: int, ldb: int, ldc: int,
    *, dtype: int = 0, gflags: int = 0, fence: int = 0,
) -> bytes:  # fmt: skip
    payload = struct.pack("<QQQ8I", a, b, c, m, n, k, lda, ldb, ldc, dtype, gflags)
    return cmd(hw.OP_GEMM, payload, fence=fence)


def tensor(opcode: int, params: int, kind: int = 0, *, rsvd: int = 0, fence: int = 0) -> bytes:
    """An ELTWISE/UNARY/CONVERT descriptor: the VA of its parameter block and the kind."""
    return cmd(opcode, struct.pack("<QII", params, kind, rsvd), fence=fence)


TENSOR_SIZE = 48  # struct npu_hw_tensor
TENSOR_PARAMS_SIZE = 256  # struct npu_tensor_params


def hw_tensor(
    va: int, dtype: int, shape: Sequence[int], strides: Sequence[int], *,
    ndim: int | None = None,
) -> bytes:  # fmt: skip
    """A ``struct npu_hw_tensor``; shape and strides are zero-padded to NPU_MAX_RANK."""
    rank = hw.MAX_RANK
    shape4 = [*shape, *[0] * (rank - len(shape))]
    strides4 = [*strides, *[0] * (rank - len(strides))]
    nd = len(shape) if ndim is None else ndim
    return struct.pack(f"<QII{rank}I{rank}I", va, dtype, nd, *shape4, *strides4)


def tensor_params(tensors: Sequence[bytes], params: Sequence[int] = ()) -> bytes:
    """A ``struct npu_tensor_params``: operands (zero-padded to 4), then the params words."""
    assert len(tensors) <= hw.TENSOR_OPERANDS and len(params) <= hw.TENSOR_PARAMS
    ops = b"".join(tensors).ljust(hw.TENSOR_OPERANDS * TENSOR_SIZE, b"\0")
    words = struct.pack(f"<{len(params)}I", *params).ljust(hw.TENSOR_PARAMS * 4, b"\0")
    return ops + words


@dataclass(frozen=True)
class Completion:
    """A ``struct npu_cpl``."""

    fence: int
    status: int
    opcode: int
    rsvd: int
    t_start: int
    t_end: int

    @classmethod
    def parse(cls, raw: bytes) -> Completion:
        return cls(*struct.unpack("<QIHHQQ", raw))


# --------------------------------------------------------------------------
# The NPU
# --------------------------------------------------------------------------

# Guest-physical layout used by the tests (the VM has RAM_SIZE of RAM at 0).
RAM_SIZE = 512 << 20
RING = 0x10_0000  # descriptor ring (up to 1024 entries)
CPL = 0x14_0000  # completion ring
FENCE = 0x15_0000  # fence write-back
DATA = 0x40_0000  # test buffers
BAR0_BASE = 0xE000_0000
BAR4_BASE = 0xE020_0000
BAR2_BASE = 0x10_0000_0000  # device memory (64 GiB: aligned for any mem-size), see map_mem()
ROOT_PORT_DEV = 4  # Npu(root_port=True): the root port's slot on bus 0
ECAM_BASE = 0xB000_0000  # the q35 MMCONFIG window, once enable_ecam() placed it


class Npu:
    """The NPU of one QEMU process, with queue 0 driven from this process."""

    def __init__(
        self, log_path: Path, device: str = "npu", *, root_port: bool = False,
        extra_args: Sequence[str] = (),
    ) -> None:  # fmt: skip
        """``root_port``: the NPU sits behind a PCIe root port (00:04.0, bus 1), as a
        firmware would place it; else on the root bus. ``extra_args`` go to QEMU."""
        # The engine tests run the device with its firmware in ROM (running
        # from reset); the firmware tests pass boot-rom=off and boot an image.
        if "boot-rom=" not in device:
            device += ",boot-rom=on"
        args = ["-machine", "q35", "-m", f"{RAM_SIZE >> 20}M", *extra_args]
        if root_port:
            args += [
                "-device",
                f"pcie-root-port,id=rp0,chassis=1,bus=pcie.0,addr={ROOT_PORT_DEV:#x}",
            ]
            device += ",bus=rp0"
        self.qt = QTest([*args, "-device", device], log_path)
        self.root_port: PciFunction | None = None
        try:
            if root_port:
                self.root_port = PciFunction(self.qt, 0, ROOT_PORT_DEV, 0)
                # Bus 1 behind it; BAR0 and the MSI-X BAR in its memory window.
                self.root_port.write32(0x18, 0x01 << 16 | 0x01 << 8)
                self.root_port.write32(
                    0x20, (BAR4_BASE + 0x10_0000) & 0xFFF0_0000 | BAR0_BASE >> 16
                )
                self.root_port.enable()
            self.pci = find_pci(
                self.qt, hw.PCI_VENDOR_ID, hw.PCI_DEVICE_ID, bus=1 if root_port else 0
            )
            self.bar0_size = self.pci.map_bar(hw.BAR_REGS, BAR0_BASE)
            self.bar4_size = self.pci.map_bar(hw.BAR_MSIX, BAR4_BASE)
            self.pci.enable()
        except BaseException:
            self.qt.close()
            raise
        self.bar0 = BAR0_BASE
        self.bar4 = BAR4_BASE
        self.bar2: int | None = None  # set by map_mem()
        self.ring = RING
        self.ring_size = 0
        self.cpl = CPL
        self.fence = FENCE
        self.tail = 0

    def close(self) -> None:
        self.qt.close()

    def enable_ecam(self) -> None:
        """Open the q35 MMCONFIG (ECAM) window at ECAM_BASE, as firmware does."""
        mch = PciFunction(self.qt, 0, 0, 0)
        mch.write32(0x64, 0)
        mch.write32(0x60, ECAM_BASE | 1)

    @staticmethod
    def ecam(fn: PciFunction, reg: int = 0) -> int:
        """The ECAM address of configuration register ``reg`` of ``fn``."""
        return ECAM_BASE | fn.bus << 20 | fn.dev << 15 | fn.fn << 12 | reg

    def map_mem(self, base: int = BAR2_BASE) -> int:
        """Place BAR2 (device memory) at ``base``, memory decoding off meanwhile; return its size.

        Not done by ``__init__``: most tests never touch device memory.
        """
        cmd = self.pci.read32(0x04) & 0xFFFF
        self.pci.write32(0x04, cmd & ~PCI_COMMAND_MEMORY)
        size = self.pci.map_bar(hw.BAR_MEM, base)
        self.pci.write32(0x04, cmd)
        self.bar2 = base if size else None
        return size

    # -- registers ----------------------------------------------------------

    def rd(self, off: int) -> int:
        return self.qt.readl(self.bar0 + off)

    def wr(self, off: int, val: int) -> None:
        self.qt.writel(self.bar0 + off, val)

    def qrd(self, reg: int, q: int = 0) -> int:
        return self.rd(hw.qreg(q, reg))

    def qwr(self, reg: int, val: int, q: int = 0) -> None:
        self.wr(hw.qreg(q, reg), val)

    def assert_alive(self) -> None:
        """QEMU is running and the device still answers MMIO."""
        assert self.qt.alive(), self.qt.log_tail()
        assert self.rd(hw.REG_MAGIC) == hw.MAGIC

    # -- queue 0 ----------------------------------------------------------

    def program_queue(
        self, *, size: int = 64, ring: int = RING, cpl: int = CPL, fence: int = FENCE
    ) -> None:
        """Write the ring registers of queue 0 (it must be disabled)."""
        self.ring, self.ring_size, self.cpl, self.fence = ring, size, cpl, fence
        for reg, val in (
            (hw.Q_RING_LO, ring), (hw.Q_RING_HI, ring >> 32), (hw.Q_RING_SIZE, size),
            (hw.Q_CPL_LO, cpl), (hw.Q_CPL_HI, cpl >> 32),
            (hw.Q_FENCE_LO, fence), (hw.Q_FENCE_HI, fence >> 32),
        ):  # fmt: skip
            self.qwr(reg, val & U32)

    def start(self, size: int = 64, *, fence: int = FENCE) -> None:
        """Program and enable queue 0, clear IRQ_STATUS and enable the device."""
        self.program_queue(size=size, fence=fence)
        self.qt.memset(self.cpl, size * CPL_SIZE, 0xEE)
        if fence:
            self.qt.memset(fence, 16, 0)
        self.qwr(hw.Q_CONTROL, hw.QCTL_ENABLE)
        assert self.qrd(hw.Q_CONTROL) == hw.QCTL_ENABLE, "queue 0 did not enable"
        self.tail = 0
        self.wr(hw.REG_IRQ_STATUS, U32)
        self.wr(hw.REG_CONTROL, hw.CONTROL_ENABLE)

    def push(self, *descs: bytes) -> list[int]:
        """Write descriptors at the software tail (no doorbell); return their indices."""
        first = self.tail
        for d in descs:
            assert len(d) == CMD_SIZE
        slot = first & (self.ring_size - 1)
        run = min(len(descs), self.ring_size - slot)
        self.qt.memwrite(self.ring + slot * CMD_SIZE, b"".join(descs[:run]))
        if run < len(descs):
            self.qt.memwrite(self.ring, b"".join(descs[run:]))
        self.tail = (first + len(descs)) & U32
        return [(first + i) & U32 for i in range(len(descs))]

    def doorbell(self, tail: int | None = None) -> None:
        self.wr(hw.doorbell(0), self.tail if tail is None else tail)

    def submit(self, *descs: bytes) -> list[int]:
        idx = self.push(*descs)
        self.doorbell()
        return idx

    def wait_head(self, target: int, timeout: float = 15.0) -> None:
        """Poll Q_HEAD until it reaches ``target``."""
        deadline = time.monotonic() + timeout
        while True:
            head = self.qrd(hw.Q_HEAD)
            if head == target & U32:
                return
            if time.monotonic() > deadline:
                raise AssertionError(
                    f"Q_HEAD stuck at {head} (want {target}); STATUS={self.rd(hw.REG_STATUS):#x}"
                    f" ERROR={self.rd(hw.REG_ERROR)}\n{self.qt.log_tail()}"
                )
            time.sleep(0.001)

    def completion(self, index: int) -> Completion:
        slot = index & (self.ring_size - 1)
        return Completion.parse(self.qt.memread(self.cpl + slot * CPL_SIZE, CPL_SIZE))

    def completions(self, first: int, count: int) -> list[Completion]:
        raw = b""
        while len(raw) < count * CPL_SIZE:
            slot = (first + len(raw) // CPL_SIZE) & (self.ring_size - 1)
            n = min(count - len(raw) // CPL_SIZE, self.ring_size - slot)
            raw += self.qt.memread(self.cpl + slot * CPL_SIZE, n * CPL_SIZE)
        return [Completion.parse(raw[i : i + CPL_SIZE]) for i in range(0, len(raw), CPL_SIZE)]

    def run(self, desc: bytes, timeout: float = 15.0) -> Completion:
        """Submit one descriptor, wait for it and return its completion."""
        (index,) = self.submit(desc)
        self.wait_head(index + 1, timeout)
        return self.completion(index)

    def fence_wb(self) -> tuple[int, int]:
        """(value, timestamp) of the fence write-back."""
        value, ts = struct.unpack("<QQ", self.qt.memread(self.fence, 16))
        return value, ts

    def soft_reset(self, timeout: float = 15.0) -> list[int]:
        """CONTROL.RESET, then poll STATUS until RESETTING clears; return the STATUS values seen."""
        self.wr(hw.REG_CONTROL, hw.CONTROL_RESET)
        seen = [self.rd(hw.REG_STATUS)]
        deadline = time.monotonic() + timeout
        while seen[-1] & hw.STATUS_RESETTING:
            assert time.monotonic() < deadline, f"reset did not finish: {seen[-5:]}"
            time.sleep(0.001)
            seen.append(self.rd(hw.REG_STATUS))
        self.tail = 0
        return seen


# -- queues other than 0 ----------------------------------------------------

# Tests of several queues put queue q's ring at QUEUES_BASE + q *
# QUEUES_STRIDE (QUEUE_ENTRIES descriptors), its completion records 32 KiB
# after it and its fence write-back 48 KiB after it.
QUEUES_BASE = 0x20_0000
QUEUES_STRIDE = 0x2_0000
QUEUE_ENTRIES = 64


def queue_ring(q: int) -> int:
    return QUEUES_BASE + q * QUEUES_STRIDE


def queue_cpl(q: int) -> int:
    return queue_ring(q) + 0x8000


def queue_fence(q: int) -> int:
    return queue_ring(q) + 0xC000


def setup_queue(npu: Npu, q: int, priority: int = 0) -> None:
    """Program and enable queue q (the device stays as it is); its
    completion records read 0xEE.. until written."""
    for reg, val in (
        (hw.Q_RING_LO, queue_ring(q)), (hw.Q_RING_HI, 0), (hw.Q_RING_SIZE, QUEUE_ENTRIES),
        (hw.Q_CPL_LO, queue_cpl(q)), (hw.Q_CPL_HI, 0),
        (hw.Q_FENCE_LO, queue_fence(q)), (hw.Q_FENCE_HI, 0),
        (hw.Q_PRIORITY, priority),
    ):  # fmt: skip
        npu.qwr(reg, val & U32, q)
    npu.qt.memset(queue_cpl(q), QUEUE_ENTRIES * CPL_SIZE, 0xEE)
    npu.qt.memset(queue_fence(q), 16, 0)
    npu.qwr(hw.Q_CONTROL, hw.QCTL_ENABLE, q)
    assert npu.qrd(hw.Q_CONTROL, q) == hw.QCTL_ENABLE
