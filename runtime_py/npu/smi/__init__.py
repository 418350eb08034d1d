"""``npu-smi``: the NPUs, the processes using them, and hang triage.

Like ``nvidia-smi``: ``npu-smi`` lists each device (PCI address, hardware,
firmware and driver versions, memory, utilisation, power state, hangs and
resets) and the processes that hold it open (from DRM fdinfo);
``npu-smi top`` is a live view; ``npu-smi diag`` says on which side of the
host/firmware boundary a stuck job is. Run it as ``npu-smi`` (installed
with the runtime) or ``python3 -m npu.smi``; docs/npu-smi.md has the
details.

Modules, one job each: :mod:`~npu.smi.fs` (the roots of /sys, /proc and
debugfs, reading with clear errors), :mod:`~npu.smi.sysfs` (devices and
their attributes, utilisation), :mod:`~npu.smi.fdinfo` (processes and
threads waiting on a device), :mod:`~npu.smi.debugfs` (queues, firmware,
counters, watchdog), :mod:`~npu.smi.diag` (the verdicts),
:mod:`~npu.smi.monitor` (samples over time), :mod:`~npu.smi.render`
(tables and JSON), :mod:`~npu.smi.top` and :mod:`~npu.smi.cli`.

A tool on the base of the runtime: it imports :mod:`npu.coredump` and
:mod:`npu._abi`, never the device layers (it never opens the device).
"""

from __future__ import annotations

from .cli import main
from .diag import Diagnosis, Verdict, diagnose
from .fs import Roots, SmiError

__all__ = ["Diagnosis", "Roots", "SmiError", "Verdict", "diagnose", "main"]
