"""The driver's and the device's events, through the kernel's tracefs.

:class:`Tracefs` turns the driver's tracepoints (``events/npu/``) on for a
profile with ``trace_clock`` set to ``mono`` (so trace timestamps are
``time.monotonic_ns()``), and reads the ``trace`` file back at the end.
:func:`parse_trace` reads that text into :class:`TraceRecord` s;
:func:`driver_events` makes the driver's layer of them, :func:`device_events`
the device's (its trace ring, drained by the driver as ``npu_fw_event``
records, on the device clock, mapped to the host's with the driver's
``npu_clock_sync`` records: :class:`ClockMap`).
"""

from __future__ import annotations

import bisect
import logging
import re
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, Final, NamedTuple

from .. import _abi
from .events import TraceEvent, device_process

__all__ = [
    "TRACEFS_ROOTS",
    "ClockMap",
    "TraceRecord",
    "Tracefs",
    "core_thread",
    "device_events",
    "drain_device_rings",
    "driver_events",
    "ioctl_name",
    "parse_trace",
]

log = logging.getLogger(__name__)

#: Where tracefs may be mounted, tried in order (the guest mounts debugfs only).
TRACEFS_ROOTS: list[Path] = [Path("/sys/kernel/tracing"), Path("/sys/kernel/debug/tracing")]
#: The driver's debugfs: ``npuN/fwtrace`` of each device (a read drains its trace ring).
NPU_DEBUGFS: Path = Path("/sys/kernel/debug/npu")


def drain_device_rings(root: Path | None = None) -> int:
    """Have the driver drain every device's trace ring into the trace now
    (a read of each ``npuN/fwtrace``); how many were drained. A missing or
    unreadable file is skipped (no device, not root)."""
    drained = 0
    for path in sorted((root or NPU_DEBUGFS).glob("npu*/fwtrace")):
        try:
            path.read_text()
            drained += 1
        except OSError as exc:
            log.debug("profiler: draining %s failed: %s", path, exc)
    return drained


#: The driver's trace system.
SYSTEM: Final = "npu"
#: The smallest per-CPU trace buffer a profile runs with (KiB); a smaller one is grown.
MIN_BUFFER_KB: Final = 4096
#: The events that carry the device's trace ring (enabling ``npu_fw_event``
#: turns the device's tracing on); every other ``npu`` event is the driver's.
DEVICE_EVENTS: Final = frozenset({"npu_fw_event", "npu_clock_sync"})
#: The AI core number of the command processor in ``npu_fw_event``.
COMMAND_PROCESSOR: Final = 255

_LINE = re.compile(
    r"^\s*(?P<task>.*?)-(?P<pid>\d+)\s+(?:\(\s*[-\d]+\)\s+)?\[(?P<cpu>\d+)\]\s+"
    r"(?:(?P<flags>\S+)\s+)?(?P<sec>\d+)\.(?P<frac>\d+):\s+(?P<event>\w+):\s?(?P<body>.*)$"
)
_FIELD = re.compile(r"(\w+)=(\S+)")
_RANGE = re.compile(r"^(\d+)\.\.(\d+)$")
_INT = re.compile(r"^-?\d+$")
_HEX = re.compile(r"^0x[0-9a-fA-F]+$")

FieldValue = int | str | tuple[int, int]


class TraceRecord(NamedTuple):
    """One line of the ``trace`` file.

    ``ts_ns``: the trace timestamp in ns (the ``mono`` clock during a
    profile); ``fields``: the ``key=value`` pairs of the event's text, values
    as ints (decimal or ``0x`` hex), ``(first, last)`` for ``a..b``, or strings.
    """

    task: str
    pid: int
    cpu: int
    ts_ns: int
    event: str
    fields: Mapping[str, FieldValue]


def _value(text: str) -> FieldValue:
    if _INT.match(text):
        return int(text)
    if _HEX.match(text):
        return int(text, 16)
    m = _RANGE.match(text)
    if m:
        return (int(m.group(1)), int(m.group(2)))
    return text


def parse_trace(text: str) -> list[TraceRecord]:
    """The records of a tracefs ``trace`` file's text, in file order.

    Comment lines (``#``), blank lines and lines of another format are
    skipped; any event is parsed (the caller picks the ones it knows).
    """
    out: list[TraceRecord] = []
    for line in text.splitlines():
        if not line or line.lstrip().startswith("#"):
            continue
        m = _LINE.match(line)
        if m is None:
            continue
        frac = m.group("frac")
        ts_ns = int(m.group("sec")) * 1_000_000_000 + int((frac + "000000000")[:9])
        fields = {k: _value(v) for k, v in _FIELD.findall(m.group("body"))}
        out.append(
            TraceRecord(
                m.group("task").strip(),
                int(m.group("pid")),
                int(m.group("cpu")),
                ts_ns,
                m.group("event"),
                fields,
            )
        )
    return out


# ---------------------------------------------------------------------------
# tracefs control
# ---------------------------------------------------------------------------


class Tracefs:
    """The driver's tracepoints in one tracefs mount, switched on for a profile.

    :meth:`start` saves and sets ``trace_clock`` (``mono``), grows the
    buffer to :data:`MIN_BUFFER_KB` if smaller, enables the
    ``events/npu/*`` events asked for that are off, turns tracing on and
    clears the buffer; :meth:`stop` disables what it enabled, reads
    ``trace`` and restores the rest.
    """

    def __init__(self, root: Path) -> None:
        self.root = root
        self._enabled: list[Path] = []
        self._clock: str | None = None
        self._buffer_kb: str | None = None
        self._tracing_on: str | None = None

    @classmethod
    def find(cls) -> Tracefs | None:
        """The first tracefs of :data:`TRACEFS_ROOTS` that has the driver's events, or None."""
        for root in TRACEFS_ROOTS:
            try:
                if (root / "events" / SYSTEM).is_dir() and (root / "trace").is_file():
                    return cls(root)
            except OSError:
                continue
        return None

    def _read(self, name: str) -> str:
        return (self.root / name).read_text().strip()

    def _write(self, name: str | Path, value: str) -> None:
        path = name if isinstance(name, Path) else self.root / name
        with open(path, "w") as f:
            f.write(value)

    def start(self, *, driver: bool = True, device: bool = True) -> None:
        """Set the clock, enable the events, clear the buffer.

        ``driver``: the driver's own events; ``device``: the device's trace
        ring (:data:`DEVICE_EVENTS`).

        Raises:
            OSError: a tracefs file could not be read or written (what was
                changed already is undone).
        """
        try:
            clocks = self._read("trace_clock")
            m = re.search(r"\[(\S+)\]", clocks)
            self._clock = m.group(1) if m else None
            if self._clock != "mono":
                self._write("trace_clock", "mono")  # (this clears the buffer)
            kb = self.root / "buffer_size_kb"
            if kb.is_file():
                size = kb.read_text().strip()
                if size.isdigit() and int(size) < MIN_BUFFER_KB:
                    self._buffer_kb = size
                    self._write(kb, str(MIN_BUFFER_KB))
            for enable in sorted((self.root / "events" / SYSTEM).glob("*/enable")):
                wanted = device if enable.parent.name in DEVICE_EVENTS else driver
                if wanted and enable.read_text().strip() == "0":
                    self._write(enable, "1")
                    self._enabled.append(enable)
            on = self.root / "tracing_on"
            if on.is_file() and on.read_text().strip() != "1":
                self._tracing_on = on.read_text().strip()
                self._write(on, "1")
            self._write("trace", "")  # truncating the file clears the buffer
        except OSError:
            self._restore()
            raise

    def stop(self) -> str:
        """Disable the events :meth:`start` enabled, read the ``trace`` file, restore
        the clock and the buffer; the text read ("" if it could not be read).

        First each device's trace ring is drained into the trace (a read of
        its debugfs ``fwtrace``), since the driver drains it only every
        watchdog period otherwise."""
        drain_device_rings()
        for enable in self._enabled:
            try:
                self._write(enable, "0")
            except OSError as exc:
                log.debug("tracefs: disabling %s failed: %s", enable, exc)
        self._enabled = []
        try:
            text = (self.root / "trace").read_text(errors="replace")
        except OSError as exc:
            log.debug("tracefs: reading %s/trace failed: %s", self.root, exc)
            text = ""
        self._restore()
        return text

    def _restore(self) -> None:
        for enable in self._enabled:
            try:
                self._write(enable, "0")
            except OSError as exc:
                log.debug("tracefs: disabling %s failed: %s", enable, exc)
        self._enabled = []
        for name, saved in (
            ("tracing_on", self._tracing_on),
            ("buffer_size_kb", self._buffer_kb),
            ("trace_clock", self._clock if self._clock != "mono" else None),
        ):
            if saved is None:
                continue
            try:
                self._write(name, saved)
            except OSError as exc:
                log.debug("tracefs: restoring %s to %s failed: %s", name, saved, exc)
        self._tracing_on = self._buffer_kb = self._clock = None


# ---------------------------------------------------------------------------
# The driver's layer
# ---------------------------------------------------------------------------


def _ioctl_names() -> dict[int, str]:
    prefix = "DRM_NPU_"
    return {
        int(getattr(_abi, name)): name.removeprefix(prefix)
        for name in dir(_abi)
        if name.startswith(prefix) and isinstance(getattr(_abi, name), int)
    }


_IOCTLS: Final = _ioctl_names()


def ioctl_name(nr: int) -> str:
    """The driver ioctl of number ``nr`` (``DRM_NPU_*``, or the same plus
    ``DRM_COMMAND_BASE`` as ``_IOC_NR`` gives it): ``"SUBMIT"``; else hex."""
    if nr in _IOCTLS:
        return _IOCTLS[nr]
    base = _abi.NPU_DRM_COMMAND_BASE
    if nr - base in _IOCTLS:
        return _IOCTLS[nr - base]
    return f"{nr:#04x}"


def _us(ns: int) -> float:
    return ns / 1000.0


def _int(fields: Mapping[str, FieldValue], key: str, default: int = 0) -> int:
    v = fields.get(key, default)
    return v if isinstance(v, int) else default


def _args(fields: Mapping[str, FieldValue]) -> dict[str, Any]:
    return {k: list(v) if isinstance(v, tuple) else v for k, v in fields.items()}


def driver_events(records: Iterable[TraceRecord], process: str = "driver") -> list[TraceEvent]:
    """The driver's layer (cat ``"driver"``) of trace records.

    Every ``npu_*`` record but the device's own (``npu_fw_event``,
    ``npu_clock_sync``) becomes an event named without the ``npu_`` prefix,
    on the thread ``"queue Q"`` when it names a queue, else on its task's
    (``"comm-pid"``). ``npu_ioctl_enter``/``npu_ioctl_exit`` of one task
    pair into one span ``"ioctl <NAME>"`` (args ``nr``, ``ret``) on the
    task's thread; an enter or exit without its partner stays an instant.
    """
    out: list[TraceEvent] = []
    open_ioctls: dict[int, list[TraceRecord]] = {}
    for r in records:
        if not r.event.startswith("npu_") or r.event in ("npu_fw_event", "npu_clock_sync"):
            continue
        task = f"{r.task}-{r.pid}"
        if r.event == "npu_ioctl_enter":
            open_ioctls.setdefault(r.pid, []).append(r)
            continue
        if r.event == "npu_ioctl_exit":
            nr = _int(r.fields, "nr")
            stack = open_ioctls.get(r.pid, [])
            for i in range(len(stack) - 1, -1, -1):
                if _int(stack[i].fields, "nr") == nr:
                    enter = stack.pop(i)
                    args = {"nr": nr, "ret": _int(r.fields, "ret")}
                    out.append(
                        TraceEvent(
                            f"ioctl {ioctl_name(nr)}",
                            "driver",
                            _us(enter.ts_ns),
                            _us(r.ts_ns - enter.ts_ns),
                            process,
                            task,
                            args,
                        )
                    )
                    break
            else:
                out.append(
                    TraceEvent(
                        f"ioctl {ioctl_name(nr)} exit",
                        "driver",
                        _us(r.ts_ns),
                        None,
                        process,
                        task,
                        _args(r.fields),
                    )
                )
            continue
        queue = r.fields.get("queue")
        thread = f"queue {queue}" if isinstance(queue, int) else task
        info = _args(r.fields)
        if thread != task:
            info["task"] = task
        out.append(
            TraceEvent(
                r.event.removeprefix("npu_"), "driver", _us(r.ts_ns), None, process, thread, info
            )
        )
    for stack in open_ioctls.values():
        for enter in stack:
            nr = _int(enter.fields, "nr")
            out.append(
                TraceEvent(
                    f"ioctl {ioctl_name(nr)}",
                    "driver",
                    _us(enter.ts_ns),
                    None,
                    process,
                    f"{enter.task}-{enter.pid}",
                    {"nr": nr, "unfinished": True},
                )
            )
    out.sort(key=lambda e: e.ts_us)
    return out


# ---------------------------------------------------------------------------
# The device's layers
# ---------------------------------------------------------------------------


class ClockMap:
    """Device nanoseconds to host ``CLOCK_MONOTONIC`` nanoseconds.

    Built from ``(device ns, host ns)`` pairs of one moment (the driver's
    ``npu_clock_sync`` records: their dev_ns and their trace timestamp). A
    device time maps with the offset of the latest pair at or before it
    (by device time), else of the first pair. Without pairs nothing maps
    (:attr:`known` is False).
    """

    def __init__(self, pairs: Iterable[tuple[int, int]] = ()) -> None:
        ordered = sorted(pairs)
        self._dev = [d for d, _ in ordered]
        self._offset = [h - d for d, h in ordered]

    @classmethod
    def from_records(cls, records: Iterable[TraceRecord]) -> ClockMap:
        """The pairs of the ``npu_clock_sync`` records (``dev_ns`` and the trace time)."""
        return cls(
            (_int(r.fields, "dev_ns"), r.ts_ns)
            for r in records
            if r.event == "npu_clock_sync" and "dev_ns" in r.fields
        )

    @property
    def known(self) -> bool:
        """True when at least one pair is known."""
        return bool(self._dev)

    def to_host(self, dev_ns: int) -> int:
        """The host time of device time ``dev_ns``.

        Raises:
            ValueError: no pair is known.
        """
        if not self._dev:
            raise ValueError("ClockMap: no clock pair known")
        i = bisect.bisect_right(self._dev, dev_ns) - 1
        return dev_ns + self._offset[max(i, 0)]


#: ``npu_fw_event`` kinds by layer.
FIRMWARE_KINDS: Final = frozenset(
    {"fetch", "dispatch", "cpl_write", "irq", "mbox_req", "mbox_reply"}
)
ENGINE_PAIRS: Final = {"cmd_start": "cmd_end", "tile_start": "tile_end"}
DMA_PAIRS: Final = {"dma_start": "dma_end"}


def core_thread(core: int) -> str:
    """The thread name of AI core ``core`` (255: the command processor)."""
    return "command processor" if core == COMMAND_PROCESSOR else f"core {core}"


def _opcode_name(code: int) -> str:
    try:
        return _abi.Opcode(code).name
    except ValueError:
        return f"opcode {code}"


def device_events(
    records: Sequence[TraceRecord], device: str = "npu0", clock: ClockMap | None = None
) -> list[TraceEvent]:
    """The device's layers (cats ``"firmware"``, ``"engine"``, ``"dma"``) of trace records.

    Each ``npu_fw_event`` (``dev_ns kind queue core fence arg32 arg``) is
    put on host time with ``clock`` (default: the records' own
    ``npu_clock_sync`` pairs; without any, the first event's trace
    timestamp minus its dev_ns, an upper bound of the offset).

    - firmware (instants on ``"queue Q"``; mailbox ones on ``"mailbox"``):
      ``fetch`` (args ``opcode``), ``dispatch``, ``cpl_write``, ``irq``
      (``vector``), ``mbox_req``, ``mbox_reply``;
    - engine (spans on ``"core K"`` / ``"command processor"``): a
      ``cmd_start``/``cmd_end`` pair of one (queue, fence, core) is a span
      named after the command's opcode (from its ``fetch``; else ``"cmd"``,
      args ``status``; under a chip timing model also ``compute_ns``,
      ``memory_ns`` and ``bound``, its roofline), a ``tile_start``/``tile_end`` pair of one (queue,
      fence, core, tile) a span ``"tile"``;
    - dma (spans on the core's thread): ``dma_start``/``dma_end`` pairs,
      ``"dma read"`` (arg32 0, operands) or ``"dma write"`` (1, results),
      args ``bytes``.

    A start or end without its partner stays an instant of its kind's name.
    """
    fw = [r for r in records if r.event == "npu_fw_event"]
    if not fw:
        return []
    if clock is None or not clock.known:
        clock = ClockMap.from_records(records)
    if not clock.known:
        first = fw[0]
        clock = ClockMap([(_int(first.fields, "dev_ns"), first.ts_ns)])
        log.debug("profiler: no npu_clock_sync record; device times mapped by the first event")
    fw.sort(key=lambda r: _int(r.fields, "dev_ns"))
    opcodes: dict[tuple[int, int], int] = {}
    for r in fw:
        if r.fields.get("kind") == "fetch":
            opcodes[(_int(r.fields, "queue"), _int(r.fields, "fence"))] = _int(r.fields, "arg32")
    fw_proc = device_process(device, "firmware")
    open_spans: dict[tuple[Any, ...], list[tuple[TraceRecord, int]]] = {}
    out: list[TraceEvent] = []
    for r in fw:
        f = r.fields
        kind = str(f.get("kind", "?"))
        dev_ns = _int(f, "dev_ns")
        host_us = _us(clock.to_host(dev_ns))
        queue, fence, core = _int(f, "queue"), _int(f, "fence"), _int(f, "core")
        arg32, arg = _int(f, "arg32"), _int(f, "arg")
        base = {"queue": queue, "fence": fence, "core": core, "dev_ns": dev_ns}
        if kind in FIRMWARE_KINDS or kind not in (
            *ENGINE_PAIRS,
            *ENGINE_PAIRS.values(),
            *DMA_PAIRS,
            *DMA_PAIRS.values(),
        ):
            args: dict[str, Any] = dict(base)
            if kind == "fetch":
                args["opcode"] = _opcode_name(arg32)
            elif kind == "irq":
                args["vector"] = arg32
            else:
                args.update(arg32=arg32, arg=arg)
            thread = "mailbox" if kind.startswith("mbox") else f"queue {queue}"
            out.append(TraceEvent(kind, "firmware", host_us, None, fw_proc, thread, args))
            continue
        dma = kind.startswith("dma")
        cat = "dma" if dma else "engine"
        proc = device_process(device, cat)
        thread = core_thread(core)
        tile = kind.startswith("tile")
        key: tuple[Any, ...] = (kind.rsplit("_", 1)[0], queue, fence, core)
        if tile:
            key = (*key, arg)
        elif dma:
            key = (*key, arg32)
        if kind.endswith("_start"):
            open_spans.setdefault(key, []).append((r, dev_ns))
            continue
        stack = open_spans.get(key)
        if not stack:
            out.append(TraceEvent(kind, cat, host_us, None, proc, thread, {**base, "arg32": arg32}))
            continue
        start, start_ns = stack.pop()
        t0 = _us(clock.to_host(start_ns))
        args = {**base, "dev_ns": start_ns}
        if dma:
            name = "dma write" if arg32 else "dma read"
            args["bytes"] = arg or _int(start.fields, "arg")
        elif tile:
            name = "tile"
            args["tile"] = arg
        else:
            name = _opcode_name(opcodes[(queue, fence)]) if (queue, fence) in opcodes else "cmd"
            args["status"] = arg32
            if arg:  # a timing mode's roofline (docs/npu-spec.md 12.2)
                compute_ns, memory_ns = arg & 0xFFFF_FFFF, arg >> 32
                args.update(
                    compute_ns=compute_ns,
                    memory_ns=memory_ns,
                    bound="compute" if compute_ns >= memory_ns else "memory",
                )
        out.append(TraceEvent(name, cat, t0, max(0.0, host_us - t0), proc, thread, args))
    for stack in open_spans.values():
        for r, dev_ns in stack:
            kind = str(r.fields.get("kind"))
            cat = "dma" if kind.startswith("dma") else "engine"
            out.append(
                TraceEvent(
                    kind,
                    cat,
                    _us(clock.to_host(dev_ns)),
                    None,
                    device_process(device, cat),
                    core_thread(_int(r.fields, "core")),
                    _args(r.fields),
                )
            )
    out.sort(key=lambda e: e.ts_us)
    return out
