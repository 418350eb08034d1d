"""The engine's promises to the host: no command can hang, abort or exhaust QEMU.

Through qtest, against the ASan/UBSan build: engine DMA reaches RAM only
(never a register, whether in the ECAM window, another device's MMIO or a
bridge), a running command stops at its next control point on a reset,
over its time budget or when the VM stops, a higher-priority command
preempts a lower one at a tile boundary without changing its result, and
host memory stays within the device's budget (docs/npu-spec.md, "Engine
control").
"""

from __future__ import annotations

import json
import socket
import struct
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from qtest import (
    CPL,
    CPL_SIZE,
    DATA,
    FENCE,
    QEMU,
    Completion,
    Npu,
    copy,
    fill,
    gemm,
    hw,
    hw_tensor,
    nop,
    queue_cpl,
    queue_fence,
    queue_ring,
    setup_queue,
    tensor,
    tensor_params,
)
from test_device_qtest_firmware import system_reset
from test_device_qtest_sync import signal

UNTOUCHED = 0xEEEE_EEEE_EEEE_EEEE  # a completion record the device did not write
PCI_BRIDGE_CONTROL = 0x3C  # dword: interrupt line/pin, bridge control (bit 22: SBR)
PCI_BRIDGE_CTL_BUS_RESET = 1 << 22
PCI_CAP_ID_EXP = 0x10
PCI_EXP_SLTCTL = 0x18  # dword: slot control, slot status
PCI_EXP_SLTCTL_PCC = 1 << 10  # power controller control: 1 = power off
HPET = 0xFED0_0000  # q35's HPET: MMIO that must never see an engine write
HPET_CONFIG = HPET + 0x10
PARAMS = DATA  # tensor parameter blocks
POOL_IN = DATA + 0x10_0000


@pytest.fixture
def bridged(tmp_path: Path) -> Iterator[Npu]:
    """The NPU behind a PCIe root port with the ECAM window open, queue 0 running."""
    dev = Npu(tmp_path / "qemu.log", root_port=True)
    try:
        dev.enable_ecam()
        dev.start()
        yield dev
    finally:
        dev.close()


def open_npu(tmp_path: Path, device: str = "npu") -> Npu:
    dev = Npu(tmp_path / "qemu.log", device=device)
    dev.start()
    return dev


@pytest.fixture
def ready(tmp_path: Path) -> Iterator[Npu]:
    dev = open_npu(tmp_path)
    try:
        yield dev
    finally:
        dev.close()


def runaway_pool(npu: Npu, fence: int) -> bytes:
    """A POOL2D that passes validation and would run for hours: a 1024x1024
    max window over a 2048x2048 plane, stride 1 (10^12 compares)."""
    h = w = 2048
    k = 1024
    o = h - k + 1
    out = POOL_IN + h * w * 4
    params = tensor_params(
        [
            hw_tensor(POOL_IN, hw.DTYPE_FP32, (1, 1, h, w), (h * w, h * w, w, 1)),
            hw_tensor(out, hw.DTYPE_FP32, (1, 1, o, o), (o * o, o * o, o, 1)),
        ],
        [k, k, 1, 1, 0, 0, 0],
    )
    npu.qt.memwrite(PARAMS + fence * 256, params)
    return tensor(hw.OP_POOL2D, PARAMS + fence * 256, hw.POOL_MAX, fence=fence)


def wait_active(npu: Npu, q: int = 0, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not npu.qrd(hw.Q_STATUS, q) & hw.QSTAT_ACTIVE:
        assert time.monotonic() < deadline, "the command did not start"
        time.sleep(0.001)


def wait_stopped(npu: Npu, q: int = 0, timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not npu.qrd(hw.Q_STATUS, q) & hw.QSTAT_STOPPED:
        assert time.monotonic() < deadline, "the queue did not stop"
        time.sleep(0.001)


def wait_fence(npu: Npu, fence: int, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while npu.fence_wb()[0] != fence:
        assert time.monotonic() < deadline, f"fence {fence} was not written"
        time.sleep(0.001)


# --------------------------------------------------------------------------
# RAM-only DMA
# --------------------------------------------------------------------------


def test_a_fill_of_the_root_ports_bridge_control_does_not_reset_the_bus(bridged: Npu) -> None:
    rp = bridged.root_port
    assert rp is not None
    before = rp.read32(PCI_BRIDGE_CONTROL)
    target = Npu.ecam(rp, PCI_BRIDGE_CONTROL)
    c = bridged.run(fill(target, 4, before | PCI_BRIDGE_CTL_BUS_RESET, fence=1))
    assert c.status == hw.ST_DMA_ERROR
    assert rp.read32(PCI_BRIDGE_CONTROL) == before
    assert bridged.run(nop(2)).status == hw.ST_OK
    bridged.assert_alive()


def test_a_copy_into_the_root_ports_slot_control_does_not_power_off_the_slot(
    bridged: Npu,
) -> None:
    rp = bridged.root_port
    assert rp is not None
    cap = rp.find_capability(PCI_CAP_ID_EXP)
    before = rp.read32(cap + PCI_EXP_SLTCTL)
    bridged.qt.memwrite(DATA, struct.pack("<I", before | PCI_EXP_SLTCTL_PCC))
    c = bridged.run(copy(DATA, Npu.ecam(rp, cap + PCI_EXP_SLTCTL), 4, fence=1))
    assert c.status == hw.ST_DMA_ERROR
    assert rp.read32(cap + PCI_EXP_SLTCTL) == before
    assert bridged.run(nop(2)).status == hw.ST_OK
    bridged.assert_alive()


def test_a_signal_into_the_ecam_window_does_not_reach_configuration_space(
    bridged: Npu,
) -> None:
    rp = bridged.root_port
    assert rp is not None
    # SIGNAL stores 8 aligned bytes: the expansion ROM BAR, then bridge control.
    rom, before = rp.read32(PCI_BRIDGE_CONTROL - 4), rp.read32(PCI_BRIDGE_CONTROL)
    value = rom | (before | PCI_BRIDGE_CTL_BUS_RESET) << 32
    c = bridged.run(signal(Npu.ecam(rp, PCI_BRIDGE_CONTROL - 4), value, fence=1))
    assert c.status == hw.ST_DMA_ERROR
    assert rp.read32(PCI_BRIDGE_CONTROL) == before
    bridged.assert_alive()


def test_a_copy_from_the_ecam_window_fails_at_once(bridged: Npu) -> None:
    c = bridged.run(copy(Npu.ecam(bridged.pci), DATA, 16 << 20, fence=1), timeout=5.0)
    assert c.status == hw.ST_DMA_ERROR
    bridged.assert_alive()


# Rings and write-backs outside RAM are refused when the queue is enabled
# (docs/npu-spec.md 13; every kind of target: test_device_qtest_dma_targets.py).
MMIO_RING = {"ring": {"ring": HPET}, "cpl": {"cpl": HPET}, "fence": {"fence": HPET_CONFIG}}


@pytest.mark.parametrize("where", MMIO_RING.values(), ids=MMIO_RING.keys())
def test_a_queue_with_a_ring_in_mmio_does_not_enable_and_touches_no_register(
    ready: Npu, where: dict[str, int]
) -> None:
    config = ready.qt.readl(HPET_CONFIG)
    ready.qwr(hw.Q_CONTROL, 0)
    ready.program_queue(size=64, **where)
    ready.qwr(hw.Q_CONTROL, hw.QCTL_ENABLE)
    assert ready.qrd(hw.Q_CONTROL) == 0
    assert ready.qrd(hw.Q_ERROR) == hw.ERR_BAD_RING
    assert ready.qt.readl(HPET_CONFIG) == config
    ready.assert_alive()


# --------------------------------------------------------------------------
# Stopping a command: budget, reset
# --------------------------------------------------------------------------


def test_a_runaway_command_ends_with_timeout_and_the_device_stays_usable(
    tmp_path: Path,
) -> None:
    npu = open_npu(tmp_path, "npu,cmd-budget-ms=200")
    try:
        c = npu.run(runaway_pool(npu, 1), timeout=20.0)
        assert c.status == hw.ST_TIMEOUT
        # Timed on the device clock: the budget, plus at most a control
        # point's work (the qtest clock is virtual; this bounds, not times).
        assert c.t_end >= c.t_start
        assert npu.run(fill(DATA, 4096, 0x5A5A_5A5A, fence=2)).status == hw.ST_OK
        assert npu.qt.memread(DATA, 4096) == b"\x5a" * 4096
        npu.assert_alive()
    finally:
        npu.close()


def test_a_budget_of_zero_lets_a_command_run_until_it_is_reset(tmp_path: Path) -> None:
    npu = open_npu(tmp_path, "npu,cmd-budget-ms=0")
    try:
        npu.submit(runaway_pool(npu, 1))
        wait_active(npu)
        time.sleep(2.5)  # past the default budget of 2 s
        assert npu.qrd(hw.Q_STATUS) & hw.QSTAT_ACTIVE
        npu.soft_reset(timeout=5.0)
        npu.assert_alive()
    finally:
        npu.close()


def test_a_soft_reset_aborts_the_running_command_and_writes_nothing_of_it(ready: Npu) -> None:
    ready.submit(runaway_pool(ready, 1), nop(2))
    wait_active(ready)
    seen = ready.soft_reset(timeout=5.0)  # hours of work otherwise
    assert seen[0] & hw.STATUS_RESETTING
    assert seen[-1] == hw.STATUS_READY
    assert all(c.fence == UNTOUCHED for c in ready.completions(0, 2))
    assert ready.fence_wb()[0] == 0
    ready.start()
    assert ready.run(nop(3)).status == hw.ST_OK
    ready.assert_alive()


def test_a_wide_pool_window_stops_within_an_input_row_of_a_reset(ready: Npu) -> None:
    # One output row of the runaway pool is 2^30 taps (seconds under ASan):
    # its control points come per input row of the window, 2^20 taps each.
    ready.submit(runaway_pool(ready, 1))
    wait_active(ready)
    time.sleep(0.2)
    t0 = time.monotonic()
    ready.soft_reset(timeout=5.0)
    assert time.monotonic() - t0 < 1.0, "the abort waited for a whole output row"
    ready.assert_alive()


def test_a_system_reset_during_a_runaway_command_leaves_qemu_responsive(ready: Npu) -> None:
    ready.submit(runaway_pool(ready, 1))
    wait_active(ready)
    system_reset(ready)
    assert ready.rd(hw.REG_STATUS) == hw.STATUS_READY
    ready.start()
    assert ready.run(nop(2)).status == hw.ST_OK
    ready.assert_alive()


def test_disabling_a_queue_under_a_running_command_keeps_its_old_rings_untouched(
    tmp_path: Path,
) -> None:
    npu = open_npu(tmp_path, "npu,cmd-budget-ms=300")
    try:
        npu.submit(runaway_pool(npu, 1))
        wait_active(npu)
        npu.qwr(hw.Q_CONTROL, 0)  # the driver takes the queue back ...
        npu.qt.memset(CPL, CPL_SIZE, 0xEE)  # ... and reuses its memory
        npu.qt.memset(FENCE, 16, 0)
        deadline = time.monotonic() + 10
        while npu.qrd(hw.Q_STATUS) & hw.QSTAT_ACTIVE:  # the command times out
            assert time.monotonic() < deadline, "the command did not end"
            time.sleep(0.005)
        assert npu.completions(0, 1)[0].fence == UNTOUCHED
        assert npu.fence_wb()[0] == 0
        npu.start()
        assert npu.run(nop(2)).status == hw.ST_OK
        npu.assert_alive()
    finally:
        npu.close()


# --------------------------------------------------------------------------
# Preemption
# --------------------------------------------------------------------------

GEMM_N = 2048  # 8.6e9 multiply-adds: far longer than a NOP, even on many cores
GEMM_A = 0x0800_0000
GEMM_B = GEMM_A + GEMM_N * GEMM_N * 4
GEMM_C = GEMM_B + GEMM_N * GEMM_N * 4


SAMPLE_ROWS = range(0, GEMM_N, 61)  # rows of C read back (qtest moves bytes slowly)


def gemm_operands(npu: Npu, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """Random A and B (each 16 MiB): one random MiB copied into place by the device."""
    block = rng.standard_normal(1 << 18, dtype=np.float32)
    npu.qt.memwrite(DATA, block.tobytes())
    size = GEMM_N * GEMM_N * 4
    descs = [copy(DATA, base + off, 1 << 20) for base in (GEMM_A, GEMM_B)
             for off in range(0, size, 1 << 20)]  # fmt: skip
    for d in descs:
        assert npu.run(d).status == hw.ST_OK
    whole = np.tile(block, size // (1 << 20)).reshape(GEMM_N, GEMM_N)
    return whole, whole


def read_c(npu: Npu) -> np.ndarray:
    rows = [npu.qt.memread(GEMM_C + r * GEMM_N * 4, GEMM_N * 4) for r in SAMPLE_ROWS]
    return np.frombuffer(b"".join(rows), dtype=np.float32).reshape(len(rows), GEMM_N)


@pytest.mark.parametrize("cores", [1, 2])
def test_a_high_priority_nop_preempts_a_low_priority_gemm_whose_result_stays_exact(
    tmp_path: Path, cores: int
) -> None:
    npu = open_npu(tmp_path, f"npu,cores={cores},cmd-budget-ms=0")
    try:
        a, b = gemm_operands(npu, np.random.default_rng(14))
        n = GEMM_N
        alone = npu.run(gemm(GEMM_A, GEMM_B, GEMM_C, n, n, n, n, n, n, fence=1), timeout=120.0)
        assert alone.status == hw.ST_OK
        reference = read_c(npu)
        want = a[list(SAMPLE_ROWS)] @ b
        np.testing.assert_allclose(reference, want, rtol=1e-3, atol=1e-2)
        for r in SAMPLE_ROWS:
            npu.qt.memset(GEMM_C + r * GEMM_N * 4, GEMM_N * 4, 0)
        setup_queue(npu, 3, priority=3)
        npu.submit(gemm(GEMM_A, GEMM_B, GEMM_C, n, n, n, n, n, n, fence=2))
        wait_active(npu)
        npu.qt.memwrite(queue_ring(3), nop(0x33))
        npu.wr(hw.doorbell(3), 1)
        deadline = time.monotonic() + 60
        while struct.unpack("<Q", npu.qt.memread(queue_fence(3), 8))[0] != 0x33:
            assert time.monotonic() < deadline, "the NOP did not complete"
        # The NOP did not wait for the GEMM: it ran at a tile boundary.
        assert npu.fence_wb()[0] == 1, "the NOP waited for the running GEMM"
        wait_fence(npu, 2, timeout=120.0)
        hi = Completion.parse(npu.qt.memread(queue_cpl(3), CPL_SIZE))
        lo = npu.completion(1)
        assert hi.status == lo.status == hw.ST_OK
        assert np.array_equal(read_c(npu), reference), "the preempted GEMM changed its result"
        npu.assert_alive()
    finally:
        npu.close()


# --------------------------------------------------------------------------
# Host memory budget
# --------------------------------------------------------------------------


def test_a_command_needing_more_host_memory_than_the_budget_completes_with_no_memory(
    tmp_path: Path,
) -> None:
    npu = open_npu(tmp_path, "npu,mem-budget=16M")
    try:
        n = 2048  # A, B and C of 16 MiB each
        c = npu.run(gemm(GEMM_A, GEMM_A, GEMM_A + 2 * n * n * 4, n, n, n, n, n, n, fence=1))
        assert c.status == hw.ST_NO_MEMORY
        n = 64  # the budget was given back
        c = npu.run(gemm(GEMM_A, GEMM_A, GEMM_A + 2 * n * n * 4, n, n, n, n, n, n, fence=2))
        assert c.status == hw.ST_OK
        npu.assert_alive()
    finally:
        npu.close()


def test_the_staging_of_a_gemm_aborted_by_a_reset_returns_to_the_budget(tmp_path: Path) -> None:
    # The aborted GEMM's blocks are freed after the device answers again.
    npu = open_npu(tmp_path, "npu,mem-budget=48M,cmd-budget-ms=0")
    try:
        n = 2048  # A, B and C of 16 MiB each: the whole budget
        big = gemm(GEMM_A, GEMM_A, GEMM_A + 2 * n * n * 4, n, n, n, n, n, n, fence=1)
        for _ in range(3):
            npu.start()
            npu.submit(big)
            wait_active(npu)
            time.sleep(0.02)
            npu.soft_reset(timeout=5.0)
        npu.start()
        assert npu.run(big, timeout=60).status == hw.ST_OK
        npu.assert_alive()
    finally:
        npu.close()


def test_a_gemm_sized_by_its_strides_allocates_only_its_elements(tmp_path: Path) -> None:
    # 8 rows of 4 elements 16 MiB apart: 112 MiB of extent, 128 bytes of data.
    npu = open_npu(tmp_path, "npu,mem-budget=16M")
    try:
        ld = 1 << 22
        rng = np.random.default_rng(7)
        a = rng.standard_normal((8, 4), dtype=np.float32)
        b = np.eye(4, dtype=np.float32)
        for r in range(8):
            npu.qt.memwrite(DATA + r * ld * 4, a[r].tobytes())
        npu.qt.memwrite(0x1F00_0000, b.tobytes())
        c = npu.run(gemm(DATA, 0x1F00_0000, 0x1F10_0000, 8, 4, 4, ld, 4, 4, fence=1))
        assert c.status == hw.ST_OK
        got = np.frombuffer(npu.qt.memread(0x1F10_0000, 8 * 16), dtype=np.float32)
        assert np.array_equal(got.reshape(8, 4), a)
        npu.assert_alive()
    finally:
        npu.close()


# --------------------------------------------------------------------------
# VM stop and cont
# --------------------------------------------------------------------------


class Qmp:
    """A minimal QMP client (qemu-qmp is not a dependency of the tests)."""

    def __init__(self, path: Path) -> None:
        self.sock = socket.socket(socket.AF_UNIX)
        deadline = time.monotonic() + 10
        while True:
            try:
                self.sock.connect(str(path))
                break
            except OSError:
                assert time.monotonic() < deadline, "no QMP socket"
                time.sleep(0.05)
        self.file = self.sock.makefile("rw")
        json.loads(self.file.readline())  # greeting
        self.execute("qmp_capabilities")

    def request(self, command: str, arguments: dict[str, object] | None = None) -> dict[str, Any]:
        """Send a command; return its reply (``return`` or ``error``), skipping events."""
        msg: dict[str, object] = {"execute": command}
        if arguments:
            msg["arguments"] = arguments
        self.file.write(json.dumps(msg) + "\n")
        self.file.flush()
        while True:
            reply: dict[str, Any] = json.loads(self.file.readline())
            if "return" in reply or "error" in reply:
                return reply

    def execute(self, command: str) -> object:
        reply = self.request(command)
        assert "error" not in reply, reply
        return reply["return"]

    def close(self) -> None:
        self.file.close()
        self.sock.close()


def test_a_stopped_vm_gets_no_dma_from_the_device_until_cont(tmp_path: Path) -> None:
    sock = tmp_path / "qmp.sock"
    npu = Npu(tmp_path / "qemu.log", extra_args=["-qmp", f"unix:{sock},server=on,wait=off"])
    try:
        qmp = Qmp(sock)
        npu.start(size=256)
        total = 200
        npu.submit(*(fill(DATA, 8 << 20, i, fence=i + 1) for i in range(total)))
        wait_active(npu)
        qmp.execute("stop")
        seen = npu.fence_wb()[0]
        time.sleep(0.3)
        assert npu.fence_wb()[0] == seen, "the device wrote guest memory while the VM was stopped"
        assert seen < total
        qmp.execute("cont")
        wait_fence(npu, total, timeout=60.0)
        assert struct.unpack("<I", npu.qt.memread(DATA, 4))[0] == total - 1
        qmp.close()
        npu.assert_alive()
    finally:
        npu.close()


def test_migration_is_refused_with_a_message_naming_the_device(tmp_path: Path) -> None:
    sock = tmp_path / "qmp.sock"
    npu = Npu(tmp_path / "qemu.log", extra_args=["-qmp", f"unix:{sock},server=on,wait=off"])
    try:
        qmp = Qmp(sock)
        reply = qmp.request("migrate", {"uri": "exec:cat >/dev/null"})
        assert "error" in reply and "npu" in reply["error"]["desc"], reply
        qmp.close()
        npu.assert_alive()
    finally:
        npu.close()


# --------------------------------------------------------------------------
# Observability and the host's BLAS
# --------------------------------------------------------------------------


def test_a_refused_dma_is_traced_with_its_target(tmp_path: Path) -> None:
    log = tmp_path / "qemu.log"
    npu = Npu(log, extra_args=["-trace", "npu_dma_error"])
    try:
        npu.start()
        assert npu.run(fill(HPET, 4, 0, fence=1)).status == hw.ST_DMA_ERROR
        npu.assert_alive()
    finally:
        npu.close()
    lines = [line for line in log.read_text().splitlines() if "npu_dma_error" in line]
    assert any(f"0x{HPET:x}" in line and "write 1" in line for line in lines), lines


def test_the_device_model_does_its_math_with_onednn_and_links_no_openblas() -> None:
    # Debian's serial OpenBLAS is not thread-safe (no USE_LOCKING), and the
    # threaded one changes the whole QEMU process: the device's sgemm is
    # oneDNN's (docs/decisions.md, issue 18).
    out = subprocess.run(["ldd", str(QEMU)], capture_output=True, text=True, check=True).stdout
    assert "libdnnl" in out, out
    assert "blas" not in out, out


# --------------------------------------------------------------------------
# Control points inside one huge slice (REDUCE, SOFTMAX, LAYERNORM)
# --------------------------------------------------------------------------

# One slice of this many elements (about a second each with ASan): its
# whole work was one unit. REDUCE's is cheaper per element.
SLICES = {"REDUCE": 1 << 27, "SOFTMAX": 1 << 24, "LAYERNORM": 1 << 24}
ALIAS_L1, ALIAS_L2, ALIAS_PAGE = DATA, DATA + 0x1_0000, DATA + 0x2_0000
LOW_L2, SRC_PAGE, PARAMS_PAGE = DATA + 0x3_0000, DATA + 0x4_0000, DATA + 0x5_0000
VA_SRC, VA_PARAMS, VA_OUT = 0x1000, 0x2000, 0x4000_0000


def alias_output(npu: Npu, n: int) -> None:
    """MMU on: VA_SRC and VA_PARAMS map their pages; the output's VA (``n``
    elements, contiguous as the ops want it) maps onto one page."""
    qt = npu.qt
    qt.memwrite(SRC_PAGE, struct.pack("<f", 1.0) * 1024)
    qt.memwrite(ALIAS_L2, struct.pack("<512Q", *[ALIAS_PAGE | hw.PTE_VALID | hw.PTE_WRITE] * 512))
    low = [0] * 512
    low[VA_SRC >> 12] = SRC_PAGE | hw.PTE_VALID
    low[VA_PARAMS >> 12] = PARAMS_PAGE | hw.PTE_VALID
    qt.memwrite(LOW_L2, struct.pack("<512Q", *low))
    entries = (VA_OUT + n * 4) >> 21
    l1 = [LOW_L2 | hw.PTE_VALID] + [0] * (entries - 1)
    for i in range(VA_OUT >> 21, entries):
        l1[i] = ALIAS_L2 | hw.PTE_VALID
    qt.memwrite(ALIAS_L1, struct.pack(f"<{entries}Q", *l1))
    npu.wr(hw.REG_MMU_L1_LO, ALIAS_L1)
    npu.wr(hw.REG_MMU_L1_HI, 0)
    npu.wr(hw.REG_MMU_L1_ENTRIES, entries)
    npu.wr(hw.REG_MMU_CONTROL, hw.MMU_ENABLE)


def one_slice_op(opcode: int, n: int) -> tuple[int, bytes]:
    """(kind, parameter block) of an op whose one slice is ``n`` elements."""
    x = hw_tensor(VA_SRC, hw.DTYPE_FP32, [n], [0])  # a stride-0 input
    if opcode == hw.OP_REDUCE:
        out = hw_tensor(VA_OUT, hw.DTYPE_FP32, [1], [1])
        return hw.REDUCE_SUM, tensor_params([x, out], [1])
    out = hw_tensor(VA_OUT, hw.DTYPE_FP32, [n], [1])
    if opcode == hw.OP_SOFTMAX:
        return hw.SOFTMAX_SOFTMAX, tensor_params([x, out], [0])
    # LAYERNORM over the last 1 dim, eps 1e-5; gamma and beta stride 0 too
    return 0, tensor_params([x, x, x, out], [1, 0x3727C5AC])


def run_one_slice(tmp_path: Path, opcode: str, stop_after: float | None) -> float:
    """The op alone (its host time), or with a soft reset after
    ``stop_after`` seconds (the time from the reset request until the
    device reports it done)."""
    npu = Npu(tmp_path / "qemu.log", device="npu,cmd-budget-ms=0")
    try:
        op, n = getattr(hw, f"OP_{opcode}"), SLICES[opcode]
        kind, block = one_slice_op(op, n)
        npu.qt.memwrite(PARAMS_PAGE, block)
        alias_output(npu, n)  # the device disabled, as the MMU registers want
        npu.start()
        t0 = time.monotonic()
        if stop_after is None:
            assert npu.run(tensor(op, VA_PARAMS, kind), timeout=600).status == hw.ST_OK
            return time.monotonic() - t0
        npu.submit(tensor(op, VA_PARAMS, kind))
        time.sleep(stop_after)
        t0 = time.monotonic()
        npu.soft_reset(timeout=600)
        parked = time.monotonic() - t0
        npu.assert_alive()
        return parked
    finally:
        npu.close()


@pytest.mark.parametrize("opcode", SLICES)
def test_a_reset_stops_one_huge_slice_at_a_control_point_inside_it(
    tmp_path: Path, opcode: str
) -> None:
    # Before, a slice was one unit of work, polled once: a reset waited for
    # the rest of it. Now the elements are accounted as they go.
    whole = run_one_slice(tmp_path, opcode, None)
    parked = run_one_slice(tmp_path, opcode, whole / 2)
    # Stopped at half time, the old device finished the slice (half of it).
    assert parked < whole / 4, f"the reset waited {parked:.3f} s of a {whole:.3f} s slice"
