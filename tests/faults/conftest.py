"""In-guest fault-injection suite: runs inside the guest on the debug kernel.

Run from the project root in the guest (/mnt/npu)::

    python3 -m pytest -q -p no:cacheprovider --confcutdir=tests/faults tests/faults

Host side: ``tests/test_guest_debug.py`` runs it after the debug-kernel pass,
in the same guest. Needs ``CONFIG_FAULT_INJECTION_DEBUG_FS`` with failslab
and fail_page_alloc (guest/kernel/debug.config); skipped elsewhere.

- every test: the kernel-log gate of tests/guest (kmsg.py), except that the
  allocation-failure warnings the injection itself causes are expected;
- session: the driver is loaded if it is not; kmemleak is scanned at the
  end (an object leaked from npu.ko fails the session's last test).
"""

from __future__ import annotations

import os
import sys

import pytest

IN_GUEST = os.environ.get("NPU_IN_GUEST") == "1"
if not IN_GUEST:
    # tests/conftest.py only ignores tests/guest; these files need the guest too.
    collect_ignore_glob = ["*.py"]

RUNTIME = "/mnt/npu/runtime_py"
if RUNTIME not in sys.path and os.path.isdir(RUNTIME):
    sys.path.insert(0, RUNTIME)
_GUEST_TESTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "guest")
if _GUEST_TESTS not in sys.path:
    sys.path.insert(0, _GUEST_TESTS)
import guest_util  # noqa: E402
import kmsg  # noqa: E402


@pytest.fixture(scope="session", autouse=True)
def _npu_module():
    problem = guest_util.load_driver()
    if problem:
        pytest.exit(problem, returncode=3)


@pytest.fixture(scope="session", autouse=True)
def _kmemleak_gate():
    if kmsg.kmemleak_available():
        kmsg.kmemleak_scan()
    yield
    kmsg.fail_on_kmemleak()


@pytest.fixture(autouse=True)
def _kmsg_gate():
    with kmsg.checked(expected_failures=True):
        yield
