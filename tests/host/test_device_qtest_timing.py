"""The chip timing model (the ``timing`` property, docs/npu-spec.md 12.2).

Through qtest, against the ASan/UBSan build. The qtest virtual clock moves
only with ``clock_step``, so a modelled command is seen to wait for its
time: not complete one nanosecond before it, complete at it, with
``t_end - t_start`` exactly the duration the chip description's roofline
gives. The expected durations are computed here from the spec's formula
and the chip table, independently of the device's C code.
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest

from qtest import DATA, Npu, QTestError, gemm, hw, nop, tensor, tensor_params
from test_device_qtest_tensor import PARAMS, Operand, Rig, conv_operands
from test_device_qtest_trace import drain, program

MiB = 1 << 20


@dataclass(frozen=True)
class Chip:
    """A chip description as docs/npu-spec.md 12.2 tabulates it."""

    rows: int
    cols: int
    clock_mhz: int
    sram: int
    dma_mb_per_s: int
    vector_bytes_per_cycle: int
    overhead_ns: int
    eff_gemm: int
    eff_conv: int

    def macs_per_cycle(self, dtype: int) -> int:
        cells = self.rows * self.cols
        if dtype == hw.DTYPE_INT8:
            return cells
        if dtype in (hw.DTYPE_BF16, hw.DTYPE_FP16):
            return cells // 2
        return cells // 4

    def roofline(
        self, macs: int, nbytes: int, dtype: int, conv: bool = False
    ) -> tuple[int, int, int]:
        """(duration, compute ns, memory ns) of an op."""
        ghz = self.clock_mhz / 1000.0
        if macs:
            eff = self.eff_conv if conv else self.eff_gemm
            compute = math.ceil(macs / (self.macs_per_cycle(dtype) * ghz * eff / 100.0))
        else:
            compute = math.ceil(nbytes / (self.vector_bytes_per_cycle * ghz))
        traffic = nbytes + max(0, nbytes - self.sram)
        memory = math.ceil(traffic * 1000.0 / self.dma_mb_per_s)
        return self.overhead_ns + max(compute, memory), compute, memory


CHIPS = {
    "edge": Chip(32, 32, 1000, 2 * MiB, 8000, 64, 2000, 85, 75),
    "datacenter": Chip(128, 128, 1500, 64 * MiB, 1_000_000, 512, 1000, 90, 70),
}
MODES = {"native": hw.TIMING_NATIVE, "edge": hw.TIMING_EDGE, "datacenter": hw.TIMING_DATACENTER}
A, B, C = DATA, DATA + 0x10_0000, DATA + 0x20_0000


def start(tmp_path: Path, timing: str) -> Npu:
    dev = Npu(tmp_path / f"{timing}.log", device=f"npu,timing={timing}")
    dev.start()
    return dev


@pytest.fixture
def edge(tmp_path: Path) -> Iterator[Npu]:
    dev = start(tmp_path, "edge")
    try:
        yield dev
    finally:
        dev.close()


def cpl_times(npu: Npu, index: int) -> tuple[int, int]:
    c = npu.completion(index)
    return c.t_start, c.t_end


def assert_waits_for(npu: Npu, index: int, duration: int) -> None:
    """Command ``index`` completes once the clock passed ``duration`` and not before."""
    time.sleep(0.3)  # the native work is done by now; the model holds it
    npu.qt.clock_step(duration - 1)
    time.sleep(0.3)
    assert npu.qrd(hw.Q_HEAD) == index, "completed before its modelled time"
    npu.qt.clock_step(1)
    npu.wait_head(index + 1)
    t_start, t_end = cpl_times(npu, index)
    assert t_end - t_start == duration


def put_gemm(npu: Npu, m: int, n: int, k: int) -> None:
    npu.qt.memwrite(A, np.ones(m * k, np.float32).tobytes())
    npu.qt.memwrite(B, np.ones(k * n, np.float32).tobytes())


def conv_desc(rig: Rig, fence: int) -> tuple[bytes, int, int]:
    """A ResNet 3x3 convolution (compute-bound on the edge chip): its
    descriptor, multiply-adds and operand bytes."""
    n, c, h, w, o = 1, 64, 28, 28, 64
    x, wt, b = conv_operands(np.random.default_rng(5), hw.DTYPE_FP32, n, c, h, w, o, 3, 3, 1)
    out = Operand(hw.DTYPE_FP32, (n, o, h, w))
    rig.place([x, wt, b, out])
    rig.write(PARAMS, tensor_params([t.desc() for t in (x, wt, b, out)], [1, 1, 1, 1, 1, 1, 1]))
    macs = n * o * h * w * c * 9
    nbytes = x.nbytes + wt.nbytes + b.nbytes + out.nbytes
    return tensor(hw.OP_CONV2D, PARAMS, fence=fence), macs, nbytes


@pytest.mark.parametrize("mode", list(MODES))
def test_the_timing_register_names_the_mode(tmp_path: Path, mode: str) -> None:
    dev = start(tmp_path, mode)
    try:
        assert dev.rd(hw.REG_TIMING) == MODES[mode]
    finally:
        dev.close()


def test_an_unknown_timing_mode_makes_qemu_refuse_to_start(tmp_path: Path) -> None:
    refused = r"(?s)(exited with 1|\(EOF\)).*timing must be native, edge or datacenter"
    with pytest.raises(QTestError, match=refused):
        Npu(tmp_path / "qtest.log", device="npu,timing=tpu")


def test_a_gemm_completes_at_its_memory_bound_time_and_not_before(edge: Npu) -> None:
    m = n = k = 256
    put_gemm(edge, m, n, k)
    duration, compute, memory = CHIPS["edge"].roofline(m * n * k, 3 * m * n * 4, hw.DTYPE_FP32)
    assert memory > compute, "the case is memory-bound"
    (index,) = edge.submit(gemm(A, B, C, m, n, k, k, n, n, fence=1))
    assert_waits_for(edge, index, duration)
    assert edge.completion(index).status == hw.ST_OK


def test_a_conv_completes_at_its_compute_bound_time(edge: Npu) -> None:
    rig = Rig(edge)
    desc, macs, nbytes = conv_desc(rig, 1)
    duration, compute, memory = CHIPS["edge"].roofline(macs, nbytes, hw.DTYPE_FP32, conv=True)
    assert compute > memory, "the case is compute-bound"
    (index,) = edge.submit(desc)
    assert_waits_for(edge, index, duration)


def test_a_nop_takes_the_dispatch_overhead(edge: Npu) -> None:
    (index,) = edge.submit(nop(1))
    assert_waits_for(edge, index, CHIPS["edge"].overhead_ns)


def test_back_to_back_commands_follow_each_other_on_the_modelled_clock(edge: Npu) -> None:
    first, second = edge.submit(nop(1), nop(2))
    for index in (first, second):
        time.sleep(0.1)
        edge.qt.clock_step(CHIPS["edge"].overhead_ns)
        edge.wait_head(index + 1)
    (s1, e1), (s2, e2) = cpl_times(edge, first), cpl_times(edge, second)
    assert (e1 - s1, e2 - s2) == (2000, 2000)
    assert s2 == e1, "the second starts where the first ended"


def test_a_clock_step_past_a_commands_time_is_not_modelled_time(edge: Npu) -> None:
    (index,) = edge.submit(nop(1))
    time.sleep(0.1)
    edge.qt.clock_step(10**6)
    edge.wait_head(index + 1)
    _, t_end = cpl_times(edge, index)
    lo, hi = edge.rd(hw.REG_TIMESTAMP_LO), edge.rd(hw.REG_TIMESTAMP_HI)
    assert lo | hi << 32 == t_end, "the device clock stands at the command's end"


def test_the_trace_ring_gives_each_command_its_roofline(edge: Npu) -> None:
    m = n = k = 256
    put_gemm(edge, m, n, k)
    _, compute, memory = CHIPS["edge"].roofline(m * n * k, 3 * m * n * 4, hw.DTYPE_FP32)
    program(edge)
    (index,) = edge.submit(gemm(A, B, C, m, n, k, k, n, n, fence=4))
    time.sleep(0.3)  # the command started: its start is the clock before the step
    edge.qt.clock_step(10**9)
    edge.wait_head(index + 1)
    recs = drain(edge)
    end = next(r for r in recs if r.kind == "cmd_end")
    assert (end.arg & 0xFFFF_FFFF, end.arg >> 32) == (compute, memory)
    assert not [r for r in recs if r.kind.startswith(("tile", "dma"))], "no parts of a command"


def test_the_busy_counter_counts_modelled_time(edge: Npu) -> None:
    for fence in (1, 2):
        (index,) = edge.submit(nop(fence))
        time.sleep(0.1)
        edge.qt.clock_step(10**6)
        edge.wait_head(index + 1)
    edge.wr(hw.PERF_BASE + hw.PERF_CONTROL, hw.PERF_SNAPSHOT)
    busy = hw.PERF_BASE + hw.PERF_Q_BASE + hw.PERF_BUSY_NS * 8
    assert edge.rd(busy) | edge.rd(busy + 4) << 32 == 2 * CHIPS["edge"].overhead_ns


def test_results_are_bit_identical_to_native_timing(tmp_path: Path) -> None:
    m, n, k = 96, 80, 64
    rng = np.random.default_rng(3)
    a = rng.standard_normal(m * k).astype(np.float32).tobytes()
    b = rng.standard_normal(k * n).astype(np.float32).tobytes()
    got = []
    for mode in ("native", "datacenter"):
        dev = start(tmp_path, mode)
        try:
            dev.qt.memwrite(A, a)
            dev.qt.memwrite(B, b)
            (index,) = dev.submit(gemm(A, B, C, m, n, k, k, n, n, fence=1))
            time.sleep(0.3)
            dev.qt.clock_step(10**9)
            dev.wait_head(index + 1)
            got.append(dev.qt.memread(C, m * n * 4))
        finally:
            dev.close()
    assert got[0] == got[1]


def test_a_reset_does_not_wait_for_the_modelled_time(edge: Npu) -> None:
    m = n = k = 256
    put_gemm(edge, m, n, k)
    edge.submit(gemm(A, B, C, m, n, k, k, n, n, fence=1))
    time.sleep(0.3)
    t0 = time.monotonic()
    edge.soft_reset()
    assert time.monotonic() - t0 < 5
    edge.assert_alive()


def test_flagged_commands_run_one_after_another_under_the_model(edge: Npu) -> None:
    i1, i2 = edge.submit(nop(1, flags=hw.CMD_F_CONCURRENT), nop(2, flags=hw.CMD_F_CONCURRENT))
    for index in (i1, i2):
        time.sleep(0.1)
        edge.qt.clock_step(CHIPS["edge"].overhead_ns)
        edge.wait_head(index + 1)
    (_, e1), (s2, _) = cpl_times(edge, i1), cpl_times(edge, i2)
    assert s2 == e1
