"""The per-test timeout of the in-guest suites (a pytest hook that
tests/guest/conftest.py takes in).

NPU_TEST_TIMEOUT seconds (default 600; 0 for none) over a test's setup,
call and teardown together: SIGALRM fails the test where it hangs, with
every thread's stack on stderr; a test still alive at twice that (stuck
where no signal reaches Python, such as an uninterruptible sleep in the
kernel) ends the process through faulthandler, so one hang never costs the
host's whole-suite timeout. Standard library and pytest only.
"""

from __future__ import annotations

import faulthandler
import os
import signal
import sys
from collections.abc import Iterator
from typing import TextIO

import pytest

TEST_TIMEOUT = float(os.environ.get("NPU_TEST_TIMEOUT", "") or 600)
# Where the hard timeout's dump goes: pytest captures fd 2 around each test
# (and while conftest files load), so pytest_configure keeps a copy of the
# real stderr, as pytest's own faulthandler plugin does.
_stderr: TextIO = sys.stderr


def pytest_configure(config: pytest.Config) -> None:
    """Keep the real stderr (tests/guest/conftest.py calls this too)."""
    global _stderr
    _stderr = open(os.dup(2), "w")  # noqa: SIM115 (for the process's life)


def _timed_out(signum: int, frame: object) -> None:
    faulthandler.dump_traceback(all_threads=True)
    pytest.fail(f"the test timed out after {TEST_TIMEOUT:.0f} s (NPU_TEST_TIMEOUT)")


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
    """The per-test timeout, over setup, call and teardown together."""
    if TEST_TIMEOUT <= 0:
        return (yield)
    old = signal.signal(signal.SIGALRM, _timed_out)
    signal.setitimer(signal.ITIMER_REAL, TEST_TIMEOUT)
    faulthandler.dump_traceback_later(2 * TEST_TIMEOUT, exit=True, file=_stderr)
    try:
        return (yield)
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        faulthandler.cancel_dump_traceback_later()
        signal.signal(signal.SIGALRM, old)
