"""Every fuzzer finding stays fixed: its reproducer replays cleanly on the ASan build.

Each ``tests/fuzz/regressions/*.qtest`` file is a qtest command sequence, written
by hand from a finding of ``make fuzz-device`` (docs/fuzzing.md), with the QEMU
arguments it needs on its ``# qemu-system-x86_64 ...`` line. The test replays
it through the qtest protocol: every command must be answered (a hang times
out), QEMU must stay alive and no sanitizer may report.
"""

from __future__ import annotations

import shlex
from pathlib import Path

import pytest

from qtest import QTest

REGRESSIONS = Path(__file__).resolve().parents[1] / "fuzz" / "regressions"
CASES = sorted(REGRESSIONS.glob("*.qtest"))


def qemu_args(script: Path) -> list[str]:
    """The machine and device arguments of the script's ``# qemu-system-x86_64`` line."""
    for line in script.read_text().splitlines():
        if line.startswith("# qemu-system-x86_64 "):
            words = shlex.split(line[2:].split("<", 1)[0])
            start = words.index("-machine")
            return words[start:]
    raise AssertionError(f"{script.name}: no '# qemu-system-x86_64' line")


def test_there_are_regressions_to_replay() -> None:
    assert CASES, f"no reproducers in {REGRESSIONS}"


@pytest.mark.parametrize("script", CASES, ids=[c.stem for c in CASES])
def test_a_fuzzer_finding_replays_without_hang_crash_or_report(
    script: Path, tmp_path: Path
) -> None:
    qt = QTest(qemu_args(script), tmp_path / "qemu.log", timeout=20.0)
    try:
        for line in script.read_text().splitlines():
            if line.strip() and not line.startswith("#"):
                qt.command(line)
        assert qt.alive(), qt.log_tail()
        qt.command("readl 0x0")  # still answering after the last command
    finally:
        qt.close()
