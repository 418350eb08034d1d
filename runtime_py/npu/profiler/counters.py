"""The device's performance counters, from the driver's debugfs ``perf`` files.

``/sys/kernel/debug/npu/<device>/perf`` holds one snapshot::

    time_ns=N
    queue=Q cmds=N busy_ns=N macs=N read_bytes=N write_bytes=N walks=N walk_hits=N wait_ns=N
    ...
    core=K busy_ns=N
    ...

A profile reads every device's file at its start and at its end and keeps
the differences (:class:`DeviceCounters`).
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = ["DEBUGFS_ROOT", "DeviceCounters", "delta", "parse_perf", "read_all"]

log = logging.getLogger(__name__)

#: The driver's debugfs directory (one subdirectory per device).
DEBUGFS_ROOT: Path = Path("/sys/kernel/debug/npu")
_PAIR = re.compile(r"(\w+)=(-?\d+)")


@dataclass
class DeviceCounters:
    """One device's counters: a snapshot, or the change over a profile.

    Attributes:
        time_ns: the device clock (a change: how long the profile lasted
            on the device).
        queues: per hardware queue, ``cmds``, ``busy_ns``, ``macs``,
            ``read_bytes``, ``write_bytes``, ``walks``, ``walk_hits``,
            ``wait_ns`` (whichever the driver reports).
        cores: per AI core, ``busy_ns``.
    """

    time_ns: int = 0
    queues: dict[int, dict[str, int]] = field(default_factory=dict)
    cores: dict[int, dict[str, int]] = field(default_factory=dict)

    def total(self, key: str) -> int:
        """``key`` summed over the queues (``total("cmds")``)."""
        return sum(q.get(key, 0) for q in self.queues.values())

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready form (queue and core numbers as strings)."""
        return {
            "time_ns": self.time_ns,
            "queues": {str(k): dict(v) for k, v in sorted(self.queues.items())},
            "cores": {str(k): dict(v) for k, v in sorted(self.cores.items())},
        }


def parse_perf(text: str) -> DeviceCounters:
    """One snapshot of a ``perf`` file's text (unknown lines are skipped)."""
    snap = DeviceCounters()
    for line in text.splitlines():
        pairs = _PAIR.findall(line)
        if not pairs:
            continue
        values = {k: int(v) for k, v in pairs}
        first = pairs[0][0]
        if first == "queue":
            q = values.pop("queue")
            snap.queues[q] = values
        elif first == "core":
            k = values.pop("core")
            snap.cores[k] = values
        elif first == "time_ns":
            snap.time_ns = values["time_ns"]
    return snap


def delta(before: DeviceCounters, after: DeviceCounters) -> DeviceCounters:
    """``after - before``, key by key (a queue or core only in ``after`` counts from 0)."""

    def sub(
        a: dict[int, dict[str, int]], b: dict[int, dict[str, int]]
    ) -> dict[int, dict[str, int]]:
        return {
            k: {name: v - a.get(k, {}).get(name, 0) for name, v in vals.items()}
            for k, vals in b.items()
        }

    return DeviceCounters(
        after.time_ns - before.time_ns,
        sub(before.queues, after.queues),
        sub(before.cores, after.cores),
    )


def read_all(root: Path | None = None) -> dict[str, DeviceCounters]:
    """A snapshot of every device's ``perf`` file under ``root`` (default
    :data:`DEBUGFS_ROOT`), by device name; ``{}`` when there is none."""
    base = DEBUGFS_ROOT if root is None else root
    out: dict[str, DeviceCounters] = {}
    try:
        files = sorted(base.glob("*/perf"))
    except OSError as exc:
        log.debug("profiler: no device counters (%s)", exc)
        return out
    for path in files:
        try:
            out[path.parent.name] = parse_perf(path.read_text())
        except OSError as exc:
            log.debug("profiler: reading %s failed: %s", path, exc)
    return out
