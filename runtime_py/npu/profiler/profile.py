"""``profile()``: record every layer of the stack over a block of code.

See :mod:`npu.profiler` for the user's view.
"""

from __future__ import annotations

import dataclasses
import logging
import os
from collections.abc import Iterable, Mapping, Sequence
from types import TracebackType
from typing import Any, Final

from .. import _spans
from . import counters as _counters
from . import tracefs as _tracefs
from .chrome import write_chrome_trace
from .events import Flow, TraceEvent, device_process
from .table import KeyAverages, key_averages
from .timeline import save_timeline_png
from .tracefs import ClockMap, Tracefs, TraceRecord

__all__ = ["Profile", "link_flows", "profile"]

log = logging.getLogger(__name__)

#: The most fences of one host call that get their own flow arrows.
MAX_FLOWS_PER_CALL: Final = 64
#: How far (us) a device event may seem to precede the host call that caused
#: it (the clocks are mapped to within a few microseconds).
SLACK_US: Final = 50.0
#: The thread of the ONNX nodes' device spans in a device's engine process.
NODES_THREAD: Final = "ONNX nodes"


class Profile:
    """What one :func:`profile` recorded (the result of ``with profile() as prof:``).

    The event lists are filled when the ``with`` block ends (:meth:`stop`).

    Attributes:
        events: every :class:`npu.profiler.TraceEvent`, by start time.
        flows: the :class:`npu.profiler.Flow` arrows from host calls to
            their driver and device counterparts (same queue and fence).
        counters: per device (``"npu0"``), the change of its performance
            counters over the profile (:class:`npu.profiler.DeviceCounters`);
            empty without the driver's debugfs files.
        trace_text: the raw tracefs text read at the end ("" without one).
    """

    def __init__(
        self, *, driver: bool = True, device: bool = True, record_shapes: bool = False
    ) -> None:
        self.driver = driver
        self.device = device
        self.record_shapes = record_shapes
        self.events: list[TraceEvent] = []
        self.flows: list[Flow] = []
        self.counters: dict[str, _counters.DeviceCounters] = {}
        self.trace_text = ""
        self._log: _spans.SpanLog | None = None
        self._tracefs: Tracefs | None = None
        self._before: dict[str, _counters.DeviceCounters] = {}

    # -- recording -------------------------------------------------------------

    def start(self) -> None:
        """Start recording (``__enter__`` calls it).

        Raises:
            RuntimeError: another profile is recording.
        """
        log_ = _spans.SpanLog(self.record_shapes)
        _spans.install(log_)
        self._log = log_
        if self.device:
            self._before = _counters.read_all()
        if self.driver or self.device:
            fs = Tracefs.find()
            if fs is None:
                log.debug("profiler: no tracefs with the npu events; no driver or device events")
            else:
                try:
                    fs.start(driver=self.driver, device=self.device)
                    self._tracefs = fs
                except OSError as exc:
                    log.debug("profiler: tracefs at %s unusable: %s", fs.root, exc)

    def stop(self) -> None:
        """Stop recording and build :attr:`events`, :attr:`flows` and :attr:`counters`
        (``__exit__`` calls it). Idempotent."""
        log_ = self._log
        if log_ is None:
            return
        _spans.uninstall(log_)
        self._log = None
        fs, self._tracefs = self._tracefs, None
        if fs is not None:
            self.trace_text = fs.stop()
        if self.device:
            after = _counters.read_all()
            self.counters = {
                name: _counters.delta(self._before.get(name, _counters.DeviceCounters()), snap)
                for name, snap in after.items()
            }
        # The reads deferred to now (the model runner's node times), after the
        # trace and the counters: their ioctls are the profiler's, not the code's.
        try:
            log_.finish()
        except OSError as exc:  # a device closed meanwhile: the spans are what they are
            log.warning("profiler: a deferred read failed: %s", exc)
        records = _tracefs.parse_trace(self.trace_text) if self.trace_text else []
        self.events, self.flows = build(log_, records, driver=self.driver, device=self.device)

    def __enter__(self) -> Profile:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    # -- results ---------------------------------------------------------------

    def key_averages(self) -> KeyAverages:
        """The events grouped by name (:class:`npu.profiler.KeyAverages`); print
        ``prof.key_averages().table(sort_by="device_time_total")``."""
        return key_averages(self.events)

    def export_chrome_trace(self, path: str | os.PathLike[str]) -> None:
        """Write the profile as Chrome trace / Perfetto JSON (:func:`npu.profiler.chrome_trace`).

        Open it in https://ui.perfetto.dev or ``chrome://tracing``.
        """
        write_chrome_trace(path, self.events, self.flows, self.counters)

    def save_timeline_png(self, path: str | os.PathLike[str], *, title: str | None = None) -> None:
        """Draw the profile's timeline into a PNG (one row per process and thread,
        colored by layer). Needs matplotlib.

        Raises:
            RuntimeError: matplotlib is not installed.
        """
        save_timeline_png(self.events, path, title=title, flows=self.flows)

    def __repr__(self) -> str:
        return f"<npu.profiler.Profile {len(self.events)} events, {len(self.flows)} flows>"


def profile(*, driver: bool = True, device: bool = True, record_shapes: bool = False) -> Profile:
    """Record the host, driver and device layers of the code in a ``with`` block.

    ::

        with npu.profiler.profile() as prof:
            sess.run(None, {"x": x})
        print(prof.key_averages().table(sort_by="device_time_total", row_limit=10))
        prof.export_chrome_trace("trace.json")

    Args:
        driver: read the driver's tracepoints (tracefs ``events/npu/``).
        device: read the device's trace ring (drained by the driver as
            ``npu_fw_event``) and its performance counters (debugfs).
        record_shapes: host spans of tensor ops and model runs also record
            their inputs' shapes.

    Without tracefs, the npu events or debugfs (the CPU backend, no root)
    only the host layer (and the model runner's per-node device times) is
    recorded; nothing fails. Profiles do not nest.
    """
    return Profile(driver=driver, device=device, record_shapes=record_shapes)


# ---------------------------------------------------------------------------
# Building the events
# ---------------------------------------------------------------------------


def _thread_names(log_: _spans.SpanLog) -> dict[int, str]:
    names: dict[int, str] = {}
    seen: dict[str, int] = {}
    for ident, name in log_.threads.items():
        n = seen.get(name, 0) + 1
        seen[name] = n
        names[ident] = name if n == 1 else f"{name} #{n}"
    return names


def _host_events(log_: _spans.SpanLog) -> list[TraceEvent]:
    names = _thread_names(log_)
    out = []
    for s in log_.spans:
        dur = None if s.t1_ns == s.t0_ns else (s.t1_ns - s.t0_ns) / 1000.0
        args = dict(s.args) if s.args else {}
        out.append(TraceEvent(s.name, "host", s.t0_ns / 1000.0, dur, "host", names[s.thread], args))
    return out


def _node_events(log_: _spans.SpanLog, clock: ClockMap) -> list[TraceEvent]:
    """The model runner's per-node device spans, on host time."""
    out = []
    for d in log_.device_spans:
        if d.host_clock:
            offset = 0
        elif clock.known:
            offset = clock.to_host(d.t0_ns) - d.t0_ns
        elif d.anchor is not None:
            offset = d.anchor[1] - d.anchor[0]
        else:
            continue
        args = dict(d.args) if d.args else {}
        args.setdefault("queue", d.queue)
        args.setdefault("fence", d.fence)
        out.append(
            TraceEvent(
                d.name,
                "engine",
                (d.t0_ns + offset) / 1000.0,
                (d.t1_ns - d.t0_ns) / 1000.0,
                device_process(d.device, "engine"),
                f"{NODES_THREAD} (queue {d.queue})",
                args,
            )
        )
    return out


def build(
    log_: _spans.SpanLog,
    records: Sequence[TraceRecord],
    *,
    driver: bool = True,
    device: bool = True,
    device_name: str = "npu0",
) -> tuple[list[TraceEvent], list[Flow]]:
    """The events and flows of a profile from its span log and trace records."""
    clock = ClockMap.from_records(records)
    events = _host_events(log_)
    if driver:
        events += _tracefs.driver_events(records)
    if device:
        events += _tracefs.device_events(records, device_name, clock)
    events += _node_rooflines(_node_events(log_, clock), events)
    events.sort(key=lambda e: e.ts_us)
    return events, link_flows(events)


def _node_rooflines(nodes: list[TraceEvent], events: Sequence[TraceEvent]) -> list[TraceEvent]:
    """``nodes``, each given under a chip timing model the roofline of its
    commands (the engine spans of its queue and fences): ``compute_ns`` and
    ``memory_ns`` summed, and ``bound``, the larger of the two."""
    modelled: dict[tuple[int, int], tuple[int, int]] = {}
    for e in events:
        if e.cat == "engine" and "compute_ns" in e.args:
            key = (int(e.args["queue"]), int(e.args["fence"]))
            modelled[key] = (int(e.args["compute_ns"]), int(e.args["memory_ns"]))
    if not modelled:
        return nodes
    out = []
    for node in nodes:
        fences = _fences(node.args)
        if fences is None:
            out.append(node)
            continue
        queue = int(node.args.get("queue", 0))
        parts = [modelled.get((queue, f)) for f in range(fences[0], fences[1] + 1)]
        known = [p for p in parts if p is not None]
        if not known:
            out.append(node)
            continue
        compute, memory = sum(p[0] for p in known), sum(p[1] for p in known)
        bound = "compute" if compute >= memory else "memory"
        args = {**node.args, "compute_ns": compute, "memory_ns": memory, "bound": bound}
        out.append(dataclasses.replace(node, args=args))
    return out


def _fences(args: Mapping[str, Any]) -> tuple[int, int] | None:
    f = args.get("fences")
    if isinstance(f, (tuple, list)) and len(f) == 2:
        return int(f[0]), int(f[1])
    return None


def _sources(events: Iterable[TraceEvent]) -> list[TraceEvent]:
    """Host spans naming a queue and the fences their call produced, innermost only
    (a tensor op's span holds its stream launch's: the launch is the source)."""
    by_thread: dict[str, list[TraceEvent]] = {}
    for e in events:
        if e.cat == "host" and "queue" in e.args and _fences(e.args) is not None:
            by_thread.setdefault(e.tid, []).append(e)
    out = []
    for spans in by_thread.values():
        spans.sort(key=lambda e: (e.ts_us, -e.end_us))
        for i, s in enumerate(spans):
            inner = False
            for t in spans[i + 1 :]:
                if t.ts_us > s.end_us:
                    break
                if t.end_us <= s.end_us and t.args["queue"] == s.args["queue"]:
                    inner = True
                    break
            if not inner:
                out.append(s)
    return out


def link_flows(events: Sequence[TraceEvent]) -> list[Flow]:
    """Flow arrows from each host call that produced fences of a queue to

    - the driver's ``submit`` of the same queue whose fences overlap them,
    - the firmware's ``fetch`` of each of those fences,
    - the engine's span of each fence: its command's from the device's
      trace ring, else (no trace ring: the CPU backend) the ONNX node whose
      first op it is,

    at most :data:`MAX_FLOWS_PER_CALL` fences per call.
    """
    submits: dict[int, list[tuple[int, int, TraceEvent]]] = {}
    fetches: dict[tuple[int, int], list[TraceEvent]] = {}
    work: dict[tuple[int, int], list[TraceEvent]] = {}
    nodes: dict[tuple[int, int], list[TraceEvent]] = {}
    for e in events:
        q = e.args.get("queue")
        if not isinstance(q, int):
            continue
        if e.cat == "driver" and e.name == "submit":
            f = _fences(e.args)
            if f is not None:
                submits.setdefault(q, []).append((*f, e))
        elif e.cat == "firmware" and e.name == "fetch":
            fetches.setdefault((q, int(e.args.get("fence", 0))), []).append(e)
        elif e.cat == "engine" and not e.instant and e.name != "tile":
            f = _fences(e.args)
            first = f[0] if f is not None else int(e.args.get("fence", 0))
            table = nodes if e.tid.startswith(NODES_THREAD) else work
            table.setdefault((q, first), []).append(e)
    flows: list[Flow] = []
    for src in sorted(_sources(events), key=lambda e: e.ts_us):
        q = int(src.args["queue"])
        fences = _fences(src.args)
        assert fences is not None
        first, last = fences
        after = src.ts_us - SLACK_US
        for lo, hi, sub in submits.get(q, ()):
            if lo <= last and first <= hi and sub.ts_us >= after:
                flows.append(Flow(len(flows) + 1, src, sub))
                break
        for fence in range(first, min(last, first + MAX_FLOWS_PER_CALL - 1) + 1):
            key = (q, fence)
            for table in (fetches, work if key in work else nodes):
                for dst in table.get(key, ()):
                    if dst.ts_us >= after:
                        flows.append(Flow(len(flows) + 1, src, dst))
                        break
    return flows
