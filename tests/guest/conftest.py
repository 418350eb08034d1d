"""In-guest pytest fixtures (runs inside the QEMU guest, python3.11).

Run from the project root in the guest (/mnt/npu)::

    python3 -m pytest -q -p no:cacheprovider --confcutdir=tests/guest tests/guest

- every test: the kernel log (/dev/kmsg) is read before and after; new
  records matching kmsg.BAD_KMSG_RE fail the test (error in its teardown);
- on a kernel with kmemleak (the debug kernel): a scan after the last
  test (each costs about 15 s there); an object leaked from npu.ko fails
  it. NPU_KMEMLEAK_EACH_FILE=1 scans after every file instead, to find
  the file that leaks;
- every test: a timeout (NPU_TEST_TIMEOUT seconds, default 600; 0 for
  none): SIGALRM fails the test where it hangs, with every thread's stack;
  a test still alive at twice that (stuck where no signal reaches Python)
  ends the process, so one hang never costs the host's whole-suite timeout;
- session: the driver is loaded (insmod) if it is not, and /dev/npu0 awaited;
- fixtures: `dev` (an open npu.Device), `dev_path` ("/dev/npu0"),
  `fd` (a raw O_RDWR file descriptor on /dev/npu0).
"""

from __future__ import annotations

import contextlib
import os
import sys

import guest_timeout
import guest_util
import kmsg  # tests/guest/kmsg.py: the kernel-log gate
import pytest
from guest_timeout import pytest_runtest_protocol  # noqa: F401 (the per-test timeout hook)

DEV_PATH = guest_util.DEV_PATH
RUNTIME = "/mnt/npu/runtime_py"

if RUNTIME not in sys.path and os.path.isdir(RUNTIME):
    sys.path.insert(0, RUNTIME)


def pytest_configure(config):
    guest_timeout.pytest_configure(config)
    config.addinivalue_line(
        "markers",
        "known_kernel_report(lines, reason, when=None): a strict xfail for a kernel report "
        "the test is known to cause (lines: regexes of its lines; when: a path that exists "
        "only on kernels that report it)",
    )


@pytest.fixture(autouse=True)
def _kmsg_gate(request):
    """The kernel-log gate; a known_kernel_report marker turns its report
    into a strict xfail: xfail if it appears, a failure if it does not."""
    m = request.node.get_closest_marker("known_kernel_report")
    when = m.kwargs.get("when") if m else None
    known = m.args[0] if m and (when is None or os.path.exists(when)) else None
    with kmsg.checked(known=known) as seen:
        yield
    if known is not None:
        if not seen:
            pytest.fail(
                f"the known kernel report ({m.kwargs['reason']}) no longer appears: "
                "the bug is fixed, remove the known_kernel_report marker",
                pytrace=False,
            )
        pytest.xfail(f"{m.kwargs['reason']}: {seen[0]}")


@pytest.fixture(scope="session", autouse=True)
def _dma_api_all_errors():
    """With DMA-API debugging (the debug kernel), print every error, not only
    the first of the boot, so that each test's gate sees its own."""
    path = "/sys/kernel/debug/dma-api/all_errors"
    if os.path.exists(path):
        with open(path, "w") as f:
            f.write("1")


KMEMLEAK_EACH_FILE = os.environ.get("NPU_KMEMLEAK_EACH_FILE", "") == "1"


@pytest.fixture(scope="session", autouse=True)
def _kmemleak_baseline():
    """Forget what kmemleak found before the suite (boot-time objects); on
    a kernel with kmemleak, an unreferenced object allocated from npu.ko
    at the end fails the suite (its last test errors). A leak stays
    unreferenced, so one scan at the end sees every leak of the suite."""
    if kmsg.kmemleak_available():
        kmsg.kmemleak_scan()
    yield
    kmsg.fail_on_kmemleak()


@pytest.fixture(scope="module", autouse=True)
def _kmemleak_gate(_kmemleak_baseline):
    """With NPU_KMEMLEAK_EACH_FILE=1: the scan after each test file too, so
    that a leak fails the file that made it."""
    yield
    if KMEMLEAK_EACH_FILE:
        kmsg.fail_on_kmemleak()


@pytest.fixture(scope="session", autouse=True)
def _npu_module():
    """Make sure the driver is loaded and /dev/npu0 exists."""
    problem = guest_util.load_driver()
    if problem:
        pytest.exit(problem, returncode=3)


@pytest.fixture
def dev_path() -> str:
    return DEV_PATH


@pytest.fixture
def dev():
    """An opened npu.Device (index 0), closed after the test."""
    import npu

    d = npu.open_device(0)
    try:
        yield d
    finally:
        d.close()


@pytest.fixture
def fd():
    """A raw file descriptor on /dev/npu0 (O_RDWR), closed after the test."""
    f = os.open(DEV_PATH, os.O_RDWR | os.O_CLOEXEC)
    try:
        yield f
    finally:
        with contextlib.suppress(OSError):
            os.close(f)
