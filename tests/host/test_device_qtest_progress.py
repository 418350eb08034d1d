"""NPU_Q_PROGRESS tells a watchdog a running or preempted command from a stuck one.

docs/npu-spec.md (the queue registers): the counter moves when a command of
the queue starts, at every control point it passes and for every command
that runs while it is preempted; a command that is stuck (here: an injected
hang, the only way the model has to stop its command processor, or a WAIT
whose value never comes) moves it no more. The driver's watchdog declares a
hang only when HEAD and Q_PROGRESS both stood still for its timeout, so a
preempted command is not taken for a hung one (issue 36, item 5).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from qtest import DATA, Npu, hw, nop, queue_fence, queue_ring, setup_queue
from test_device_qtest_engine import open_npu, runaway_pool, wait_active
from test_device_qtest_sync import wait

SYNC = DATA  # the 8-byte cell a WAIT looks at

PREEMPTING_NOPS = 16


def progress(npu: Npu, q: int = 0) -> int:
    return npu.qrd(hw.Q_PROGRESS, q)


def moved(before: int, after: int) -> int:
    return (after - before) & 0xFFFF_FFFF  # free-running, 32 bits


@pytest.fixture
def busy(tmp_path: Path) -> Iterator[Npu]:
    """Queue 0 running a POOL2D of hours (no budget): reset away after the test."""
    npu = open_npu(tmp_path, "npu,cmd-budget-ms=0")
    try:
        npu.submit(runaway_pool(npu, 1))
        wait_active(npu)
        yield npu
        npu.soft_reset()
        npu.assert_alive()
    finally:
        npu.close()


def test_progress_moves_while_a_long_command_runs(busy: Npu) -> None:
    before = progress(busy)
    time.sleep(0.2)
    # Control points come every few milliseconds of work (tens on ASan).
    assert moved(before, progress(busy)) >= 2


def test_a_preempted_queues_progress_moves_with_each_command_that_preempts_it(
    busy: Npu,
) -> None:
    setup_queue(busy, 3, priority=3)
    busy.qt.memwrite(queue_fence(3), bytes(16))
    ring = b"".join(nop(0x300 + i) for i in range(PREEMPTING_NOPS))
    before = progress(busy)
    busy.qt.memwrite(queue_ring(3), ring)
    busy.wr(hw.doorbell(3), PREEMPTING_NOPS)
    deadline = time.monotonic() + 10
    while busy.qt.memread(queue_fence(3), 8) != (0x300 + PREEMPTING_NOPS - 1).to_bytes(8, "little"):
        assert time.monotonic() < deadline, "the preempting NOPs did not complete"
    assert busy.qrd(hw.Q_STATUS) & hw.QSTAT_ACTIVE, "the preempted command stopped"
    assert moved(before, progress(busy)) >= PREEMPTING_NOPS


def test_progress_stands_still_while_a_command_is_stuck(tmp_path: Path) -> None:
    npu = open_npu(tmp_path)
    try:
        npu.wr(hw.REG_INJECT, hw.INJECT_HANG)
        npu.submit(nop(1))
        wait_active(npu)
        before = progress(npu)
        time.sleep(0.2)
        assert progress(npu) == before
        assert npu.qrd(hw.Q_STATUS) & hw.QSTAT_ACTIVE
        npu.soft_reset()
        npu.assert_alive()
    finally:
        npu.close()


def test_a_blocked_wait_leaves_progress_still_until_its_value_comes(tmp_path: Path) -> None:
    """A WAIT looked at again every 1 ms is not progress: a dependency that
    never comes is a hang to the watchdog (the driver's dependency timeout)."""
    npu = open_npu(tmp_path)
    try:
        npu.qt.memwrite(SYNC, bytes(8))
        npu.submit(wait(SYNC, 1, fence=1))
        deadline = time.monotonic() + 10
        while progress(npu) == 0:
            assert time.monotonic() < deadline, "the WAIT did not start"
            time.sleep(0.001)
        before = progress(npu)
        time.sleep(0.2)  # some 200 looks again
        assert progress(npu) == before
        assert npu.qrd(hw.Q_HEAD) == 0
        npu.qt.memwrite(SYNC, (1).to_bytes(8, "little"))
        npu.wait_head(1)
        npu.submit(nop(2))
        npu.wait_head(2)
        assert moved(before, progress(npu)) >= 1
    finally:
        npu.close()
