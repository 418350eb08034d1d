"""The one list of kernel-log reports that fail a test.

Both gates read it: the host's (scripts/guest.py ``bad_dmesg_lines``, over
the guest's dmesg) and the in-guest one (tests/guest/kmsg.py, over
/dev/kmsg). Standard library only: it is loaded by path on either side.

What it catches: an oops, BUG or WARNING; a KASAN, UBSAN or KFENCE report;
lockdep (circular, inconsistent or recursive locking, suspicious RCU usage,
a non-static key, lockdep switching itself off); DMA-API debug warnings;
sleeping in atomic context; refcount or list corruption; a page fault the
kernel could not handle; an allocation failure (the fault-injection suite
excuses those by ALLOC_FAILURE_RE); and stalls: a hung task, a soft lockup
(a ``BUG:`` line), an RCU stall and a workqueue lockup. The debug kernel
turns on the detectors most of these need (guest/kernel/debug.config).
"""

from __future__ import annotations

import re

REPORT_PATTERNS = (
    r"Oops",
    r"BUG:",
    r"WARNING:",
    r"general protection",
    r"kernel BUG",
    r"KASAN",
    r"UBSAN",
    r"KFENCE",
    r"possible circular locking",
    r"inconsistent lock state",
    r"possible recursive locking",
    r"suspicious RCU usage",
    # DMA-API debug's own start-up lines are not reports.
    r"DMA-API: (?!preallocated|debugging)",
    r"sleeping function called",
    r"trying to register non-static key",
    r"turning off the locking correctness validator",
    r"refcount_t:",
    r"list_(add|del) corruption",
    r"Unable to handle",
    r"page allocation failure",
    # Stalls: the hung-task detector, RCU's stall warnings (self-detected or
    # seen on other CPUs), and the watchdogs that print no BUG: line.
    r"INFO: task \S+ blocked for more than",
    r"rcu: INFO: \w+ (self-)?detected stall",
    r"rcu_\w+ kthread (timer wakeup didn't happen|starved)",
    r"hard LOCKUP",
)

BAD_KMSG_RE = re.compile("|".join(REPORT_PATTERNS))

# What injected allocation failures print by design (warn_alloc and its
# dump): expected in the fault-injection suite, an error everywhere else.
ALLOC_FAILURE_RE = re.compile(r"page allocation failure|FAULT_INJECTION")


def bad_lines(lines: list[str]) -> list[str]:
    """The lines of ``lines`` that are kernel reports."""
    return [ln for ln in lines if BAD_KMSG_RE.search(ln)]
