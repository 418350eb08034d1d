"""Each test that ran inside a guest, reported as a test of the host's run.

The guest suites (tests/guest on the distribution kernel and again on the
debug kernel, the fault-injection suite, the ioctl fuzzer, tests/stress)
run as one pytest process in a guest and write a junit XML under build/.
The host's tests that start them check the run as a whole and per file;
this module makes every guest case its own line of the host's report too,
so that the summary counts them and a failed or skipped case is named with
its pass (``tests/guest/test_poll.py@debug::test_poll_wakes``).

The reports are made in the controlling pytest process at the end of the
session (tests/conftest.py), from the XML files this session wrote: pytest-
xdist lets a worker report only the item it is running.
"""

from __future__ import annotations

import json
import os
import xml.etree.ElementTree as ET
from dataclasses import dataclass
from pathlib import Path

from pytest import TestReport

ROOT = Path(__file__).resolve().parent.parent
BUILD = ROOT / "build"

# junit XML -> the pass it reports (the suffix of each case's node id).
PASSES = {
    "guest-junit.xml": "distro",
    "guest-junit-debug.xml": "debug",
    "guest-junit-faults.xml": "faults",
    "guest-junit-fuzz-debug.xml": "fuzz-debug",
    "stress-junit.xml": "stress",
}


@dataclass
class GuestCase:
    """One testcase of a guest run's junit XML."""

    nodeid: str  # tests/guest/test_x.py@distro::TestY::test_z[p]
    path: str  # tests/guest/test_x.py
    label: str  # the pass: distro, debug...
    outcome: str  # passed, failed, skipped
    message: str
    seconds: float


def _path_and_rest(classname: str, name: str) -> tuple[str, str]:
    """A junit classname ("tests.guest.test_x.TestY") and name as pytest's
    file path and the rest of the node id."""
    parts = classname.split(".") if classname else []
    for i, part in enumerate(parts):
        if part.startswith("test_"):
            return "/".join(parts[: i + 1]) + ".py", "::".join([*parts[i + 1 :], name])
    return classname.replace(".", "/") or "guest", name


def read_cases(junit: Path, label: str) -> list[GuestCase]:
    """The cases of one junit XML, labelled with their pass."""
    out = []
    for tc in ET.parse(junit).getroot().iter("testcase"):
        path, rest = _path_and_rest(tc.get("classname", ""), tc.get("name", ""))
        outcome, message = "passed", ""
        for tag in ("failure", "error", "skipped"):
            el = tc.find(tag)
            if el is not None:
                outcome = "skipped" if tag == "skipped" else "failed"
                message = ((el.get("message") or "") + "\n" + (el.text or "")).strip()
                break
        out.append(
            GuestCase(
                f"{path}@{label}::{rest}", path, label, outcome, message, float(tc.get("time") or 0)
            )
        )
    return out


def to_report(case: GuestCase) -> TestReport:
    """A pytest report of the call phase of one guest case."""
    longrepr: str | tuple[str, int, str] | None = None
    if case.outcome == "failed":
        longrepr = case.message or "failed in the guest (no message)"
    elif case.outcome == "skipped":
        longrepr = (case.path, 0, case.message or "Skipped")
    return TestReport(
        nodeid=case.nodeid,
        location=(case.path, None, f"{case.nodeid.split('::', 1)[-1]} ({case.label})"),
        keywords={},
        outcome=case.outcome,  # type: ignore[arg-type]
        longrepr=longrepr,
        when="call",
        duration=case.seconds,
    )


def written_since(t0: float) -> list[tuple[Path, str]]:
    """The junit XML files of guest runs written at or after t0 (this
    session's), with their pass labels."""
    out = []
    for name, label in PASSES.items():
        path = BUILD / name
        if path.is_file() and path.stat().st_mtime >= t0:
            out.append((path, label))
    return out


def write_times(seconds: float, host_tests: int, guest_cases: int, exitstatus: int) -> None:
    """build/test-times.json: make test's pytest wall time and counts
    (written only under make test, NPU_MAKE_TEST=1; scripts/ci_times.py
    reads it)."""
    if os.environ.get("NPU_MAKE_TEST", "") != "1":
        return
    BUILD.mkdir(parents=True, exist_ok=True)
    doc = {
        "seconds": round(seconds, 1),
        "host_tests": host_tests,
        "guest_cases": guest_cases,
        "exitstatus": int(exitstatus),
    }
    (BUILD / "test-times.json").write_text(json.dumps(doc, indent=1) + "\n")
