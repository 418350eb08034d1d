"""The kernel-log gate of the in-guest suites (tests/guest, tests/stress).

``checked()`` wraps one test: it reads /dev/kmsg from the end before the
test and the records added after it, and fails the test (pytest.fail) if
one matches BAD_KMSG_RE, the pattern list of tests/kernel_reports.py that
the host's gate shares (oopses, sanitizer and lockdep reports, DMA-API
warnings, hung tasks, soft lockups, RCU stalls...). The debug kernel
(NPU_KERNEL=debug) is what makes most of these fire.
"""

from __future__ import annotations

import contextlib
import errno
import importlib.util
import os
import re
from collections.abc import Iterator

import pytest

KMEMLEAK = "/sys/kernel/debug/kmemleak"
# A kmemleak backtrace frame in the driver: "    [<...>] npu_bo_create+0x9a/0x1f0 [npu]"
NPU_FRAME_RE = re.compile(r"\[npu\]")


def _load_reports():  # type: ignore[no-untyped-def]
    """tests/kernel_reports.py, the one pattern list of both gates."""
    path = os.path.join(
        os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "kernel_reports.py"
    )
    spec = importlib.util.spec_from_file_location("npu_kernel_reports", path)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


_reports = _load_reports()
BAD_KMSG_RE: re.Pattern[str] = _reports.BAD_KMSG_RE


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


# Kernel reports known to come from a defect left to a later issue, by name:
# the regexes of their lines. Tests that cause one carry
# @pytest.mark.known_kernel_report(KNOWN_REPORTS[name], ...) (a strict xfail,
# tests/guest/conftest.py); the host side of the debug pass excuses them in
# its whole-run check. docs/reliability.md quotes each.
KNOWN_REPORTS = {
    # DMA memory outlives the unbind (issue 16).
    "unbind-keeps-dma-memory": [
        r"DMA-API: .*pending DMA allocations while released from device",
        r"DMA-API: Mapped at",
        r"WARNING: .* at kernel/dma/debug\.c:\d+ dma_debug_device_change",
    ],
}

# What injected allocation failures print by design: expected in the
# fault-injection suite, an error everywhere else.
ALLOC_FAILURE_RE: re.Pattern[str] = _reports.ALLOC_FAILURE_RE


@contextlib.contextmanager
def checked(expected_failures: bool = False, known: list[str] | None = None) -> Iterator[list[str]]:
    """Fail the enclosed test if the kernel logged an error meanwhile.

    expected_failures: allocation-failure warnings (and the WARNING-free
    dumps that come with them) are not errors: the test injects them.
    known: regexes of the lines of a known report (a strict xfail, see
    tests/guest/conftest.py): such lines are not errors; the ones seen are
    appended to the yielded list.
    """
    seen: list[str] = []
    fd = kmsg_open()
    try:
        yield seen
        new = kmsg_read(fd)
    finally:
        os.close(fd)
    if expected_failures:
        new = [m for m in new if not ALLOC_FAILURE_RE.search(m)]
    if known:
        excused = [m for m in new if any(re.search(k, m) for k in known)]
        seen.extend(excused)
        new = [m for m in new if m not in excused]
    if any(BAD_KMSG_RE.search(m) for m in new):
        pytest.fail(
            "kernel log has errors after this test:\n" + "\n".join(new[-80:]), pytrace=False
        )


def kmemleak_available() -> bool:
    """Whether the kernel has kmemleak (the debug kernel has)."""
    return os.path.exists(KMEMLEAK)


def fail_on_kmemleak() -> None:
    """pytest.fail if a kmemleak scan (when the kernel has kmemleak) finds
    objects leaked from npu.ko."""
    if not kmemleak_available():
        return
    leaks = kmemleak_scan()
    if leaks:
        pytest.fail(
            f"kmemleak: {len(leaks)} object(s) from npu.ko leaked:\n" + "\n".join(leaks[:5]),
            pytrace=False,
        )


def kmemleak_scan() -> list[str]:
    """Scan for leaks now; return the reports of objects allocated from
    npu.ko, then clear every report so that the next scan shows new ones.

    kmemleak reports an object only once it is older than a few seconds, so
    a leak at the very end of one test file may show at the next scan.
    """
    with open(KMEMLEAK, "w") as f:
        f.write("scan")
    with open(KMEMLEAK) as f:
        text = f.read()
    with open(KMEMLEAK, "w") as f:
        f.write("clear")
    reports = re.split(r"(?m)^(?=unreferenced object)", text)
    return [r for r in reports if r.startswith("unreferenced object") and NPU_FRAME_RE.search(r)]
