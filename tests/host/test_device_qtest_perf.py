"""The device's performance counters (NPU_CAP_PERF, docs/npu-spec.md 4.7).

Through qtest, against the ASan/UBSan build. The qtest clock moves only
with ``clock_step``, so time counts are checked where a test moves it (a
WAIT held across a step); work counts (commands, multiply-adds, bytes,
MMU walks) are exact.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from qtest import DATA, Npu, copy, fill, gemm, hw, nop, queue_ring, setup_queue
from test_device_qtest import enable_mmu
from test_device_qtest_concurrent import concurrent
from test_device_qtest_engine import runaway_pool, wait_active
from test_device_qtest_firmware import system_reset
from test_device_qtest_sync import SYNC, put_u64, signal, wait
from test_device_qtest_tensor import Operand, Rig

COUNTERS = ("CMDS", "BUSY_NS", "MACS", "READ_BYTES", "WRITE_BYTES", "WALKS", "WALK_HITS", "WAIT_NS")


@pytest.fixture
def npu(tmp_path: Path) -> Iterator[Npu]:
    """A device with queue 0 running."""
    dev = Npu(tmp_path / "qemu.log")
    try:
        dev.start()
        yield dev
    finally:
        dev.close()


def perf_q(q: int, counter: int) -> int:
    """NPU_PERF_Q(q, counter): offset of a queue's count in the block."""
    return hw.PERF_Q_BASE + q * hw.PERF_Q_STRIDE + counter * 8


def perf_rd(npu: Npu, off: int) -> int:
    return npu.rd(hw.PERF_BASE + off)


def perf_wr(npu: Npu, off: int, val: int) -> None:
    npu.wr(hw.PERF_BASE + off, val)


def rd64(npu: Npu, off: int) -> int:
    return perf_rd(npu, off) | perf_rd(npu, off + 4) << 32


def snapshot(npu: Npu, q: int = 0, *, reset: bool = False) -> dict[str, int]:
    """Take a snapshot (and reset with it); queue q's counts by name."""
    perf_wr(npu, hw.PERF_CONTROL, hw.PERF_SNAPSHOT | (hw.PERF_RESET if reset else 0))
    return {name: rd64(npu, perf_q(q, i)) for i, name in enumerate(COUNTERS)}


def test_the_device_reports_performance_counters_in_caps(npu: Npu) -> None:
    assert npu.rd(hw.REG_CAPS) & hw.CAP_PERF
    assert len(COUNTERS) == hw.PERF_COUNTERS


def test_counters_read_zero_before_any_snapshot(npu: Npu) -> None:
    npu.run(nop(1))
    known = [hw.PERF_TIME_LO, hw.PERF_TIME_HI, hw.PERF_SNAPSHOTS]
    known += range(hw.PERF_Q_BASE, perf_q(hw.NUM_QUEUES, 0), 4)
    known += range(hw.PERF_CORE_BASE, hw.PERF_CORE_BASE + 2 * 8, 4)
    assert [perf_rd(npu, off) for off in known] == [0] * len(known)


def test_a_snapshot_counts_the_commands_each_queue_completed(npu: Npu) -> None:
    idx = npu.submit(*(nop(i + 1) for i in range(5)))
    npu.wait_head(idx[-1] + 1)
    assert snapshot(npu)["CMDS"] == 5
    assert snapshot(npu, 1)["CMDS"] == 0
    assert perf_rd(npu, hw.PERF_SNAPSHOTS) == 2


def test_the_registers_keep_the_snapshot_until_the_next_one(npu: Npu) -> None:
    npu.run(nop(1))
    assert snapshot(npu)["CMDS"] == 1
    npu.run(nop(2))
    assert rd64(npu, perf_q(0, hw.PERF_CMDS)) == 1
    assert snapshot(npu)["CMDS"] == 2


def test_a_reset_starts_every_count_again_from_zero(npu: Npu) -> None:
    npu.run(nop(1))
    assert snapshot(npu, reset=True)["CMDS"] == 1, "snapshot and reset: the counts up to it"
    npu.run(nop(2))
    assert snapshot(npu)["CMDS"] == 1


def test_a_gemm_counts_its_multiply_adds_and_operand_bytes(npu: Npu) -> None:
    m, n, k = 48, 40, 32
    a, b, c = DATA, DATA + 0x10_0000, DATA + 0x20_0000
    npu.qt.memwrite(a, np.ones(m * k, np.float32).tobytes())
    npu.qt.memwrite(b, np.ones(k * n, np.float32).tobytes())
    assert npu.run(gemm(a, b, c, m, n, k, k, n, n, fence=1)).status == hw.ST_OK
    got = snapshot(npu)
    assert got["MACS"] == m * n * k
    assert got["READ_BYTES"] == (m * k + k * n) * 4
    assert got["WRITE_BYTES"] == m * n * 4


def test_a_tensor_op_counts_its_operands_not_its_parameter_block(npu: Npu) -> None:
    """READ_BYTES are operand bytes (spec 4.7): the 256-byte parameter block
    a tensor op reads first is control, like a descriptor (the device
    counted it until issue 34)."""
    rig = Rig(npu)
    x = Operand(hw.DTYPE_FP32, (1024,), buf=np.linspace(-1, 1, 1024, dtype=np.float32))
    out = Operand(hw.DTYPE_FP32, (1024,))
    rig.run(hw.OP_UNARY, hw.UNARY_RELU, [x, out])
    got = snapshot(npu)
    assert (got["READ_BYTES"], got["WRITE_BYTES"]) == (4096, 4096)


def test_copy_and_fill_count_the_bytes_they_move(npu: Npu) -> None:
    npu.run(copy(DATA, DATA + 0x10_0000, 0x3000, fence=1))
    npu.run(fill(DATA, 0x800, 0x5A5A5A5A, fence=2))
    got = snapshot(npu)
    assert (got["READ_BYTES"], got["WRITE_BYTES"]) == (0x3000, 0x3000 + 0x800)
    assert got["MACS"] == 0


def test_a_failed_command_counts_as_completed_with_no_multiply_adds(npu: Npu) -> None:
    bad = gemm(DATA, DATA, DATA, 4, 4, 4, 3, 4, 4, fence=1)  # lda below k
    assert npu.run(bad).status == hw.ST_BAD_ARGS
    got = snapshot(npu)
    assert (got["CMDS"], got["MACS"]) == (1, 0)


def test_the_mmu_counts_its_walks_and_walk_cache_hits(npu: Npu) -> None:
    npu.wr(hw.REG_CONTROL, 0)
    enable_mmu(npu)
    npu.wr(hw.REG_CONTROL, hw.CONTROL_ENABLE)
    # Two source pages and two destination pages, all under L1[0].
    assert npu.run(copy(0x1000, 0x3000, 0x2000, fence=1)).status == hw.ST_OK
    got = snapshot(npu)
    assert got["WALKS"] >= 4
    # One L2 table read; every other page found it held.
    assert got["WALK_HITS"] == got["WALKS"] - 1


def test_a_wait_counts_the_time_it_was_blocked(npu: Npu) -> None:
    put_u64(npu, SYNC, 0)
    idx = npu.submit(wait(SYNC, 1, 1), nop(2))
    deadline = time.monotonic() + 10
    while not npu.qrd(hw.Q_STATUS) & hw.QSTAT_WAITING:
        assert time.monotonic() < deadline, "the WAIT did not block"
        time.sleep(0.001)
    npu.qt.clock_step(5_000_000)  # 5 ms of device clock while blocked
    put_u64(npu, SYNC, 1)
    npu.wait_head(idx[-1] + 1)
    assert snapshot(npu)["WAIT_NS"] >= 5_000_000


def test_a_snapshot_records_the_device_clock(npu: Npu) -> None:
    npu.qt.clock_step(1_000_000)
    snapshot(npu)
    t0 = rd64(npu, hw.PERF_TIME_LO)
    npu.qt.clock_step(2_000_000)
    snapshot(npu)
    assert rd64(npu, hw.PERF_TIME_LO) - t0 == 2_000_000


def test_unknown_control_bits_change_nothing(npu: Npu) -> None:
    npu.run(nop(1))
    perf_wr(npu, hw.PERF_CONTROL, hw.PERF_SNAPSHOT | 1 << 5)
    assert perf_rd(npu, hw.PERF_SNAPSHOTS) == 0
    assert rd64(npu, perf_q(0, hw.PERF_CMDS)) == 0
    npu.assert_alive()


def test_a_soft_reset_keeps_the_counts_and_a_system_reset_clears_them(npu: Npu) -> None:
    npu.run(nop(1))
    npu.soft_reset()
    npu.start()
    assert snapshot(npu)["CMDS"] == 1
    system_reset(npu)
    npu.start()
    assert snapshot(npu)["CMDS"] == 0


def test_each_queue_counts_its_own_commands(npu: Npu) -> None:
    setup_queue(npu, 2)
    npu.qt.memwrite(queue_ring(2), signal(SYNC, 7, 1) + fill(DATA, 0x100, 0, 2))
    npu.wr(hw.doorbell(2), 2)
    deadline = time.monotonic() + 10
    while npu.qrd(hw.Q_HEAD, 2) != 2:
        assert time.monotonic() < deadline, "queue 2 did not run"
        time.sleep(0.001)
    got = snapshot(npu, 2)
    # The SIGNAL's 8-byte store is an engine write too.
    assert (got["CMDS"], got["WRITE_BYTES"]) == (2, 0x100 + 8)
    assert snapshot(npu, 0)["CMDS"] == 0


def test_an_ai_core_counts_the_time_it_runs_a_group_member(npu: Npu) -> None:
    # The head runs on the command processor, the flagged member on a core;
    # the device clock moves 3 ms while both run, then a reset stops them.
    npu.submit(runaway_pool(npu, 1), concurrent(runaway_pool(npu, 2)))
    wait_active(npu)
    time.sleep(0.2)
    npu.qt.clock_step(3_000_000)
    npu.soft_reset(timeout=5.0)
    perf_wr(npu, hw.PERF_CONTROL, hw.PERF_SNAPSHOT)
    busy = [rd64(npu, hw.PERF_CORE_BASE + 8 * k) for k in range(npu.rd(hw.REG_NUM_CORES))]
    assert sum(busy) >= 3_000_000, busy
    assert snapshot(npu)["CMDS"] == 0, "an aborted command is not completed"
