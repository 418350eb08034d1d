"""Run the in-guest pytest suite (tests/guest/) once, report it per file.

test_guest_suite_ran checks the run itself (pytest ran, wrote its junit XML,
no kernel splat meanwhile); test_guest_file[<file>] passes only if that file
executed at least one test case and none failed or errored (skips are fine).
"""

from __future__ import annotations

import os
import sys
import time
import xml.etree.ElementTree as ET
from dataclasses import dataclass, field
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
GUEST_TESTS = ROOT / "tests" / "guest"
GUEST_FILES = sorted(p.name for p in GUEST_TESTS.glob("test_*.py"))
JUNIT_HOST = ROOT / "build" / "guest-junit.xml"
JUNIT_GUEST = "/mnt/npu/build/guest-junit.xml"
SUITE_TIMEOUT = float(os.environ.get("NPU_GUEST_SUITE_TIMEOUT", "") or 3600)
# The soak loops' size (tests/guest/guest_util.py: soak_cycles): short in
# make test, full in make stress.
SCALE = os.environ.get("NPU_STRESS_SCALE", "").strip() or "short"
# Passed through to the guest: the per-test timeout (tests/guest/conftest.py).
PASS_ENV = ("NPU_TEST_TIMEOUT",)


def suite_cmd(junit_guest: str, files: list[str] | None = None) -> str:
    """The in-guest pytest command over tests/guest (or the given files of
    it) writing its junit XML to junit_guest."""
    env = " ".join(f"{k}={float(os.environ[k])}" for k in PASS_ENV if os.environ.get(k, ""))
    paths = " ".join(f"tests/guest/{f}" for f in files) if files else "tests/guest"
    return (
        f"NPU_STRESS_SCALE={SCALE} {env} python3 -m pytest -q -p no:cacheprovider "
        f"--confcutdir=tests/guest {paths} --junitxml={junit_guest}"
    )


pytestmark = pytest.mark.guest


@dataclass
class Case:
    name: str
    outcome: str  # passed, failed, error, skipped
    message: str = ""


@dataclass
class SuiteRun:
    rc: int | None = None
    output: str = ""
    error: str = ""  # why there are no usable results
    seconds: float = 0.0
    cases: list = field(default_factory=list)  # (classname, Case)
    bad_dmesg: list = field(default_factory=list)


def _parse_junit(path: Path) -> list:
    cases = []
    for tc in ET.parse(path).getroot().iter("testcase"):
        cls = tc.get("classname", "")
        name = tc.get("name", "")
        outcome, msg = "passed", ""
        for tag in ("failure", "error", "skipped"):
            el = tc.find(tag)
            if el is not None:
                outcome = {"failure": "failed"}.get(tag, tag)
                msg = (el.get("message") or "") + "\n" + (el.text or "")
                break
        cases.append((cls, Case(f"{cls}::{name}" if cls else name, outcome, msg.strip())))
    return cases


def _case_file(classname: str, name: str) -> str | None:
    """The test_*.py file a junit testcase belongs to."""
    parts = classname.split(".") if classname else name.split(".")
    for f in GUEST_FILES:
        if f[:-3] in parts:
            return f
    return None


def run_suite(
    g, gm, junit_host: Path, junit_guest: str, cmd: str | None = None
) -> tuple[SuiteRun, list]:
    """Run tests/guest (or `cmd`, a pytest command line with a ``{junit}``
    field, or suite_cmd() of some files) in the booted guest g; (the run,
    its new kernel log lines)."""
    run = SuiteRun()
    junit_host.parent.mkdir(parents=True, exist_ok=True)
    junit_host.unlink(missing_ok=True)  # never read a stale result
    mark = g.dmesg_mark()
    t0 = time.monotonic()
    try:
        run.rc, run.output = g.run(
            f"{cmd.format(junit=junit_guest) if cmd else suite_cmd(junit_guest)}; "
            "rc=$?; sync; exit $rc",
            timeout=SUITE_TIMEOUT,
        )
    except gm.GuestError as e:
        run.error = f"{e}\n{getattr(e, 'output', '')[-4000:]}"
    run.seconds = time.monotonic() - t0
    dmesg = g.new_dmesg(mark) if g.alive else []
    run.bad_dmesg = gm.bad_dmesg_lines(dmesg)
    if not run.error:
        if not junit_host.is_file():
            run.error = f"the guest's pytest (rc {run.rc}) wrote no {junit_host}"
        else:
            try:
                run.cases = _parse_junit(junit_host)
            except ET.ParseError as e:
                run.error = f"bad junit XML {junit_host}: {e}"
    return run, dmesg


@pytest.fixture(scope="session")
def guest_suite(guest_holder) -> SuiteRun:
    g = guest_holder.get()  # imports scripts/guest.py as npu_guest (tests/conftest.py)
    return run_suite(g, sys.modules["npu_guest"], JUNIT_HOST, JUNIT_GUEST)[0]


def _tail(text: str, n: int = 60) -> str:
    return "\n".join(text.splitlines()[-n:])


def test_guest_suite_ran(guest_suite):
    assert GUEST_FILES, f"no test_*.py in {GUEST_TESTS}"
    assert not guest_suite.error, guest_suite.error + "\n" + _tail(guest_suite.output)
    # pytest: 0 all passed, 1 some failed (reported per file); others mean
    # it could not run properly (interrupted, internal error, usage, no tests).
    assert guest_suite.rc in (0, 1), (
        f"in-guest pytest exited {guest_suite.rc}:\n{_tail(guest_suite.output)}"
    )
    assert not guest_suite.bad_dmesg, "kernel log errors during the in-guest suite:\n" + "\n".join(
        guest_suite.bad_dmesg
    )
    stray = [
        c
        for cls, c in guest_suite.cases
        if _case_file(cls, c.name) is None and c.outcome in ("failed", "error")
    ]
    assert not stray, "failures outside tests/guest/test_*.py:\n" + "\n\n".join(
        f"{c.name} [{c.outcome}]\n{c.message}" for c in stray
    )


@pytest.mark.parametrize("fname", GUEST_FILES)
def test_guest_file(guest_suite, fname):
    assert not guest_suite.error, (
        f"in-guest suite did not produce results: {guest_suite.error}\n" + _tail(guest_suite.output)
    )
    cases = [c for cls, c in guest_suite.cases if _case_file(cls, c.name) == fname]
    bad = [c for c in cases if c.outcome in ("failed", "error")]
    ran = [c for c in cases if c.outcome != "skipped"]
    assert not bad, (
        f"{len(bad)} of {len(cases)} cases in tests/guest/{fname} failed:\n\n"
        + "\n\n".join(f"{c.name} [{c.outcome}]\n{c.message}" for c in bad)
    )
    assert ran, (
        f"tests/guest/{fname}: no test case was executed "
        f"({len(cases)} collected, all skipped or none at all)"
    )
