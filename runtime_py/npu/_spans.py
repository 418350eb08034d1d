"""The runtime's profiling hook: where host spans go while a profile records.

A base module (it imports nothing of the package), so that every layer can
record: the device layer its SUBMITs and WAITs, the streams their
launches, the allocator its blocks, the model runner its runs and nodes.
:mod:`npu.profiler` (the front end, on top of every layer) installs a
:class:`SpanLog` as :data:`recorder` for the length of a profile and takes
it back at the end.

The hook costs one module attribute read when no profile records::

    rec = _spans.recorder
    if rec is not None:
        t0 = _spans.now()
    ...                                     # the work
    if rec is not None:
        rec.add("Device.submit", t0, _spans.now(), {"queue": q, "fences": (a, b)})

Timestamps are ``time.monotonic_ns()`` (the clock the profiler also sets
the kernel's trace clock to). ``args`` names the queue and the fences a
call produced (``"queue"``, ``"fences": (first, last)`` or ``"fence"``)
when it knows them, so the profiler can draw flows to the driver's and the
device's view of the same commands.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping
from typing import Any, Final, NamedTuple

__all__ = ["DeviceSpan", "HostSpan", "SpanLog", "install", "now", "recorder", "uninstall"]

#: The clock of every host timestamp (nanoseconds, CLOCK_MONOTONIC).
now: Final[Callable[[], int]] = time.monotonic_ns


class HostSpan(NamedTuple):
    """A runtime call on the host: ``[t0_ns, t1_ns]`` in :func:`now`'s clock
    (``t0_ns == t1_ns``: an instant), on thread ``thread`` (an ident)."""

    name: str
    t0_ns: int
    t1_ns: int
    thread: int
    args: Mapping[str, Any] | None


class DeviceSpan(NamedTuple):
    """Work the device timed itself (a completion record's start and end).

    ``t0_ns``/``t1_ns`` are on the device's clock unless ``host_clock`` (the
    CPU backend stamps with :func:`now`); ``anchor`` is ``(device ns, host
    ns)`` of one moment seen from both sides (a completion and the wait that
    saw it), for mapping the clocks when nothing better is known.
    """

    name: str
    device: str
    queue: int
    fence: int
    t0_ns: int
    t1_ns: int
    host_clock: bool
    anchor: tuple[int, int] | None
    args: Mapping[str, Any] | None


class SpanLog:
    """What one profile records: host spans, device spans, thread names, and
    reads deferred to the end of the profile.

    Appends only (``list.append`` is atomic), so any thread may record
    without a lock.

    Attributes:
        record_shapes: callers add the shapes of their inputs to ``args``.
    """

    def __init__(self, record_shapes: bool = False) -> None:
        self.record_shapes = record_shapes
        self.spans: list[HostSpan] = []
        self.device_spans: list[DeviceSpan] = []
        self.threads: dict[int, str] = {}
        self.deferred: list[Callable[[SpanLog], None]] = []

    def add(self, name: str, t0_ns: int, t1_ns: int, args: Mapping[str, Any] | None = None) -> None:
        """Record a host span of the calling thread."""
        ident = threading.get_ident()
        if ident not in self.threads:
            self.threads[ident] = threading.current_thread().name
        self.spans.append(HostSpan(name, t0_ns, t1_ns, ident, args))

    def instant(self, name: str, args: Mapping[str, Any] | None = None) -> None:
        """Record a host instant (a span of no length) now."""
        t = now()
        self.add(name, t, t, args)

    def device(self, span: DeviceSpan) -> None:
        """Record work the device timed."""
        self.device_spans.append(span)

    def defer(self, read: Callable[[SpanLog], None]) -> None:
        """Call ``read(self)`` when the profile ends (:meth:`finish`), not now:
        reading device records (an ioctl each) stays out of the timed code.
        ``read`` may be called earlier by its owner; it must then do nothing
        the second time."""
        self.deferred.append(read)

    def finish(self) -> None:
        """Run the deferred reads (the profiler calls it at the end), oldest first."""
        reads, self.deferred = self.deferred, []
        for read in reads:
            read(self)


#: The active profile's log, or None (nothing records).
recorder: SpanLog | None = None
_lock = threading.Lock()


def install(log: SpanLog) -> None:
    """Make ``log`` the recorder.

    Raises:
        RuntimeError: another profile records already (profiles do not nest).
    """
    global recorder
    with _lock:
        if recorder is not None:
            raise RuntimeError("a profile is already recording (profiles do not nest)")
        recorder = log


def uninstall(log: SpanLog) -> None:
    """Stop recording into ``log`` (nothing happens if it is not the recorder)."""
    global recorder
    with _lock:
        if recorder is log:
            recorder = None
