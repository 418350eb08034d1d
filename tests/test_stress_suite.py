"""Run the in-guest reliability suite (tests/stress/) in the session guest.

``make test`` runs it at the short sizes (NPU_STRESS_SCALE=short: 10 kills,
5 module cycles, 8 x 100 jobs, 5 hang cycles, and only DISTRO_FUZZ_CALLS
fuzz calls: the fuzzer's 100,000 calls of make test run on the debug kernel,
tests/test_guest_debug.py); ``make stress`` runs only this file at the
issue's full sizes (NPU_STRESS_SCALE=full: 100 kills, 50 module cycles,
1,000,000 fuzz calls, 8 x 1,000 jobs, 100 hang cycles). The figures each
test records (junit properties) are written to build/stress-figures.json.

test_stress_suite_ran checks the run itself (pytest ran, wrote its junit
XML, no kernel splat meanwhile); test_stress_file[<file>] passes only if
that file ran at least one test case and none failed.
"""

from __future__ import annotations

import json
import os
import random
import re
import sys
import time
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
from test_guest_suite import SuiteRun, _parse_junit, _tail

ROOT = Path(__file__).resolve().parent.parent
STRESS_TESTS = ROOT / "tests" / "stress"
STRESS_FILES = sorted(p.name for p in STRESS_TESTS.glob("test_*.py"))
JUNIT_HOST = ROOT / "build" / "stress-junit.xml"
JUNIT_GUEST = "/mnt/npu/build/stress-junit.xml"
FIGURES = ROOT / "build" / "stress-figures.json"
SCALE = os.environ.get("NPU_STRESS_SCALE", "") or "short"
# Full: the fuzzer's 1,000,000 calls alone take ~12 min on the distro kernel
# and ~55 min on the debug kernel (NPU_KERNEL=debug make stress).
TIMEOUT = float(os.environ.get("NPU_STRESS_TIMEOUT", "") or (7200 if SCALE == "full" else 900))
# Passed through to the guest: sizes, seed.
PASS_ENV = (
    "NPU_STRESS_KILLS",
    "NPU_STRESS_MODULE_CYCLES",
    "NPU_STRESS_FUZZ_CALLS",
    "NPU_STRESS_PROCS",
    "NPU_STRESS_JOBS",
    "NPU_STRESS_HANG_CYCLES",
)

# The short run's fuzzer on this (distro) kernel: a smoke run of ~8 s; the
# 100,000 calls of make test run on the debug kernel (docs/decisions.md).
DISTRO_FUZZ_CALLS = 10_000

pytestmark = pytest.mark.guest


def stress_seed() -> int:
    """The seed the guest's stress tests use, chosen here so that every
    failure message can name it: NPU_STRESS_SEED if set, else the fixed
    seed of the short scale (make test: two runs test the same calls) or a
    new one at the full scale (make stress)."""
    v = os.environ.get("NPU_STRESS_SEED", "").strip()
    if v:
        return int(v)
    return FIXED_SEED if SCALE == "short" else random.SystemRandom().randrange(2**32)


# tests/stress/stress_util.py's fixed seed, read without importing it
# (it needs the guest's driver ABI at import).
FIXED_SEED = int(
    re.search(r"^FIXED_SEED = (\d+)$", (STRESS_TESTS / "stress_util.py").read_text(), re.M).group(1)  # type: ignore[union-attr]
)
SEED = stress_seed()


def _figures(path: Path) -> dict[str, str]:
    out = {}
    for tc in ET.parse(path).getroot().iter("testcase"):
        for prop in tc.iter("property"):
            out[prop.get("name", "")] = prop.get("value", "")
    return out


@pytest.fixture(scope="session")
def stress_suite(guest_holder) -> SuiteRun:
    g = guest_holder.get()
    # scripts/guest.py, loaded by tests/conftest.py's holder. (Not `from
    # conftest import ...`: tests/host/conftest.py also imports as conftest.)
    gm = sys.modules["npu_guest"]
    run = SuiteRun()
    JUNIT_HOST.parent.mkdir(parents=True, exist_ok=True)
    JUNIT_HOST.unlink(missing_ok=True)
    env = " ".join(f"{k}={int(os.environ[k])}" for k in PASS_ENV if os.environ.get(k, "").strip())
    env += f" NPU_STRESS_SEED={SEED}"
    if SCALE == "short" and not os.environ.get("NPU_STRESS_FUZZ_CALLS", "").strip():
        env += f" NPU_STRESS_FUZZ_CALLS={DISTRO_FUZZ_CALLS}"
    cmd = (
        f"NPU_STRESS_SCALE={SCALE} {env} python3 -m pytest -q -s -p no:cacheprovider "
        f"-o junit_family=xunit1 --confcutdir=tests/stress tests/stress "
        f"--junitxml={JUNIT_GUEST}"
    )
    mark = g.dmesg_mark()
    t0 = time.monotonic()
    try:
        run.rc, run.output = g.run(f"{cmd}; rc=$?; sync; exit $rc", timeout=TIMEOUT)
    except gm.GuestError as e:
        run.error = f"{e}\n{getattr(e, 'output', '')[-4000:]}"
    run.seconds = time.monotonic() - t0
    sys.stderr.write(
        f"\n[stress] {SCALE} suite ran {run.seconds:.0f} s in the guest (NPU_STRESS_SEED={SEED})\n"
    )
    if g.alive:
        run.bad_dmesg = gm.bad_dmesg_lines(g.new_dmesg(mark))
        # Later tests expect the driver loaded, whatever the suite did.
        if not g.module_loaded():
            g.load_module()
    if not run.error:
        if not JUNIT_HOST.is_file():
            run.error = f"the guest's pytest (rc {run.rc}) wrote no {JUNIT_HOST}"
        else:
            run.cases = _parse_junit(JUNIT_HOST)
            figs = {"scale": SCALE, "guest_seconds": round(run.seconds, 1)}
            figs.update(_figures(JUNIT_HOST))
            FIGURES.write_text(json.dumps(figs, indent=1) + "\n")
    return run


def test_stress_suite_ran(stress_suite):
    assert STRESS_FILES, f"no test_*.py in {STRESS_TESTS}"
    assert not stress_suite.error, stress_suite.error + "\n" + _tail(stress_suite.output)
    assert stress_suite.rc in (0, 1), (
        f"in-guest pytest exited {stress_suite.rc}:\n{_tail(stress_suite.output)}"
    )
    assert not stress_suite.bad_dmesg, "kernel log errors during the stress suite:\n" + "\n".join(
        stress_suite.bad_dmesg
    )


@pytest.mark.parametrize("fname", STRESS_FILES)
def test_stress_file(stress_suite, fname):
    assert not stress_suite.error, (
        f"stress suite did not produce results: {stress_suite.error}\n" + _tail(stress_suite.output)
    )
    stem = fname[:-3]
    cases = [c for cls, c in stress_suite.cases if stem in cls.split(".")]
    bad = [c for c in cases if c.outcome in ("failed", "error")]
    assert not bad, (
        f"{len(bad)} of {len(cases)} cases in tests/stress/{fname} failed "
        f"(NPU_STRESS_SEED={SEED} replays them):\n\n"
        + "\n\n".join(f"{c.name} [{c.outcome}]\n{c.message}" for c in bad)
        + "\n\n"
        + _tail(stress_suite.output, 40)
    )
    assert any(c.outcome != "skipped" for c in cases), f"tests/stress/{fname}: nothing ran"
