"""Host-side pytest harness: the QEMU guest fixture and its dmesg gate.

Tests that take the `guest` fixture share one guest per session (booted on
first use, driver loaded). After each such test the guest's kernel log is
checked: new lines matching BAD_DMESG_RE fail the test (as an error in its
teardown). Tests in tests/guest/ run inside the guest, never on the host.

This file must stay importable without pexpect (pytest may meet it from
inside the guest); the guest machinery is imported lazily.
"""

from __future__ import annotations

import importlib.util
import os
import sys
import time
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
IN_GUEST = os.environ.get("NPU_IN_GUEST") == "1"

# tests/guest/ holds the in-guest suite: collected only inside the guest.
collect_ignore = [] if IN_GUEST else ["guest"]


def pytest_configure(config):
    config.addinivalue_line(
        "markers", "guest: boots the QEMU guest (once per session) and runs there"
    )


# Under pytest-xdist (make test: -n 2 --dist loadfile) each file runs in one
# worker, the guest files first: the debug-kernel pass (the longest) on one
# worker while the other runs the distribution kernel's guest files (one
# guest per worker, see _GuestHolder) and the host tests fill in after.
FILE_ORDER = {
    "test_guest_debug.py": 0,
    "test_guest_suite.py": 1,
    "test_stress_suite.py": 1,
    "test_guest_basics.py": 1,
}


def pytest_collection_modifyitems(config, items):
    for item in items:
        if "guest" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.guest)
    # Stable: host tests keep their order, after the guest files.
    items.sort(key=lambda it: FILE_ORDER.get(it.path.name, 2))


_SESSION_T0 = pytest.StashKey[float]()


def pytest_sessionstart(session):
    session.config.stash[_SESSION_T0] = time.time()


@pytest.hookimpl(tryfirst=True)
def pytest_sessionfinish(session, exitstatus):
    """Every case of the guest runs of this session becomes a report of its
    own (tests/guest_cases.py), in the controlling process only."""
    if IN_GUEST or hasattr(session.config, "workerinput"):
        return
    import guest_cases

    t0 = session.config.stash[_SESSION_T0]
    failed = False
    cases = 0
    for path, label in guest_cases.written_since(t0):
        try:
            read = guest_cases.read_cases(path, label)
        except ET.ParseError:
            continue  # the test that ran the suite reports the bad XML
        for case in read:
            session.config.hook.pytest_runtest_logreport(report=guest_cases.to_report(case))
            failed |= case.outcome == "failed"
            cases += 1
    if failed and session.exitstatus == pytest.ExitCode.OK:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
    guest_cases.write_times(time.time() - t0, session.testscollected, cases, session.exitstatus)


def _guest_module():
    """scripts/guest.py, imported by path as `npu_guest` (tests/guest/ would
    shadow a plain `import guest`)."""
    mod = sys.modules.get("npu_guest")
    if mod is None:
        spec = importlib.util.spec_from_file_location("npu_guest", ROOT / "scripts" / "guest.py")
        mod = importlib.util.module_from_spec(spec)
        sys.modules["npu_guest"] = mod
        spec.loader.exec_module(mod)
    return mod


SLAB_TRACKING = "slub_debug=U,kmalloc-*"


class _GuestHolder:
    """The session's guest; reboots it if an earlier test left it dead."""

    def __init__(self):
        self.g = None
        self.boots = 0

    def get(self):
        gm = _guest_module()
        if self.g is not None and self.g.alive:
            return self.g
        if self.g is not None:
            self.g.close()
            self.g = None
        try:
            gm.check_prerequisites(need_module=True)
        except gm.GuestSetupError as e:
            pytest.fail(str(e), pytrace=False)
        # SLUB records the call site of every live kmalloc object: the
        # module-cycles leak test (tests/stress/) counts objects per call
        # site exactly (about 5% slower allocations).
        g = gm.Guest(extra_cmdline=SLAB_TRACKING)
        try:
            g.start()
            g.load_module()
        except BaseException:
            g.close()
            raise
        self.boots += 1
        sys.stderr.write(f"\n[guest] booted in {g.boot_s:.1f} s (boot #{self.boots})\n")
        self.g = g
        return g

    def close(self):
        if self.g is not None:
            self.g.close()
            self.g = None


@pytest.fixture(scope="session")
def guest_module():
    """scripts/guest.py (the Guest class and its helpers), for tests that boot their own guest."""
    return _guest_module()


@pytest.fixture(scope="session")
def guest_holder():
    h = _GuestHolder()
    yield h
    h.close()


@pytest.fixture(scope="session")
def guest_session(guest_holder):
    """The booted guest with the driver loaded, without the dmesg gate."""
    return guest_holder.get()


@pytest.fixture
def guest(guest_holder):
    """The session's guest (driver loaded); fails the test on a kernel splat."""
    gm = _guest_module()
    g = guest_holder.get()
    mark = g.dmesg_mark()
    yield g
    if not g.alive:
        pytest.fail(f"guest died during the test: {g.dead_reason}", pytrace=False)
    new = g.new_dmesg(mark)
    bad = gm.bad_dmesg_lines(new)
    if bad:
        pytest.fail(
            "kernel log has errors after this test:\n" + "\n".join(new[-80:]), pytrace=False
        )
