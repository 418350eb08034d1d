"""Every opcode parks within a control point of every engine-control event.

docs/npu-spec.md 11 and 12.1: a soft reset, a system reset, a move to D3hot,
a VM stop, the ``cmd-budget-ms`` budget and a higher-priority command each
wait for at most one control point's work of the running command, "within a
few milliseconds of host time whatever the command"; section 13: the host
memory of the commands in flight stays within ``mem-budget``.

Each opcode runs its worst case (park_matrix.WORST: the command the
validator accepts with the largest units of work between two control
points, stride-0 inputs and outputs aliased by the MMU onto one page), and
each event hits it while it runs. The device must answer within
PARK_BOUND_MS: generous, for the ASan build (3-5 times slower than the
release one) on a two-core host that ``make test`` keeps busy with a guest
as well, where 100-200 ms were seen for cells the release build answers in
under 10 ms; yet a missing control point (the review's and this matrix's
first findings: 0.3 to 9 s) still fails. The 10 ms target is measured on
the release build by scripts/bench_engine.py (``park_latency_ms_max``).
After each event the device runs a NOP, and an aborted command has
written neither its completion nor its fence.

The RSS tests run a device with ``mem-budget=16M`` and the commands whose
host scratch is sized by guest numbers (park_matrix.RSS_WORST), and bound
QEMU's peak RSS (VmHWM) by its RSS before the command plus the budget plus
RSS_OVERHEAD. The overhead is a fixed 64 MiB: a NOP or a 64^3 GEMM grows
the ASan QEMU's peak by a few MiB (measured: NOP 0.0 MiB, GEMM64 6.0 MiB, release 4.1; a
command's first run also maps oneDNN's code and a 1 MiB chunk per core), so
64 MiB covers the allocator's and oneDNN's overhead with room to spare,
while an uncharged scratch sized by the guest (hundreds of MiB) fails.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

import park_matrix as pm
from qtest import hw

PARK_BOUND_MS = 250.0
RSS_OVERHEAD = 64 << 20
MiB = 1 << 20


class Rigs:
    """One QEMU per opcode, reused by its events; replaced after a failure."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.rigs: dict[str, pm.Rig] = {}
        self.made = 0

    def get(self, opcode: str) -> pm.Rig:
        rig = self.rigs.get(opcode)
        if rig is None or not rig.npu.qt.alive():
            self.made += 1
            rig = pm.Rig(self.root / f"{opcode}-{self.made}", pm.device_for(pm.WORST[opcode]))
            self.rigs[opcode] = rig
        return rig

    def drop(self, opcode: str) -> None:
        rig = self.rigs.pop(opcode, None)
        if rig is not None:
            rig.close()

    def close(self) -> None:
        for op in list(self.rigs):
            self.drop(op)


@pytest.fixture(scope="module")
def rigs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Rigs]:
    r = Rigs(tmp_path_factory.mktemp("park"))
    try:
        yield r
    finally:
        r.close()


def park(rigs: Rigs, opcode: str, event: str) -> pm.Cell:
    """Measure one cell; a device that did not park fails the test with the
    time it was given, and its QEMU is replaced."""
    rig = rigs.get(opcode)
    try:
        cell = pm.measure_event(rig, pm.WORST[opcode], event)
    except TimeoutError:
        rigs.drop(opcode)
        pytest.fail(f"{opcode}: the device did not answer {event} within {pm.GIVE_UP_S:.0f} s")
    except BaseException:
        rigs.drop(opcode)
        raise
    assert cell.alive, f"{opcode}: a NOP after {event} did not complete OK"
    return cell


OPCODES = list(pm.WORST)
RUNNING = [op for op, w in pm.WORST.items() if w.runs and not w.blocks]


@pytest.mark.parametrize("event", ["reset", "system_reset", "d3hot"])
@pytest.mark.parametrize("opcode", OPCODES)
def test_a_reset_or_d3hot_parks_every_opcode_within_a_control_point_and_drops_its_command(
    rigs: Rigs, opcode: str, event: str
) -> None:
    cell = park(rigs, opcode, event)
    assert cell.ms is not None and cell.ms < PARK_BOUND_MS, (
        f"{opcode} ({pm.WORST[opcode].why}): {event} took {cell.ms:.1f} ms"
    )
    if pm.WORST[opcode].runs:
        assert cell.wrote_nothing, f"{opcode}: the command aborted by {event} wrote its completion"


@pytest.mark.parametrize("opcode", OPCODES)
def test_a_vm_stop_returns_within_a_control_point_of_every_opcode(rigs: Rigs, opcode: str) -> None:
    cell = park(rigs, opcode, "vm_stop")
    assert cell.ms is not None and cell.ms < PARK_BOUND_MS, (
        f"{opcode} ({pm.WORST[opcode].why}): QMP stop took {cell.ms:.1f} ms"
    )


@pytest.mark.parametrize("opcode", RUNNING)
def test_a_command_past_its_budget_completes_with_timeout_within_a_control_point(
    rigs: Rigs, opcode: str
) -> None:
    cell = park(rigs, opcode, "budget")
    assert cell.status == hw.ST_TIMEOUT, f"{opcode}: completed with status {cell.status}"
    assert cell.ms is not None and cell.ms < PARK_BOUND_MS, (
        f"{opcode} ({pm.WORST[opcode].why}): TIMEOUT written {cell.ms:.1f} ms past the budget"
    )


@pytest.mark.parametrize("opcode", OPCODES)
def test_a_higher_priority_nop_runs_within_a_control_point_of_every_opcode(
    rigs: Rigs, opcode: str
) -> None:
    cell = park(rigs, opcode, "preempt")
    assert cell.ms is not None and cell.ms < PARK_BOUND_MS, (
        f"{opcode} ({pm.WORST[opcode].why}): the priority-3 NOP took {cell.ms:.1f} ms"
    )
    assert not cell.note, f"{opcode}: {cell.note}"


@pytest.mark.parametrize("opcode", list(pm.RSS_WORST))
def test_qemus_peak_rss_stays_within_the_memory_budget(tmp_path: Path, opcode: str) -> None:
    fig = pm.measure_rss(tmp_path, opcode)
    assert fig.over_budget <= RSS_OVERHEAD, (
        f"{opcode} ({pm.RSS_WORST[opcode].why}): peak RSS {fig.hwm / MiB:.0f} MiB, "
        f"{fig.over_budget / MiB:.0f} MiB over RSS before ({fig.rss_before / MiB:.0f} MiB) "
        f"+ mem-budget ({pm.RSS_BUDGET}); status {fig.status}"
    )
