"""The debug-kernel pass: the in-guest suite again on the debug kernel
(NPU_KERNEL=debug: KASAN, KFENCE, UBSAN, lockdep, kmemleak, DMA-API debug,
fault injection), with the NPU behind an emulated Intel VT-d IOMMU
(``-device intel-iommu``, ``intel_iommu=on``), then the fault-injection
suite (tests/faults/) and the ioctl fuzzer (tests/stress/test_fuzz.py,
100,000 calls: NPU_STRESS_SCALE=short) in the same guest. Its figures (boot
time, case count, allocations failed per scenario, the fuzzer's
``fuzz_calls_per_s``) go to build/debug-pass.json.

The in-guest gates do the checking: the kernel-log gate after every test
(KASAN, UBSAN, KFENCE, lockdep, DMA-API, Oops/BUG/WARNING) and, with
kmemleak, a scan after every test file (an object leaked from npu.ko fails
it). Every DMA of the device is translated by the IOMMU, so a driver that
hands the device a physical address, or unmaps a page the device still
uses, gets DMAR faults here.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from test_guest_suite import SuiteRun, _tail, run_suite
from test_stress_suite import _figures

ROOT = Path(__file__).resolve().parent.parent


def _load_kmsg() -> Any:
    """tests/guest/kmsg.py (the in-guest gate), for its KNOWN_REPORTS."""
    spec = importlib.util.spec_from_file_location("npu_kmsg", ROOT / "tests" / "guest" / "kmsg.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


# Lines of the known reports: the in-guest gate makes each a strict xfail
# of the test that causes it; the whole-run check here lets them through.
KNOWN_LINES = [p for lines in _load_kmsg().KNOWN_REPORTS.values() for p in lines]

DMAR_FAULT_RE = re.compile(r"DMAR: \[DMA (Read|Write)|DMAR:.*fault", re.IGNORECASE)
FIGURES = ROOT / "build" / "debug-pass.json"
FAULTS_CMD = (
    "python3 -m pytest -q -p no:cacheprovider --confcutdir=tests/faults tests/faults "
    "--junitxml={junit}"
)
# The ioctl fuzzer at make test's size (100,000 calls): its home is this
# kernel, where KASAN, lockdep and kmemleak see what the calls do
# (docs/decisions.md). NPU_STRESS_SEED and NPU_STRESS_FUZZ_CALLS pass through.
FUZZ_ENV = ("NPU_STRESS_SEED", "NPU_STRESS_FUZZ_CALLS")
FUZZ_CMD = (
    "NPU_STRESS_SCALE=short {env} python3 -m pytest -q -s -p no:cacheprovider "
    "-o junit_family=xunit1 --confcutdir=tests/stress tests/stress/test_fuzz.py "
    "--junitxml={{junit}}"
)

pytestmark = pytest.mark.guest


@dataclass
class DebugPass:
    suite: SuiteRun
    faults: SuiteRun
    fuzz: SuiteRun
    dmar: list[str]
    iommu_group: str
    bug_finders: dict[str, bool]


# What the debug kernel must have switched on, as the guest sees it.
BUG_FINDER_CHECKS = {
    "kmemleak": "test -e /sys/kernel/debug/kmemleak",
    "failslab": "test -d /sys/kernel/debug/failslab",
    "fail_page_alloc": "test -d /sys/kernel/debug/fail_page_alloc",
    "fail-nth": "test -e /proc/thread-self/fail-nth",
    "kasan": "dmesg | grep -q KernelAddressSanitizer",
    "kfence": "dmesg | grep -q 'kfence: initialized'",
    "lockdep": "test -e /proc/lockdep",
    "dma-api-debug": "test -d /sys/kernel/debug/dma-api",
}


@pytest.fixture(scope="module")
def debug_pass(guest_module: Any) -> Iterator[DebugPass]:
    gm = guest_module
    old = os.environ.get("NPU_IOMMU")
    os.environ["NPU_IOMMU"] = "1"
    g = gm.Guest(log_path=ROOT / "build" / "guest-console-debug.log", kernel="debug")
    try:
        g.start()
    finally:
        if old is None:
            os.environ.pop("NPU_IOMMU", None)
        else:
            os.environ["NPU_IOMMU"] = old
    try:
        finders = {k: g.run(cmd, timeout=60)[0] == 0 for k, cmd in BUG_FINDER_CHECKS.items()}
        g.load_module()
        rc, group = g.run(
            "basename $(readlink /sys/class/accel/accel0/device/iommu_group)", timeout=60
        )
        suite, dmesg = run_suite(
            g, gm, ROOT / "build" / "guest-junit-debug.xml", "/mnt/npu/build/guest-junit-debug.xml"
        )
        faults, _ = run_suite(
            g,
            gm,
            ROOT / "build" / "guest-junit-faults.xml",
            "/mnt/npu/build/guest-junit-faults.xml",
            cmd=FAULTS_CMD,
        )
        env = " ".join(f"{k}={int(os.environ[k])}" for k in FUZZ_ENV if os.environ.get(k, ""))
        fuzz, fuzz_dmesg = run_suite(
            g,
            gm,
            ROOT / "build" / "guest-junit-fuzz-debug.xml",
            "/mnt/npu/build/guest-junit-fuzz-debug.xml",
            cmd=FUZZ_CMD.format(env=env),
        )
        if g.alive and not g.module_loaded():
            g.load_module()
        dmar = [line for line in dmesg + fuzz_dmesg if DMAR_FAULT_RE.search(line)]
        figures = {
            "boot_s": g.boot_s,
            "suite_cases": len(suite.cases),
            "suite_s": suite.seconds,
            "faults_s": faults.seconds,
            "fuzz_s": fuzz.seconds,
        }
        for name in ("guest-junit-faults.xml", "guest-junit-fuzz-debug.xml"):
            junit = ROOT / "build" / name
            if junit.is_file():
                figures.update(_figures(junit))
        FIGURES.write_text(json.dumps(figures, indent=2, default=str) + "\n")
        yield DebugPass(suite, faults, fuzz, dmar, group.strip() if rc == 0 else "", finders)
    finally:
        g.close()


def _failed(run: SuiteRun) -> str:
    bad = [c for _, c in run.cases if c.outcome in ("failed", "error")]
    return f"{len(bad)} of {len(run.cases)} cases failed:\n\n" + "\n\n".join(
        f"{c.name} [{c.outcome}]\n{c.message}" for c in bad
    )


@pytest.mark.parametrize("finder", list(BUG_FINDER_CHECKS))
def test_the_debug_kernel_has_its_bug_finder(debug_pass: DebugPass, finder: str) -> None:
    assert debug_pass.bug_finders[finder], f"{finder} is not on in the debug kernel"


def test_the_npu_is_in_an_iommu_group(debug_pass: DebugPass) -> None:
    group = debug_pass.iommu_group
    assert group.isdigit(), f"the NPU has no IOMMU group ({group!r}): is intel_iommu on?"


def test_guest_suite_passes_on_the_debug_kernel(debug_pass: DebugPass) -> None:
    run = debug_pass.suite
    assert not run.error, run.error + "\n" + _tail(run.output)
    assert not [c for _, c in run.cases if c.outcome in ("failed", "error")], _failed(run)
    assert run.rc == 0, f"in-guest pytest exited {run.rc}:\n{_tail(run.output)}"
    assert len(run.cases) > 100, f"only {len(run.cases)} cases ran"
    bad = [ln for ln in run.bad_dmesg if not any(re.search(k, ln) for k in KNOWN_LINES)]
    assert not bad, "kernel log errors:\n" + "\n".join(bad)


def test_no_dmar_faults_during_the_suite(debug_pass: DebugPass) -> None:
    assert not debug_pass.dmar, "DMAR faults:\n" + "\n".join(debug_pass.dmar[:20])


def test_fault_injection_suite_passes(debug_pass: DebugPass) -> None:
    run = debug_pass.faults
    assert not run.error, run.error + "\n" + _tail(run.output)
    assert not [c for _, c in run.cases if c.outcome in ("failed", "error")], _failed(run)
    ran = [c for _, c in run.cases if c.outcome == "passed"]
    assert run.rc == 0 and ran, f"fault-injection pytest exited {run.rc}:\n{_tail(run.output)}"


def test_ioctl_fuzzer_passes_on_the_debug_kernel(debug_pass: DebugPass) -> None:
    run = debug_pass.fuzz
    assert not run.error, run.error + "\n" + _tail(run.output)
    assert not [c for _, c in run.cases if c.outcome in ("failed", "error")], (
        _failed(run) + "\n\n" + _tail(run.output, 30)
    )
    ran = [c for _, c in run.cases if c.outcome == "passed"]
    assert run.rc == 0 and ran, f"the fuzzer's pytest exited {run.rc}:\n{_tail(run.output)}"
    bad = [ln for ln in run.bad_dmesg if not any(re.search(k, ln) for k in KNOWN_LINES)]
    assert not bad, "kernel log errors during the fuzzer:\n" + "\n".join(bad)
