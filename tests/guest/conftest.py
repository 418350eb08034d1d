"""In-guest pytest fixtures (runs inside the QEMU guest, python3.11).

Run from the project root in the guest (/mnt/npu)::

    python3 -m pytest -q -p no:cacheprovider --confcutdir=tests/guest tests/guest

- every test: the kernel log (/dev/kmsg) is read before and after; new
  records matching kmsg.BAD_KMSG_RE fail the test (error in its teardown);
- every test file, on a kernel with kmemleak (the debug kernel): a scan
  after the file; an object leaked from npu.ko fails it;
- session: the driver is loaded (insmod) if it is not, and /dev/npu0 awaited;
- fixtures: `dev` (an open npu.Device), `dev_path` ("/dev/npu0"),
  `fd` (a raw O_RDWR file descriptor on /dev/npu0).
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import time

import kmsg  # tests/guest/kmsg.py: the kernel-log gate
import pytest

DEV_PATH = "/dev/npu0"
# npu.ko as built for the running kernel (scripts/build-module.sh).
MODULE = f"/mnt/npu/build/module/{os.uname().release}/npu.ko"
RUNTIME = "/mnt/npu/runtime_py"

if RUNTIME not in sys.path and os.path.isdir(RUNTIME):
    sys.path.insert(0, RUNTIME)


@pytest.fixture(autouse=True)
def _kmsg_gate():
    with kmsg.checked():
        yield


@pytest.fixture(scope="session", autouse=True)
def _kmemleak_baseline():
    """Forget what kmemleak found before the suite (boot-time objects)."""
    if kmsg.kmemleak_available():
        kmsg.kmemleak_scan()


@pytest.fixture(scope="module", autouse=True)
def _kmemleak_gate(_kmemleak_baseline):
    """On a kernel with kmemleak: scan after each test file; an unreferenced
    object allocated from npu.ko fails the file (its last test errors)."""
    yield
    if kmsg.kmemleak_available():
        leaks = kmsg.kmemleak_scan()
        if leaks:
            pytest.fail(
                f"kmemleak: {len(leaks)} object(s) from npu.ko leaked:\n" + "\n".join(leaks[:5]),
                pytrace=False,
            )


@pytest.fixture(scope="session", autouse=True)
def _npu_module():
    """Make sure the driver is loaded and /dev/npu0 exists."""
    if not os.path.isdir("/sys/module/npu"):
        r = subprocess.run(["insmod", MODULE], capture_output=True, text=True)
        if r.returncode != 0:
            pytest.exit(f"insmod {MODULE} failed: {r.stderr.strip()}", returncode=3)
    subprocess.run(["udevadm", "settle", "-t", "30"], check=False)
    for _ in range(100):
        if os.path.exists(DEV_PATH):
            break
        time.sleep(0.1)
    else:
        pytest.exit(f"{DEV_PATH} did not appear after loading the driver", returncode=3)


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
