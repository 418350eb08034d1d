"""Every case of a guest run becomes a report of the host's run
(tests/guest_cases.py): named by file, pass and test, with its outcome."""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests"))
import guest_cases  # noqa: E402

JUNIT = """<?xml version="1.0" encoding="utf-8"?><testsuites><testsuite name="pytest">
<testcase classname="tests.guest.test_poll" name="test_a" time="0.5" />
<testcase classname="tests.guest.test_poll.TestX" name="test_b[1-2]" time="0.25">
<failure message="assert 1 == 2">trace</failure></testcase>
<testcase classname="tests.guest.test_poll" name="test_c" time="0.1">
<error message="fixture failed">boom</error></testcase>
<testcase classname="tests.stress.test_fuzz" name="test_d" time="0.1">
<skipped type="pytest.skip" message="no device">skip</skipped></testcase>
</testsuite></testsuites>
"""


def _cases(tmp_path: Path) -> list[guest_cases.GuestCase]:
    path = tmp_path / "guest-junit-debug.xml"
    path.write_text(JUNIT)
    return guest_cases.read_cases(path, "debug")


def test_each_case_is_named_by_its_file_pass_and_test(tmp_path: Path) -> None:
    assert [c.nodeid for c in _cases(tmp_path)] == [
        "tests/guest/test_poll.py@debug::test_a",
        "tests/guest/test_poll.py@debug::TestX::test_b[1-2]",
        "tests/guest/test_poll.py@debug::test_c",
        "tests/stress/test_fuzz.py@debug::test_d",
    ]


def test_failures_and_errors_fail_and_skips_skip(tmp_path: Path) -> None:
    assert [c.outcome for c in _cases(tmp_path)] == ["passed", "failed", "failed", "skipped"]


def test_a_failed_case_reports_its_message(tmp_path: Path) -> None:
    rep = guest_cases.to_report(_cases(tmp_path)[1])
    assert rep.failed and rep.when == "call" and "assert 1 == 2" in str(rep.longrepr)
    assert rep.duration == 0.25


def test_a_skipped_case_reports_its_reason(tmp_path: Path) -> None:
    rep = guest_cases.to_report(_cases(tmp_path)[3])
    assert rep.skipped and rep.longrepr[2].startswith("no device")  # type: ignore[index]


def test_only_this_sessions_junit_files_are_read(tmp_path: Path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setattr(guest_cases, "BUILD", tmp_path)
    (tmp_path / "guest-junit.xml").write_text(JUNIT)
    (tmp_path / "stress-junit.xml").write_text(JUNIT)
    t = (tmp_path / "stress-junit.xml").stat().st_mtime
    import os

    os.utime(tmp_path / "stress-junit.xml", (t - 100, t - 100))
    assert guest_cases.written_since(t - 1) == [(tmp_path / "guest-junit.xml", "distro")]
