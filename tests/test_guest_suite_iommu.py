"""The in-guest suite again, on a guest whose NPU sits behind an emulated
Intel VT-d IOMMU (``NPU_IOMMU=1``: ``-device intel-iommu``, ``intel_iommu=on``).

Every DMA of the device is then translated by the IOMMU, so a driver that
hands the device a physical address instead of a DMA address, or unmaps a
page the device still uses, gets DMAR faults here. The suite must pass with
no DMAR fault in the kernel log.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from test_guest_suite import SuiteRun, _tail, run_suite

ROOT = Path(__file__).resolve().parent.parent
JUNIT_HOST = ROOT / "build" / "guest-junit-iommu.xml"
JUNIT_GUEST = "/mnt/npu/build/guest-junit-iommu.xml"
DMAR_FAULT_RE = re.compile(r"DMAR: \[DMA (Read|Write)|DMAR:.*fault", re.IGNORECASE)

pytestmark = pytest.mark.guest


@pytest.fixture(scope="module")
def iommu_suite(guest_module: Any) -> Iterator[tuple[SuiteRun, list[str], str]]:
    """(the suite's run, DMAR fault lines, the IOMMU group of the NPU) of one IOMMU guest."""
    gm = guest_module
    old = os.environ.get("NPU_IOMMU")
    os.environ["NPU_IOMMU"] = "1"
    g = gm.Guest(log_path=ROOT / "build" / "guest-console-iommu.log")
    try:
        g.start()
    finally:
        if old is None:
            os.environ.pop("NPU_IOMMU", None)
        else:
            os.environ["NPU_IOMMU"] = old
    try:
        g.load_module()
        rc, group = g.run("basename $(readlink /sys/class/npu/npu0/device/iommu_group)", timeout=60)
        run, dmesg = run_suite(g, gm, JUNIT_HOST, JUNIT_GUEST)
        faults = [line for line in dmesg if DMAR_FAULT_RE.search(line)]
        yield run, faults, group.strip() if rc == 0 else ""
    finally:
        g.close()


def test_the_npu_is_in_an_iommu_group(iommu_suite: tuple[SuiteRun, list[str], str]) -> None:
    _, _, group = iommu_suite
    assert group.isdigit(), f"the NPU has no IOMMU group ({group!r}): is intel_iommu on?"


def test_guest_suite_passes_behind_the_iommu(iommu_suite: tuple[SuiteRun, list[str], str]) -> None:
    run, _, _ = iommu_suite
    assert not run.error, run.error + "\n" + _tail(run.output)
    bad = [c for _, c in run.cases if c.outcome in ("failed", "error")]
    assert not bad, f"{len(bad)} of {len(run.cases)} cases failed behind the IOMMU:\n\n" + (
        "\n\n".join(f"{c.name} [{c.outcome}]\n{c.message}" for c in bad)
    )
    assert run.rc == 0, f"in-guest pytest exited {run.rc}:\n{_tail(run.output)}"
    assert len(run.cases) > 100, f"only {len(run.cases)} cases ran"
    assert not run.bad_dmesg, "kernel log errors:\n" + "\n".join(run.bad_dmesg)


def test_no_dmar_faults_during_the_suite(iommu_suite: tuple[SuiteRun, list[str], str]) -> None:
    _, faults, _ = iommu_suite
    assert not faults, "DMAR faults:\n" + "\n".join(faults[:20])
