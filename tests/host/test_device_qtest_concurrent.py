"""Concurrent groups (NPU_CMD_F_CONCURRENT): independent commands of one queue
run at the same time on the AI cores and still complete in ring order.

Through qtest, against the ASan/UBSan build (docs/npu-spec.md, section 6.3
"Concurrent groups"). The qtest clock does not move, so overlap is seen in
memory: a flagged command's output appears while a command before it, one
that would run for hours, still holds the head.
"""

from __future__ import annotations

import struct
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from qtest import (
    DATA,
    Completion,
    Npu,
    fill,
    gemm,
    hw,
    nop,
    queue_fence,
    queue_ring,
    setup_queue,
)
from test_device_qtest_engine import UNTOUCHED, runaway_pool, wait_active, wait_fence
from test_device_qtest_sync import signal

M = N = K = 512  # 134M multiply-adds: milliseconds of work on one core
A = DATA
B = DATA + 0x10_0000
C0 = DATA + 0x20_0000  # one output per command, 1 MiB apart
FLAG = DATA + 0x80_0000  # a SIGNAL's target
PATTERN = 0x5A5A_0000


def concurrent(desc: bytes) -> bytes:
    """``desc`` with NPU_CMD_F_CONCURRENT set."""
    opcode, flags = struct.unpack_from("<HH", desc)
    return struct.pack("<HH", opcode, flags | hw.CMD_F_CONCURRENT) + desc[4:]


def out(i: int) -> int:
    return C0 + i * 0x10_0000


def square(i: int, fence: int) -> bytes:
    """C_i = A @ B, 512 x 512 x 512, fp32."""
    return gemm(A, B, out(i), M, N, K, K, N, N, fence=fence)


def open_npu(tmp_path: Path, cores: int, props: str = "") -> Npu:
    dev = Npu(tmp_path / "qemu.log", device=f"npu,cores={cores}" + (f",{props}" if props else ""))
    dev.start()
    rng = np.random.default_rng(7)
    dev.qt.memwrite(A, rng.standard_normal((M, K)).astype(np.float32).tobytes())
    dev.qt.memwrite(B, rng.standard_normal((K, N)).astype(np.float32).tobytes())
    return dev


@pytest.fixture
def two(tmp_path: Path) -> Iterator[Npu]:
    """A device with two AI cores, queue 0 running, A and B written."""
    dev = open_npu(tmp_path, 2)
    try:
        yield dev
    finally:
        dev.close()


def run_all(npu: Npu, *descs: bytes) -> list[Completion]:
    idx = npu.submit(*descs)
    npu.wait_head(idx[-1] + 1, timeout=60.0)
    return npu.completions(idx[0], len(descs))


def result(npu: Npu, i: int) -> np.ndarray:
    return np.frombuffer(npu.qt.memread(out(i), M * N * 4), np.float32).reshape(M, N)


def test_the_device_reports_concurrent_groups_in_caps(two: Npu) -> None:
    assert two.rd(hw.REG_CAPS) & hw.CAP_CONCURRENT


def written(npu: Npu, i: int, within: float = 0.0) -> bool:
    """Has ``quick(i)`` written its output (polling up to ``within`` seconds)?"""
    deadline = time.monotonic() + within
    while True:
        if npu.qt.memread(out(i), 16) == struct.pack("<I", PATTERN + i) * 4:
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.005)


def quick(i: int, fence: int) -> bytes:
    """A FILL of 4 KiB at out(i): done in microseconds."""
    return fill(out(i), 4096, PATTERN + i, fence=fence)


def test_a_flagged_command_runs_while_the_one_before_is_still_running(two: Npu) -> None:
    two.submit(runaway_pool(two, 1), concurrent(quick(0, 2)))
    wait_active(two)
    assert written(two, 0, within=10.0), "the flagged FILL waited for the runaway command"
    assert two.qrd(hw.Q_HEAD) == 0
    two.soft_reset(timeout=5.0)
    two.assert_alive()


def test_commands_without_the_flag_wait_for_the_one_before(two: Npu) -> None:
    two.submit(runaway_pool(two, 1), quick(0, 2))
    wait_active(two)
    assert not written(two, 0, within=0.5)
    two.soft_reset(timeout=5.0)
    two.assert_alive()


def test_a_member_that_ends_first_is_completed_only_after_those_before_it(
    tmp_path: Path,
) -> None:
    dev = open_npu(tmp_path, 2, "cmd-budget-ms=500")
    try:
        dev.submit(runaway_pool(dev, 1), concurrent(quick(0, 2)))
        wait_active(dev)
        assert written(dev, 0, within=10.0)
        assert dev.completion(1).fence == UNTOUCHED, "completed before the command before it"
        wait_fence(dev, 2)
        assert [(c.fence, c.status) for c in dev.completions(0, 2)] == [
            (1, hw.ST_TIMEOUT), (2, hw.ST_OK),
        ]  # fmt: skip
    finally:
        dev.close()


def test_results_of_a_group_are_those_of_the_same_commands_in_order(two: Npu) -> None:
    run_all(two, square(0, 1), square(1, 2))
    sequential = [result(two, 0).copy(), result(two, 1).copy()]
    two.qt.memset(out(0), 2 * 0x10_0000, 0)
    run_all(two, square(0, 3), concurrent(square(1, 4)))
    assert np.array_equal(result(two, 0), sequential[0])
    assert np.array_equal(result(two, 1), sequential[1])
    a = np.frombuffer(two.qt.memread(A, M * K * 4), np.float32).reshape(M, K)
    b = np.frombuffer(two.qt.memread(B, K * N * 4), np.float32).reshape(K, N)
    np.testing.assert_allclose(sequential[0], a.astype(np.float64) @ b, rtol=1e-4, atol=1e-3)


def test_a_group_completes_in_ring_order_and_writes_back_its_last_fence(two: Npu) -> None:
    cpls = run_all(two, square(0, 11), concurrent(square(1, 12)), nop(13))
    assert [c.fence for c in cpls] == [11, 12, 13]
    assert two.fence_wb()[0] == 13
    assert two.qrd(hw.Q_DONE_LO) == 13


def test_a_group_is_no_larger_than_the_device_has_cores(two: Npu) -> None:
    two.submit(runaway_pool(two, 1), concurrent(runaway_pool(two, 2)), concurrent(quick(0, 3)))
    wait_active(two)
    assert not written(two, 0, within=0.5), "a third member ran on a device of two cores"
    two.soft_reset(timeout=5.0)
    two.assert_alive()


def test_a_failing_member_does_not_stop_the_others_of_its_group(two: Npu) -> None:
    bad = gemm(A, B, out(1), M, N, K, K - 1, N, N, fence=2)  # lda below k
    cpls = run_all(two, square(0, 1), concurrent(bad), concurrent(nop(3)))
    assert [c.status for c in cpls] == [hw.ST_OK, hw.ST_BAD_ARGS, hw.ST_OK]
    a = np.frombuffer(two.qt.memread(A, M * K * 4), np.float32).reshape(M, K)
    b = np.frombuffer(two.qt.memread(B, K * N * 4), np.float32).reshape(K, N)
    np.testing.assert_allclose(result(two, 0), a.astype(np.float64) @ b, rtol=1e-4, atol=1e-3)
    assert not two.rd(hw.REG_STATUS) & hw.STATUS_ERROR


def test_a_signal_never_joins_a_group(two: Npu) -> None:
    two.qt.memset(FLAG, 8, 0)
    two.submit(runaway_pool(two, 1), concurrent(signal(FLAG, 5, fence=2)))
    wait_active(two)
    time.sleep(0.5)
    assert two.qt.memread(FLAG, 8) == bytes(8), "a SIGNAL ran before the command before it"
    two.soft_reset(timeout=5.0)
    two.assert_alive()


def test_one_core_runs_flagged_commands_one_after_another(tmp_path: Path) -> None:
    dev = open_npu(tmp_path, 1)
    try:
        dev.submit(runaway_pool(dev, 1), concurrent(quick(0, 2)))
        wait_active(dev)
        assert not written(dev, 0, within=0.5)
        dev.soft_reset(timeout=5.0)
        dev.assert_alive()
    finally:
        dev.close()


def test_a_soft_reset_stops_every_member_of_a_running_group(two: Npu) -> None:
    two.submit(runaway_pool(two, 1), concurrent(runaway_pool(two, 2)))
    wait_active(two)
    seen = two.soft_reset(timeout=5.0)  # hours of work otherwise
    assert seen[-1] == hw.STATUS_READY
    assert two.fence_wb()[0] == 0, "nothing of an aborted group is completed"
    two.start()
    assert two.run(nop(3)).status == hw.ST_OK
    two.assert_alive()


def test_every_member_of_a_group_is_held_to_the_command_budget(tmp_path: Path) -> None:
    dev = open_npu(tmp_path, 2, "cmd-budget-ms=200")
    try:
        dev.submit(runaway_pool(dev, 1), concurrent(runaway_pool(dev, 2)))
        wait_fence(dev, 2)
        assert [c.status for c in dev.completions(0, 2)] == [hw.ST_TIMEOUT] * 2
        dev.assert_alive()
    finally:
        dev.close()


def test_a_group_is_not_preempted_by_a_higher_priority(tmp_path: Path) -> None:
    dev = open_npu(tmp_path, 2, "cmd-budget-ms=500")
    try:
        setup_queue(dev, 3, priority=3)
        dev.submit(runaway_pool(dev, 1), concurrent(runaway_pool(dev, 2)))
        wait_active(dev)
        dev.qt.memwrite(queue_ring(3), nop(0x33))
        dev.wr(hw.doorbell(3), 1)
        time.sleep(0.2)
        assert struct.unpack("<Q", dev.qt.memread(queue_fence(3), 8))[0] == 0, (
            "the higher priority ran inside the group"
        )
        wait_fence(dev, 2)  # the group times out ...
        deadline = time.monotonic() + 10
        while struct.unpack("<Q", dev.qt.memread(queue_fence(3), 8))[0] != 0x33:
            assert time.monotonic() < deadline, "the NOP did not run after the group"
            time.sleep(0.005)
        dev.assert_alive()
    finally:
        dev.close()
