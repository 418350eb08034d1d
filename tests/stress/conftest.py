"""In-guest reliability suite (issue 7): runs inside the QEMU guest, as root.

Run from the project root in the guest (/mnt/npu)::

    NPU_STRESS_SCALE=short python3 -m pytest -q -p no:cacheprovider \\
        --confcutdir=tests/stress tests/stress

Host side: ``tests/test_stress_suite.py`` (``make test``: short sizes) and
``make stress`` (the issue's full sizes).

- every test: the kernel log (/dev/kmsg) is read before and after; a new
  record matching BAD_KMSG_RE (Oops, BUG, WARNING, KASAN, ...) fails it;
- session: the driver is loaded (insmod) if it is not, and /dev/npu0
  awaited; at the end it is loaded again if a test left it unloaded;
- sizes: ``stress_util.size()`` (NPU_STRESS_SCALE=full|short, per-size
  overrides); figures go to the junit XML via ``record_property``.

On the host (outside the guest) nothing here is collected.
"""

from __future__ import annotations

import errno
import os
import re
import sys

import pytest

IN_GUEST = os.environ.get("NPU_IN_GUEST") == "1"
if not IN_GUEST:
    # tests/conftest.py only ignores tests/guest; these files need the guest too.
    collect_ignore_glob = ["*.py"]

RUNTIME = "/mnt/npu/runtime_py"
if RUNTIME not in sys.path and os.path.isdir(RUNTIME):
    sys.path.insert(0, RUNTIME)

BAD_KMSG_RE = re.compile(
    r"Oops|BUG:|WARNING:|general protection|circular locking|"
    r"sleeping function called|KASAN|kernel BUG|refcount_t:|list_(add|del) corruption|"
    r"Unable to handle|page allocation failure"
)


def _kmsg_open() -> int:
    fd = os.open("/dev/kmsg", os.O_RDONLY | os.O_NONBLOCK)
    os.lseek(fd, 0, os.SEEK_END)
    return fd


def _kmsg_read(fd: int) -> list[str]:
    """New kernel log records since the last read (message text only)."""
    out = []
    while True:
        try:
            rec = os.read(fd, 8192)
        except BlockingIOError:
            break
        except OSError as e:
            if e.errno == errno.EPIPE:  # overwritten before we read it: skip on
                continue
            if e.errno == errno.EAGAIN:
                break
            raise
        if not rec:
            break
        _, _, msg = rec.decode("utf-8", "replace").partition(";")
        out.append(msg.rstrip("\n"))
    return out


@pytest.fixture(autouse=True)
def _kmsg_gate():
    fd = _kmsg_open()
    try:
        yield
        new = _kmsg_read(fd)
    finally:
        os.close(fd)
    bad = [m for m in new if BAD_KMSG_RE.search(m)]
    if bad:
        pytest.fail(
            "kernel log has errors after this test:\n" + "\n".join(new[-80:]), pytrace=False
        )


@pytest.fixture(scope="session", autouse=True)
def _npu_module():
    """The driver is loaded during the session, and again after it."""
    from . import stress_util as su

    try:
        su.ensure_loaded()
    except RuntimeError as e:
        pytest.exit(str(e), returncode=3)
    yield
    su.ensure_loaded()
