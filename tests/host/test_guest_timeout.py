"""The in-guest suites' per-test timeout (tests/guest/guest_timeout.py),
tried on the host in a pytest of its own: a hung test fails where it hangs,
and a test no signal reaches ends the process at twice the timeout."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

HANGS = """
import time

def test_hangs():
    time.sleep(60)

def test_after_the_hang():
    pass
"""

BLOCKS_THE_SIGNAL = """
import signal, time

def test_blocks_sigalrm():
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGALRM})
    time.sleep(60)
"""


def run_pytest(
    tmp_path: Path, source: str, timeout_s: str
) -> tuple[subprocess.CompletedProcess[str], float]:
    (tmp_path / "test_sample.py").write_text(source)
    env = dict(
        os.environ,
        NPU_TEST_TIMEOUT=timeout_s,
        PYTHONPATH=os.pathsep.join(
            [str(ROOT / "tests" / "guest"), os.environ.get("PYTHONPATH", "")]
        ),
    )
    t0 = time.monotonic()
    r = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "guest_timeout", "-p", "no:cacheprovider",
         "--rootdir", str(tmp_path), str(tmp_path / "test_sample.py")],
        capture_output=True, text=True, timeout=120, env=env, cwd=tmp_path,
    )  # fmt: skip
    return r, time.monotonic() - t0


def test_a_hung_test_fails_at_the_timeout_and_the_next_one_runs(tmp_path: Path) -> None:
    r, seconds = run_pytest(tmp_path, HANGS, "2")
    assert r.returncode == 1, r.stdout + r.stderr
    assert "the test timed out after 2 s" in r.stdout
    assert "1 failed, 1 passed" in r.stdout
    assert seconds < 40, f"took {seconds:.0f} s"


def test_a_test_no_signal_reaches_ends_the_process_at_twice_the_timeout(tmp_path: Path) -> None:
    r, seconds = run_pytest(tmp_path, BLOCKS_THE_SIGNAL, "2")
    assert r.returncode != 0
    assert "Timeout" in r.stderr  # faulthandler's dump of every thread
    assert seconds < 40, f"took {seconds:.0f} s"


def test_no_timeout_when_it_is_zero(tmp_path: Path) -> None:
    r, _ = run_pytest(tmp_path, "def test_quick():\n    pass\n", "0")
    assert r.returncode == 0 and "1 passed" in r.stdout
