"""``npu.profiler``: every layer of the stack on one time axis.

::

    import npu

    with npu.profiler.profile() as prof:
        sess.run(None, {"x": x})
    print(prof.key_averages().table(sort_by="device_time_total", row_limit=10))
    prof.export_chrome_trace("trace.json")     # https://ui.perfetto.dev
    prof.save_timeline_png("trace.png")        # needs matplotlib

A profile records five layers, each event's ``cat``:

- ``host``: the runtime's calls (SUBMITs, waits, stream launches and
  synchronisations, buffer and allocator allocations and frees, tensor
  ops, model runs and CPU-run ONNX nodes), from the hook in
  :mod:`npu._spans`; calls that produced fences name their queue and
  fences;
- ``driver``: the driver's tracepoints (tracefs ``events/npu/``: ioctl
  entry and exit, submit, ring write, doorbell, interrupt, fence signal,
  waiter wake-up, job retire);
- ``firmware``, ``engine``, ``dma``: the device's trace ring (command
  fetched, dispatched, tile and DMA start and end, completion written,
  interrupt raised, mailbox), drained by the driver into tracefs and mapped
  from the device clock to the host's; the model runner's per-node device
  times (completion records) are ``engine`` spans too;

plus the change of the device's performance counters (debugfs), and flow
arrows from host calls to the driver's and the device's view of the same
(queue, fence). What is missing (no tracefs, no root, the CPU backend) is
left out without an error.
"""

from __future__ import annotations

import os

from .chrome import chrome_trace, load_chrome_trace
from .counters import DeviceCounters, parse_perf
from .events import CATS, Flow, TraceEvent
from .profile import Profile, link_flows, profile
from .table import KeyAverage, KeyAverages, key_averages
from .timeline import save_timeline_png
from .tracefs import ClockMap, TraceRecord, device_events, driver_events, parse_trace

__all__ = [
    "CATS",
    "ClockMap",
    "DeviceCounters",
    "Flow",
    "KeyAverage",
    "KeyAverages",
    "Profile",
    "TraceEvent",
    "TraceRecord",
    "chrome_trace",
    "device_events",
    "driver_events",
    "key_averages",
    "link_flows",
    "load",
    "parse_perf",
    "parse_trace",
    "profile",
    "save_timeline_png",
]


def load(path: str | os.PathLike[str]) -> Profile:
    """A :class:`Profile` of a trace that :meth:`Profile.export_chrome_trace`
    wrote (its events, flows and counters), e.g. to draw it elsewhere.

    Raises:
        OSError: the file cannot be read.
        ValueError: it is not a Chrome trace.
    """
    prof = Profile(driver=False, device=False)
    prof.events, prof.flows, prof.counters = load_chrome_trace(path)
    return prof
