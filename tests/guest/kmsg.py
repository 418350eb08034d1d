"""The kernel-log gate of the in-guest suites (tests/guest, tests/stress).

``checked()`` wraps one test: it reads /dev/kmsg from the end before the
test and the records added after it, and fails the test (pytest.fail) if
one matches BAD_KMSG_RE: an oops, BUG, WARNING, KASAN report, lock or
sleep-in-atomic complaint, refcount or list corruption.
"""

from __future__ import annotations

import contextlib
import errno
import os
import re
from collections.abc import Iterator

import pytest

BAD_KMSG_RE = re.compile(
    r"Oops|BUG:|WARNING:|general protection|circular locking|"
    r"sleeping function called|KASAN|kernel BUG|refcount_t:|list_(add|del) corruption|"
    r"Unable to handle|page allocation failure"
)


def kmsg_open() -> int:
    """/dev/kmsg opened at its end (non-blocking)."""
    fd = os.open("/dev/kmsg", os.O_RDONLY | os.O_NONBLOCK)
    os.lseek(fd, 0, os.SEEK_END)
    return fd


def kmsg_read(fd: int) -> list[str]:
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


@contextlib.contextmanager
def checked() -> Iterator[None]:
    """Fail the enclosed test if the kernel logged an error meanwhile."""
    fd = kmsg_open()
    try:
        yield
        new = kmsg_read(fd)
    finally:
        os.close(fd)
    if any(BAD_KMSG_RE.search(m) for m in new):
        pytest.fail(
            "kernel log has errors after this test:\n" + "\n".join(new[-80:]), pytrace=False
        )
