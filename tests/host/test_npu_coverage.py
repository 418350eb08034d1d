"""npu.ko's line coverage from gcov's summary (scripts/npu_coverage.py):
the module's own C files are summed, headers and other files are not."""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "scripts"))
import npu_coverage  # noqa: E402

GCOV = """File '/src/build/module/6.12.57-npu-debug/npu_drv.c'
Lines executed:50.00% of 200

File '/src/build/module/6.12.57-npu-debug/npu_job.c'
Lines executed:75.00% of 400

File '/cache/kernel-debug/x/build/include/linux/list.h'
Lines executed:100.00% of 12

File '/src/build/module/6.12.57-npu-debug/npu_drv.c'
Lines executed:10.00% of 200
"""


def test_the_module_files_are_summed_once_each() -> None:
    cov = npu_coverage.parse_gcov(GCOV)
    assert cov.files == {"npu_drv.c": (100, 200), "npu_job.c": (300, 400)}
    assert (cov.executed, cov.lines) == (400, 600)
    assert abs(cov.percent - 400 / 6) < 1e-9


def test_no_gcov_output_is_no_coverage() -> None:
    cov = npu_coverage.parse_gcov("")
    assert (cov.executed, cov.lines, cov.percent) == (0, 0, 0.0)


def test_the_guest_command_copies_only_the_modules_counters() -> None:
    cmd = npu_coverage.collect_cmd("build/gcov-debug")
    assert "/sys/kernel/debug/gcov" in cmd and "'npu_*.gcda'" in cmd
    assert "/mnt/npu/build/gcov-debug" in cmd
