"""Sampling the devices and their processes over time (``npu-smi``, ``-l``, ``top``).

A :class:`Monitor` keeps the previous sample of each device's busy
counters and each process's engine time, so that every :meth:`Monitor.refresh`
reports utilisation over the time since the last one.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from .fdinfo import ProcessInfo, processes
from .fs import Roots
from .sysfs import (
    DeviceInfo,
    DeviceRef,
    Sample,
    read_device,
    require_devices,
    sample,
    select_device,
)
from .sysfs import utilisation as util_between

ProcKey = tuple[int, int | None]


@dataclass(frozen=True)
class Snapshot:
    """One refresh: each device with its utilisation, the processes, their engine shares."""

    devices: list[tuple[DeviceInfo, float | None]]
    processes: list[ProcessInfo]
    engine_percent: dict[ProcKey, float]


class Monitor:
    """The devices under ``roots`` (or the one of ``index``) over time."""

    def __init__(self, roots: Roots, index: int | None = None) -> None:
        self.roots = roots
        self.index = index
        found = require_devices(roots)
        self.found = found
        self.refs: list[DeviceRef] = select_device(found, index)
        self.samples: dict[int, Sample] = {}
        self.engine: dict[ProcKey, tuple[int, float]] = {}

    def prime(self) -> None:
        """Take the first samples (the next refresh measures from here)."""
        for ref in self.refs:
            self.samples[ref.index] = sample(ref)
        now = time.monotonic()
        for p in self._processes():
            self.engine[(p.pid, p.device)] = (p.engine_ns, now)

    def _processes(self) -> list[ProcessInfo]:
        by_address = {r.pci_address: r.index for r in self.found}
        rows = processes(self.roots, by_address)
        if self.index is not None:
            rows = [p for p in rows if p.device == self.index]
        return rows

    def refresh(self) -> Snapshot:
        """Read everything now; utilisation and engine shares since the last refresh."""
        devices: list[tuple[DeviceInfo, float | None]] = []
        for ref in self.refs:
            now = sample(ref)
            before = self.samples.get(ref.index)
            info = read_device(ref, now)
            devices.append((info, None if before is None else util_between(before, now)))
            self.samples[ref.index] = now
        procs = self._processes()
        t = time.monotonic()
        shares: dict[ProcKey, float] = {}
        engine: dict[ProcKey, tuple[int, float]] = {}
        for p in procs:
            key = (p.pid, p.device)
            engine[key] = (p.engine_ns, t)
            prev = self.engine.get(key)
            if prev is not None and t > prev[1]:
                ns = max(0, p.engine_ns - prev[0])
                shares[key] = min(100.0, 100.0 * ns / ((t - prev[1]) * 1e9))
        self.engine = engine
        return Snapshot(devices, procs, shares)
